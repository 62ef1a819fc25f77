"""The per-GPU collectors: their declarations against the catalog and the code, and the guard.

A collector's declarations (families, NVML calls, fields, settings) are checked against the
catalog and against what it really does on the fake NVML; a collector that raises costs only
its own families on that GPU for that tick, while the choke point's control flow (GPU lost)
still takes the whole GPU down.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pynvml as N
import pytest

from gpu_exporter.collect.nvml import collectors
from gpu_exporter.collect.nvml.calls import DeviceLostError
from gpu_exporter.collect.nvml.collectors import (
    COLLECTORS,
    SOURCE_FAMILIES,
    SOURCE_INSTANCE_FAMILIES,
    Collector,
)
from gpu_exporter.collect.nvml.source import NvmlConfig, NvmlSource
from gpu_exporter.collect.nvml.topology import read_topology
from gpu_exporter.collect.nvml.xid import XidCounts, XidWatcher
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.model.catalog import BY_NAME, FAMILIES
from gpu_exporter.model.snapshot import Reading
from tests.conftest import ManualClock

H200 = {"model": "NVIDIA H200", "architecture": "hopper", "nvlink_links": 18}
BUSY = {"utilization": 0.9, "sm_active": 0.8, "tensor_active": 0.5, "power_watts": 500}
NVML_SOURCES = {"nvml", "gpm", "topology"}  # catalog sources the NVML source produces

# One GPU on an old driver: every fallback path of every collector runs.
OLD_DRIVER = {
    "name": "old-driver",
    "defaults": {"model": "NVIDIA A100-SXM4-80GB", "architecture": "ampere"},
    "devices": [{"label": "old", "values": BUSY}],
    "driver": {
        "missing_functions": [
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetTemperatureV",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetSupportedClocksEventReasons",
        ],
        "unsupported_fields": [74, 83, 94, 142, 143, 144, 145, 197, 198, 269, 270],
    },
}


def scenario(devices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": "test", "defaults": {**H200, "values": BUSY}, "devices": devices, **extra}


@pytest.fixture
def start(start_source: Callable[..., NvmlSource]) -> Callable[..., NvmlSource]:
    def _start(spec: Any, topology: bool = False, **settings: Any) -> NvmlSource:
        settings.setdefault("xid_events", False)  # its thread waits in real time
        return start_source(spec, topology=topology, **settings)

    return _start


def tick(source: NvmlSource, clock: ManualClock, seconds: float = 1.0) -> dict[int, Any]:
    clock.advance(seconds)
    return {d.index: d for d in source.sample()}


def readers(source: NvmlSource) -> list[Any]:
    return [device.reader for device in source._devices.values()]


def collector_of(source: NvmlSource, index: int, name: str) -> Collector:
    reader = next(r for r in readers(source) if r.index == index)
    return next(c for c in reader.collectors if c.name == name)


# -- the declarations -----------------------------------------------------------------------


def test_every_nvml_family_is_declared_by_exactly_one_collector() -> None:
    declared = Counter(name for c in COLLECTORS for name in c.families)
    declared.update(SOURCE_FAMILIES)
    assert {name: n for name, n in declared.items() if n > 1} == {}
    produced = {f.name for f in FAMILIES if f.on_gpus and f.source in NVML_SOURCES}
    assert produced - set(declared) == set(), "catalog families no collector declares"
    for name in declared:
        assert name in BY_NAME, f"{name} is not in the catalog"
        assert BY_NAME[name].on_gpus and BY_NAME[name].source in NVML_SOURCES, name
    # MIG instances' families, likewise, from the collectors' instance_families.
    of_instances = Counter(name for c in COLLECTORS for name in c.instance_families)
    of_instances.update(SOURCE_INSTANCE_FAMILIES)
    assert {name: n for name, n in of_instances.items() if n > 1} == {}
    expected = {f.name for f in FAMILIES if f.on_instances and f.source in NVML_SOURCES}
    assert set(of_instances) == expected


def test_declarations_name_real_calls_fields_and_settings() -> None:
    settings = set(NvmlConfig.model_fields)
    names = [c.name for c in COLLECTORS]
    assert len(set(names)) == len(names)
    field_ids = Counter(spec.field_id for c in COLLECTORS for spec in c.fields)
    assert {fid: n for fid, n in field_ids.items() if n > 1} == {}
    for c in COLLECTORS:
        # processes emits nothing itself: its processes go on the tick's samples, and the
        # pod-use processor makes them per-pod families.
        assert c.families or c.name == "processes", c.name
        assert [call for call in c.calls if not hasattr(N, call)] == [], c.name
        assert {spec.family for spec in c.fields} <= set(c.families), c.name
        for flag in (c.setting, *c.options):
            assert flag is None or flag in settings, (c.name, flag)


@pytest.mark.parametrize(
    ("overrides", "topology", "missing"),
    [
        ({}, True, {"processes"}),  # off by default (kubernetes.processes turns it on)
        ({"gpm": False, "xid_events": False}, False, {"gpm", "xid", "topology", "processes"}),
        ({"processes": True}, True, set()),
    ],
)
def test_settings_turn_collectors_on_and_off(
    overrides: dict[str, bool], topology: bool, missing: set[str]
) -> None:
    on = {c.name for c in collectors.enabled(NvmlConfig(**overrides), topology=topology)}
    assert on == {c.name for c in COLLECTORS} - missing


class _CallRecorder:
    """Wraps every pynvml function; records (collector running, function) per outermost call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, running: Callable[[], str]) -> None:
        self.calls: set[tuple[str, str]] = set()
        self._depth = threading.local()
        for name, fn in inspect.getmembers(N, inspect.isfunction):
            if name.startswith("nvml"):
                monkeypatch.setattr(N, name, self._wrap(name, fn, running))

    def _wrap(self, name: str, fn: Callable[..., Any], running: Callable[[], str]) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            if depth == 0:
                self.calls.add((running(), name))
            self._depth.n = depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth.n = depth

        wrapper.__name__ = name
        return wrapper

    def by(self, collector: str) -> set[str]:
        return {fn for who, fn in self.calls if who == collector}


@pytest.mark.parametrize("spec", [scenario([{"label": "a"}]), OLD_DRIVER], ids=["new", "old"])
def test_collectors_call_only_the_nvml_functions_they_declare(
    start, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, spec: dict[str, Any]
) -> None:
    holder: dict[str, Any] = {}
    recorder = _CallRecorder(monkeypatch, lambda: holder["reader"].running if holder else "")
    source = start(spec, slow_refresh_seconds=2)
    holder["reader"] = readers(source)[0]
    for _ in range(4):  # first window, GPM reads, a slow refresh
        assert tick(source, clock)[0].up
    made = {c.name: recorder.by(c.name) for c in COLLECTORS}
    for c in COLLECTORS:
        # The tick's one field batch is made by whichever collector with fields asks first.
        allowed = {*c.calls, *(["nvmlDeviceGetFieldValues"] if c.fields else [])}
        assert made[c.name] <= allowed, (c.name, made[c.name] - allowed)
    assert made["power"] and made["gpm" if spec is not OLD_DRIVER else "clocks"]


def test_topology_and_xid_call_only_what_their_collectors_declare(
    fake_nvml, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _CallRecorder(monkeypatch, lambda: "")
    fake_nvml.install("mixed", clock=clock)
    N.nvmlInit()
    try:
        handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
        devices = [(N.nvmlDeviceGetUUID(h), i, h) for i, h in enumerate(handles)]
        before = set(recorder.calls)
        read_topology(devices, sysfs_root="/nonexistent")
        topology_calls = {fn for _, fn in recorder.calls - before}
        before = set(recorder.calls)
        watcher = XidWatcher({u: h for u, _, h in devices}, XidCounts(), ErrorLog())
        watcher.start()
        watcher.stop(join=True)
        xid_calls = {fn for _, fn in recorder.calls - before}
    finally:
        N.nvmlShutdown()
    assert topology_calls and topology_calls <= set(collectors.Topology.calls)
    assert "nvmlEventSetWait" in xid_calls and xid_calls <= set(collectors.Xid.calls)


@pytest.mark.parametrize("builtin", ["mixed", "pre-hopper", "faults"])
def test_on_the_builtin_scenarios_no_collector_fails(start, clock: ManualClock, builtin) -> None:
    source = start(builtin, topology=True, device_deadline_seconds=1.0)
    for _ in range(4):  # `faults` hangs a call from 5 s on
        devices = tick(source, clock)
        for device in devices.values():
            produced = {r.family for r in device.readings}
            assert produced <= {f for c in COLLECTORS for f in c.families}
        assert [s.collector for s in source.collector_status() if not s.success] == []


# -- the guard ------------------------------------------------------------------------------


def test_normal_ticks_report_every_enabled_collector_as_successful(
    start, clock: ManualClock
) -> None:
    source = start(scenario([{"label": "a"}, {"label": "b"}]), topology=True)
    assert source.collector_status() == ()  # before the first sample
    for _ in range(2):
        tick(source, clock)
        statuses = source.collector_status()
        assert [s.collector for s in statuses] == sorted(
            c.name for c in COLLECTORS if c.name not in ("xid", "processes")
        )
        assert all(s.success for s in statuses)
        assert all(s.duration_seconds >= 0 for s in statuses)


def test_a_raising_collector_loses_only_its_families_on_that_gpu(
    start, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    source = start(scenario([{"label": "a"}, {"label": "b"}]), topology=True)
    tick(source, clock)  # GPM baseline

    def broken(nvml: Any) -> list[Reading]:
        raise ZeroDivisionError("a bug in the power collector")

    power = collector_of(source, 1, "power")
    power.read = broken  # type: ignore[method-assign]
    power_families = set(power.families)
    caplog.set_level(logging.ERROR, logger="gpu_exporter.model.guard")
    for _ in range(3):
        devices = tick(source, clock)
        assert devices[0].up and devices[1].up
        assert power_families <= devices[0].families()  # the other GPU keeps its power
        assert devices[1].families() & power_families == set()
        # Every other collector's families are still there on the broken GPU.
        assert devices[1].families() == devices[0].families() - power_families
        status = {s.collector: s.success for s in source.collector_status()}
        assert status.pop("power") is False
        assert all(status.values())
    logged = [r for r in caplog.records if "collector power failed" in r.getMessage()]
    assert len(logged) == 1, "logged once per distinct error, not every tick"
    assert source.errors.snapshot() == (), "a bug is not an NVML error"


def test_a_failing_slow_refresh_costs_that_collector_until_it_succeeds(
    start, clock: ManualClock
) -> None:
    source = start(scenario([{"label": "a"}]))
    pcie = collector_of(source, 0, "pcie")
    real = pcie.refresh
    pcie.refresh = lambda nvml: 1 / 0  # type: ignore[method-assign,assignment]
    device = tick(source, clock)[0]
    assert device.up and device.value("gpu_pcie_link_width", state="current") is None
    assert device.value("gpu_clock_max_hertz", clock="sm") is not None  # clocks' refresh ran
    pcie.refresh = real  # type: ignore[method-assign]
    device = tick(source, clock)[0]  # retried on the next tick, not 30 s later
    assert device.value("gpu_pcie_link_width", state="max") == 16
    assert device.value("gpu_pcie_link_width", state="current") == 16


def test_an_undeclared_family_fails_the_collector(start, clock: ManualClock) -> None:
    source = start(scenario([{"label": "a"}]))
    memory = collector_of(source, 0, "memory")
    memory.read = lambda nvml: [Reading("gpu_power_watts", 1.0)]  # type: ignore[method-assign]
    device = tick(source, clock)[0]
    assert device.up and device.value("gpu_power_watts") != 1.0
    assert {s.collector: s.success for s in source.collector_status()}["memory"] is False


def test_choke_point_control_flow_still_takes_the_gpu_down(start, clock: ManualClock) -> None:
    source = start(scenario([{"label": "a"}, {"label": "b"}]))

    def lost(nvml: Any) -> list[Reading]:
        raise DeviceLostError("memory_info_v2")

    collector_of(source, 1, "memory").read = lost  # type: ignore[method-assign]
    devices = tick(source, clock)
    assert devices[0].up
    assert not devices[1].up and "GPU lost" in devices[1].down_reason
    assert all(s.success for s in source.collector_status())


# A reading the catalog refuses; each fails its collector on that GPU alone.
_REFUSED = [
    ("power", Reading("gpu_power_watts", None), "value None"),  # type: ignore[arg-type]
    ("power", Reading("gpu_power_watts", True), "value bool"),
    ("power", Reading("gpu_power_watts", "500"), "value str"),  # type: ignore[arg-type]
    ("power", Reading("gpu_power_watts", 1.0, (("sensor", "gpu"),)), "undeclared label"),
    ("temperature", Reading("gpu_temperature_celsius", 50.0), "missing label"),
    ("temperature", Reading("gpu_temperature_celsius", 50.0, (("sensor", 0),)), "non-str"),  # type: ignore[arg-type]
    (
        "temperature",
        Reading("gpu_temperature_celsius", 50.0, (("sensor", "gpu"), ("sensor", "hbm"))),
        "label twice",
    ),
]


@pytest.mark.parametrize(
    ("name", "bad"), [(name, bad) for name, bad, _ in _REFUSED], ids=[i for *_, i in _REFUSED]
)
def test_a_reading_the_catalog_refuses_fails_only_that_collector_on_that_gpu(
    start, clock: ManualClock, caplog: pytest.LogCaptureFixture, name: str, bad: Reading
) -> None:
    source = start(scenario([{"label": "a"}, {"label": "b"}]), topology=True)
    tick(source, clock)  # GPM baseline
    collector = collector_of(source, 1, name)
    real = collector.read
    collector.read = lambda nvml: [*real(nvml), bad]  # type: ignore[method-assign]
    families = set(collector.families)
    caplog.set_level(logging.ERROR, logger="gpu_exporter.model.guard")
    for _ in range(3):
        devices = tick(source, clock)
        assert devices[0].up and devices[1].up, "gpu_up stays 1 on both GPUs"
        assert families <= devices[0].families(), "the other GPU keeps that collector's output"
        assert devices[1].families() & families == set(), "that collector's readings dropped"
        assert devices[1].families() == devices[0].families() - families
        assert bad not in devices[1].readings
        status = {s.collector: s.success for s in source.collector_status()}
        assert status.pop(name) is False
        assert all(status.values()), status
    logged = [r for r in caplog.records if f"collector {name} failed" in r.getMessage()]
    assert len(logged) == 1, "logged once per distinct error, not every tick"
    assert source.errors.snapshot() == (), "a bug is not an NVML error"


def test_a_refused_reading_in_a_slow_refresh_fails_that_collector(
    start, clock: ManualClock
) -> None:
    source = start(scenario([{"label": "a"}]))
    pcie = collector_of(source, 0, "pcie")
    real = pcie.refresh
    pcie.refresh = lambda nvml: [  # type: ignore[method-assign]
        *real(nvml),
        Reading("gpu_pcie_link_width", 16, (("state", "max"), ("lane", "0"))),
    ]
    device = tick(source, clock)[0]
    assert device.up and device.value("gpu_pcie_link_width", state="max") is None
    assert {s.collector: s.success for s in source.collector_status()}["pcie"] is False


def test_an_offline_collector_is_checked_too(start, clock: ManualClock) -> None:
    source = start(scenario([{"label": "a"}, {"label": "b"}]), xid_events=True)
    xid = collector_of(source, 1, "xid")
    xid.read = lambda nvml: [Reading("gpu_xid_errors_total", None, (("xid", "79"),))]  # type: ignore[method-assign,arg-type]
    result = readers(source)[1].read_offline()  # what a down GPU reports
    assert result.readings == ()
    assert [(s.collector, s.success) for s in result.statuses] == [("xid", False)]


def test_the_field_batch_is_charged_to_the_collectors_in_it(
    start, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpu_exporter_collector_duration_seconds: the one nvmlDeviceGetFieldValues call is split
    over the collectors whose entries it carries (by entry count), not charged to the first
    collector that asked for it."""
    import time

    source = start(scenario([{"label": "a"}]))
    tick(source, clock)  # first tick: refreshes, GPM baseline
    reader = readers(source)[0]
    shares = {
        c.name: sum(not reader.is_unsupported(s.key) for s in c.wanted_fields())
        for c in reader.collectors
    }
    total = sum(shares.values())
    assert sum(n > 0 for n in shares.values()) > 2, shares
    real = N.nvmlDeviceGetFieldValues
    batch = 0.2

    def slow(*args: Any) -> Any:
        time.sleep(batch)
        return real(*args)

    monkeypatch.setattr(N, "nvmlDeviceGetFieldValues", slow)
    tick(source, clock)
    durations = {s.collector: s.duration_seconds for s in source.collector_status()}
    assert sum(durations.values()) >= batch
    for name, share in shares.items():
        fair = batch * share / total
        assert fair - 1e-3 <= durations[name] < fair + 0.05, (name, durations[name], fair)
