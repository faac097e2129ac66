"""Operator tools behind the `ms-exporter` command: top, hangs, report and peak-flops."""
