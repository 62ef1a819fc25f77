"""The activity quantities (SM, tensor, DRAM and pipe activity): one row each, written once.

A row names the family (and labels) the exporter reports the quantity as, the NVML GPM metric
that measures it on Hopper and newer, and the DCGM profiling field that measures it before
Hopper, paired as DCGM itself pairs them (NVIDIA/DCGM dcgmlib/src/dcgm_fields.cpp,
DcgmFieldIdToNvmlGpmMetricId): the same quantity, a percentage from GPM and a ratio from DCGM,
reported as a ratio of 0..1 either way. The GPM collector, the DCGM source and its settings, the
dcgm-exporter compatible output and the simulator's fakes all read this table.

Standard library only, like nvml_facts.py: the numbers are NVIDIA's, written as numbers (GPM
metric ids from nvml.h, NVML_GPM_METRIC_*; field ids from DCGM's dcgmlib/dcgm_fields.h);
tests/test_activity.py checks the GPM ones against the installed nvidia-ml-py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpu_exporter.model.snapshot import Labels

# Present (value 1) while a device's activity is measured but has no value yet, so that rules
# can tell "not sampled yet" from "not available". NVML GPM diffs two samples taken at least
# 100 ms apart (nvml.h, nvmlGpmMetricsGet), so the tick that takes a window's first sample (at
# start, after a driver re-init or a MIG change) has none; DCGM answers DCGM_ST_NO_DATA for a
# watched field before its first update cycle (dcgm_structs.h).
AWAITED_FAMILY = "gpu_activity_awaited"


@dataclass(frozen=True, slots=True)
class Activity:
    """One activity quantity, and how each source names it."""

    family: str
    labels: Labels
    gpm_metric: int  # nvml.h NVML_GPM_METRIC_<gpm_name>
    gpm_name: str
    dcgm_field: int  # dcgm_fields.h <dcgm_name>
    # As DCGM 4.5 and dcgm-exporter's counter files spell it; DCGM 4.6 renamed the profiling
    # fields (DCGM_FI_PROF_SM_ACTIVE is now an alias of DCGM_FI_PROF_SM_UTIL_RATIO).
    dcgm_name: str
    # Watched by default (dcgm.fields): the activity the classifier and the rules read. The
    # tensor-pipe and integer fields are opt-in: before Hopper DCGM multiplexes shared
    # counters, and "some groups cannot be watched concurrently" (DCGM profiling docs).
    dcgm_default: bool


def _pipe(pipe: str) -> Labels:
    return (("pipe", pipe),)


GRAPHICS_ACTIVE = Activity(
    "gpu_graphics_engine_active_ratio", (), 1, "GRAPHICS_UTIL",
    1001, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", True,
)  # fmt: skip
SM_ACTIVE = Activity(
    "gpu_sm_active_ratio", (), 2, "SM_UTIL",
    1002, "DCGM_FI_PROF_SM_ACTIVE", True,
)  # fmt: skip
SM_OCCUPANCY = Activity(
    "gpu_sm_occupancy_ratio", (), 3, "SM_OCCUPANCY",
    1003, "DCGM_FI_PROF_SM_OCCUPANCY", True,
)  # fmt: skip
TENSOR_ACTIVE = Activity(
    "gpu_tensor_active_ratio", (), 5, "ANY_TENSOR_UTIL",
    1004, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", True,
)  # fmt: skip
DRAM_ACTIVE = Activity(
    "gpu_dram_active_ratio", (), 10, "DRAM_BW_UTIL",
    1005, "DCGM_FI_PROF_DRAM_ACTIVE", True,
)  # fmt: skip
FP64_ACTIVE = Activity(
    "gpu_pipe_active_ratio", _pipe("fp64"), 11, "FP64_UTIL",
    1006, "DCGM_FI_PROF_PIPE_FP64_ACTIVE", True,
)  # fmt: skip
FP32_ACTIVE = Activity(
    "gpu_pipe_active_ratio", _pipe("fp32"), 12, "FP32_UTIL",
    1007, "DCGM_FI_PROF_PIPE_FP32_ACTIVE", True,
)  # fmt: skip
FP16_ACTIVE = Activity(
    "gpu_pipe_active_ratio", _pipe("fp16"), 13, "FP16_UTIL",
    1008, "DCGM_FI_PROF_PIPE_FP16_ACTIVE", True,
)  # fmt: skip
INT_ACTIVE = Activity(
    "gpu_pipe_active_ratio", _pipe("int"), 4, "INTEGER_UTIL",
    1016, "DCGM_FI_PROF_PIPE_INT_ACTIVE", False,
)  # fmt: skip
HMMA_ACTIVE = Activity(
    "gpu_tensor_pipe_active_ratio", _pipe("hmma"), 7, "HMMA_TENSOR_UTIL",
    1014, "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", False,
)  # fmt: skip
IMMA_ACTIVE = Activity(
    "gpu_tensor_pipe_active_ratio", _pipe("imma"), 9, "IMMA_TENSOR_UTIL",
    1013, "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", False,
)  # fmt: skip
DFMA_ACTIVE = Activity(
    "gpu_tensor_pipe_active_ratio", _pipe("dfma"), 6, "DFMA_TENSOR_UTIL",
    1015, "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", False,
)  # fmt: skip

# In the order the GPM collector reads and reports them.
ACTIVITY: tuple[Activity, ...] = (
    GRAPHICS_ACTIVE,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    DRAM_ACTIVE,
    FP64_ACTIVE,
    FP32_ACTIVE,
    FP16_ACTIVE,
    INT_ACTIVE,
    HMMA_ACTIVE,
    IMMA_ACTIVE,
    DFMA_ACTIVE,
)
# By DCGM field id, in id order (the order DCGM's fields are listed and watched in).
BY_DCGM_FIELD: Mapping[int, Activity] = MappingProxyType(
    {a.dcgm_field: a for a in sorted(ACTIVITY, key=lambda a: a.dcgm_field)}
)
BY_DCGM_NAME: Mapping[str, Activity] = MappingProxyType(
    {a.dcgm_name: a for a in BY_DCGM_FIELD.values()}
)
