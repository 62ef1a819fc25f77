"""Rules evaluated inside the daemon: rule files, PromQL, the history store, alert states,
the notifier that sends them to Alertmanager, the runbook links, and per-GPU health read from
the shipped health rules.

Imports `collect`, `model` and `support` (checked in CI: `lint-imports`).
"""
