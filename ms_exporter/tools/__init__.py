"""Operator tools behind the `ms-exporter` command: top, report and the demo job."""
