"""Prometheus rule files evaluated inside the daemon: loading, PromQL subset, alert states."""
