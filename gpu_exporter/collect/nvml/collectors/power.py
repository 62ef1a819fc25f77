"""power: draw, enforced and management limits, and energy since the driver loaded.

The management limit is the one an administrator set (or the default); the enforced limit is
the lowest of it and the other limiters (nvml.h, nvmlDeviceGetEnforcedPowerLimit). The
management limit, the range it may be set in (nvmlDeviceGetPowerManagementLimitConstraints)
and its default (nvmlDeviceGetPowerManagementDefaultLimit) are settings and board facts: read
at the slow refresh (`nvml.slow_refresh_seconds`), as max clocks are; the enforced one, which
other limiters move, every tick. nvml.h: all three for Kepler or newer fully supported devices;
a board that does not answer one has no series for it.
"""

from __future__ import annotations

import pynvml as N

from gpu_exporter.collect.nvml.collectors.base import Collector, Device, FieldSpec
from gpu_exporter.model.snapshot import Reading

ENERGY = FieldSpec(83, "gpu_energy_joules_total", scale=1e-3)  # mJ since driver load


class Power(Collector):
    name = "power"
    families = (
        "gpu_power_watts",
        "gpu_power_limit_watts",
        "gpu_power_management_limit_watts",
        "gpu_power_management_limit_min_watts",
        "gpu_power_management_limit_max_watts",
        "gpu_power_management_limit_default_watts",
        "gpu_energy_joules_total",
    )
    calls = (
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetTotalEnergyConsumption",  # without the energy field
    )
    fields = (ENERGY,)
    refreshes = True

    def refresh(self, nvml: Device) -> list[Reading]:
        h, out = nvml.handle, []
        managed = nvml.call("power_management_limit", N.nvmlDeviceGetPowerManagementLimit, h)
        if managed is not None:
            out.append(Reading("gpu_power_management_limit_watts", managed / 1000.0))
        bounds = nvml.call(
            "power_limit_constraints", N.nvmlDeviceGetPowerManagementLimitConstraints, h
        )
        if bounds is not None:
            low, high = bounds
            out.append(Reading("gpu_power_management_limit_min_watts", low / 1000.0))
            out.append(Reading("gpu_power_management_limit_max_watts", high / 1000.0))
        default = nvml.call("power_default_limit", N.nvmlDeviceGetPowerManagementDefaultLimit, h)
        if default is not None:
            out.append(Reading("gpu_power_management_limit_default_watts", default / 1000.0))
        return out

    def read(self, nvml: Device) -> list[Reading]:
        h, out = nvml.handle, []
        power = nvml.call("power_usage", N.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            out.append(Reading("gpu_power_watts", power / 1000.0))
        limit = nvml.call("power_limit", N.nvmlDeviceGetEnforcedPowerLimit, h)
        if limit is not None:
            out.append(Reading("gpu_power_limit_watts", limit / 1000.0))
        out += nvml.field_readings(self.fields)
        if nvml.fields_gone(ENERGY.field_id):
            mj = nvml.call("total_energy", N.nvmlDeviceGetTotalEnergyConsumption, h)
            if mj is not None:
                out.append(Reading("gpu_energy_joules_total", mj / 1000.0))
        return out
