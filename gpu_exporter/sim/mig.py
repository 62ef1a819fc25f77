"""MIG layouts in scenario files: which GPU instances a simulated GPU has, and when.

A device's `mig:` mapping (docs/scenarios.md, "MIG") lists GPU instances by profile. Each has
a lifetime (`from`, `until`), so a reconfiguration is two entries: one that ends and one that
begins, possibly with the same GPU-instance id (NVML reuses ids at once). Each GPU instance
has 0..n compute instances; every compute instance is one MIG device, with its own MIG UUID
and its own slot among the parent's MIG device indices.

Profiles come from NVIDIA's MIG user guide (the supported-profiles tables for A100 80GB, H100
80GB and H200): GPU slices of 7 and SM counts as listed there; memory sizes are the profile's
nominal gigabytes in MiB, which is close to, not exactly, what nvmlDeviceGetAttributes reports.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, PlainValidator, field_validator, model_validator

from gpu_exporter.sim.fields import (
    Flag,
    Info,
    Seconds,
    Strict,
    Until,
    choice,
    context_of,
    each,
    error,
    error_at,
    int_in,
    integer,
    settle,
    until_after_from,
)
from gpu_exporter.sim.values import ValueSpec, complete, value_table

__all__ = [
    "INSTANCE_QUANTITIES",
    "MIG_PROFILES",
    "MigInstanceSpec",
    "MigSpec",
    "mig_device_name",
]

MIB = 1024**2
GPU_SLICES = 7  # A100, A30 has 4; every model below has 7

# The quantities an instance's `values` may set: what NVML reads per MIG device (memory) and
# per GPU instance (GPM activity). Everything else is the parent's.
INSTANCE_QUANTITIES = (
    "memory_used_bytes",
    "graphics_active",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "fp64_active",
    "fp32_active",
    "fp16_active",
    "int_active",
)


@dataclass(frozen=True)
class MigProfile:
    name: str  # "1g.18gb"
    gpu_slices: int
    multiprocessors: int
    memory_gb: int

    @property
    def memory_bytes(self) -> int:
        return self.memory_gb * 1000**3 // MIB * MIB


def _profiles(*rows: tuple[str, int, int]) -> Mapping[str, MigProfile]:
    out = {}
    for name, slices, sms in rows:
        memory = int(name.split(".")[1].removesuffix("gb"))
        out[name] = MigProfile(name, slices, sms, memory)
    return out


# model -> GPU-instance profiles (name, GPU slices, SMs)
MIG_PROFILES: Mapping[str, Mapping[str, MigProfile]] = {
    "NVIDIA H200": _profiles(
        ("1g.18gb", 1, 16),
        ("1g.35gb", 1, 16),
        ("2g.35gb", 2, 32),
        ("3g.71gb", 3, 60),
        ("4g.71gb", 4, 64),
        ("7g.141gb", 7, 132),
    ),
    "NVIDIA H100 80GB HBM3": _profiles(
        ("1g.10gb", 1, 16),
        ("1g.20gb", 1, 16),
        ("2g.20gb", 2, 32),
        ("3g.40gb", 3, 60),
        ("4g.40gb", 4, 64),
        ("7g.80gb", 7, 132),
    ),
    "NVIDIA A100-SXM4-80GB": _profiles(
        ("1g.10gb", 1, 14),
        ("1g.20gb", 1, 14),
        ("2g.20gb", 2, 28),
        ("3g.40gb", 3, 42),
        ("4g.40gb", 4, 56),
        ("7g.80gb", 7, 98),
    ),
}


def _profile(value: Any, info: Info) -> MigProfile:
    profiles: Mapping[str, MigProfile] = context_of(info)["mig_profiles"]
    return profiles[choice(value, profiles)]


class MigInstanceSpec(Strict):
    """One GPU instance and its compute instances (each a MIG device)."""

    profile: Annotated[MigProfile, PlainValidator(_profile)]
    gpu_instance: Annotated[int, int_in(0, 63)] = 0  # not given: position + 1
    compute_instances: int = 1  # 0: a GPU instance without a compute instance (no MIG device)
    slots: tuple[Annotated[int, int_in(0, 63)], ...] = ()  # MIG device index of each; not
    # given: the lowest free at its start (MigSpec places them)
    start: Seconds = Field(default=0.0, alias="from")
    until: Until = None
    values: Annotated[Mapping[str, ValueSpec], value_table(INSTANCE_QUANTITIES)] = Field(
        default_factory=dict
    )

    if TYPE_CHECKING:  # set at validation, not written in the file
        position: int  # in the scenario's list: tells generations apart
        mig_uuids: tuple[str, ...]  # one per compute instance

    @field_validator("compute_instances", mode="plain")
    @classmethod
    def _split(cls, value: Any, info: Info) -> int:
        profile = info.data.get("profile")
        count = integer(value, lo=0, hi=profile.gpu_slices if profile else None)
        if profile and count > 1 and profile.gpu_slices % count:
            raise error(
                f"{profile.gpu_slices} GPU slices do not split into {count} equal compute instances"
            )
        return count

    @field_validator("slots")
    @classmethod
    def _one_per_compute_instance(cls, slots: tuple[int, ...], info: Info) -> tuple[int, ...]:
        count = info.data.get("compute_instances")
        if count is not None and len(slots) != count:
            raise error(f"expected {count} slots, one per compute instance")
        return slots

    _after_start = field_validator("until")(until_after_from)

    @model_validator(mode="after")
    def _identify(self, info: Info) -> MigInstanceSpec:
        context = context_of(info)
        position = context["position"]
        key = f"{context['device_key']}:{position}"
        settle(
            self,
            position=position,
            mig_uuids=tuple(_mig_uuid(f"{key}:{ci}") for ci in range(self.compute_instances)),
            values=complete(self.values, {}),
        )
        if "gpu_instance" not in self.model_fields_set:
            settle(self, gpu_instance=position + 1)
        return self

    def live(self, t: float) -> bool:
        return t >= self.start and (self.until is None or t < self.until)

    @property
    def compute_slices(self) -> int:
        return self.profile.gpu_slices // max(1, self.compute_instances)

    def compute_profile(self) -> str:
        """The MIG device's profile: the GPU instance's, or `<c>c.<gi profile>` for a compute
        instance that does not span its GPU instance."""
        if self.compute_instances <= 1:
            return self.profile.name
        return f"{self.compute_slices}c.{self.profile.name}"


def _instances(value: Any, info: Info) -> tuple[MigInstanceSpec, ...]:
    context = context_of(info)

    def position(i: int) -> dict[str, Any]:
        return {"position": i, "noise_prefix": f"{context['seed']}:{context['device_key']}:mig{i}"}

    return each(MigInstanceSpec, value, context, position)


class MigSpec(Strict):
    """A device's `mig:` (validated with the device's model's profiles in the context)."""

    enabled: Flag = True
    pending: Flag = True  # not given: = enabled
    max_devices: Annotated[int, int_in(1, 64)] = 7
    monitor_capability: Flag = False  # NVIDIA_MIG_MONITOR_DEVICES: parent aggregates readable
    instances: Annotated[tuple[MigInstanceSpec, ...], PlainValidator(_instances)] = ()

    @model_validator(mode="after")
    def _layout(self) -> MigSpec:
        if "pending" not in self.model_fields_set:
            settle(self, pending=self.enabled)
        _place(self.instances, self.max_devices)
        _check_layouts(self)
        return self

    def live(self, t: float) -> tuple[MigInstanceSpec, ...]:
        return tuple(i for i in self.instances if self.enabled and i.live(t))

    def changes(self) -> tuple[float, ...]:
        """Times at which the layout changes (MIG config change events)."""
        times = {i.start for i in self.instances if i.start > 0}
        times |= {i.until for i in self.instances if i.until is not None}
        return tuple(sorted(times))


def mig_device_name(model: str, instance: MigInstanceSpec) -> str:
    """nvmlDeviceGetName of a MIG device: the parent's name, " MIG ", the profile."""
    return f"{model} MIG {instance.compute_profile()}"


def _mig_uuid(key: str) -> str:
    h = hashlib.sha256(key.encode()).hexdigest()
    return f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _overlap(a: MigInstanceSpec, b: MigInstanceSpec) -> bool:
    a_end = float("inf") if a.until is None else a.until
    b_end = float("inf") if b.until is None else b.until
    return a.start < b_end and b.start < a_end


def _place(instances: tuple[MigInstanceSpec, ...], max_devices: int) -> None:
    """Slots for compute instances that give none: the lowest free at their start."""
    for i, inst in enumerate(instances):
        if not inst.slots and inst.compute_instances:
            taken = {s for other in instances[:i] if _overlap(other, inst) for s in other.slots}
            free = [s for s in range(max_devices) if s not in taken]
            if len(free) < inst.compute_instances:
                raise error(f"more MIG devices than max_devices ({max_devices})")
            settle(inst, slots=tuple(free[: inst.compute_instances]))


def _check_layouts(spec: MigSpec) -> None:
    """At no time may two live GPU instances share an id or a slot, or hold over 7 slices."""
    for i, inst in enumerate(spec.instances):
        at = ("instances", i)
        if any(s >= spec.max_devices for s in inst.slots):
            raise error_at(at, f"a slot is not below max_devices ({spec.max_devices})")
        for j, other in enumerate(spec.instances[:i]):
            if not _overlap(inst, other):
                continue
            if inst.gpu_instance == other.gpu_instance:
                raise error_at(
                    at,
                    f"gpu_instance {inst.gpu_instance} is also instances[{j}]'s at the same time",
                )
            if set(inst.slots) & set(other.slots):
                raise error_at(at, f"a slot of instances[{j}] is used at the same time")
        starts = {inst.start, *(o.start for o in spec.instances if _overlap(o, inst))}
        for t in starts:
            used = sum(o.profile.gpu_slices for o in spec.instances if o.live(t))
            if inst.live(t) and used > GPU_SLICES:
                raise error_at(
                    at, f"the GPU instances live at {t:g} s hold {used} GPU slices, more than 7"
                )
