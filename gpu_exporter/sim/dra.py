"""How the simulated node's DRA driver names and describes its devices: one definition for the
fake kubelet's `dynamic_resources` and the fake API server's ResourceSlices.

Names follow NVIDIA's DRA driver (k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin): a whole GPU is
`gpu-<minor>`; a MIG device `gpu-<parent minor>-mig-<profile without dots>-<n>-<first slot>`,
where the driver's `<n>` is the GPU-instance profile's id and the fake's is the GPU instance's
id (the fake has no profile ids; the exporter never parses names: it matches `uuid`). The
fake's minor number is the GPU's index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_exporter.sim.mig import MigInstanceSpec

DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver, the default of a scenario's claims


def gpu_device_name(index: int) -> str:
    return f"gpu-{index}"


def mig_device_name(index: int, instance: MigInstanceSpec, compute_instance: int = 0) -> str:
    profile = instance.compute_profile().replace(".", "")
    slot = instance.slots[compute_instance] if instance.slots else 0
    return f"gpu-{index}-mig-{profile}-{instance.gpu_instance}-{slot}"


def gpu_attributes(uuid: str, product: str) -> dict[str, Any]:
    """A whole GPU's attributes, as ResourceSlice JSON (`{"string": ...}` values)."""
    return {
        "type": {"string": "gpu"},
        "uuid": {"string": uuid},
        "productName": {"string": product},
    }


def mig_attributes(uuid: str, parent_uuid: str, profile: str, product: str) -> dict[str, Any]:
    return {
        "type": {"string": "mig"},
        "uuid": {"string": uuid},
        "parentUUID": {"string": parent_uuid},
        "profile": {"string": profile},
        "productName": {"string": product},
    }
