"""Building blocks that know nothing of GPUs: the one bounded YAML loader with the line of
every value, and rate limits for log lines a fault can repeat.

Imports nothing else of the package (checked in CI: `lint-imports`).
"""
