"""fabric: the GPU's NVLink fabric: its registration state and the health the driver reports.

nvmlDeviceGetGpuFabricInfoV (nvml.h; Hopper and newer), every tick, with the v3 struct
(nvmlGpuFabricInfo_v3: healthSummary added) and, where the driver answers
ARGUMENT_VERSION_MISMATCH, the v2 one; each answer is learned once at the choke point. NOT_SUPPORTED
("if device doesn't support gpu fabric") means no fabric series at all.

- `state`: nvmlGpuFabricState_t, the state set gpu_fabric_state; a value past those known
  reads 0 for every state.
- `status`: "must be checked only if" the state is COMPLETED: then a failure is counted in
  gpu_exporter_errors_total (source nvml, field fabric_status, the error's name), every tick
  it lasts. There is no family of its own: the issue's contract has none.
- `healthMask`: sub-fields by shift and width (`nvml_facts.FABRIC_HEALTH_ISSUES`); a sub-field
  at 0 is one the driver does not report (no series), otherwise gpu_fabric_health_issue is 1
  while it reports the issue.
- `healthSummary` (v3 only): the state set gpu_fabric_health_summary; 0 ("not supported"):
  absent; a value past those known reads 0 for every summary.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml.calls import SOURCE
from gpu_exporter.collect.nvml.collectors.base import Collector, Device
from gpu_exporter.collect.nvml.values import binding, return_code_name
from gpu_exporter.model.nvml_facts import (
    FABRIC_HEALTH_ISSUES,
    FABRIC_HEALTH_SUMMARIES,
    FABRIC_STATE_COMPLETED,
    FABRIC_STATES,
)
from gpu_exporter.model.snapshot import Reading

CALL = "nvmlDeviceGetGpuFabricInfoV"
# The structs, newest first, as (choke-point key, pynvml class name): an nvidia-ml-py without a
# class is the same as a driver without that version.
STRUCTS = (
    ("fabric_info_v3", "c_nvmlGpuFabricInfo_v3_t"),
    ("fabric_info_v2", "c_nvmlGpuFabricInfo_v2_t"),
)


def _reader(struct_name: str) -> Callable[[Any], Any] | None:
    """A call that fills a fresh struct of that version and returns it (pynvml's wrapper
    returns only NVML_SUCCESS); None where this nvidia-ml-py lacks the struct or the call."""
    struct = getattr(N, struct_name, None)
    if struct is None or binding(CALL) is None:
        return None

    def read(handle: Any) -> Any:
        info = struct()  # its constructor presets `version` to the struct's
        fn = binding(CALL)  # looked up per call, as every pynvml call here
        assert fn is not None
        fn(handle, ctypes.byref(info))
        return info

    return read


def _state_set(family: str, label: str, names: tuple[str, ...], value: int) -> list[Reading]:
    return [Reading(family, float(i == value), ((label, name),)) for i, name in enumerate(names)]


def fabric_readings(info: Any) -> list[Reading]:
    """One fabric info struct (v2 or v3) as readings."""
    out = _state_set("gpu_fabric_state", "state", FABRIC_STATES, int(info.state))
    mask = int(info.healthMask)
    for issue in FABRIC_HEALTH_ISSUES:
        value = issue.value(mask)
        if value:
            out.append(
                Reading(
                    "gpu_fabric_health_issue", float(issue.present(value)), (("issue", issue.name),)
                )
            )
    summary = int(getattr(info, "healthSummary", 0))  # v2 has none
    if summary:
        # Index 0 is "not supported": the state set is over the others.
        out += _state_set(
            "gpu_fabric_health_summary", "summary", FABRIC_HEALTH_SUMMARIES[1:], summary - 1
        )
    return out


class Fabric(Collector):
    name = "fabric"
    families = ("gpu_fabric_state", "gpu_fabric_health_summary", "gpu_fabric_health_issue")
    calls = (CALL,)
    setting = "fabric"

    def read(self, nvml: Device) -> list[Reading]:
        info = nvml.first(*((key, _reader(struct), nvml.handle) for key, struct in STRUCTS))
        if info is None:
            return []
        if int(info.state) == FABRIC_STATE_COMPLETED and int(info.status) != N.NVML_SUCCESS:
            nvml.count_error(SOURCE, "fabric_status", return_code_name(int(info.status)))
        return fabric_readings(info)
