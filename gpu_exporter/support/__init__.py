"""Building blocks that know nothing of GPUs: the one bounded YAML loader with the line of
every value (`yamlfile`), pydantic validation that names `file:line: field` (`validation`),
Go's regexp semantics on RE2 (`regex`), and rate limits for log lines a fault can repeat
(`ratelimit`).

Imports nothing else of the package (checked in CI: `lint-imports`).
"""
