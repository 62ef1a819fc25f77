"""MIG GPU instances in the DCGM source: which DCGM entities to watch, and their activity onto
the tick's MIG instances.

On a GPU with MIG enabled, DCGM gives its profiling fields per GPU instance: they are watched
on the instance's own entity (DCGM_FE_GPU_I). Their "entity level" in DCGM 4.6.0
dcgmlib/src/dcgm_fields.cpp says where a field exists: GPU_CI for 1001-1004, 1006-1008 and
1013-1016 (at the GPU, GPU instance or compute instance), GPU_I for 1005 (DRAM: at the GPU or
GPU instance). Every activity field is therefore a GPU instance's own, and none is the
parent's value repeated.

DCGM numbers its GPU-instance entities itself, in enumeration order, and numbers them again
after each MIG reconfiguration (dcgm_api.MigEntity), so an entity id means nothing without
the hierarchy read with it: dcgmGetGpuInstanceHierarchy pairs each entity with NVML's
GPU-instance id (`nvmlInstanceId`) and the parent's UUID, and that pair is how its values
reach the NVML instance of the same id. The source reads the hierarchy when it sets up its
watch and again before every read, and sets the watch up anew when the pairing changed.

Watched are the GPU instances with exactly one compute instance: one without a compute
instance has no MIG device (no series), and no data either where DCGM says (its GPM path,
DCGM 4.6.0 DcgmGpmManager.cpp: "No data available"); one split into several compute
instances has activity of its own, but no series
of its own: its compute instances' series are the MIG devices, and the instance's activity
would be repeated on each, so it stays absent there, as with NVML GPM (collect/nvml/
collectors/mig.py).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gpu_exporter.collect import dcgm_api as api
from gpu_exporter.model.activity import AWAITED_FAMILY
from gpu_exporter.model.snapshot import DeviceSample, InstanceSample, Reading

# A GPU instance as the tick's samples name it: (parent GPU UUID, NVML GPU-instance id).
InstanceKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class WatchedInstance:
    """The NVML GPU instance a DCGM GPU-instance entity is, as the hierarchy said."""

    gpu_uuid: str
    gpu_instance: int
    slices: int  # of its profile: must match NVML's for the values to be given to it

    @property
    def key(self) -> InstanceKey:
        return (self.gpu_uuid, self.gpu_instance)


@dataclass(frozen=True, slots=True)
class InstanceActivity:
    """One GPU instance's activity from DCGM in one read."""

    slices: int
    readings: tuple[Reading, ...]


def watched_instances(
    hierarchy: Iterable[api.MigEntity], parents: Collection[str]
) -> dict[int, WatchedInstance]:
    """DCGM entity id -> NVML GPU instance, for the GPU instances of the GPUs with these UUIDs
    that have exactly one compute instance (the module docstring says why)."""
    rows = list(hierarchy)
    compute_instances = Counter(
        row.parent_id
        for row in rows
        if row.entity_group == api.FE_GPU_CI and row.parent_group == api.FE_GPU_I
    )
    return {
        row.entity_id: WatchedInstance(row.gpu_uuid, row.gpu_instance, row.slices)
        for row in rows
        if row.entity_group == api.FE_GPU_I
        and row.gpu_uuid in parents
        and compute_instances[row.entity_id] == 1
    }


def listed_parents(hierarchy: Iterable[api.MigEntity]) -> set[str]:
    """The GPUs of which DCGM lists at least one GPU instance."""
    return {row.gpu_uuid for row in hierarchy if row.entity_group == api.FE_GPU_I}


def with_instance_activity(
    sample: DeviceSample, activity: Mapping[InstanceKey, InstanceActivity]
) -> tuple[DeviceSample, bool]:
    """`sample` (a MIG-enabled GPU) with DCGM's activity on its MIG instances, and whether any
    instance got some. An instance gets its GPU instance's activity only when it is that GPU
    instance's one compute instance and NVML's slice count (gpu_mig_instance_slices) agrees
    with DCGM's: a GPU-instance id reused at once by a reconfiguration that one of the two
    has not seen yet must not give one instance's activity to another."""
    given = False
    instances = []
    for instance in sample.instances:
        found = activity.get((sample.uuid, instance.gpu_instance))
        # An instance not read this tick (its identity unknown) is listed without values.
        if found is None or not instance.up or instance.shared or not _same_size(instance, found):
            instances.append(instance)
            continue
        given = given or any(r.family != AWAITED_FAMILY for r in found.readings)
        readings = (*instance.readings, *found.readings)
        instances.append(dataclasses.replace(instance, readings=readings))
    return (dataclasses.replace(sample, instances=tuple(instances)) if given else sample), given


def awaiting_activity(sample: DeviceSample) -> DeviceSample:
    """`sample` (a MIG-enabled GPU that needs DCGM from the next tick on: GPM was just learned
    unsupported on it) with its instances' activity marked awaited, as it is while DCGM has no
    first value. Instances split in several compute instances never get any and stay as
    they are."""
    awaited = Reading(AWAITED_FAMILY, 1.0)
    instances = tuple(
        instance
        if not instance.up or instance.shared or instance.value("gpu_sm_active_ratio") is not None
        else dataclasses.replace(instance, readings=(*instance.readings, awaited))
        for instance in sample.instances
    )
    return dataclasses.replace(sample, instances=instances)


def has_instance_activity(sample: DeviceSample) -> bool:
    """Whether any MIG instance of `sample` has SM activity (from GPM)."""
    return any(i.value("gpu_sm_active_ratio") is not None for i in sample.instances)


def _same_size(instance: InstanceSample, found: InstanceActivity) -> bool:
    slices = instance.value("gpu_mig_instance_slices")
    return slices is None or int(slices) == found.slices
