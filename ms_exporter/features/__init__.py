"""Whole features that follow the run as parts: goodput, replica divergence, the hang watchdog, breach watching."""
