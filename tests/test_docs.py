"""The README's metric reference is generated from the catalog and must not drift."""

from __future__ import annotations

from pathlib import Path

from gpu_exporter.catalog import markdown_table

ROOT = Path(__file__).resolve().parent.parent


def test_readme_metric_table_matches_catalog() -> None:
    readme = (ROOT / "README.md").read_text()
    begin, end = "<!-- metrics:begin -->\n", "\n<!-- metrics:end -->"
    embedded = readme[readme.index(begin) + len(begin) : readme.index(end)]
    assert embedded == markdown_table(), (
        "README metric table is stale: regenerate it from `python -m gpu_exporter.catalog`"
    )


def test_readme_quickstart_commands_exist_and_are_executable() -> None:
    readme = (ROOT / "README.md").read_text()
    for script in ("scripts/run-simulated.sh", "scripts/test.sh"):
        assert f"./{script}" in readme
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_every_test_the_fault_matrix_names_exists() -> None:
    import re

    matrix = (ROOT / "docs" / "reliability.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", matrix)
    assert len(named) > 50
    missing = [
        f"{path}::{name}"
        for path, name in named
        if not re.search(rf"^(?:async )?def {name}\(", (ROOT / path).read_text(), re.M)
    ]
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"
