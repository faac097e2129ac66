"""`ms-exporter top`: a live table of every rank's training health, polled from the ranks' own /metrics endpoints."""

from ms_exporter.tools.top.command import run_top

__all__ = ["run_top"]
