"""Where the shipped rule pack lives: `rules/` in the source tree, `rulepack/` in the package."""

from __future__ import annotations

from pathlib import Path

PACK_DIR = Path(__file__).resolve().parent.parent / "rulepack"  # a link to ../rules in the tree


def default_rule_files() -> list[str]:
    return [str(PACK_DIR / "*.yaml")]
