"""The native families beyond the basics: encoder/decoder utilization, tensor pipes (GPM),
violation time per performance policy, aggregate ECC and NVLink error counts, and the power
management limit with its range and default.

The production NVML source runs on the fake NVML with a manual clock; each value is checked
against what the scenario set, after the unit conversion (percent -> ratio, ns -> s, mW -> W),
and each family's absence where NVML has no answer (NOT_SUPPORTED, no NVLink, no ECC, MIG on,
no GPM) is checked as absence, never a zero.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.sim.scenario import ScenarioError, load_scenario
from tests.conftest import ManualClock
from tests.test_mig_source import ticks  # n ticks one second apart; the last one's samples

H200 = {"model": "NVIDIA H200", "architecture": "hopper", "nvlink_links": 18}

CODECS = ("gpu_encoder_utilization_ratio", "gpu_decoder_utilization_ratio")
PIPES = ("hmma", "imma", "dfma")
POLICIES = ("board_limit", "low_utilization", "reliability")
NVLINK_ERRORS = ("crc_flit", "crc_data", "replay", "recovery")
LIMIT_BOUNDS = (
    "gpu_power_management_limit_min_watts",
    "gpu_power_management_limit_max_watts",
    "gpu_power_management_limit_default_watts",
)
NEW_FAMILIES = (
    *CODECS,
    "gpu_tensor_pipe_active_ratio",
    "gpu_violation_seconds_total",
    "gpu_ecc_aggregate_errors_total",
    "gpu_nvlink_errors_total",
    "gpu_power_management_limit_watts",
    *LIMIT_BOUNDS,
)

# One H200 with every new quantity set to a distinct constant.
SET = {
    "encoder_utilization": 0.37,
    "decoder_utilization": 0.52,
    "tensor_active": 0.6,
    "tensor_imma_active": 0.2,
    "tensor_dfma_active": 0.1,
    "ecc_corrected_total": 3,
    "ecc_uncorrected_total": 1,
    "ecc_corrected_aggregate_total": 40,
    "ecc_uncorrected_aggregate_total": 2,
    "nvlink_crc_flit_errors_total": 11,
    "nvlink_crc_data_errors_total": 7,
    "nvlink_replay_errors_total": 5,
    "nvlink_recovery_errors_total": 2,
    # Board limit from 0 s, reliability from 1 s, never idle (low utilization stays at 0).
    "clock_event_reasons": {"steps": [[0, ["board_limit"]], [1, ["board_limit", "reliability"]]]},
}


def scenario(devices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": "superset", "defaults": {**H200, "values": SET}, "devices": devices, **extra}


@pytest.fixture
def start(start_source: Callable[..., NvmlSource]) -> Callable[..., NvmlSource]:
    def _start(spec: Any, **settings: Any) -> NvmlSource:
        settings.setdefault("xid_events", False)  # its thread waits in real time
        return start_source(spec, **settings)

    return _start


def test_every_value_is_the_scenarios_after_unit_conversion(start, clock: ManualClock) -> None:
    limits = {
        "power_limit_watts": 650,
        "power_management_limit_watts": 700,
        "power_default_limit_watts": 680,
        "power_limit_range_watts": [200, 720],
    }
    source = start(scenario([limits]))
    gpu = ticks(source, clock)[0]  # t = 3
    assert gpu.value("gpu_encoder_utilization_ratio") == pytest.approx(0.37)
    assert gpu.value("gpu_decoder_utilization_ratio") == pytest.approx(0.52)
    # HMMA is the tensor activity the IMMA and DFMA pipes leave: 0.6 - 0.2 - 0.1.
    assert gpu.value("gpu_tensor_pipe_active_ratio", pipe="hmma") == pytest.approx(0.3)
    assert gpu.value("gpu_tensor_pipe_active_ratio", pipe="imma") == pytest.approx(0.2)
    assert gpu.value("gpu_tensor_pipe_active_ratio", pipe="dfma") == pytest.approx(0.1)
    assert gpu.value("gpu_tensor_active_ratio") == pytest.approx(0.6)
    # ns -> s: board limit held the clocks for all 3 s, reliability for the last 2.
    assert gpu.value("gpu_violation_seconds_total", policy="board_limit") == pytest.approx(3.0)
    assert gpu.value("gpu_violation_seconds_total", policy="reliability") == pytest.approx(2.0)
    assert gpu.value("gpu_violation_seconds_total", policy="low_utilization") == 0.0
    # Aggregate (lifetime) and volatile ECC counts are separate counters.
    assert gpu.value("gpu_ecc_aggregate_errors_total", error="corrected") == 40
    assert gpu.value("gpu_ecc_aggregate_errors_total", error="uncorrected") == 2
    assert gpu.value("gpu_ecc_errors_total", error="corrected") == 3
    assert gpu.value("gpu_ecc_errors_total", error="uncorrected") == 1
    expected = {"crc_flit": 11, "crc_data": 7, "replay": 5, "recovery": 2}
    for error, count in expected.items():
        assert gpu.value("gpu_nvlink_errors_total", error=error) == count, error
    # mW -> W: the management limit the administrator set, the enforced one below it.
    assert gpu.value("gpu_power_management_limit_watts") == 700
    assert gpu.value("gpu_power_limit_watts") == 650
    # The range the management limit may be set in, and the one the board boots with.
    assert gpu.value("gpu_power_management_limit_min_watts") == 200
    assert gpu.value("gpu_power_management_limit_max_watts") == 720
    assert gpu.value("gpu_power_management_limit_default_watts") == 680
    # The per-policy fields answered: no fallback call was made.
    assert source.fake.call_counts["nvmlDeviceGetViolationStatus"] == 0  # type: ignore[attr-defined]
    assert [s.collector for s in source.collector_status() if not s.success] == []


def test_violation_time_falls_back_to_the_status_call_without_the_fields(
    start, clock: ManualClock
) -> None:
    source = start(scenario([{}], driver={"unsupported_fields": [77, 78, 79]}))
    gpu = ticks(source, clock)[0]
    assert gpu.value("gpu_violation_seconds_total", policy="board_limit") == pytest.approx(3.0)
    assert gpu.value("gpu_violation_seconds_total", policy="reliability") == pytest.approx(2.0)
    assert gpu.value("gpu_violation_seconds_total", policy="low_utilization") == 0.0
    # One call per policy and tick, not one per field that is still there.
    assert source.fake.call_counts["nvmlDeviceGetViolationStatus"] == 3 * 3  # type: ignore[attr-defined]


def test_only_the_gone_field_falls_back(start, clock: ManualClock) -> None:
    source = start(scenario([{}], driver={"unsupported_fields": [79]}))
    gpu = ticks(source, clock)[0]
    assert gpu.value("gpu_violation_seconds_total", policy="reliability") == pytest.approx(2.0)
    assert gpu.value("gpu_violation_seconds_total", policy="board_limit") == pytest.approx(3.0)
    assert source.fake.call_counts["nvmlDeviceGetViolationStatus"] == 3  # type: ignore[attr-defined]


def test_without_fields_or_status_call_violation_time_is_absent(start, clock: ManualClock) -> None:
    source = start(
        scenario(
            [{}],
            driver={
                "unsupported_fields": [77, 78, 79],
                "missing_functions": ["nvmlDeviceGetViolationStatus"],
            },
        )
    )
    gpu = ticks(source, clock)[0]
    assert "gpu_violation_seconds_total" not in gpu.families()
    assert gpu.value("gpu_clock_event_seconds_total", reason="sw_power_cap") is not None


def test_not_supported_leaves_the_families_absent(start, clock: ManualClock) -> None:
    source = start(
        scenario(
            [
                {"unsupported": ["encoder", "decoder", "power_limit", "throttle_time"]},
                {"ecc": False, "nvlink_links": 0},
                {},
            ]
        )
    )
    devices = ticks(source, clock)
    gone, bare, full = devices[0], devices[1], devices[2]
    limits = ("gpu_power_management_limit_watts", *LIMIT_BOUNDS)
    for family in (*CODECS, *limits, "gpu_violation_seconds_total"):
        assert family not in gone.families(), family
    assert gone.value("gpu_utilization_ratio") is not None  # the collector still reports
    assert "gpu_ecc_aggregate_errors_total" in gone.families()
    # No ECC, no NVLink: no counts made up.
    assert "gpu_ecc_aggregate_errors_total" not in bare.families()
    assert "gpu_nvlink_errors_total" not in bare.families()
    assert set(NEW_FAMILIES) <= full.families()
    assert [s.collector for s in source.collector_status() if not s.success] == []


MIG_AND_WHOLE = {
    "name": "mig-and-whole",
    "defaults": {**H200, "values": {"encoder_utilization": 0.25, "decoder_utilization": 0.5}},
    "devices": [
        {
            "mig": {
                "instances": [
                    {"profile": "3g.71gb", "values": {"tensor_active": 0.55}},
                    {"profile": "3g.71gb", "values": {"tensor_active": 0.2}},
                ]
            }
        },
        {"values": {"tensor_active": 0.4}},
        {
            "model": "NVIDIA A100-SXM4-80GB",
            "architecture": "ampere",
            "mig": {"instances": [{"profile": "3g.40gb", "values": {"tensor_active": 0.5}}]},
        },
    ],
}


def test_a_mig_enabled_gpu_has_no_encoder_or_decoder_series(start, clock: ManualClock) -> None:
    source = start(MIG_AND_WHOLE)
    devices = ticks(source, clock)
    for index in (0, 2):  # MIG on: NVML answers NOT_SUPPORTED
        assert devices[index].mig_enabled
        assert not set(CODECS) & devices[index].families(), index
        for instance in devices[index].instances:
            assert not {r.family for r in instance.readings} & set(CODECS)
    whole = devices[1]
    assert whole.value("gpu_encoder_utilization_ratio") == pytest.approx(0.25)
    assert whole.value("gpu_decoder_utilization_ratio") == pytest.approx(0.5)


def test_tensor_pipes_on_mig_instances(start, clock: ManualClock) -> None:
    source = start(MIG_AND_WHOLE)
    devices = ticks(source, clock)
    parent = devices[0]
    assert "gpu_tensor_pipe_active_ratio" not in parent.families()  # the instances' then
    hmma = [i.value("gpu_tensor_pipe_active_ratio", pipe="hmma") for i in parent.instances]
    assert hmma == pytest.approx([0.55, 0.2])  # each instance's own tensor activity
    for instance in parent.instances:
        assert instance.value("gpu_tensor_pipe_active_ratio", pipe="imma") == 0.0
        assert instance.value("gpu_tensor_pipe_active_ratio", pipe="dfma") == 0.0
    assert devices[1].value("gpu_tensor_pipe_active_ratio", pipe="hmma") == pytest.approx(0.4)
    # An A100's instances have no GPM: no pipes, never zeros.
    a100 = devices[2]
    assert a100.instances
    for instance in a100.instances:
        assert "gpu_tensor_pipe_active_ratio" not in {r.family for r in instance.readings}


def test_mixed_has_every_new_family_on_every_gpu(start, clock: ManualClock) -> None:
    devices = ticks(start("mixed"), clock)
    assert len(devices) == 8
    for device in devices.values():
        assert set(NEW_FAMILIES) <= device.families(), device.index
        labels = {
            family: {dict(r.labels).get(key) for r in device.readings if r.family == family}
            for family, key in (
                ("gpu_tensor_pipe_active_ratio", "pipe"),
                ("gpu_violation_seconds_total", "policy"),
                ("gpu_nvlink_errors_total", "error"),
                ("gpu_ecc_aggregate_errors_total", "error"),
            )
        }
        assert labels == {
            "gpu_tensor_pipe_active_ratio": set(PIPES),
            "gpu_violation_seconds_total": set(POLICIES),
            "gpu_nvlink_errors_total": set(NVLINK_ERRORS),
            "gpu_ecc_aggregate_errors_total": {"corrected", "uncorrected"},
        }
        assert device.value("gpu_power_management_limit_watts") == 700
    tensor_heavy = devices[2]
    assert tensor_heavy.value("gpu_tensor_pipe_active_ratio", pipe="hmma") == pytest.approx(
        tensor_heavy.value("gpu_tensor_active_ratio")
    )
    # The idle GPU's clocks are parked by low utilization the whole time (t = 3 s).
    idle = devices[0].value("gpu_violation_seconds_total", policy="low_utilization")
    assert idle == pytest.approx(3.0)


def test_pre_hopper_has_no_tensor_pipes_but_the_rest(start, clock: ManualClock) -> None:
    devices = ticks(start("pre-hopper"), clock)
    for device in devices.values():
        families = device.families()
        assert "gpu_tensor_pipe_active_ratio" not in families
        assert "gpu_tensor_active_ratio" not in families
        assert set(NEW_FAMILIES) - {"gpu_tensor_pipe_active_ratio"} <= families, device.index


def test_a_board_without_nvlink_or_ecc_reports_neither(start, clock: ManualClock) -> None:
    source = start({"name": "desk", "devices": [{"model": "NVIDIA GeForce RTX 4090"}]})
    gpu = ticks(source, clock)[0]
    assert "gpu_nvlink_errors_total" not in gpu.families()
    assert "gpu_ecc_aggregate_errors_total" not in gpu.families()
    assert gpu.value("gpu_encoder_utilization_ratio") == 0.0


def test_a_management_limit_below_the_enforced_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            name: limits
            defaults: {power_limit_watts: 700}
            devices:
              - {}
              - power_management_limit_watts: 600
            """
        )
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value) == (
        f"{path}:5: devices[1].power_management_limit_watts: must be >= power_limit_watts "
        "(700, the enforced limit), got 600"
    )


def test_the_limits_default_to_each_other() -> None:
    only_management, only_enforced, neither = load_scenario(
        {
            "name": "limits",
            "devices": [
                {"power_management_limit_watts": 600},
                {"power_limit_watts": 500},
                {"model": "NVIDIA A100-SXM4-80GB"},
            ],
        }
    ).devices
    assert (only_management.power_limit_watts, only_management.power_management_limit_watts) == (
        600,
        600,
    )
    assert (only_enforced.power_limit_watts, only_enforced.power_management_limit_watts) == (
        500,
        500,
    )
    assert (neither.power_limit_watts, neither.power_management_limit_watts) == (400, 400)
