"""The daemon's settings from one YAML file, the environment and flags, composed from each
folder's own settings, and `config check`.

Read only by the CLI and the assembly (checked in CI: `lint-imports`).
"""
