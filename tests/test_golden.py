"""The exposition is pinned: `mixed` at fixed times, attribution off / labels / info, text and
OpenMetrics. A change to any family shows up here as a diff; regenerate with
`.venv/bin/python -m tests.golden_exposition` and review it."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.golden_exposition import (
    COMPAT_PATH,
    FORMATS,
    FULL_PATH,
    MODES,
    path,
    render,
    render_compat,
    render_full,
)
from tests.support import promtool_check_metrics

REGENERATE = "regenerate with `.venv/bin/python -m tests.golden_exposition` and review the diff"


@pytest.fixture(scope="module", params=MODES)
def rendered(request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    return request.param, render(request.param)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_exposition_matches_the_golden_file(rendered: tuple[str, dict[str, str]], fmt: str) -> None:
    mode, outputs = rendered
    assert_as_pinned(path(mode, fmt), outputs[fmt], "/metrics")


def assert_as_pinned(golden: Path, actual: str, endpoint: str) -> None:
    assert golden.exists(), f"{golden} is missing; {REGENERATE}"
    expected = golden.read_text()
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                str(golden),
                "now",
                n=1,
            )
        )
        pytest.fail(f"{endpoint} differs from {golden.name} ({REGENERATE}):\n{diff[:6000]}")


def test_full_profile_matches_the_golden_file() -> None:
    """The full metrics profile: every family the mixed node has."""
    assert_as_pinned(FULL_PATH, render_full(), "/metrics (metrics.profile full)")


def test_golden_text_is_valid_exposition() -> None:
    """The pinned files are what Prometheus would accept (durations unmasked to a number)."""
    for golden in [*(path(mode, "text") for mode in MODES), FULL_PATH]:
        text = golden.read_text().replace("<measured>", "0.001")
        result = promtool_check_metrics(text.encode())
        assert result.returncode == 0, (golden.name, result.stdout, result.stderr)


def test_golden_openmetrics_is_valid_openmetrics() -> None:
    for mode in MODES:
        text = path(mode, "openmetrics").read_text()
        text = re.sub(r'(_bucket\{le="[^"]+"\}) <measured>', r"\1 1", text)  # counts
        text = text.replace("<measured>", "0.001")
        families = list(text_string_to_metric_families(text))  # raises on invalid input
        assert any(f.name == "gpu_up" for f in families), mode


def test_modes_differ_only_as_documented() -> None:
    """labels: pod labels on gpu_up/gpu_info and every other per-GPU family of held GPUs;
    info: only gpu_pod_info has them; off: no gpu_pod_info at all."""
    off, labels, info = (path(mode, "text").read_text() for mode in MODES)
    assert "gpu_pod_info" not in off and 'namespace="' not in off
    info_without_pods = [line for line in info.splitlines() if 'namespace="' in line]
    assert info_without_pods and all(line.startswith("gpu_pod_info{") for line in info_without_pods)
    assert 'gpu_up{container="main",gpu="0",namespace="ml",pod="trainer-0",' in labels
    assert 'gpu_info{architecture="hopper"' in labels
    held = [line for line in labels.splitlines() if re.search(r'[{,]gpu="0"', line)]
    assert held and all('pod="trainer-0"' in line for line in held), "a series without its pod"
    # GPU 5 is time-sliced by two pods: both in gpu_pod_info, the first on its other series.
    assert labels.count('pod="job-b"') == 1 and 'gpu_pod_info{container="work"' in labels


def test_compat_exposition_matches_the_golden_file() -> None:
    """/metrics/dcgm of the same ticks: names, label order, units and formats pinned."""
    assert_as_pinned(COMPAT_PATH, render_compat(), "/metrics/dcgm")
