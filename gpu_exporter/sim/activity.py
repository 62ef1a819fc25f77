"""The scenario quantity behind each activity quantity (gpu_exporter/model/activity.py).

The fake NVML's GPM and the fake libdcgm's profiling fields both serve activity through this
one mapping, so a scenario's activity reads the same through either source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from gpu_exporter.model import activity as a
from gpu_exporter.model.activity import Activity

# Scenario quantities (scenario.QUANTITIES), ratios of 0..1; every activity quantity but HMMA's.
QUANTITIES: Mapping[Activity, str] = MappingProxyType(
    {
        a.GRAPHICS_ACTIVE: "graphics_active",
        a.SM_ACTIVE: "sm_active",
        a.SM_OCCUPANCY: "sm_occupancy",
        a.TENSOR_ACTIVE: "tensor_active",
        a.DRAM_ACTIVE: "dram_active",
        a.FP64_ACTIVE: "fp64_active",
        a.FP32_ACTIVE: "fp32_active",
        a.FP16_ACTIVE: "fp16_active",  # HMMA excluded, as DCGM's FP16 pipe field
        a.INT_ACTIVE: "int_active",
        a.IMMA_ACTIVE: "tensor_imma_active",
        a.DFMA_ACTIVE: "tensor_dfma_active",
    }
)
# HMMA (FP16/BF16 matrix work) has no quantity of its own: hmma_share.
HMMA = a.HMMA_ACTIVE


def hmma_share(value: Callable[[str], float]) -> float:
    """HMMA's activity, from `value` of the other quantities: what tensor_active leaves after
    the IMMA and DFMA pipes, at least 0 (the pipes are taken to be busy at different times, so
    their shares add up to tensor_active)."""
    busy = value(QUANTITIES[a.TENSOR_ACTIVE]) - value(QUANTITIES[a.IMMA_ACTIVE])
    return max(0.0, busy - value(QUANTITIES[a.DFMA_ACTIVE]))
