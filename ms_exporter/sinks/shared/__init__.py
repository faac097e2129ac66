"""What the sinks share and are not sinks themselves: the JSON Lines columns, the trackers' writer thread, the
OpenTelemetry SDK's wiring, the series budget and the families the rules read."""
