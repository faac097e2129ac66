"""Generators of the deploy files: Prometheus rules, the Grafana dashboard, Kubernetes objects."""
