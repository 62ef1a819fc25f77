"""The vocabulary every other folder speaks: the catalog of metric families, a tick's
snapshot, the one series list built from it, the guard that keeps a bad value out, and the
facts of NVML, DCGM's fields, the activity quantities, XIDs and Prometheus names.

Imports nothing else of the package (checked in CI: `lint-imports`).
"""
