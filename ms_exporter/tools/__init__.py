"""Operator tools behind the `ms-exporter` command: top, hangs, report, triage and peak-flops."""
