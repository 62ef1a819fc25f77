"""`gpu-exporter config check FILE…`: what `serve --config FILE` would load, checked before a
rollout (as `promtool check config` does for Prometheus).

Each file is checked with the daemon's own loaders, in the order `serve` runs them: the
configuration (the file alone: environment variables and flags are not read), the simulation
scenario it names, the web-config file it names, the dcgm-exporter counters file it names, and
its rule files, loaded by the rule manager with the settings `serve` gives it. Every problem is
printed as the loader words it (`file:line: field: message`); exit status 2 when any file has
one, as `serve` exits on bad input. What `serve` starts with but warns about (a counters-file
row /metrics/dcgm does not serve) is printed as a warning, and is a problem with `--strict`
(or `dcgm_compat.strict`), as `rules check --strict` refuses rules the daemon would skip.

`--root DIR` checks files laid out as a pod sees them (the chart's ConfigMaps and Secrets
extracted under DIR): every absolute path in the configuration and in the web-config file is
read under DIR instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from gpu_exporter.config.load import Config
    from gpu_exporter.support.yamlfile import LocatedYaml

EXIT_OK = 0
EXIT_PROBLEMS = 2  # what `serve` exits with on the same input
_CONFIG_PREFIX = "config error: "  # ConfigError's lines start so; the file name follows

DESCRIPTION = """\
Check daemon configuration files as `serve --config FILE` would load them: the settings, the
simulation scenario (simulate:), the web-config file (web_config_file:), the dcgm-exporter
counters file (dcgm_compat.counters_file) and the rule files (rules.files, the shipped pack
unless the file says otherwise). Environment variables and flags are not read. Prints
`FILE: OK`, or every problem as `file:line: field: message` (wrong settings do not hide the
problems of the files the others name); exits 0 when every file passes, 2 otherwise. Warnings
(counters-file rows /metrics/dcgm does not serve) do not fail a file unless --strict is
given."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    config = commands.add_parser("config", help="check configuration files")
    verbs = config.add_subparsers(dest="config_command", metavar="VERB", required=True)
    check = verbs.add_parser(
        "check",
        help="validate configuration files and the files they name",
        description=DESCRIPTION,
    )
    check.add_argument(
        "--root",
        metavar="DIR",
        type=Path,
        help="read the absolute paths the configuration and its web-config file name under DIR "
        "(files laid out as the pod mounts them, e.g. extracted from `helm template`)",
    )
    check.add_argument(
        "--strict",
        action="store_true",
        help="also fail on what the daemon would start with but warn about (rows of the "
        "counters file /metrics/dcgm does not serve; a warning otherwise), for CI",
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="configuration files")


def run(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        problems, warnings = check_file(path, args.root, args.strict)
        for warning in warnings:
            print(f"warning: {warning} (--strict refuses it)", file=sys.stderr)
        if problems:
            failed = True
            for problem in problems:
                print(problem, file=sys.stderr)
        else:
            print(f"{path}: OK")
    return EXIT_PROBLEMS if failed else EXIT_OK


def check_file(
    path: str, root: Path | None = None, strict: bool = False
) -> tuple[list[str], list[str]]:
    """Every problem `serve --config path` would stop at (with `strict`, also what it would
    warn about), and what it would warn about otherwise. Settings that are wrong do not hide
    the problems of the files the others name: those are checked with the wrong settings left
    at their defaults."""
    from gpu_exporter.config.load import ConfigError, load_config, load_config_leniently

    problems: list[str] = []
    with _rerooted(path, root) as (readable, shown):
        try:
            config = load_config(readable, environ={})
        except ConfigError as exc:
            problems = [
                line.removeprefix(_CONFIG_PREFIX).replace(readable, shown)
                for line in str(exc).splitlines()
            ]
            lenient = load_config_leniently(readable)
            if lenient is None:
                return problems, []
            config = lenient
        located = _located(readable, shown)
    counters, warnings = _counters_problems(config, root, strict)
    problems += (
        _scenario_problems(config, located)
        + _web_config_problems(config, root, located)
        + counters
        + _rule_problems(config, located)
    )
    return problems, warnings


def _located(readable: str, shown: str) -> LocatedYaml | None:
    """The configuration file as read, named as shown, for the lines of its settings."""
    from gpu_exporter.support.yamlfile import YamlFileError, load_yaml_file

    try:
        located = load_yaml_file(readable)
    except YamlFileError:
        return None
    located.filename = shown
    return located


def _setting_at(located: LocatedYaml | None, path: tuple[str | int, ...]) -> str:
    """`file:line: setting: ` for a setting the file sets (a list given as one string: the
    list's); "" for one it does not."""
    if located is None:
        return ""
    for end in range(len(path), 0, -1):
        if located.line_of(path[:end]):
            return f"{located.where(path[:end])}: "
    return ""


def _scenario_problems(config: Config, located: LocatedYaml | None) -> list[str]:
    if not config.simulate:
        return []
    from gpu_exporter.sim.scenario import load_scenario

    try:
        load_scenario(config.simulate)
    except ValueError as exc:  # ScenarioError and YAML errors name the file and field
        return _unplaced_at(str(exc).splitlines(), config.simulate, located, ("simulate",))
    return []


def _web_config_problems(
    config: Config, root: Path | None, located: LocatedYaml | None
) -> list[str]:
    from gpu_exporter.web.http_server import web_config_problem

    if config.web_config_file is None:
        return []
    with _rerooted(config.web_config_file, root) as (readable, shown):
        problem = web_config_problem(readable)
    lines = problem.replace(readable, shown).splitlines()
    return _unplaced_at(lines, config.web_config_file, located, ("web_config_file",))


def _counters_problems(
    config: Config, root: Path | None, strict: bool
) -> tuple[list[str], list[str]]:
    """The counters file's problems (its rows not served among them with `strict` or
    dcgm_compat.strict), and those rows otherwise; under `root`, named as the config names it."""
    settings = config.dcgm_compat
    if not settings.enabled or settings.counters_file is None:
        return [], []
    from gpu_exporter.web.dcgm_compat.selection import read_counters_file

    readable = settings.counters_file
    shown = readable.removeprefix(str(root.resolve())) if root is not None else readable
    counters = read_counters_file(readable)
    strict = strict or settings.strict
    problems = [problem.replace(readable, shown) for problem in counters.problems(strict)]
    warnings = [] if strict else [row.replace(readable, shown) for row in counters.unserved]
    return problems, warnings


def _rule_problems(config: Config, located: LocatedYaml | None) -> list[str]:
    if not config.rules.enabled:
        return []
    from gpu_exporter.config.load import rule_manager

    try:
        rule_manager(config).load()  # what `serve` does before it starts
    except ValueError as exc:  # RuleFileError: one line per problem
        lines = str(exc).splitlines()
        for i, pattern in enumerate(config.rules.files):
            lines = _unplaced_at(lines, pattern, located, ("rules", "files", i))
        return lines
    return []


def _unplaced_at(
    lines: list[str], named: str, located: LocatedYaml | None, setting: tuple[str | int, ...]
) -> list[str]:
    """Problems of the file `named` that have no line in it (it is missing, unreadable, or
    matches nothing) get the line of the setting that names it, `file:line: setting: `."""
    where = _setting_at(located, setting)
    if not where:
        return lines
    has_line = re.compile(re.escape(named) + r":\d+: ")
    return [
        f"{where}{line}" if line.startswith(f"{named}: ") and not has_line.match(line) else line
        for line in lines
    ]


@contextlib.contextmanager
def _rerooted(path: str, root: Path | None) -> Iterator[tuple[str, str]]:
    """(the file to read, its name in messages): `path` itself, or with `root`, a copy of it
    whose absolute paths lie under `root`, written beside it (a web-config file's relative
    paths are relative to its directory) and removed afterwards. A file that cannot be read or
    parsed is not copied: its loader reports that."""
    if root is None:
        yield path, path
        return
    from gpu_exporter.support.yamlfile import MAX_FILE_BYTES

    try:
        if not Path(path).is_file() or Path(path).stat().st_size > MAX_FILE_BYTES:
            raise OSError("left to the loader")  # a FIFO or device could block or never end
        copy = _with_root(Path(path).read_text(encoding="utf-8"), str(root.resolve()))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        yield path, path
        return
    fd, name = tempfile.mkstemp(dir=Path(path).parent, prefix=".config-check-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(copy)
        yield name, path
    finally:
        os.unlink(name)


def _with_root(text: str, root: str) -> str:
    """`text` with every one-line scalar value that is an absolute path prefixed by `root`,
    each edited in place, so that every line keeps its number for the loaders' messages."""
    edits: list[tuple[int, int, str]] = []
    seen: set[int] = set()

    def visit(node: yaml.Node) -> None:
        if id(node) in seen:  # an alias: edited where its anchor is
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for _key, value in node.value:
                visit(value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                visit(item)
        elif (
            isinstance(node, yaml.ScalarNode)
            and node.value.startswith("/")
            and node.start_mark.line == node.end_mark.line
        ):
            # A JSON string is a YAML double-quoted scalar, valid in block and flow context.
            edits.append(
                (node.start_mark.index, node.end_mark.index, json.dumps(root + node.value))
            )

    for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if document is not None:
            visit(document)
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text
