"""`--simulate NAME` is a built-in scenario unless the argument is a path (it has a `/` or
ends in .yaml or .yml): a folder or file called `mixed` in the working directory does not
shadow the built-in, and `./mixed` reads that file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_exporter.sim.scenario import ScenarioError, load_scenario, names_a_file

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = "name: {name}\ndevices:\n  - {{model: NVIDIA H200}}\n"


@pytest.mark.parametrize(
    ("argument", "is_path"),
    [
        ("mixed", False),
        ("pre-hopper-dcgm", False),
        ("./mixed", True),
        ("scenarios/node", True),
        ("/etc/scenario", True),
        ("node.yaml", True),
        ("node.yml", True),
        ("node.json", False),
    ],
)
def test_what_names_a_file(argument: str, is_path: bool) -> None:
    assert names_a_file(argument) is is_path


def test_a_folder_called_like_a_built_in_does_not_shadow_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mixed").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load_scenario("mixed").name == "mixed"
    with pytest.raises(ScenarioError, match="mixed: cannot read: a directory"):
        load_scenario("./mixed")


def test_a_file_is_read_by_its_path_and_only_by_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mixed").write_text(MINIMAL.format(name="local"))
    (tmp_path / "node").write_text(MINIMAL.format(name="node"))
    (tmp_path / "node.yml").write_text(MINIMAL.format(name="node-yml"))
    monkeypatch.chdir(tmp_path)
    assert load_scenario("mixed").name == "mixed"
    assert load_scenario("./mixed").name == "local"
    assert load_scenario("node.yml").name == "node-yml"
    assert load_scenario(tmp_path / "node").name == "node"  # a Path is always a file
    with pytest.raises(ScenarioError) as caught:
        load_scenario("node")
    assert "node: no such scenario file or built-in" in str(caught.value)
    assert "the file node is ./node" in str(caught.value)


def test_config_check_in_a_folder_holding_mixed_checks_the_built_in(tmp_path: Path) -> None:
    (tmp_path / "mixed").mkdir()
    config = tmp_path / "config.yaml"
    config.write_text("simulate: mixed\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "config", "check", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{config}: OK\n"
