"""temperature: the GPU die, and the memory where the driver reports it."""

from __future__ import annotations

import pynvml as N

from gpu_exporter.collect.nvml.collectors.base import Collector, Device, FieldSpec
from gpu_exporter.collect.nvml.values import binding
from gpu_exporter.model.snapshot import Reading


class Temperature(Collector):
    name = "temperature"
    families = ("gpu_temperature_celsius",)
    calls = ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")  # newer first
    fields = (FieldSpec(82, "gpu_temperature_celsius", (("sensor", "memory"),)),)

    def read(self, nvml: Device) -> list[Reading]:
        h, gpu = nvml.handle, N.NVML_TEMPERATURE_GPU
        temp = nvml.first(
            ("temperature_v", binding("nvmlDeviceGetTemperatureV"), h, gpu),
            ("temperature", N.nvmlDeviceGetTemperature, h, gpu),
        )
        out = []
        if temp is not None:
            out.append(Reading("gpu_temperature_celsius", temp, (("sensor", "gpu"),)))
        return out + nvml.field_readings(self.fields)
