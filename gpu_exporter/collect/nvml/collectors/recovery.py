"""recovery: the action the driver says the GPU needs to recover, as a state set.

NVML field 230, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h: "GPU Recovery action -
None/Reset/Reboot/Drain P2P/Drain and Reset"), whose value is an nvmlDeviceGpuRecoveryAction_t;
read every tick in the tick's one field batch. A driver or GPU without the field answers it
NOT_SUPPORTED (or an older driver INVALID_ARGUMENT, an unknown id): learned once, and the family
is then absent, never a made-up "none". A value past the actions known here
(`nvml_facts.RECOVERY_ACTIONS`) is "unknown", never "none".
"""

from __future__ import annotations

from gpu_exporter.collect.nvml.collectors.base import Collector, Device, FieldSpec
from gpu_exporter.model.nvml_facts import RECOVERY_ACTION_FIELD, RECOVERY_ACTIONS, recovery_action
from gpu_exporter.model.snapshot import Reading

FAMILY = "gpu_recovery_action"


def action_readings(value: float) -> list[Reading]:
    """The state set of one field value: 1 for its action, 0 for every other."""
    current = recovery_action(value)
    return [
        Reading(FAMILY, float(action == current), (("action", action),))
        for action in RECOVERY_ACTIONS
    ]


class Recovery(Collector):
    name = "recovery"
    families = (FAMILY,)
    # The field's raw value, made a state set by `read` (the batch labels nothing itself).
    fields = (FieldSpec(RECOVERY_ACTION_FIELD, FAMILY),)

    def read(self, nvml: Device) -> list[Reading]:
        out: list[Reading] = []
        for raw in nvml.field_readings(self.fields):
            out += action_readings(raw.value)
        return out
