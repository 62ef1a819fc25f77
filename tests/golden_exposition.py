"""Golden expositions: `/metrics` of the `mixed` scenario at fixed times, pinned in files (the
default metrics profile; the full one too, with pods in labels mode, as text), and
`/metrics/dcgm`, the dcgm-exporter compatible output, with pods in labels mode.

The daemon is assembled as `serve` assembles it (`gpu_exporter.pipeline.assembly`), on the fake NVML
driven by a manual clock, with the shipped rule pack, ticked `TICKS` times one second apart;
pod attribution is off, in `labels` mode or in `info` mode (a real gRPC fake kubelet serving
pods on six of the eight GPUs, one of them shared by two pods). What cannot be the same from
run to run is masked: measured durations (value `<measured>`) and the Python and binding
versions in `gpu_exporter_build_info`.

    .venv/bin/python -m tests.golden_exposition     # rewrite tests/golden/ after a change

and review the diff: it is exactly what every scraper and rule sees change.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpu_exporter import sim
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.nvml.topology import read_topology
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.config.load import load_config
from gpu_exporter.model.series import SeriesSet
from gpu_exporter.pipeline.assembly import Assembly, assemble
from gpu_exporter.sim.kubelet import FakeKubelet, pod
from gpu_exporter.web.dcgm_compat.endpoint import DcgmCompat
from tests.conftest import ManualClock

GOLDEN = Path(__file__).resolve().parent / "golden"
MODES = ("off", "labels", "info")
FORMATS = {"text": "metrics.txt", "openmetrics": "metrics.openmetrics.txt"}
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: scenario t=0 at a fixed wall time
TICKS = 6
SCENARIO = "mixed"

# Families whose values are wall-time measurements of our own code.
_MEASURED = re.compile(r"^(gpu_exporter_\w*duration_seconds\w*)(\{[^}]*\})? (.+)$")
_BUILD_INFO = re.compile(r'(nvml_binding_version|python_version)="[^"]*"')


def kubelet_pods(uuids: list[str]) -> list:
    """Six of eight GPUs held: a two-GPU trainer, single-GPU pods, GPU 5 time-sliced."""
    return [
        pod("ml", "trainer-0", {"main": [("nvidia.com/gpu", [uuids[0], uuids[4]])]}),
        pod("ml", "eval-1", {"eval": [("nvidia.com/gpu", [uuids[1]])]}),
        pod("web", "infer-2", {"srv": [("nvidia.com/gpu", [uuids[2]])]}),
        pod("web", "infer-3", {"srv": [("nvidia.com/gpu", [uuids[3]])]}),
        pod("batch", "job-a", {"work": [("nvidia.com/gpu", [f"{uuids[5]}::0"])]}),
        pod("batch", "job-b", {"work": [("nvidia.com/gpu", [f"{uuids[5]}::1"])]}),
    ]


@contextmanager
def _kubelet(mode: str, uuids: list[str]) -> Iterator[dict[str, object]]:
    if mode == "off":
        yield {"kubernetes.enabled": False}
        return
    kubelet = FakeKubelet().start()
    try:
        kubelet.set_pods(kubelet_pods(uuids))
        yield {
            "kubernetes.enabled": True,
            "kubernetes.socket_path": kubelet.socket_path,
            "kubernetes.mode": mode,
        }
    finally:
        kubelet.close()


@contextmanager
def running(
    mode: str,
    before_ticks: Callable[[Assembly], None] = lambda _: None,
    profile: str = "default",
) -> Iterator[Assembly]:
    """The assembled daemon after TICKS ticks, for attribution `mode` and metrics `profile`."""
    clock = ManualClock()
    scenario = sim.load_scenario(SCENARIO)
    uuids = [device.uuid for device in scenario.devices]
    sim.install(scenario, clock=clock)
    try:
        with _kubelet(mode, uuids) as k8s_flags:
            # A group's time budget is wall time: on a loaded machine it would stop a group
            # and change the file. Budgets have their own tests (tests/test_rule_budgets.py).
            flags = {
                "interval_seconds": 1.0,
                "nvml.xid_events": False,
                "rules.group_time_budget_seconds": 3600,
                "metrics.profile": profile,
                **k8s_flags,
            }
            config = load_config(None, flags, environ={})
            errors = ErrorLog()
            source = NvmlSource(
                settings=config.nvml,
                interval_seconds=config.interval_seconds,
                errors=errors,
                clock=clock,
                topology_reader=read_topology,
            )
            source.start()
            try:
                assembly = assemble(config, source, errors, wall_clock=lambda: EPOCH + clock())
                if assembly.attribution is not None:
                    assert assembly.attribution.refresh(), "the fake kubelet did not answer"
                before_ticks(assembly)
                for _ in range(TICKS):
                    clock.advance(1.0)
                    assembly.sampler.tick()
                yield assembly
            finally:
                source.close()
    finally:
        sim.uninstall()


def render(mode: str, profile: str = "default") -> dict[str, str]:
    """format -> masked exposition after TICKS ticks, for attribution `mode` and `profile`."""
    with running(mode, profile=profile) as assembly:
        rendered = assembly.sampler.rendered
        assert rendered is not None
        return {
            "text": mask(rendered.body(False, False).decode()),
            "openmetrics": mask(rendered.body(True, False).decode()),
        }


# The full metrics profile's /metrics, pods in labels mode.
FULL_PATH = GOLDEN / f"{SCENARIO}-labels.full.metrics.txt"


def render_full() -> str:
    return render("labels", "full")["text"]


# The dcgm-exporter compatible output (/metrics/dcgm) of the same daemon, pods in labels mode.
COMPAT_PATH = GOLDEN / f"{SCENARIO}-labels.dcgm.txt"
COMPAT_HOSTNAME = ("hostname", "node-a")


@contextmanager
def running_compat(mode: str = "labels") -> Iterator[tuple[SeriesSet, str]]:
    """The published series after TICKS ticks, and their /metrics/dcgm (rates from the last
    two), for attribution `mode`."""
    compat = DcgmCompat(COMPAT_HOSTNAME)
    with running(mode, lambda assembly: assembly.sampler.add_listener(compat)) as assembly:
        published = assembly.sampler.series
        assert published is not None
        yield published, compat.body(published).decode()


def render_compat() -> str:
    """/metrics/dcgm after TICKS ticks, attribution in labels mode."""
    with running_compat() as (_, text):
        return text


def mask(text: str) -> str:
    lines = []
    for line in text.splitlines():
        measured = _MEASURED.match(line)
        if measured and not _is_tick_count(measured.group(1), measured.group(2) or ""):
            line = f"{measured.group(1)}{measured.group(2) or ''} <measured>"
        elif line.startswith("gpu_exporter_build_info"):
            line = _BUILD_INFO.sub(r'\1="<masked>"', line)
        lines.append(line)
    return "\n".join(lines) + "\n"


def _is_tick_count(name: str, labels: str) -> bool:
    """A duration histogram's count (and +Inf bucket) is the number of ticks: not masked."""
    return name.endswith("_count") or 'le="+Inf"' in labels


def path(mode: str, fmt: str) -> Path:
    return GOLDEN / f"{SCENARIO}-{mode}.{FORMATS[fmt]}"


def main() -> int:
    GOLDEN.mkdir(exist_ok=True)
    for mode in MODES:
        for fmt, text in render(mode).items():
            path(mode, fmt).write_text(text)
            print(f"wrote {path(mode, fmt).relative_to(GOLDEN.parent.parent)}")
    FULL_PATH.write_text(render_full())
    print(f"wrote {FULL_PATH.relative_to(GOLDEN.parent.parent)}")
    COMPAT_PATH.write_text(render_compat())
    print(f"wrote {COMPAT_PATH.relative_to(GOLDEN.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
