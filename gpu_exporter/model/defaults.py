"""Defaults shown by several layers (the flags' help, the config model, the sampler, the rule
manager), written once here; a light module, so `--help` does not import the config layer."""

DEFAULT_LISTEN_ADDRESS = "0.0.0.0:9449"
DEFAULT_INTERVAL_SECONDS = 1.0  # how often a snapshot is taken, and rules evaluated
# Which Prometheus' PromQL rules follow (`rules.semantics`, `rules check/test --semantics`):
# 2.42 is what the project's CI checks the shipped rules against (Debian's promtool).
RULE_SEMANTICS = ("prometheus2", "prometheus3")
DEFAULT_RULE_SEMANTICS = "prometheus2"
