"""The README's command synopsis ("## Command line") is the CLI's: every option of every
command is in its command's lines there, an option a command requires for the shipped pack is
shown as required, and every option and argument has a help text."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gpu_exporter.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def commands(
    parser: argparse.ArgumentParser, name: str = "gpu-exporter"
) -> dict[str, argparse.ArgumentParser]:
    """Every command's own parser, by its full name ("gpu-exporter rules check")."""
    found = {name: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                found |= commands(sub, f"{name} {verb}")
    return found


COMMANDS = {
    name: parser
    for name, parser in commands(build_parser()).items()
    if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
}


def synopsis() -> dict[str, str]:
    """Each command's lines of the README's synopsis (its own and their continuation lines)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Command line", 1)[1].split("```", 2)[1]
    out: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        if line.startswith("gpu-exporter "):
            words = line.split()
            current = " ".join(w for w in words[:3] if not w.startswith(("-", "[")))
            out[current] = ""
        if current is not None:
            out[current] += line.split("#", 1)[0] + "\n"
    return out


def test_every_command_is_in_the_synopsis() -> None:
    assert set(COMMANDS) <= set(synopsis()), sorted(set(COMMANDS) - set(synopsis()))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_is_in_its_commands_synopsis(name: str) -> None:
    lines = synopsis()[name]
    options = [
        option
        for action in COMMANDS[name]._actions
        if not isinstance(action, argparse._HelpAction)
        for option in action.option_strings[:1]
    ]
    missing = [o for o in options if not re.search(re.escape(o) + r"(?![\w-])", lines)]
    assert not missing, f"README.md's synopsis of `{name}` lacks {missing}"


def test_runbook_base_url_is_shown_required_for_rules_export() -> None:
    """The shipped pack links its runbook: `rules export` refuses it without the URL."""
    lines = synopsis()["gpu-exporter rules export"]
    assert re.search(r"(?<!\[)--runbook-base-url URL", lines), lines


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_and_argument_has_a_help_text(name: str) -> None:
    bare = [
        action.option_strings or action.dest
        for action in COMMANDS[name]._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert not bare, f"`{name}`: no help for {bare}"
