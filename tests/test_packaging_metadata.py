"""The package metadata builds without setuptools' deprecation warnings (PEP 639: `license` is
an SPDX expression, not a table) and says the license as such."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_metadata_builds_without_deprecations_and_names_the_license(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "deprecat" not in output.lower(), output
    dist_info = tmp_path / result.stdout.strip().splitlines()[-1]
    metadata = (dist_info / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
