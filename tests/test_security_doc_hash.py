"""docs/security.md's bcrypt command works where the exporter's virtualenv is not on PATH (a
fresh Debian with apache2-utils, which scripts/test.sh installs), and its hash is one the
daemon's own web-config loader accepts and its password check verifies."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import subprocess
import sys
from pathlib import Path

from gpu_exporter.web.password_check import PasswordCheck, Verdict
from gpu_exporter.web.web_config import load_web_config
from tests.support import require_tool

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "correct horse battery staple"


def documented_command() -> str:
    text = (ROOT / "docs/security.md").read_text()
    commands = re.findall(r"```sh\n(htpasswd [^\n]*)\n```", text)
    assert len(commands) == 1, "docs/security.md should show one htpasswd command block"
    return commands[0]


def without_the_venv() -> dict[str, str]:
    """PATH without this interpreter's bin directory, as on a host without the venv."""
    venv_bin = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    return {**os.environ, "PATH": os.pathsep.join(path)}


def authorization(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def test_the_documented_hash_command_makes_a_hash_the_daemon_verifies(tmp_path: Path) -> None:
    require_tool("htpasswd")
    result = subprocess.run(
        ["bash", "-c", documented_command()],
        input=f"{PASSWORD}\n{PASSWORD}\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=without_the_venv(),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    hashed = result.stdout
    assert re.fullmatch(r"\$2[aby]\$10\$[./A-Za-z0-9]{53}", hashed), repr(hashed)
    web_config = tmp_path / "web.yml"
    web_config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    users = load_web_config(web_config).users
    check = PasswordCheck()
    try:
        good = asyncio.run(check.check(users, authorization("prometheus", PASSWORD)))
        wrong = asyncio.run(check.check(users, authorization("prometheus", "wrong")))
    finally:
        check.close()
    assert (good, wrong) == (Verdict.ALLOWED, Verdict.DENIED)
