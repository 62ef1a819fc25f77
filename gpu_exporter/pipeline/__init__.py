"""The tick and its wiring: the sampler that reads every source once per interval and
publishes one snapshot and one series list, and the assembly that builds the daemon from a
validated configuration.

May import every folder below it; only the assembly (and the CLI) read `config`.
"""
