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

from dataclasses import dataclass
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
