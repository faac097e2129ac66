"""Where numbers go. Sinks read the MetricStore; probes never import them."""
