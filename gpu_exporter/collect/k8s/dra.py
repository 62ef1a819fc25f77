"""Dynamic Resource Allocation: what the kubelet says a container was allocated through a
ResourceClaim, and what the node's ResourceSlices say that device is.

The kubelet's PodResources v1 API reports a DRA device as `ContainerResources.dynamic_resources`:
the claim (`claim_name`, the ResourceClaim object's name, and `claim_namespace`) and, per
allocated device, `driver_name`, `pool_name` and `device_name` ("the driver name/pool name/device
name triplet uniquely identifies the device": kubernetes pkg/kubelet/apis/podresources/v1
api.proto). The triplet names no GPU: the driver's ResourceSlices (`resource.k8s.io`) publish
each device of a pool with its attributes, and NVIDIA's DRA driver (`gpu.nvidia.com`) gives a
whole GPU `type: gpu` and `uuid: GPU-...`, a MIG device `type: mig`, `uuid: MIG-...`,
`parentUUID` and `profile` (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go). Devices
are matched on `uuid`, never on the name or an index (the names changed between the driver's
releases; `index` was dropped in v25.8).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from gpu_exporter.collect.k8s.pod_ref import PodRef


class DraDevice(NamedTuple):
    """One device as DRA names it: unique on the cluster."""

    driver: str
    pool: str
    device: str


class Claim(NamedTuple):
    """A container's allocation of a device through a ResourceClaim."""

    holder: PodRef
    claim_namespace: str
    claim_name: str  # the ResourceClaim object's name (a template's generated name)


@dataclass(frozen=True)
class SliceDevice:
    """What a ResourceSlice publishes of a device, as far as the exporter reads it."""

    uuid: str  # `uuid`: GPU-... or MIG-...; "" when the device publishes none
    kind: str = ""  # `type`: gpu, mig, vfio, ... ("" when absent)
    parent_uuid: str = ""  # `parentUUID` of a MIG device
    profile: str = ""  # `profile` of a MIG device, e.g. 1g.10gb


@dataclass(frozen=True)
class Resolved:
    """The claims of one moment, resolved to the GPUs and MIG devices the node has.

    `holders`: GPU or MIG UUID -> the containers holding it through a claim (sorted), merged
    with the device plugin's map by the caller. `claims`: UUID -> (claim, device) pairs, for the
    join series. `unresolved`: devices the kubelet reports allocated that no ResourceSlice of
    the node publishes with a `uuid` (its driver's slice not read yet, or gone): counted, never
    guessed."""

    holders: Mapping[str, tuple[PodRef, ...]]
    claims: Mapping[str, tuple[tuple[Claim, DraDevice], ...]]
    unresolved: tuple[DraDevice, ...]


def resolve(
    claims: Mapping[DraDevice, tuple[Claim, ...]], slices: Mapping[DraDevice, SliceDevice]
) -> Resolved:
    holders: dict[str, set[PodRef]] = {}
    by_uuid: dict[str, set[tuple[Claim, DraDevice]]] = {}
    unresolved = []
    for device, held in claims.items():
        published = slices.get(device)
        if published is None or not published.uuid:
            unresolved.append(device)
            continue
        holders.setdefault(published.uuid, set()).update(claim.holder for claim in held)
        by_uuid.setdefault(published.uuid, set()).update((claim, device) for claim in held)
    return Resolved(
        MappingProxyType({uuid: tuple(sorted(refs)) for uuid, refs in sorted(holders.items())}),
        MappingProxyType({uuid: tuple(sorted(pairs)) for uuid, pairs in sorted(by_uuid.items())}),
        tuple(sorted(unresolved)),
    )


NOTHING = Resolved(MappingProxyType({}), MappingProxyType({}), ())
