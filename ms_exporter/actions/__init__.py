"""What the monitor may do to a run when asked (monitor_config.actions): decide, then act."""
