"""The DCGM source: the production ctypes binding through the simulator's fake libdcgm.

Every test drives `NvmlSource` with its DCGM supplement on a manual clock, over a small A100
node (no GPM) whose host engine the scenario describes, and reads what a tick gives: values
present, absent while DCGM cannot give them, back when it can, errors counted where they are
errors, and the NVML values untouched throughout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_exporter import sim
from gpu_exporter.collect import dcgm, dcgm_api
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.settings import DcgmConfig, NvmlConfig
from gpu_exporter.collect.source import ErrorLog, SourceUnavailableError
from gpu_exporter.model.activity import AWAITED_FAMILY
from gpu_exporter.model.snapshot import DeviceSample
from gpu_exporter.sim.clock import ManualClock

INTERVAL = 1.0
SM = {"training": 0.9, "launch": 0.12}


def scenario(dcgm_section: dict[str, Any] | None = None, faults: list | None = None) -> dict:
    spec: dict[str, Any] = {
        "name": "dcgm-test",
        "defaults": {"model": "NVIDIA A100-SXM4-80GB", "architecture": "ampere"},
        "devices": [
            {
                "label": "training",
                "values": {
                    "utilization": 0.97,
                    "sm_active": SM["training"],
                    "sm_occupancy": 0.5,
                    "tensor_active": 0.4,
                    "dram_active": 0.3,
                },
            },
            {
                "label": "launch",
                "values": {
                    "utilization": 0.97,
                    "sm_active": SM["launch"],
                    "sm_occupancy": 0.05,
                    "tensor_active": 0.01,
                    "dram_active": 0.04,
                },
            },
        ],
        "faults": faults or [],
    }
    if dcgm_section is not None:
        spec["dcgm"] = dcgm_section
    return spec


def node_factory() -> Iterator[Callable[..., tuple[NvmlSource, ManualClock]]]:
    """The `node` fixture (other modules make it theirs with pytest.fixture):
    node(spec, mode="auto", **settings) -> a started NVML source with its DCGM supplement
    (None for `off` or no libdcgm), on a manual clock; closed and uninstalled afterwards."""
    made: list[NvmlSource] = []

    def start(spec: dict, mode: str = "auto", **settings: Any) -> tuple[NvmlSource, ManualClock]:
        clock = ManualClock()
        sim.install(spec, clock=clock)
        errors = ErrorLog()
        # Back-off, staleness and abandonment on scenario time.
        supplement = dcgm.configured(DcgmConfig(mode=mode, **settings), errors, INTERVAL, clock)
        source = NvmlSource(
            settings=NvmlConfig(device_deadline_seconds=0.8),
            errors=errors,
            clock=clock,
            dcgm=supplement,
        )
        source.start()
        made.append(source)
        return source, clock

    try:
        yield start
    finally:
        for source in made:
            source.close()
        sim.uninstall()


node = pytest.fixture(node_factory, name="node")


def tick(source: NvmlSource, clock: ManualClock, seconds: float = INTERVAL) -> list[DeviceSample]:
    clock.advance(seconds)
    return source.sample()


def ticks(source: NvmlSource, clock: ManualClock, n: int) -> list[DeviceSample]:
    samples: list[DeviceSample] = []
    for _ in range(n):
        samples = tick(source, clock)
    return samples


def sm(samples: list[DeviceSample]) -> list[float | None]:
    return [s.value("gpu_sm_active_ratio") for s in samples]


def utilization(samples: list[DeviceSample]) -> list[float | None]:
    return [s.value("gpu_utilization_ratio") for s in samples]


def errors_of(source: NvmlSource, error: str | None = None) -> int:
    return sum(
        e.count for e in source.errors.snapshot() if e.source == "dcgm" and error in (None, e.error)
    )


def dcgm_series(source: NvmlSource) -> dict[str, float]:
    assert source.dcgm is not None
    return {s.name: s.value for s in source.dcgm.producer().produce()}


# --- values where DCGM has them ----------------------------------------------------------------


def test_activity_of_gpus_without_gpm_comes_from_dcgm(node: Any) -> None:
    source, clock = node(scenario({"host_engine": "running"}))
    samples = ticks(source, clock, 3)  # tick 1 learns "no GPM"; the watch's first cycle follows
    assert sm(samples) == pytest.approx([SM["training"], SM["launch"]])
    for sample in samples:
        assert sample.value("gpu_activity_source_info", source="dcgm") == 1.0
        assert sample.value("gpu_tensor_active_ratio") is not None
        assert sample.value("gpu_dram_active_ratio") is not None
        assert sample.value("gpu_graphics_engine_active_ratio") is not None
    assert dcgm_series(source) == {"gpu_exporter_dcgm_up": 1.0, "gpu_exporter_dcgm_blank_values": 0}
    assert errors_of(source) == 0
    assert ("dcgm", True) in {(s.collector, s.success) for s in source.collector_status()}


def test_hopper_gpus_keep_gpm_and_dcgm_is_not_asked(node: Any) -> None:
    spec = scenario({"host_engine": "running"})
    spec["defaults"] = {"model": "NVIDIA H100 80GB HBM3"}
    source, clock = node(spec)
    samples = ticks(source, clock, 3)
    assert sm(samples) == pytest.approx([SM["training"], SM["launch"]], abs=0.05)
    for sample in samples:
        assert sample.value("gpu_activity_source_info", source="gpm") == 1.0
        assert sample.value("gpu_activity_source_info", source="dcgm") is None
    assert source.dcgm is not None and source.dcgm._connection.session is None


def test_off_and_no_library_are_exactly_without_dcgm(node: Any) -> None:
    """mode off, and auto on a node without libdcgm: no supplement at all, and tick by tick the
    very readings of a source built without any DCGM."""
    runs = []
    for spec, mode in ((scenario({"host_engine": "running"}), "off"), (scenario(None), "auto")):
        source, clock = node(spec, mode=mode)
        assert source.dcgm is None
        assert "dcgm" not in source.collector_names()
        runs.append([tuple(s.readings for s in tick(source, clock)) for _ in range(4)])
        source.close()
        sim.uninstall()
    sim.install(scenario(None), clock=(plain_clock := ManualClock()))
    plain = NvmlSource(settings=NvmlConfig(device_deadline_seconds=0.8), clock=plain_clock)
    plain.start()
    try:
        baseline = [tuple(s.readings for s in tick(plain, plain_clock)) for _ in range(4)]
    finally:
        plain.close()
    assert runs[0] == baseline
    assert runs[1] == baseline


@pytest.mark.parametrize("mode", ["standalone", "embedded"])
def test_an_explicit_mode_without_libdcgm_is_refused_naming_it(mode: str) -> None:
    sim.install(scenario(None))
    try:
        with pytest.raises(SourceUnavailableError, match=f"dcgm.mode is {mode}.*libdcgm.so.4"):
            dcgm.configured(DcgmConfig(mode=mode), ErrorLog(), INTERVAL)
    finally:
        sim.uninstall()


def test_embedded_mode_reads_without_a_host_engine(node: Any) -> None:
    source, clock = node(scenario({"host_engine": "absent"}), mode="embedded")
    assert sm(ticks(source, clock, 3)) == pytest.approx([SM["training"], SM["launch"]])


# --- host engine down, restarted, refusing ------------------------------------------------------


def test_host_engine_restart_mid_run_absent_then_back_and_nvml_unaffected(node: Any) -> None:
    spec = scenario(
        {"host_engine": "running"}, faults=[{"kind": "dcgm_down", "at": 5, "until": 12}]
    )
    source, clock = node(spec)
    assert sm(ticks(source, clock, 4)) == pytest.approx([SM["training"], SM["launch"]])  # t=4
    down = ticks(source, clock, 3)  # t=7: host engine stopped at 5
    assert sm(down) == [None, None]
    assert utilization(down) == pytest.approx([0.97, 0.97])  # NVML sampled as ever
    assert all(s.up for s in down)
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 0.0
    assert errors_of(source, "ConnectionNotValid") == 1  # the read that found it gone
    assert all(s.value("gpu_activity_source_info", source="dcgm") is None for s in down)
    # DCGM refusing is counted, not a failed collector (that is for the exporter's own bugs).
    assert ("dcgm", True) in {(s.collector, s.success) for s in source.collector_status()}
    back: list[DeviceSample] = []
    for _ in range(40):  # restarted at 12: reconnect within the back-off, rewatch, first cycle
        back = tick(source, clock)
        if all(v is not None for v in sm(back)):
            break
    assert sm(back) == pytest.approx([SM["training"], SM["launch"]])
    assert clock.now <= 12 + DcgmConfig.reconnect_max_backoff_seconds + 3
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 1.0


def test_host_engine_down_at_start_then_up(node: Any) -> None:
    spec = scenario({"host_engine": "running"}, faults=[{"kind": "dcgm_down", "at": 0, "until": 6}])
    source, clock = node(spec)
    assert sm(ticks(source, clock, 4)) == [None, None]
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 0.0
    assert errors_of(source) == 0  # auto: no host engine answering is no error
    values: list[float | None] = []
    for _ in range(30):
        values = sm(tick(source, clock))
        if None not in values:
            break
    assert values == pytest.approx([SM["training"], SM["launch"]])


def test_back_off_doubles_between_failed_connects(node: Any) -> None:
    source, clock = node(scenario({"host_engine": "absent"}), mode="standalone")
    ticks(source, clock, 40)  # 40 s without a host engine
    # Tick 1 learns which GPUs lack GPM; then attempts at 2 s, 4 (+2), 8 (+4), 16 (+8), 32 (+16).
    assert errors_of(source, "ConnectionNotValid") == 5
    assert errors_of(source) == 5


def test_a_session_that_fails_on_its_first_read_backs_off_too(node: Any) -> None:
    spec = scenario(
        {"host_engine": "running", "missing_functions": ["dcgmEntitiesGetLatestValues"]}
    )
    source, clock = node(spec, mode="standalone")
    ticks(source, clock, 40)
    fake = sim.installed_dcgm()
    assert fake is not None
    # Each connect reads the UUIDs with dcgmEntitiesGetLatestValues, which this library lacks:
    # five attempts in 40 s, as without a host engine, not one per tick.
    assert fake.call_counts["dcgmConnect_v2"] == 5


@pytest.mark.parametrize(
    ("section", "mode", "error", "hint"),
    [
        ({"profiling_module": "missing"}, "auto", "ModuleNotLoaded", "no profiling module"),
        ({"embedded": "requires_root"}, "embedded", "RequiresRoot", "CAP_SYS_ADMIN"),
    ],
)
def test_a_refusing_host_engine_leaves_activity_absent_and_says_why(
    node: Any,
    caplog: pytest.LogCaptureFixture,
    section: dict[str, str],
    mode: str,
    error: str,
    hint: str,
) -> None:
    caplog.set_level(logging.INFO, logger="gpu_exporter.collect.dcgm")
    source, clock = node(scenario({"host_engine": "running", **section}), mode=mode)
    samples = ticks(source, clock, 5)
    assert sm(samples) == [None, None]
    assert utilization(samples) == pytest.approx([0.97, 0.97])
    assert errors_of(source, error) >= 1
    said = [r.getMessage() for r in caplog.records if hint in r.getMessage()]
    assert len(said) == 1, caplog.text  # said once, not every retry


def test_wrong_address_is_not_reached(node: Any) -> None:
    spec = scenario({"host_engine": "running", "address": "10.0.0.7:5555"})
    source, clock = node(spec, address="localhost:5555")
    assert sm(ticks(source, clock, 4)) == [None, None]
    right, right_clock = node(spec, address="10.0.0.7:5555")
    assert sm(ticks(right, right_clock, 3)) == pytest.approx([SM["training"], SM["launch"]])


# --- blank, not supported, paused ---------------------------------------------------------------


def test_a_field_that_stays_blank_is_absent_and_not_an_error(node: Any) -> None:
    fault = {"kind": "dcgm_blank", "device": 1, "field": 1002, "at": 0}
    source, clock = node(scenario({"host_engine": "running"}, faults=[fault]))
    samples = ticks(source, clock, 4)
    assert sm(samples) == [pytest.approx(SM["training"]), None]
    assert samples[1].value("gpu_tensor_active_ratio") is not None  # only that field is blank
    assert dcgm_series(source)["gpu_exporter_dcgm_blank_values"] == 1.0
    assert errors_of(source) == 0


def test_profiling_paused_is_reported_as_blank_not_as_errors(node: Any) -> None:
    fault = {"kind": "dcgm_paused", "at": 4, "until": 8}
    source, clock = node(scenario({"host_engine": "running"}, faults=[fault]))
    ticks(source, clock, 3)
    paused = ticks(source, clock, 2)  # t=5
    assert sm(paused) == [None, None]
    assert dcgm_series(source)["gpu_exporter_dcgm_blank_values"] == 2 * len(DcgmConfig().fields)
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 1.0
    assert errors_of(source) == 0
    assert sm(ticks(source, clock, 4)) == pytest.approx([SM["training"], SM["launch"]])


def test_fields_a_gpu_lacks_are_absent_and_not_errors(node: Any) -> None:
    spec = scenario({"host_engine": "running"})
    spec["defaults"] = {"model": "Tesla P100-SXM2-16GB", "architecture": "pascal"}
    source, clock = node(spec)
    assert sm(ticks(source, clock, 4)) == [None, None]
    assert errors_of(source) == 0


def test_configured_fields_are_the_ones_watched(node: Any) -> None:
    source, clock = node(scenario({"host_engine": "running"}), fields=(1002,))
    samples = ticks(source, clock, 3)
    assert sm(samples) == pytest.approx([SM["training"], SM["launch"]])
    assert [s.value("gpu_tensor_active_ratio") for s in samples] == [None, None]


# --- versions, missing symbols, hangs -----------------------------------------------------------


def test_a_library_that_only_takes_version1_connect_params_still_connects(node: Any) -> None:
    spec = scenario({"host_engine": "running", "connect_params_versions": [1]})
    source, clock = node(spec)
    assert sm(ticks(source, clock, 3)) == pytest.approx([SM["training"], SM["launch"]])


def test_a_library_refusing_every_connect_params_version_counts_a_version_mismatch(
    node: Any,
) -> None:
    spec = scenario({"host_engine": "running", "connect_params_versions": [3]})
    source, clock = node(spec)
    assert sm(ticks(source, clock, 3)) == [None, None]
    assert errors_of(source, "VersionMismatch") >= 1


def test_values_written_in_another_layout_are_refused() -> None:
    raw = dcgm_api.FieldValueV2()
    raw.version = dcgm_api.make_version(dcgm_api.FieldValueV2, 1)  # a v1 library's value
    raw.fieldType, raw.value.dbl = dcgm_api.FT_DOUBLE, 0.5
    assert dcgm_api.decode(raw).value is None
    assert dcgm_api.decode(raw).problem == "VersionMismatch"
    raw.version = dcgm_api.FIELD_VALUE_VERSION2
    assert dcgm_api.decode(raw).value == 0.5


@pytest.mark.parametrize(
    ("offset", "problem"),
    [(0, "Blank"), (1, "NotFound"), (2, "NotSupported"), (3, "NotPermissioned")],
)
def test_blank_sentinels_decode_to_no_value(offset: int, problem: str) -> None:
    raw = dcgm_api.FieldValueV2(version=dcgm_api.FIELD_VALUE_VERSION2)
    raw.fieldType, raw.value.dbl = dcgm_api.FT_DOUBLE, dcgm_api.FP64_BLANK + offset
    assert (dcgm_api.decode(raw).value, dcgm_api.decode(raw).problem) == (None, problem)
    raw.fieldType, raw.value.i64 = dcgm_api.FT_INT64, dcgm_api.INT64_BLANK + offset
    assert (dcgm_api.decode(raw).value, dcgm_api.decode(raw).problem) == (None, problem)


def test_struct_sizes_are_the_headers() -> None:
    # dcgm_structs.h: 6 four-byte fields, an 8-byte timestamp, the 4096-byte blob union.
    assert dcgm_api.ctypes.sizeof(dcgm_api.FieldValueV2) == 4 * 6 + 8 + 4096
    assert dcgm_api.CONNECT_V2_PARAMS_VERSION2 == 16 | 2 << 24
    assert dcgm_api.ctypes.sizeof(dcgm_api.GroupEntityPair) == 8


def test_a_library_without_a_symbol_counts_and_keeps_running(node: Any) -> None:
    spec = scenario(
        {"host_engine": "running", "missing_functions": ["dcgmEntitiesGetLatestValues"]}
    )
    source, clock = node(spec)
    samples = ticks(source, clock, 4)
    assert sm(samples) == [None, None]
    assert utilization(samples) == pytest.approx([0.97, 0.97])
    assert errors_of(source) >= 1


def test_a_hung_host_engine_costs_the_tick_only_its_values(node: Any) -> None:
    hang = {"kind": "dcgm_hang", "function": "dcgmEntitiesGetLatestValues", "at": 4, "duration": 3}
    source, clock = node(scenario({"host_engine": "running"}, faults=[hang]))
    ticks(source, clock, 3)
    started = time.monotonic()
    hung = tick(source, clock, 1.5)  # t=4.5: the read sleeps 3 s in the library
    took = time.monotonic() - started
    assert sm(hung) == [None, None]
    assert utilization(hung) == pytest.approx([0.97, 0.97])
    assert took < 2.5  # the deadline (0.8 s), not the hang (3 s)
    assert errors_of(source, "Timeout") == 1
    still = tick(source, clock)  # the read is still in the library: no second one started
    assert sm(still) == [None, None]
    assert errors_of(source, "Timeout") == 1
    time.sleep(3.2)  # the read comes back; past the hang's window (4 s to 7 s) the next works
    tick(source, clock, 2.0)
    assert sm(tick(source, clock)) == pytest.approx([SM["training"], SM["launch"]])


def test_a_node_whose_gpus_all_have_gpm_has_no_dcgm_up_series(node: Any) -> None:
    """Nothing needs DCGM there, so nothing is down: a cluster-wide `standalone` setting must
    not raise GpuExporterDcgmUnavailable on every Hopper node."""
    spec = scenario({"host_engine": "absent"})
    spec["defaults"] = {"model": "NVIDIA H100 80GB HBM3"}
    source, clock = node(spec, mode="standalone")
    ticks(source, clock, 5)
    assert dcgm_series(source) == {}
    assert errors_of(source) == 0


def test_a_read_hung_for_ten_intervals_is_abandoned_for_a_new_session(node: Any) -> None:
    hang = {"kind": "dcgm_hang", "function": "dcgmEntitiesGetLatestValues", "at": 4, "duration": 2}
    source, clock = node(scenario({"host_engine": "running"}, faults=[hang]))
    ticks(source, clock, 3)
    tick(source, clock, 1.5)  # t=4.5: the read sleeps 2 s (real) in the library
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 0.0  # late: not up
    tick(source, clock, 11)  # 11 s of scenario time later it is still there: abandoned
    assert errors_of(source, "Hung") == 1
    back = [sm(tick(source, clock)) for _ in range(3)]  # a new session, its first cycle
    assert back[-1] == pytest.approx([SM["training"], SM["launch"]])
    time.sleep(2.2)  # the abandoned read returns now: it must not touch the new session's state
    assert sm(tick(source, clock)) == pytest.approx([SM["training"], SM["launch"]])
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 1.0
    fake = sim.installed_dcgm()
    assert fake is not None and fake.call_counts["dcgmDisconnect"] == 1  # the old one, after


def test_an_embedded_engine_that_hangs_is_given_up_not_started_twice(
    node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    hang = {"kind": "dcgm_hang", "function": "dcgmEntitiesGetLatestValues", "at": 4, "duration": 1}
    source, clock = node(scenario({"host_engine": "absent"}, faults=[hang]), mode="embedded")
    ticks(source, clock, 3)
    tick(source, clock, 1.5)
    tick(source, clock, 11)
    time.sleep(1.2)
    assert sm(ticks(source, clock, 3)) == [None, None]
    assert "restart the exporter" in caplog.text
    # The hung read has returned (with values): it must not make DCGM look up again.
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 0.0
    fake = sim.installed_dcgm()
    assert fake is not None and fake.call_counts["dcgmStartEmbedded"] == 1


def test_embedded_failures_keep_the_one_engine(node: Any) -> None:
    source, clock = node(scenario({"embedded": "requires_root"}), mode="embedded")
    ticks(source, clock, 40)
    fake = sim.installed_dcgm()
    assert fake is not None and fake.call_counts["dcgmStartEmbedded"] == 1
    assert errors_of(source, "RequiresRoot") == 5  # backing off, as connects do
    assert errors_of(source) == 5  # never a handle-less session (BadParam)


def test_close_while_a_read_hangs_returns_and_twice_is_fine(node: Any) -> None:
    hang = {"kind": "dcgm_hang", "function": "dcgmEntitiesGetLatestValues", "at": 4, "duration": 3}
    source, clock = node(scenario({"host_engine": "running"}, faults=[hang]))
    ticks(source, clock, 3)
    tick(source, clock, 1.5)
    started = time.monotonic()
    source.close()
    source.close()
    assert time.monotonic() - started < 2.5  # not the 3 s hang
    fake = sim.installed_dcgm()
    assert fake is not None and fake.call_counts["dcgmShutdown"] == 0  # not under that call


def test_close_leaves_libdcgm_alone_while_an_abandoned_teardown_is_inside_it(node: Any) -> None:
    """The abandoned session's disconnect runs when its hung read returns; if that teardown
    hangs in turn, dcgmShutdown must still wait (it would free what the call uses)."""
    read_hang = {
        "kind": "dcgm_hang",
        "function": "dcgmEntitiesGetLatestValues",
        "at": 4,
        "duration": 1,
    }
    unwatch_hang = {"kind": "dcgm_hang", "function": "dcgmUnwatchFields", "at": 15, "duration": 3}
    source, clock = node(scenario({"host_engine": "running"}, faults=[read_hang, unwatch_hang]))
    ticks(source, clock, 3)
    tick(source, clock, 1.5)  # t=4.5: the read hangs for 1 s
    tick(source, clock, 11)  # t=15.5: abandoned; its teardown will hang in dcgmUnwatchFields
    time.sleep(1.3)  # the read is back, the teardown is now inside libdcgm
    fake = sim.installed_dcgm()
    assert fake is not None and fake.call_counts["dcgmUnwatchFields"] == 1
    source.close()
    assert fake.call_counts["dcgmShutdown"] == 0
    time.sleep(3.2)  # let the teardown finish before the fake goes


def test_an_unexpected_exception_backs_off_like_a_failure(
    node: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> int:
        raise ValueError("not what the headers say")

    monkeypatch.setattr(dcgm_api.Library, "field_group_create", broken)
    source, clock = node(scenario({"host_engine": "running"}), mode="standalone")
    ticks(source, clock, 40)
    fake = sim.installed_dcgm()
    assert fake is not None and fake.call_counts["dcgmConnect_v2"] == 5  # backing off
    assert fake.call_counts["dcgmDisconnect"] == 5  # each half-made session undone
    assert errors_of(source, "exception") == 5
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 0.0
    logged = [r for r in caplog.records if "not what the headers say" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info  # once, with its traceback


def test_a_value_whose_timestamp_stops_moving_goes_stale(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = dcgm_api.Library.latest_values

    def frozen(self: Any, *args: Any, live: bool = False) -> list[dcgm_api.FieldValue]:
        values = real(self, *args, live=live)
        if live:
            return values
        return [
            dcgm_api.FieldValue(v.entity_id, v.field_id, v.value, v.problem, 42)
            if v.field_id == 1002
            else v
            for v in values
        ]

    monkeypatch.setattr(dcgm_api.Library, "latest_values", frozen)
    source, clock = node(scenario({"host_engine": "running"}))
    assert sm(ticks(source, clock, 4)) == pytest.approx([SM["training"], SM["launch"]])
    later = ticks(source, clock, dcgm.STALE_AFTER_INTERVALS + 1)
    assert sm(later) == [None, None]  # the host engine stopped updating it: not a current value
    assert later[0].value("gpu_tensor_active_ratio") is not None  # the others still move
    assert errors_of(source, "StaleData") >= 2


def test_gpus_dcgm_does_not_know_leave_it_not_up(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = dcgm_api.Library.latest_values

    def other_uuids(self: Any, *args: Any, live: bool = False) -> list[dcgm_api.FieldValue]:
        values = real(self, *args, live=live)
        if not live:
            return values
        return [
            dcgm_api.FieldValue(v.entity_id, v.field_id, f"GPU-other-{v.entity_id}") for v in values
        ]

    monkeypatch.setattr(dcgm_api.Library, "latest_values", other_uuids)
    source, clock = node(scenario({"host_engine": "running"}), mode="standalone")
    assert sm(ticks(source, clock, 5)) == [None, None]
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 0.0
    assert errors_of(source, "UnknownGpu") == 1  # said at connect, not every tick
    fake = sim.installed_dcgm()
    assert fake is not None and fake.call_counts["dcgmConnect_v2"] == 1


def test_non_finite_values_are_dropped_not_crashing() -> None:
    raw = dcgm_api.FieldValueV2(version=dcgm_api.FIELD_VALUE_VERSION2)
    raw.fieldType, raw.value.dbl = dcgm_api.FT_DOUBLE, float("inf")
    assert (dcgm_api.decode(raw).value, dcgm_api.decode(raw).problem) == (None, "Blank")


def test_an_abandoned_read_that_returns_changes_nothing(node: Any) -> None:
    hang = {"kind": "dcgm_hang", "function": "dcgmEntitiesGetLatestValues", "at": 4, "duration": 2}
    source, clock = node(scenario({"host_engine": "running"}, faults=[hang]))
    ticks(source, clock, 3)
    tick(source, clock, 1.5)  # the read hangs for 2 s
    tick(source, clock, 11)  # abandoned: no session now, so DCGM is not up
    before = source.errors.snapshot()
    time.sleep(2.3)  # the abandoned read returns with good values
    assert dcgm_series(source)["gpu_exporter_dcgm_up"] == 0.0  # still not up: not ours
    assert source.errors.snapshot() == before


# --- activity not sampled yet ------------------------------------------------------------------


def awaited(samples: list[DeviceSample]) -> list[float | None]:
    return [s.value(AWAITED_FAMILY) for s in samples]


def test_activity_is_awaited_until_dcgms_first_update_cycle(node: Any) -> None:
    """Tick 1 learns "no GPM" (DCGM is asked from tick 2), tick 2's watch has not had its first
    update cycle (NoData): both say the activity is awaited, which the rules read as "not
    sampled yet"; from tick 3 on DCGM's values are there and nothing is awaited."""
    source, clock = node(scenario({"host_engine": "running"}))
    for samples in (tick(source, clock), tick(source, clock)):
        assert sm(samples) == [None, None]
        assert awaited(samples) == [1.0, 1.0]
        assert all(s.value("gpu_activity_source_info", source="dcgm") is None for s in samples)
    samples = tick(source, clock)
    assert sm(samples) == pytest.approx([SM["training"], SM["launch"]])
    assert awaited(samples) == [None, None]
    assert errors_of(source) == 0


def test_activity_is_not_awaited_from_a_host_engine_that_is_not_there(node: Any) -> None:
    """Awaited is "not sampled yet", never "unavailable": once the connect has failed, the
    activity is simply absent (and GpuActivityMetricsUnavailable may judge it)."""
    source, clock = node(scenario({"host_engine": "absent"}))
    assert awaited(tick(source, clock)) == [1.0, 1.0]  # DCGM not asked yet
    for samples in ticks_each(source, clock, 4):
        assert sm(samples) == [None, None]
        assert awaited(samples) == [None, None]


def ticks_each(source: NvmlSource, clock: ManualClock, n: int) -> list[list[DeviceSample]]:
    return [tick(source, clock) for _ in range(n)]
