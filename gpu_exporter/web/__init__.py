"""Everything served over HTTP: the server and its limits, TLS and basic auth from the
web-config file, the exposition, the JSON API, the status page and the dcgm-exporter
compatible endpoint.

Imports `alerting`, `collect`, `model` and `support` (checked in CI: `lint-imports`).
"""
