"""GpuActivityMetricsUnavailable at start, on the daemon's own evaluator: activity that is not
sampled yet (GPM's first window needs a second sample, DCGM its first update cycle) is not
missing, so a fresh start raises no activity alert while activity is shown; activity the
hardware cannot give still raises it from the first evaluation on.

The daemon is assembled as `serve` assembles it, on the fake NVML with a manual clock, with the
shipped rule pack (its efficiency group is evaluated on the first tick, then every 15 s).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpu_exporter import sim
from gpu_exporter.collect import dcgm
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.nvml.topology import read_topology
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.config.load import load_config
from gpu_exporter.pipeline.assembly import Assembly, assemble
from tests.conftest import ManualClock

ALERT = "GpuActivityMetricsUnavailable"


@contextmanager
def started(scenario_name: str) -> Iterator[tuple[Assembly, ManualClock]]:
    clock = ManualClock()
    scenario = sim.load_scenario(scenario_name)
    sim.install(scenario, clock=clock)
    flags = {"interval_seconds": 1.0, "nvml.xid_events": False, "kubernetes.enabled": False}
    if scenario.dcgm is not None:  # as serve does for a scenario with a host engine
        flags["dcgm.mode"] = "auto"
    config = load_config(None, flags, environ={})
    errors = ErrorLog()
    source = NvmlSource(
        settings=config.nvml,
        interval_seconds=config.interval_seconds,
        errors=errors,
        clock=clock,
        topology_reader=read_topology,
        dcgm=dcgm.configured(config.dcgm, errors, config.interval_seconds, clock),
    )
    source.start()
    try:
        yield assemble(config, source, errors, wall_clock=lambda: 1e9 + clock()), clock
    finally:
        source.close()
        sim.uninstall()


def activity_alerts(assembly: Assembly) -> list[dict]:
    assert assembly.rules is not None
    return [a for a in assembly.rules.alerts_json() if a["labels"]["alertname"] == ALERT]


def shown_activity(assembly: Assembly) -> set[str]:
    """The GPUs whose SM activity /metrics shows."""
    rendered = assembly.sampler.rendered
    assert rendered is not None
    return {
        line.split('gpu="', 1)[1].split('"', 1)[0]
        for line in rendered.body(False, False).decode().splitlines()
        if line.startswith("gpu_sm_active_ratio{")
    }


@pytest.mark.parametrize("scenario_name", ["mixed", "pre-hopper-dcgm"])
def test_a_fresh_start_shows_no_activity_alert_while_activity_is_shown(
    scenario_name: str,
) -> None:
    """The default scenario (GPM) and the A100 node whose activity DCGM gives: every GPU's
    activity is shown within three ticks, and no tick of the first 20 s (two evaluations of
    the efficiency group) has an activity alert, pending or firing."""
    with started(scenario_name) as (assembly, clock):
        gpus = None
        for second in range(1, 21):
            clock.advance(1.0)
            assembly.sampler.tick()
            assert activity_alerts(assembly) == [], f"tick {second}"
            if second == 3:
                gpus = shown_activity(assembly)
        assert gpus and gpus == shown_activity(assembly)


def test_busy_gpus_without_any_activity_source_still_pend_from_the_first_evaluation() -> None:
    """Pre-Hopper without DCGM: the activity is unavailable, not awaited; the alert pends on
    the first tick for each busy GPU (and fires after its `for`)."""
    with started("pre-hopper") as (assembly, clock):
        clock.advance(1.0)
        assembly.sampler.tick()
        alerts = activity_alerts(assembly)
        assert alerts and {a["state"] for a in alerts} == {"pending"}
        assert shown_activity(assembly) == set()
