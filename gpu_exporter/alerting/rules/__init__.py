"""Prometheus rule files evaluated inside the daemon: loading, PromQL, alert states."""
