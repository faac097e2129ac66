"""The MindSpore hooks and the wiring: TrainingMonitor forwards each hook to its parts; the assembly builds them."""
