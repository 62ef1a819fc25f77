"""Each process's share of each engine over a tick (collect/nvml/collectors/processes.py), read
from the fake driver's sample buffers through the production NVML source: a share is the
process's busy sample periods over all the periods that ended in the window, bounded by what
the device did in the same periods. The fake's sample period is 1 s; a tick at t has read the
periods that ended by t."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpu_exporter.model.snapshot import ProcessSample
from gpu_exporter.sim.clock import ManualClock


def scenario(*processes: dict[str, Any], utilization: Any = 1.0, **top: Any) -> dict[str, Any]:
    return {
        "name": "shares",
        "devices": [{"values": {"utilization": utilization}}],
        "processes": list(processes),
        **top,
    }


def shares_at(
    start_source: Callable[..., Any], clock: ManualClock, spec: dict[str, Any], *ticks: float
) -> list[dict[int, ProcessSample]]:
    """The processes of GPU 0 at each tick time, in order."""
    source = start_source(spec, processes=True, xid_events=False)
    out = []
    for at in ticks:
        clock.now = at
        (device,) = source.sample()
        assert device.processes is not None
        out.append({p.pid: p for p in device.processes})
    return out


def test_a_process_busy_in_one_period_of_ten_has_a_tenth_not_its_samples_mean(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    bursty = {"pid": 10, "gpu": 0, "utilization": {"sm": {"steps": [[0, 0], [14, 1], [15, 0]]}}}
    steady = {"pid": 11, "gpu": 0, "utilization": {"sm": 0.3}}
    spec = scenario(bursty, steady)
    _, window = shares_at(start_source, clock, spec, 10.0, 20.0)  # periods 11..20
    assert window[10].utilization == {"sm": pytest.approx(0.1)}
    assert window[11].utilization == {"sm": pytest.approx(0.3)}


def test_idle_periods_bring_a_share_down_and_a_window_without_samples_to_zero(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    stops = {"pid": 10, "gpu": 0, "utilization": {"sm": {"steps": [[0, 0.6], [12, 0]]}}}
    _, stopping, stopped = shares_at(start_source, clock, scenario(stops), 10.0, 20.0, 30.0)
    assert stopping[10].utilization == {"sm": pytest.approx(0.12)}  # 2 busy periods of 10
    assert stopped[10].utilization == {}  # listed, sampled in no period: used nothing


def test_reads_within_one_period_repeat_its_window(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    busy = {"pid": 10, "gpu": 0, "utilization": {"sm": {"steps": [[0, 0.5], [20.5, 0]]}}}
    _, first, within, next_ = shares_at(start_source, clock, scenario(busy), 10.0, 20.2, 20.9, 21.1)
    assert first[10].utilization == within[10].utilization == {"sm": pytest.approx(0.5)}
    assert next_[10].utilization == {}  # period 21 (20-21 s) judged at 20.5: idle


def test_overlapping_shares_are_bounded_by_the_device_sm_by_its_utilization(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    # MPS clients' kernels overlap: each is sampled at 0.8 while the GPU was busy 0.9 of the
    # time. Scaled to the device, each is its part of it; two encoders at 0.8 sum to at most 1.
    engines = {"sm": 0.8, "encoder": 0.8}
    server = {"pid": 9, "gpu": 0, "kind": "mps_server"}
    clients = [{"pid": p, "gpu": 0, "kind": "mps", "utilization": engines} for p in (10, 11)]
    _, window = shares_at(
        start_source, clock, scenario(server, *clients, utilization=0.9), 10.0, 20.0
    )
    for pid in (10, 11):
        assert window[pid].utilization == {
            "sm": pytest.approx(0.45),
            "encoder": pytest.approx(0.5),
        }
    assert window[9].utilization == {}


def test_unreadable_device_samples_leave_utilization_unknown_not_zero(
    start_source: Callable[..., Any], clock: ManualClock
) -> None:
    busy = {"pid": 10, "gpu": 0, "utilization": {"sm": 0.5}}
    denied = {"at": 0, "kind": "no_permission", "device": 0, "function": "nvmlDeviceGetSamples"}
    (window,) = shares_at(start_source, clock, scenario(busy, faults=[denied]), 10.0)
    assert window[10].utilization is None
    assert window[10].memory_bytes == 0.0  # the lists were read: the process is known
