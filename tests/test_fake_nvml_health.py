"""The fake NVML's health readings: field 230 (the recovery action), nvmlDeviceGetGpuFabricInfoV
and the `gpu_reset` fault, driven through pynvml's public wrappers on a manual clock; the
scenario format that writes them; and the NVML numbers they share with the exporter
(gpu_exporter/model/nvml_facts.py), checked against the vendor's binding."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml as N
import pytest

from gpu_exporter import sim
from gpu_exporter.collect.nvml.values import field_value
from gpu_exporter.model import nvml_facts as facts
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.fabric import FabricSpec
from gpu_exporter.sim.fake_nvml import FABRIC_INFO_VERSIONS, FakeNvmlLib
from gpu_exporter.sim.scenario import ScenarioError, load_scenario
from gpu_exporter.sim.spec import _FAULT_KINDS

Install = Callable[..., FakeNvmlLib]
DOC = Path(__file__).resolve().parent.parent / "docs" / "scenarios.md"
FIELD = N.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION


@pytest.fixture
def install(clock: ManualClock) -> Iterator[Install]:
    """install(scenario) -> fake, NVML initialised; always uninstalled afterwards."""

    def _install(scenario: Any) -> FakeNvmlLib:
        fake = sim.install(scenario, clock=clock)
        N.nvmlInit()
        return fake

    try:
        yield _install
    finally:
        sim.uninstall()


def scenario(*devices: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"name": "health", "devices": list(devices) or [{}], **top}


def handle(i: int = 0) -> Any:
    return N.nvmlDeviceGetHandleByIndex(i)


def field(i: int, field_id: int = FIELD) -> tuple[int, int | None]:
    """(nvmlReturn, value or None) of one field of GPU i."""
    (value,) = N.nvmlDeviceGetFieldValues(handle(i), [field_id])
    if value.nvmlReturn != N.NVML_SUCCESS:
        return value.nvmlReturn, None
    if field_id == FIELD:  # an nvmlDeviceGpuRecoveryAction_t
        assert value.valueType == N.NVML_VALUE_TYPE_UNSIGNED_INT
    return value.nvmlReturn, int(field_value(value))


def fabric(i: int = 0, struct: type = N.c_nvmlGpuFabricInfo_v3_t) -> Any:
    info = struct()
    N.nvmlDeviceGetGpuFabricInfoV(handle(i), ctypes.byref(info))
    return info


# -- field 230 ------------------------------------------------------------------------------


def test_recovery_action_steps_by_name_and_number(install: Install, clock: ManualClock) -> None:
    install(
        scenario(
            {"values": {"recovery_action": {"steps": [[0, "none"], [5, "drain_and_reset"]]}}},
            {"values": {"recovery_action": {"pattern": [[10, 2], [10, 9]]}}},
            {},  # default: none
        )
    )
    assert [field(i) for i in range(3)] == [(0, 0), (0, 2), (0, 0)]
    clock.now = 5.0
    assert field(0) == (0, facts.RECOVERY_ACTIONS.index("drain_and_reset"))
    clock.now = 12.0
    assert field(1) == (0, 9)  # past the known actions: the number, as a newer driver's


@pytest.mark.parametrize(
    ("device", "driver", "expected"),
    [
        ({"model": "Tesla V100", "architecture": "volta"}, {}, N.NVML_ERROR_NOT_SUPPORTED),
        ({"unsupported": ["recovery_action"]}, {}, N.NVML_ERROR_NOT_SUPPORTED),
        ({}, {"unsupported_fields": [230]}, N.NVML_ERROR_INVALID_ARGUMENT),  # an older driver
        ({"model": "NVIDIA A100-SXM4-80GB"}, {}, N.NVML_SUCCESS),
    ],
)
def test_recovery_action_where_unsupported(
    install: Install, device: dict[str, Any], driver: dict[str, Any], expected: int
) -> None:
    install(scenario(device, driver=driver))
    assert field(0)[0] == expected


# -- fabric ---------------------------------------------------------------------------------


def test_fabric_versions_match_the_binding() -> None:
    assert {N.nvmlGpuFabricInfo_v2: 2, N.nvmlGpuFabricInfo_v3: 3} == FABRIC_INFO_VERSIONS
    for version, struct in ((2, N.c_nvmlGpuFabricInfo_v2_t), (3, N.c_nvmlGpuFabricInfo_v3_t)):
        assert struct().version == version << 24 | ctypes.sizeof(struct)


def test_fabric_health_over_time(install: Install, clock: ManualClock) -> None:
    install(
        scenario(
            {
                "fabric": {
                    "incorrect_configuration": "not_supported",
                    "changes": [
                        {"from": 5, "until": 9, "degraded_bandwidth": True},
                        {"from": 5, "summary": "limited_capacity"},
                        {"from": 7, "until": 9, "route_unhealthy": "not_supported"},
                    ],
                }
            }
        )
    )
    healthy = fabric()
    assert (healthy.state, healthy.status) == (N.NVML_GPU_FABRIC_STATE_COMPLETED, N.NVML_SUCCESS)
    assert healthy.healthSummary == N.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    false = N.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
    assert healthy.healthMask == false | false << 2 | false << 4 | false << 6  # config: 0
    clock.now = 7.0
    degraded = fabric()
    assert degraded.healthSummary == N.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
    shift, width = (
        N.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
        N.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW,
    )
    assert degraded.healthMask >> shift & width == N.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
    assert degraded.healthMask >> N.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY & 0x3 == 0
    clock.now = 9.0  # the first and third changes are over, the second lasts
    later = fabric()
    assert later.healthMask == healthy.healthMask
    assert later.healthSummary == N.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY


def test_fabric_state_status_and_configuration(install: Install) -> None:
    install(
        scenario(
            {
                "fabric": {
                    "state": "in_progress",
                    "status": "unknown",
                    "incorrect_configuration": "insufficient_nvlinks",
                    "summary": "not_supported",
                }
            }
        )
    )
    info = fabric()
    assert (info.state, info.status) == (
        N.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
        N.NVML_ERROR_UNKNOWN,
    )
    config = info.healthMask >> N.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION & 0xF
    assert config == N.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS
    assert info.healthSummary == N.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED


def test_fabric_struct_versions(install: Install) -> None:
    install(scenario({"fabric": {}}, {"fabric": {}}, driver={"fabric_info_versions": [2]}))
    v2 = fabric(0, N.c_nvmlGpuFabricInfo_v2_t)  # the only version this driver knows
    assert v2.state == N.NVML_GPU_FABRIC_STATE_COMPLETED and v2.healthMask != 0
    with pytest.raises(N.NVMLError_ArgumentVersionMismatch):
        fabric(0, N.c_nvmlGpuFabricInfo_v3_t)
    odd = N.c_nvmlGpuFabricInfo_v3_t()
    odd.version = 4 << 24 | ctypes.sizeof(odd)  # no such version
    with pytest.raises(N.NVMLError_ArgumentVersionMismatch):
        N.nvmlDeviceGetGpuFabricInfoV(handle(1), ctypes.byref(odd))


def test_fabric_not_supported_without_a_fabric_and_missing_on_old_drivers(
    install: Install,
) -> None:
    install(scenario({}, {"fabric": {}}))
    with pytest.raises(N.NVMLError_NotSupported):
        fabric(0)
    assert fabric(1).state == N.NVML_GPU_FABRIC_STATE_COMPLETED
    sim.uninstall()
    install(scenario({"fabric": {}}, driver={"missing_functions": ["nvmlDeviceGetGpuFabricInfoV"]}))
    with pytest.raises(N.NVMLError_FunctionNotFound):
        fabric(0)


def test_fabric_is_hopper_and_newer_and_defaults_can_be_undone() -> None:
    with pytest.raises(ScenarioError, match=r"devices\[0\]\.fabric: ampere GPUs have no fabric"):
        load_scenario(scenario({"model": "NVIDIA A100-SXM4-80GB", "fabric": {}}))
    loaded = load_scenario(
        {"name": "t", "defaults": {"fabric": {}}, "devices": [{}, {"fabric": None}]}
    )
    assert [d.fabric is not None for d in loaded.devices] == [True, False]


@pytest.mark.parametrize(
    ("fabric_block", "message"),
    [
        ({"degraded_bandwidth": "yes please"}, "expected true, false or not_supported"),
        ({"state": "done"}, "unknown value 'done'"),
        ({"status": "kaput"}, "unknown value 'kaput'"),
        ({"changes": [{"until": 4}]}, "missing required key 'from'"),
        ({"changes": [{"from": 5, "until": 4}]}, "`until` must be after `from`"),
        ({"colour": "green"}, "unknown key 'colour'"),
    ],
)
def test_fabric_blocks_are_checked(fabric_block: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(message)):
        load_scenario(scenario({"fabric": fabric_block}))


def test_recovery_action_values_are_checked() -> None:
    for value, message in [
        ("reboot_please", "unknown value 'reboot_please'"),
        (-1, "expected a recovery action name or a number"),
        ({"sine": {"mean": 1, "amplitude": 1, "period": 5}}, "takes only steps or pattern"),
        ({"steps": [[0, "none"]], "noise": 1}, "takes only steps or pattern"),
    ]:
        with pytest.raises(ScenarioError, match=re.escape(message)):
            load_scenario(scenario({"values": {"recovery_action": value}}))


# -- gpu_reset ------------------------------------------------------------------------------

RESET = scenario(
    {
        "model": "NVIDIA H100 80GB HBM3",
        "values": {
            "ecc_uncorrected_total": {"steps": [[0, 0], [10, 3], [30, 5]]},
            "ecc_corrected_total": 7,
            "row_remap_pending": {"steps": [[0, 0], [10, 1]]},
            "retired_pages_pending": {"steps": [[0, 0], [10, 1]]},
            "recovery_action": {"steps": [[0, "none"], [10, "drain_and_reset"], [40, "gpu_reset"]]},
        },
    },
    faults=[
        {"at": 10, "device": 0, "kind": "xid", "xid": 48},
        {"at": 15, "device": 0, "kind": "xid", "xid": 94},
        {"at": 20, "device": 0, "kind": "gpu_reset"},
        {"at": 25, "device": 0, "kind": "xid", "xid": 79},
    ],
)


def health(i: int = 0) -> dict[str, Any]:
    h = handle(i)
    volatile, aggregate = N.NVML_VOLATILE_ECC, N.NVML_AGGREGATE_ECC
    double, single = N.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, N.NVML_MEMORY_ERROR_TYPE_CORRECTED
    return {
        "uncorrected": N.nvmlDeviceGetTotalEccErrors(h, double, volatile),
        "corrected": N.nvmlDeviceGetTotalEccErrors(h, single, volatile),
        "uncorrected_aggregate": N.nvmlDeviceGetTotalEccErrors(h, double, aggregate),
        "ecc_field": field(i, N.NVML_FI_DEV_ECC_DBE_VOL_TOTAL)[1],
        "remap_pending": N.nvmlDeviceGetRemappedRows(h)[2],
        "remap_field": field(i, N.NVML_FI_DEV_REMAPPED_PENDING)[1],
        "retired_pending": N.nvmlDeviceGetRetiredPagesPendingStatus(h),
        "action": field(i)[1],
    }


def test_gpu_reset_clears_what_a_reset_clears(install: Install, clock: ManualClock) -> None:
    install(RESET)
    clock.now = 19.0
    before = health()
    assert before == {
        "uncorrected": 3,
        "corrected": 7,
        "uncorrected_aggregate": 3,
        "ecc_field": 3,
        "remap_pending": 1,
        "remap_field": 1,
        "retired_pending": 1,
        "action": facts.RECOVERY_ACTIONS.index("drain_and_reset"),
    }
    clock.now = 20.0
    assert health() == {
        "uncorrected": 0,
        "corrected": 0,
        "uncorrected_aggregate": 3,  # the InfoROM's lifetime count survives a reset
        "ecc_field": 0,
        "remap_pending": 0,
        "remap_field": 0,
        "retired_pending": 0,
        "action": 0,
    }
    clock.now = 40.0  # errors and an action after the reset count again
    after = health()
    assert (after["uncorrected"], after["uncorrected_aggregate"], after["corrected"]) == (2, 5, 0)
    assert after["action"] == facts.RECOVERY_ACTIONS.index("gpu_reset")
    assert after["remap_pending"] == 0  # still the pending remap the reset applied


def test_gpu_reset_drops_xids_from_before_it(install: Install, clock: ManualClock) -> None:
    install(RESET)
    events = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(handle(), N.nvmlEventTypeXidCriticalError, events)
    clock.now = 12.0
    assert N.nvmlEventSetWait(events, 0).eventData == 48  # delivered before the reset
    clock.now = 30.0  # XID 94 (15 s) was not delivered before the reset at 20 s: never is
    assert N.nvmlEventSetWait(events, 0).eventData == 79
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait(events, 0)
    N.nvmlEventSetFree(events)


def test_gpu_reset_needs_a_device() -> None:
    with pytest.raises(ScenarioError, match="missing required key 'device'"):
        load_scenario(scenario({}, faults=[{"at": 1, "kind": "gpu_reset"}]))


def test_the_faults_scenario_resets_the_xid_48_gpu(install: Install, clock: ManualClock) -> None:
    install("faults")
    clock.now = 9.0
    assert field(1)[1] == facts.RECOVERY_ACTIONS.index("node_reboot")
    assert field(2)[1] == 0
    clock.now = 10.0
    assert field(2)[1] == facts.RECOVERY_ACTIONS.index("drain_and_reset")
    assert N.nvmlDeviceGetRemappedRows(handle(2))[2] == 1
    clock.now = 2410.0  # the GPU reset, 40 minutes after XID 48
    assert field(2)[1] == 0 and N.nvmlDeviceGetRemappedRows(handle(2))[2] == 0
    clock.now = 25.0
    assert fabric(0).healthSummary == N.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
    assert fabric(2).healthSummary == N.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
    with pytest.raises(N.NVMLError_NotSupported):
        fabric(3)  # the consumer card


# -- the facts, the format and its doc ------------------------------------------------------


def test_recovery_actions_are_the_bindings() -> None:
    names = {
        "none": "NONE",
        "gpu_reset": "GPU_RESET",
        "node_reboot": "NODE_REBOOT",
        "drain_p2p": "DRAIN_P2P",
        "drain_and_reset": "DRAIN_AND_RESET",
        "recover_imex_domain": "RECOVER_IMEX_DOMAIN",
        "bus_reset": "BUS_RESET",
        "system_reboot": "SYSTEM_REBOOT",
    }
    assert list(names) == list(facts.RECOVERY_ACTIONS[:-1])
    for value, name in enumerate(names.values()):
        assert getattr(N, f"NVML_GPU_RECOVERY_ACTION_{name}") == value
    assert facts.RECOVERY_ACTIONS[-1] == "unknown"
    assert facts.RECOVERY_ACTION_FIELD == N.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    assert [facts.recovery_action(v) for v in (0, 4, 7, 8, 4294967295, -1, 2.5)] == [
        "none",
        "drain_and_reset",
        "system_reboot",
        "unknown",
        "unknown",
        "unknown",
        "unknown",
    ]


def test_fabric_facts_are_the_bindings() -> None:
    for value, state in enumerate(facts.FABRIC_STATES):
        assert getattr(N, f"NVML_GPU_FABRIC_STATE_{state.upper()}") == value
    for value, summary in enumerate(facts.FABRIC_HEALTH_SUMMARIES):
        assert getattr(N, f"NVML_GPU_FABRIC_HEALTH_SUMMARY_{summary.upper()}") == value
    for issue in facts.FABRIC_HEALTH_ISSUES:
        assert getattr(N, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{issue.binding}") == issue.shift
        assert getattr(N, f"NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_{issue.binding}") == issue.width
        if issue.width == 0x3:
            assert getattr(N, f"NVML_GPU_FABRIC_HEALTH_MASK_{issue.binding}_TRUE") == 1
            assert getattr(N, f"NVML_GPU_FABRIC_HEALTH_MASK_{issue.binding}_FALSE") == 2
    for value, name in enumerate(facts.FABRIC_INCORRECT_CONFIGURATIONS):
        binding = "INCORRECT_CONFIGURATION_" + name.upper()
        assert getattr(N, f"NVML_GPU_FABRIC_HEALTH_MASK_{binding}") == value
    assert facts.FABRIC_STATE_COMPLETED == N.NVML_GPU_FABRIC_STATE_COMPLETED


def test_a_fabric_spec_encodes_every_issue_at_its_shift() -> None:
    every = FabricSpec.model_validate(
        {
            "degraded_bandwidth": True,
            "route_recovery": True,
            "route_unhealthy": True,
            "access_timeout_recovery": True,
            "incorrect_configuration": "gpu_state_invalid",
        }
    ).at(0.0)
    decoded = {issue.name: issue.value(every.health_mask) for issue in facts.FABRIC_HEALTH_ISSUES}
    assert decoded == {
        "degraded_bandwidth": 1,
        "route_recovery": 1,
        "route_unhealthy": 1,
        "access_timeout_recovery": 1,
        "incorrect_configuration": 8,
    }


def test_doc_names_every_fault_kind_and_fabric_key() -> None:
    text = DOC.read_text()
    for name in (*_FAULT_KINDS, *FabricSpec.model_fields, "fabric", "fabric_info_versions"):
        assert f"`{name}`" in text or f"{name}:" in text, name
    for name in (*facts.RECOVERY_ACTIONS[:-1], *facts.FABRIC_INCORRECT_CONFIGURATIONS):
        assert name in text, name
