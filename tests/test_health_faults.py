"""The faults scenario's broken GPUs on a manual clock, through the production NVML source and
the health latch: the XID 79 and XID 48 GPUs stay critical 30 minutes after their XIDs (nothing
was fixed), and the XID 48 GPU passes again once the scenario resets it (at 2410 s: the row
remap applied, the recovery action back to none); the XID 79 GPU, whose driver still asks for a
node reboot, stays critical."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from gpu_exporter.collect.health_latch import HealthLatch
from gpu_exporter.model.snapshot import DeviceSample, DownCause
from gpu_exporter.pipeline.sampler import Sampler
from gpu_exporter.sim.clock import ManualClock


def verdicts(devices: list[DeviceSample]) -> dict[int, dict[str, str]]:
    out: dict[int, dict[str, str]] = {}
    for device in devices:
        for reading in device.readings:
            if reading.family == "gpu_health_verdict" and reading.value == 1.0:
                out.setdefault(device.index, {})["verdict"] = dict(reading.labels)["verdict"]
            if reading.family == "gpu_health_action_info":
                out.setdefault(device.index, {}).update(dict(reading.labels))
    return out


def answered(source: Any) -> list[DeviceSample]:
    """A tick in which GPUs 1 and 2 answered (a loaded machine may make a tick miss its
    deadline: such a GPU has no readings, which is no evidence either way)."""
    deadline = time.monotonic() + 10
    while True:
        devices = source.sample()
        up = {d.index for d in devices if d.up and d.value("gpu_row_remap_pending") is not None}
        if {1, 2} <= up or time.monotonic() > deadline:
            return devices
        time.sleep(0.1)


def test_the_faults_gpus_stay_critical_until_reset(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    source = start_source("faults")
    latch = HealthLatch()
    latch.process(source.sample(), clock.now)
    clock.now = 30.0  # past the XIDs (8 s, 10 s), GPU 1's loss and GPU 2's hung power reads
    deadline = time.monotonic() + 10
    while True:  # the XID events arrive on their own thread
        devices = answered(source)
        by_index = {d.index: d for d in devices}
        xid_79 = by_index[1].value("gpu_xid_errors_total", xid="79")
        xid_48 = by_index[2].value("gpu_xid_errors_total", xid="48")
        if (xid_79 and xid_48) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    now = verdicts(latch.process(devices, clock.now))
    assert now[1]["verdict"] == now[2]["verdict"] == "critical", now
    assert now[1]["action"] == "reboot_node" and now[2]["action"] == "drain_and_reset", now
    assert now[0]["verdict"] != "critical" and now[3]["verdict"] == "pass", now

    clock.now = 10.0 + 30 * 60  # 30 minutes after XID 48: nothing was fixed
    later = verdicts(latch.process(answered(source), clock.now))
    assert later[1]["verdict"] == later[2]["verdict"] == "critical", later

    clock.now = 2412.0  # the scenario reset GPU 2 at 2410 s
    reset = verdicts(latch.process(answered(source), clock.now))
    assert reset[2]["verdict"] == "pass", reset
    assert reset[1]["verdict"] == "critical" and reset[1]["action"] == "reboot_node", reset


def test_a_tick_the_source_failed_in_leaves_each_verdict_as_it_was(
    start_source: Callable[..., Any], clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = start_source("faults")
    sampler = Sampler(source, source.errors, interval=1.0, wall_clock=lambda: 1.75e9 + clock.now)
    sampler.add_processor("health_verdict", HealthLatch().process)
    clock.now = 1.0  # before any fault: every GPU passes
    first = sampler.tick()
    assert first is not None and {v["verdict"] for v in verdicts(first.devices).values()} == {
        "pass"
    }

    def broken() -> list[DeviceSample]:
        raise RuntimeError("a bug in the source")

    monkeypatch.setattr(source, "sample", broken)
    clock.now = 2.0
    failed = sampler.tick()
    assert failed is not None and not any(device.up for device in failed.devices)
    assert {device.down_cause for device in failed.devices} == {DownCause.UNREAD}
    # The daemon's own failure: no GPU is judged lost for it.
    assert {v["verdict"] for v in verdicts(failed.devices).values()} == {"pass"}
