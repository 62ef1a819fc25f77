"""The health readings' collectors on the fake NVML: gpu_recovery_action (field 230), the fabric
families (nvmlDeviceGetGpuFabricInfoV) and the XID counters exported at 0 before the first
XID. State sets are checked whole: every label value, exactly one (or, for an unknown value,
none but "unknown") at 1; a quantity the driver does not give is absent, never 0."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pynvml as N
import pytest

from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.series_notation import parse_series
from gpu_exporter.alerting.store import SeriesStore
from gpu_exporter.collect.nvml.collectors.fabric import fabric_readings
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.model import nvml_facts as facts
from gpu_exporter.model.snapshot import DeviceSample
from gpu_exporter.model.xids import ALWAYS_EXPORTED, CRITICAL_XIDS, WARNING_XIDS
from gpu_exporter.sim import fake_nvml
from tests.conftest import ManualClock

H100 = {"model": "NVIDIA H100 80GB HBM3"}
ISSUES = [issue.name for issue in facts.FABRIC_HEALTH_ISSUES]


@pytest.fixture
def start(start_source: Callable[..., NvmlSource]) -> Callable[..., NvmlSource]:
    def _start(devices: list[dict[str, Any]], **extra: Any) -> NvmlSource:
        settings = extra.pop("settings", {})
        settings.setdefault("xid_events", False)  # its thread waits in real time
        spec = {"name": "health", "defaults": H100, "devices": devices, **extra}
        return start_source(spec, **settings)

    return _start


def tick(source: NvmlSource, clock: ManualClock, to: float | None = None) -> list[DeviceSample]:
    if to is None:
        clock.advance(1.0)
    else:
        clock.now = to
    return source.sample()


def state_set(device: DeviceSample, family: str) -> dict[str, float]:
    """{label value: value} of a one-label family on a GPU ({} when absent)."""
    return {r.labels[0][1]: r.value for r in device.readings if r.family == family}


def only(current: str, names: tuple[str, ...]) -> dict[str, float]:
    return {name: float(name == current) for name in names}


def reader_of(source: NvmlSource, index: int) -> Any:
    return next(d.reader for d in source._devices.values() if d.reader.index == index)


# -- gpu_recovery_action --------------------------------------------------------------------


def test_recovery_action_is_a_state_set_over_every_action(start, clock: ManualClock) -> None:
    steps = [[0, "none"], [2, "node_reboot"], [4, "drain_and_reset"], [6, 8], [8, 4294967295]]
    source = start([{"values": {"recovery_action": {"steps": steps}}}])
    expected = ["none", "node_reboot", "drain_and_reset", "unknown", "unknown"]
    for t, action in zip((1, 3, 5, 7, 9), expected, strict=True):
        (device,) = tick(source, clock, to=t)
        assert state_set(device, "gpu_recovery_action") == only(action, facts.RECOVERY_ACTIONS)
    assert list(state_set(device, "gpu_recovery_action")) == list(facts.RECOVERY_ACTIONS)


@pytest.mark.parametrize(
    ("device", "driver"),
    [
        ({"model": "Tesla V100", "architecture": "volta"}, {}),  # per-field NOT_SUPPORTED
        ({"unsupported": ["recovery_action"]}, {}),
        ({}, {"unsupported_fields": [230]}),  # an older driver: INVALID_ARGUMENT
    ],
)
def test_recovery_action_is_absent_where_unsupported_and_learned_once(
    start, clock: ManualClock, device: dict[str, Any], driver: dict[str, Any]
) -> None:
    source = start([device], driver=driver)
    for _ in range(3):
        (sample,) = tick(source, clock)
        assert sample.up and state_set(sample, "gpu_recovery_action") == {}
    assert reader_of(source, 0).is_unsupported("field_230")  # not asked again
    assert [e for e in source.errors.snapshot() if e.field == "field_230"] == []


def test_a_field_answered_function_not_found_is_learned_too(
    start, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = (N.NVML_ERROR_FUNCTION_NOT_FOUND, 0, 0)
    monkeypatch.setitem(fake_nvml._FIELDS, 230, ("recovery_action", lambda *_: missing))
    source = start([{}])
    (device,) = tick(source, clock)
    assert device.up and state_set(device, "gpu_recovery_action") == {}
    assert reader_of(source, 0).is_unsupported("field_230")
    assert device.value("gpu_ecc_errors_total", error="uncorrected") == 0  # the batch goes on
    tick(source, clock)
    assert [e for e in source.errors.snapshot() if e.field == "field_230"] == []


# -- fabric ---------------------------------------------------------------------------------


def test_fabric_state_summary_and_issues(start, clock: ManualClock) -> None:
    fabric = {
        "route_recovery": "not_supported",
        "changes": [
            {"from": 4, "until": 8, "degraded_bandwidth": True, "summary": "limited_capacity"},
            {"from": 6, "until": 8, "incorrect_configuration": "incorrect_sysguid"},
        ],
    }
    source = start([{"fabric": fabric}])
    (device,) = tick(source, clock, to=1)
    reported = [name for name in ISSUES if name != "route_recovery"]  # not supported: absent
    assert state_set(device, "gpu_fabric_state") == only("completed", facts.FABRIC_STATES)
    summaries = facts.FABRIC_HEALTH_SUMMARIES[1:]
    assert state_set(device, "gpu_fabric_health_summary") == only("healthy", summaries)
    assert state_set(device, "gpu_fabric_health_issue") == dict.fromkeys(reported, 0.0)
    (device,) = tick(source, clock, to=5)
    assert state_set(device, "gpu_fabric_health_summary") == only("limited_capacity", summaries)
    issues = state_set(device, "gpu_fabric_health_issue")
    assert issues == {**dict.fromkeys(reported, 0.0), "degraded_bandwidth": 1.0}
    (device,) = tick(source, clock, to=7)
    assert state_set(device, "gpu_fabric_health_issue")["incorrect_configuration"] == 1.0
    (device,) = tick(source, clock, to=9)
    assert set(state_set(device, "gpu_fabric_health_issue").values()) == {0.0}
    assert state_set(device, "gpu_fabric_health_summary") == only("healthy", summaries)


def test_no_fabric_means_no_fabric_series_and_nothing_counted(start, clock: ManualClock) -> None:
    source = start([{}, {"fabric": {}}])
    for _ in range(2):
        without, with_fabric = tick(source, clock)
        for family in ("gpu_fabric_state", "gpu_fabric_health_summary", "gpu_fabric_health_issue"):
            assert state_set(without, family) == {}, family
            assert state_set(with_fabric, family) != {}, family
    assert reader_of(source, 0).is_unsupported("fabric_info_v3")
    assert reader_of(source, 0).is_unsupported("fabric_info_v2")
    assert not reader_of(source, 1).is_unsupported("fabric_info_v3")
    assert [e for e in source.errors.snapshot() if e.field.startswith("fabric")] == []
    calls = source.fake.call_counts["nvmlDeviceGetGpuFabricInfoV"]  # type: ignore[attr-defined]
    tick(source, clock)
    assert source.fake.call_counts["nvmlDeviceGetGpuFabricInfoV"] == calls + 1  # type: ignore[attr-defined]


def test_a_v2_only_driver_gives_state_and_issues_but_no_summary(start, clock: ManualClock) -> None:
    source = start([{"fabric": {"route_unhealthy": True}}], driver={"fabric_info_versions": [2]})
    for _ in range(2):
        (device,) = tick(source, clock)
        assert state_set(device, "gpu_fabric_state") == only("completed", facts.FABRIC_STATES)
        assert state_set(device, "gpu_fabric_health_issue")["route_unhealthy"] == 1.0
        assert state_set(device, "gpu_fabric_health_summary") == {}
    reader = reader_of(source, 0)
    assert reader.is_unsupported("fabric_info_v3") and not reader.is_unsupported("fabric_info_v2")
    mismatches = [e for e in source.errors.snapshot() if e.field == "fabric_info_v3"]
    assert [(e.error, e.count) for e in mismatches] == [("ArgumentVersionMismatch", 1)]


def test_a_failed_fabric_probe_is_counted_while_completed(start, clock: ManualClock) -> None:
    fabric = {"status": "timeout", "changes": [{"from": 3, "state": "in_progress"}]}
    source = start([{"fabric": fabric}])
    tick(source, clock, to=1)
    tick(source, clock, to=2)
    counted = [(e.source, e.error, e.count) for e in source.errors.snapshot()
               if e.field == "fabric_status"]  # fmt: skip
    assert counted == [("nvml", "Timeout", 2)]
    (device,) = tick(source, clock, to=4)  # not completed: the status means nothing
    assert state_set(device, "gpu_fabric_state") == only("in_progress", facts.FABRIC_STATES)
    assert [e.count for e in source.errors.snapshot() if e.field == "fabric_status"] == [2]


def test_the_fabric_setting_turns_the_collector_off(start, clock: ManualClock) -> None:
    source = start([{"fabric": {}}], settings={"fabric": False})
    (device,) = tick(source, clock)
    assert state_set(device, "gpu_fabric_state") == {}
    assert source.fake.call_counts["nvmlDeviceGetGpuFabricInfoV"] == 0  # type: ignore[attr-defined]


def test_values_past_the_known_ones_set_no_state() -> None:
    info = SimpleNamespace(state=7, status=0, healthMask=0x3 | 0x9 << 8, healthSummary=9)
    readings = {(r.family, r.labels[0][1]): r.value for r in fabric_readings(info)}
    assert {k: v for k, v in readings.items() if k[0] == "gpu_fabric_state"} == {
        ("gpu_fabric_state", state): 0.0 for state in facts.FABRIC_STATES
    }
    summaries = {k[1]: v for k, v in readings.items() if k[0] == "gpu_fabric_health_summary"}
    assert summaries == dict.fromkeys(facts.FABRIC_HEALTH_SUMMARIES[1:], 0.0)
    # 3 is no yes/no value (1 yes, 2 no): not an issue; 9 is an incorrect configuration.
    issues = {k[1]: v for k, v in readings.items() if k[0] == "gpu_fabric_health_issue"}
    assert issues == {"degraded_bandwidth": 0.0, "incorrect_configuration": 1.0}


# -- XID counters at 0 ----------------------------------------------------------------------


def xid_series(device: DeviceSample) -> tuple[dict[str, float], dict[str, float]]:
    counts = state_set(device, "gpu_xid_errors_total")
    return counts, state_set(device, "gpu_xid_last_timestamp_seconds")


def wait_for_count(source: NvmlSource, gpu: int, xid: str) -> list[DeviceSample]:
    """Samples until the event thread (real time) has counted `xid` on `gpu`."""
    deadline = time.monotonic() + 5
    while True:
        devices = source.sample()
        if state_set(devices[gpu], "gpu_xid_errors_total").get(xid) or time.monotonic() > deadline:
            return devices
        time.sleep(0.05)


def test_alerted_xids_are_exported_at_zero_before_the_first(start, clock: ManualClock) -> None:
    assert set(ALWAYS_EXPORTED) == CRITICAL_XIDS | WARNING_XIDS
    consumer = {"model": "NVIDIA GeForce RTX 4090", "architecture": "ada"}
    source = start(
        [{}, {**consumer, "unsupported": ["events"]}],
        faults=[
            {"at": 2, "device": 0, "kind": "xid", "xid": 79},
            {"at": 2, "device": 0, "kind": "xid", "xid": 13},  # not alerted
        ],
        settings={"xid_events": True},
    )
    store = SeriesStore(retention_seconds=math.inf)

    def keep(devices: list[DeviceSample], t: float) -> None:
        for r in devices[0].readings:
            if r.family == "gpu_xid_errors_total":
                store.append(parse_series(f'{r.family}{{xid="{r.labels[0][1]}"}}'), t, r.value)

    first, no_events = tick(source, clock, to=1)
    counts, last = xid_series(first)
    assert counts == {str(xid): 0 for xid in ALWAYS_EXPORTED} and last == {}
    assert xid_series(no_events) == ({}, {})  # XIDs cannot be seen there: no claim of 0
    keep([first], 1000.0)
    clock.now = 2.5
    seen, _ = wait_for_count(source, 0, "79")
    counts, last = xid_series(seen)
    assert counts == {**{str(xid): 0 for xid in ALWAYS_EXPORTED}, "79": 1, "13": 1}
    assert set(last) == {"79", "13"} and last["79"] > 1e9
    keep([seen], 1060.0)
    # The first XID is visible to increase(): the series existed at 0 before it. A series
    # born at 1 (XID 13's, not alerted) has a single sample: increase() gives nothing.
    increase = promql.parse('increase(gpu_xid_errors_total{xid=~"79|13"}[5m])')
    result = {dict(e.labels)["xid"]: e.value for e in promql.evaluate(increase, store, 1060.0)}
    assert set(result) == {"79"} and result["79"] > 0
