"""The package's layering (docs/architecture.md): the import contracts in pyproject.toml hold,
and they are not a formality: a deliberately wrong import, or a circle, breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpu_exporter"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the package under `root`, with the contracts of this repository."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_contracts_hold() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken." in done.stdout, done.stdout


def test_the_top_level_holds_only_the_face_and_entry_points() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py", "cli.py"], modules
    for folder in (p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        doc = (folder / "__init__.py").read_text()
        assert doc.startswith('"""'), f"{folder.name}/__init__.py says what it owns and imports"


@pytest.mark.parametrize(
    ("module", "wrong_import", "broken"),
    [
        # model/ imports nothing of the package
        ("model/catalog.py", "import gpu_exporter.collect.classify", "Folders import only"),
        # a collector reads the world; it never reaches the HTTP side
        ("collect/nvml/collectors/power.py", "import gpu_exporter.web.api", "Folders import"),
        # only the CLI and the assembly read the configuration
        ("diagnose/report.py", "import gpu_exporter.config.load", "Only the CLI and the assembly"),
        # two siblings importing each other
        ("collect/nvml/calls.py", "import gpu_exporter.collect.nvml.device", "No import circles"),
    ],
)
def test_a_wrong_import_breaks_a_contract(
    tmp_path: Path, module: str, wrong_import: str, broken: str
) -> None:
    shutil.copytree(
        PACKAGE, tmp_path / "gpu_exporter", ignore=shutil.ignore_patterns("__pycache__")
    )
    path = tmp_path / "gpu_exporter" / module
    path.write_text(path.read_text() + f"\n{wrong_import}  # noqa\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{broken}" in done.stdout.split("Broken contracts")[-1], done.stdout
