"""The README's metric reference is generated from the catalog and must not drift; the docs
cite only what is in the repository or upstream."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gpu_exporter.model.catalog import markdown_table

ROOT = Path(__file__).resolve().parent.parent


def test_readme_metric_table_matches_catalog() -> None:
    readme = (ROOT / "README.md").read_text()
    begin, end = "<!-- metrics:begin -->\n", "\n<!-- metrics:end -->"
    embedded = readme[readme.index(begin) + len(begin) : readme.index(end)]
    assert embedded == markdown_table(), (
        "README metric table is stale: regenerate it from `python -m gpu_exporter.model.catalog`"
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


# Documents the project was written from that are not part of it: nothing in it may send a
# reader there (say the fact and its upstream source instead).
_OUTSIDE = re.compile(
    r"DESIGN\.md|(?:reference/)?(?:nvml|tooling|anchors|peers|dcgm-compat-mig)\.md"
    r"|\.\./shared/|\bthe seed\b",
    re.IGNORECASE,
)


def test_nothing_cites_a_document_outside_the_repository() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    found = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if name == "tests/test_docs.py" or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary files cite nothing
        found += [
            f"{name}:{number}: {line.strip()[:100]}"
            for number, line in enumerate(text.splitlines(), 1)
            if _OUTSIDE.search(line)
        ]
    assert not found, "cites a document that is not in this repository:\n" + "\n".join(found)
