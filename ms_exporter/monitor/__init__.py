"""The drivers and the wiring: the Callback and the loop API feed one core; the assembly builds the parts it drives."""
