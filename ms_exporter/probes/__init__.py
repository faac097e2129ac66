"""One measured quantity per module; each writes to the MetricStore only."""
