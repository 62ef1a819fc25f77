"""Helpers shared by tests: tool lookup and promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def require_tool(name: str) -> str:
    """Path of a tool the suite depends on; scripts/test.sh installs them, so absence fails."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; run scripts/test.sh, which installs it")
    return path


def promtool_check_metrics(text: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        timeout=30,
        check=False,
    )
