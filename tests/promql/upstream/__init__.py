"""Prometheus 2.42's own PromQL tests (promql/testdata/*.test), as promtool unit-test files.

`testfile` reads the upstream format, `convert` writes `prometheus-2.42/*.test.yaml`, and
`conformance` runs them through promtool and `gpu-exporter rules test` and compares verdicts.
"""
