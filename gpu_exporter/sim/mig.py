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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_exporter.sim.scenario import ValueSpec, _Node

__all__ = [
    "INSTANCE_QUANTITIES",
    "MIG_PROFILES",
    "MigInstanceSpec",
    "MigSpec",
    "mig_device_name",
    "parse_mig",
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


@dataclass(frozen=True)
class MigInstanceSpec:
    """One GPU instance and its compute instances (each a MIG device)."""

    position: int  # in the scenario's list: tells generations apart
    profile: MigProfile
    gpu_instance: int
    compute_instances: int  # 0: a GPU instance without a compute instance (no MIG device)
    slots: tuple[int, ...]  # MIG device index of each compute instance
    mig_uuids: tuple[str, ...]  # one per compute instance
    start: float
    until: float | None
    values: Mapping[str, ValueSpec]

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


@dataclass(frozen=True)
class MigSpec:
    enabled: bool
    pending: bool
    max_devices: int
    monitor_capability: bool  # NVIDIA_MIG_MONITOR_DEVICES: parent aggregates readable
    instances: tuple[MigInstanceSpec, ...]

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


_KEYS = frozenset({"enabled", "pending", "max_devices", "monitor_capability", "instances"})
_INSTANCE_KEYS = frozenset(
    {"profile", "gpu_instance", "compute_instances", "slots", "from", "until", "values"}
)


def parse_mig(
    node: _Node,
    model: str,
    device_key: str,
    parse_values: Callable[[dict[str, _Node], str], Mapping[str, ValueSpec]],
) -> MigSpec:
    """A device's `mig:` mapping; `device_key` makes MIG UUIDs unique per scenario and GPU."""
    profiles = MIG_PROFILES.get(model)
    if profiles is None:
        known = ", ".join(MIG_PROFILES)
        raise node.error(f"no MIG profiles known for model {model!r} (known: {known})")
    keys = node.mapping(_KEYS)
    enabled = keys["enabled"].boolean() if "enabled" in keys else True
    pending = keys["pending"].boolean() if "pending" in keys else enabled
    max_devices = keys["max_devices"].integer(lo=1, hi=64) if "max_devices" in keys else 7
    monitor = keys["monitor_capability"].boolean() if "monitor_capability" in keys else False
    entries = keys["instances"].seq() if "instances" in keys else []
    instances = tuple(
        _parse_instance(entry, position, profiles, device_key, parse_values)
        for position, entry in enumerate(entries)
    )
    spec = MigSpec(enabled, pending, max_devices, monitor, _placed(instances, max_devices, node))
    _check_layouts(spec, entries)
    return spec


def _parse_instance(
    node: _Node,
    position: int,
    profiles: Mapping[str, MigProfile],
    device_key: str,
    parse_values: Callable[[dict[str, _Node], str], Mapping[str, ValueSpec]],
) -> MigInstanceSpec:
    keys = node.mapping(_INSTANCE_KEYS, required=("profile",))
    profile = profiles[keys["profile"].choice(frozenset(profiles))]
    gi = keys["gpu_instance"].integer(lo=0, hi=63) if "gpu_instance" in keys else position + 1
    cis = (
        keys["compute_instances"].integer(lo=0, hi=profile.gpu_slices)
        if "compute_instances" in keys
        else 1
    )
    if cis > 1 and profile.gpu_slices % cis:
        raise keys["compute_instances"].error(
            f"{profile.gpu_slices} GPU slices do not split into {cis} equal compute instances"
        )
    slots: tuple[int, ...] = ()
    if "slots" in keys:
        slots = tuple(n.integer(lo=0, hi=63) for n in keys["slots"].seq())
        if len(slots) != cis:
            raise keys["slots"].error(f"expected {cis} slots, one per compute instance")
    start = keys["from"].number(lo=0) if "from" in keys else 0.0
    until = keys["until"].number(lo=0) if "until" in keys else None
    if until is not None and until <= start:
        raise keys["until"].error("`until` must be after `from`")
    values = keys["values"].mapping(frozenset(INSTANCE_QUANTITIES)) if "values" in keys else {}
    uuids = tuple(_mig_uuid(f"{device_key}:{position}:{ci}") for ci in range(cis))
    return MigInstanceSpec(
        position=position,
        profile=profile,
        gpu_instance=gi,
        compute_instances=cis,
        slots=slots,
        mig_uuids=uuids,
        start=start,
        until=until,
        values=parse_values(values, f"{device_key}:mig{position}"),
    )


def _overlap(a: MigInstanceSpec, b: MigInstanceSpec) -> bool:
    a_end = float("inf") if a.until is None else a.until
    b_end = float("inf") if b.until is None else b.until
    return a.start < b_end and b.start < a_end


def _placed(
    instances: tuple[MigInstanceSpec, ...], max_devices: int, node: _Node
) -> tuple[MigInstanceSpec, ...]:
    """Slots for compute instances that give none: the lowest free at their start."""
    out: list[MigInstanceSpec] = []
    for inst in instances:
        if not inst.slots and inst.compute_instances:
            taken = {s for other in out if _overlap(other, inst) for s in other.slots}
            free = [s for s in range(max_devices) if s not in taken]
            if len(free) < inst.compute_instances:
                raise node.error(f"more MIG devices than max_devices ({max_devices})")
            inst = _with_slots(inst, tuple(free[: inst.compute_instances]))
        out.append(inst)
    return tuple(out)


def _with_slots(inst: MigInstanceSpec, slots: tuple[int, ...]) -> MigInstanceSpec:
    fields: dict[str, Any] = {**inst.__dict__, "slots": slots}
    return MigInstanceSpec(**fields)


def _check_layouts(spec: MigSpec, entries: list[_Node]) -> None:
    """At no time may two live GPU instances share an id or a slot, or hold over 7 slices."""
    for i, inst in enumerate(spec.instances):
        if any(s >= spec.max_devices for s in inst.slots):
            raise entries[i].error(f"a slot is not below max_devices ({spec.max_devices})")
        for j, other in enumerate(spec.instances[:i]):
            if not _overlap(inst, other):
                continue
            if inst.gpu_instance == other.gpu_instance:
                raise entries[i].error(
                    f"gpu_instance {inst.gpu_instance} is also instances[{j}]'s at the same time"
                )
            if set(inst.slots) & set(other.slots):
                raise entries[i].error(f"a slot of instances[{j}] is used at the same time")
        starts = {inst.start, *(o.start for o in spec.instances if _overlap(o, inst))}
        for t in starts:
            used = sum(o.profile.gpu_slices for o in spec.instances if o.live(t))
            if inst.live(t) and used > GPU_SLICES:
                raise entries[i].error(
                    f"the GPU instances live at {t:g} s hold {used} GPU slices, more than 7"
                )
