"""A simulated GPU's NVLink fabric: what nvmlDeviceGetGpuFabricInfoV answers, and when.

A device's `fabric:` mapping (docs/scenarios.md, "Fabric") gives the fabric's state, the
probe's status, the health mask's sub-fields and the health summary; its `changes` override
some of them inside [from, until), later entries over earlier ones. Without the mapping the
GPU has no fabric (the call answers NOT_SUPPORTED, as nvml.h says "if device doesn't support
gpu fabric"). The encodings are NVML's (`gpu_exporter.model.nvml_facts`): state and summary by
value, each health sub-field at its shift (0 not supported, 1 true, 2 false; incorrect
configuration 1 none, 2-8 the problem).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import pynvml
from pydantic import Field, PlainValidator, field_validator

from gpu_exporter.model import nvml_facts as facts
from gpu_exporter.sim.fields import Seconds, Strict, Until, error, one_of, until_after_from

__all__ = ["FLAG_ISSUES", "STATUSES", "FabricChange", "FabricReading", "FabricSpec"]

# The probe's `status` as a file writes it: "success", or an NVML error's name in lower case
# (pynvml's NVML_ERROR_<NAME>: "unknown", "timeout", ...).
STATUSES: dict[str, int] = {"success": pynvml.NVML_SUCCESS} | {
    name.removeprefix("NVML_ERROR_").lower(): getattr(pynvml, name)
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
}
# The yes/no health sub-fields, by key (incorrect_configuration names its value instead).
FLAG_ISSUES = tuple(i.name for i in facts.FABRIC_HEALTH_ISSUES if i.width == 0x3)
_FLAG_VALUES = {
    True: facts.FABRIC_HEALTH_TRUE,
    False: facts.FABRIC_HEALTH_FALSE,
    "not_supported": 0,
}


def _flag(value: Any) -> int:
    """A yes/no sub-field: true, false, or not_supported (the driver does not report it)."""
    if isinstance(value, bool) or value == "not_supported":
        return _FLAG_VALUES[value]
    raise error(f"expected true, false or not_supported, got {value!r}")


_Flag = Annotated[int, PlainValidator(_flag)]
_State = Annotated[str, one_of(facts.FABRIC_STATES)]
_Status = Annotated[str, one_of(STATUSES)]
_Summary = Annotated[str, one_of(facts.FABRIC_HEALTH_SUMMARIES)]
_Configuration = Annotated[str, one_of(facts.FABRIC_INCORRECT_CONFIGURATIONS)]
_KEYS = ("state", "status", "summary", *FLAG_ISSUES, "incorrect_configuration")


@dataclass(frozen=True)
class FabricReading:
    """What the call answers at one time, in NVML's numbers."""

    state: int
    status: int
    health_mask: int
    health_summary: int


class FabricChange(Strict):
    """One entry of `changes`: the keys it gives hold inside [from, until)."""

    start: Seconds = Field(alias="from")
    until: Until = None
    state: _State | None = None
    status: _Status | None = None
    summary: _Summary | None = None
    degraded_bandwidth: _Flag | None = None
    route_recovery: _Flag | None = None
    route_unhealthy: _Flag | None = None
    access_timeout_recovery: _Flag | None = None
    incorrect_configuration: _Configuration | None = None

    _after_start = field_validator("until")(until_after_from)

    def active(self, t: float) -> bool:
        return t >= self.start and (self.until is None or t < self.until)


class FabricSpec(Strict):
    """A device's `fabric:`: a fabric the GPU registered with, healthy unless it says not."""

    state: _State = "completed"
    status: _Status = "success"
    summary: _Summary = "healthy"
    degraded_bandwidth: _Flag = facts.FABRIC_HEALTH_FALSE
    route_recovery: _Flag = facts.FABRIC_HEALTH_FALSE
    route_unhealthy: _Flag = facts.FABRIC_HEALTH_FALSE
    access_timeout_recovery: _Flag = facts.FABRIC_HEALTH_FALSE
    incorrect_configuration: _Configuration = "none"
    changes: tuple[FabricChange, ...] = ()

    def at(self, t: float) -> FabricReading:
        """The answer at scenario time `t`: the block's keys, with the active changes' over
        them in order."""
        now: dict[str, Any] = {key: getattr(self, key) for key in _KEYS}
        for change in self.changes:
            if change.active(t):
                now.update(
                    {key: value for key in _KEYS if (value := getattr(change, key)) is not None}
                )
        mask = 0
        for issue in facts.FABRIC_HEALTH_ISSUES:
            if issue.name == "incorrect_configuration":
                value = facts.FABRIC_INCORRECT_CONFIGURATIONS.index(now[issue.name])
            else:
                value = now[issue.name]
            mask |= value << issue.shift
        return FabricReading(
            state=facts.FABRIC_STATES.index(now["state"]),
            status=STATUSES[now["status"]],
            health_mask=mask,
            health_summary=facts.FABRIC_HEALTH_SUMMARIES.index(now["summary"]),
        )
