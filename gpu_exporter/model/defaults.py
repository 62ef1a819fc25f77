"""Defaults shown by several layers (the flags' help, the config model, the sampler, the rule
manager), written once here; a light module, so `--help` does not import the config layer."""

DEFAULT_LISTEN_ADDRESS = "0.0.0.0:9449"
DEFAULT_INTERVAL_SECONDS = 1.0  # how often a snapshot is taken, and rules evaluated
