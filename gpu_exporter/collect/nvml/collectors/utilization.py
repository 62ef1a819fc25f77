"""utilization: the share of time any kernel ran, device memory was read or written, and the
video encoder and decoder were busy."""

from __future__ import annotations

import pynvml as N

from gpu_exporter.collect.nvml.collectors.base import Collector, Device
from gpu_exporter.collect.nvml.values import binding
from gpu_exporter.model.snapshot import Reading

# (choke-point key, family, call): each call returns [percent, sampling period in µs] (nvml.h).
CODECS: tuple[tuple[str, str, str], ...] = (
    ("encoder_utilization", "gpu_encoder_utilization_ratio", "nvmlDeviceGetEncoderUtilization"),
    ("decoder_utilization", "gpu_decoder_utilization_ratio", "nvmlDeviceGetDecoderUtilization"),
)


class Utilization(Collector):
    name = "utilization"
    families = (
        "gpu_utilization_ratio",
        "gpu_memory_utilization_ratio",
        *(family for _, family, _ in CODECS),
    )
    calls = ("nvmlDeviceGetUtilizationRates", *(call for _, _, call in CODECS))
    # NOT_SUPPORTED while MIG is on: learned afresh when the mode changes.
    mig_dependent = ("utilization", *(key for key, _, _ in CODECS))

    def read(self, nvml: Device) -> list[Reading]:
        out = []
        util = nvml.call("utilization", N.nvmlDeviceGetUtilizationRates, nvml.handle)
        if util is not None:
            out += [
                Reading("gpu_utilization_ratio", util.gpu / 100.0),
                Reading("gpu_memory_utilization_ratio", util.memory / 100.0),
            ]
        for key, family, call in CODECS:
            codec = nvml.call(key, binding(call), nvml.handle)
            if codec is not None:
                out.append(Reading(family, codec[0] / 100.0))
        return out
