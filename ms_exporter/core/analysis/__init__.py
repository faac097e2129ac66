"""Computations over what was measured, with no MindSpore and no threads: the goodput ledger, FLOPs, replica groups,
fail-slow detection, the checkpoint interval, the learned hang deadline."""
