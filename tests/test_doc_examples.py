"""Every YAML example in the README and docs/ loads with the loader that reads it for real.

Each ```yaml block is preceded by `<!-- example: KIND -->`, which says what reads it: the
daemon's configuration loader, the scenario loader (a part of a scenario is put into the
built-in `mig` scenario, whose GPU 0 has the instances the examples name), the web-config
loader, the Helm chart's values schema (over the chart's defaults, as helm merges them),
promtool for Prometheus configuration; formats read by others (kustomize, prometheus-adapter)
are parsed by the project's strict YAML loader. File paths the examples name stand for files
on a node: they are replaced by real files here, so that the rest of the example is what the
loaders judge. A block without a kind fails, so a new example cannot skip the check.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_exporter import sim
from gpu_exporter.config.load import load_config
from gpu_exporter.support.yamlfile import load_yaml_file
from gpu_exporter.web.web_config import load_web_config
from tests.support import promtool
from tests.tlsfiles import make_pki

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHART = ROOT / "helm" / "gpu-exporter"
_BLOCK = re.compile(r"^([ \t]*)```ya?ml[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)
_KIND = re.compile(r"<!-- example: ([a-z-]+) -->[ \t]*\n[ \t]*$")
KINDS = (
    "config",
    "scenario",
    "scenario-part",
    "web-config",
    "helm-values",
    "prometheus",
    "kustomize",
    "prometheus-adapter",
)


def examples() -> Iterator[tuple[str, str, str]]:
    """(where, kind, text) of every YAML block; kind "" when the block has none."""
    for doc in DOCS:
        text = doc.read_text()
        for block in _BLOCK.finditer(text):
            before = text[: block.start()]
            line = before.count("\n") + 1
            kind = _KIND.search(before[-80:] if len(before) > 80 else before)
            indent = block.group(1)
            body = "".join(
                row[len(indent) :] if row.startswith(indent) else row
                for row in block.group(2).splitlines(keepends=True)
            )
            yield f"{doc.relative_to(ROOT)}:{line}", kind.group(1) if kind else "", body


EXAMPLES = list(examples())


def test_every_example_says_what_reads_it() -> None:
    assert len(EXAMPLES) >= 14
    unmarked = [where for where, kind, _ in EXAMPLES if kind not in KINDS]
    assert not unmarked, f"YAML examples without a known <!-- example: KIND -->: {unmarked}"


def _stand_in_files(node: Any, directory: Path, key: str = "") -> Any:
    """The data with every file path (a `*_file` / `*File` key, or a path under /etc or /var)
    replaced by a real file."""
    if isinstance(node, dict):
        return {k: _stand_in_files(v, directory, str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [_stand_in_files(item, directory, key) for item in node]
    looks_like_a_file = key.endswith(("_file", "File")) or (
        isinstance(node, str) and node.startswith(("/etc/", "/var/")) and "*" not in node
    )
    if looks_like_a_file and isinstance(node, str):
        stand_in = directory / f"file-{abs(hash(node))}"
        stand_in.write_text("x\n")
        return str(stand_in)
    return node


def _by_kind(kind: str) -> list[tuple[str, str]]:
    return [(where, text) for where, k, text in EXAMPLES if k == kind]


@pytest.mark.parametrize(("where", "text"), _by_kind("config"))
def test_configuration_examples_load(where: str, text: str, tmp_path: Path) -> None:
    data = _stand_in_files(yaml.safe_load(text), tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    load_config(path, environ={})  # raises ConfigError naming the field


@pytest.mark.parametrize(("where", "text"), _by_kind("scenario"))
def test_scenario_examples_load(where: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    assert sim.load_scenario(str(path)).devices


@pytest.mark.parametrize(("where", "text"), _by_kind("scenario-part"))
def test_scenario_parts_load_in_the_mig_scenario(where: str, text: str, tmp_path: Path) -> None:
    part = yaml.safe_load(text)
    base = yaml.safe_load((ROOT / "gpu_exporter/sim/scenarios/mig.yaml").read_text())
    if "mig" in part:
        base["devices"][0]["mig"] = part["mig"]
        base.pop("pods", None)  # they name GPU 0's instances, which the example replaces
    else:
        base.update(part)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    assert sim.load_scenario(str(path)).devices


@pytest.mark.parametrize(("where", "text"), _by_kind("web-config"))
def test_web_config_examples_load(where: str, text: str, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    real = {"cert_file": pki.server_cert, "key_file": pki.server_key}
    data = yaml.safe_load(text)
    for key, path in real.items():
        if key in data.get("tls_server_config", {}):
            data["tls_server_config"][key] = str(path)
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(data))
    load_web_config(path)


@pytest.mark.parametrize(("where", "text"), _by_kind("helm-values"))
def test_helm_values_examples_match_the_chart_schema(where: str, text: str, tmp_path: Path) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = _merged(yaml.safe_load((CHART / "values.yaml").read_text()), yaml.safe_load(text))
    jsonschema.validate(values, schema)
    # And the chart renders them: its templates refuse what the daemon would refuse at start.
    (tmp_path / "values.yaml").write_text(text)
    helm = ROOT / ".tools" / "bin" / "helm"
    result = subprocess.run(
        [str(helm), "template", "gpu-exporter", str(CHART), "-f", str(tmp_path / "values.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"{where}: {result.stderr}"


def _merged(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merged(base.get(k), over[k]) if k in over else base[k] for k in {*base, *over}}
    return over


@pytest.mark.parametrize(("where", "text"), _by_kind("prometheus"))
def test_prometheus_examples_pass_promtool(where: str, text: str, tmp_path: Path) -> None:
    data = _stand_in_files(yaml.safe_load(text), tmp_path)
    for job in data.get("scrape_configs", []):
        # Debian's promtool is built without Kubernetes service discovery: a static target
        # stands in for it; the relabeling and everything else are checked as written.
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": ["127.0.0.1:9449"]}]
    if "rule_files" in data:
        rules = tmp_path / "rules.yaml"
        rules.write_text("groups: []\n")
        data["rule_files"] = [str(rules)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(data))
    checked = promtool("check", "config", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(("where", "text"), _by_kind("kustomize") + _by_kind("prometheus-adapter"))
def test_other_tools_examples_are_strict_yaml(where: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / "example.yaml"
    path.write_text(text)
    assert load_yaml_file(path).data  # duplicate keys, tags and documents refused
