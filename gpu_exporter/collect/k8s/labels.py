"""Pod attribution -> exporter labels and readings (the glue between k8s/ and the sampler)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from gpu_exporter.collect.k8s.attribution import DeviceMap, PodAttribution, PodRef
from gpu_exporter.collect.k8s.dra import NOTHING, Claim, DraDevice, Resolved
from gpu_exporter.model.series import HOLDERS_LABEL
from gpu_exporter.model.snapshot import MINOR_NUMBER, DeviceSample, InstanceSample, Labels, Reading

# A shared GPU's `holders` label names at most this many containers, then "+N more": the label
# must stay a label (gpu_pod_info lists every holder, one series each).
MAX_HOLDERS_NAMED = 8


def pod_labels(pods: tuple[PodRef, ...]) -> Labels:
    """Labels for every series of a GPU: the pod's, when one container holds it; `holders`
    naming them all when several share it (time-slicing, MPS), so that an alert on the GPU
    blames none of them alone; gpu_pod_info lists each."""
    if not pods:
        return ()
    if len(pods) == 1:
        only = pods[0]
        return (("namespace", only.namespace), ("pod", only.pod), ("container", only.container))
    named = [f"{p.namespace}/{p.pod}/{p.container}" for p in pods[:MAX_HOLDERS_NAMED]]
    if len(pods) > MAX_HOLDERS_NAMED:
        named.append(f"+{len(pods) - MAX_HOLDERS_NAMED} more")
    return ((HOLDERS_LABEL, ",".join(named)),)


class PodsOfTick:
    """One kubelet map per tick: `process` (a sampler processor, both modes) adds
    gpu_pod_info{namespace,pod,container} 1 per pod holding the GPU (or MIG instance) and keeps
    the map it used; `labels` (the sampler's device labels, "labels" mode), called later in the
    same tick, answers from that same map — so gpu_pod_info and the pod labels never come from
    two different kubelet answers.

    A MIG instance is found under any of the ids the kubelet may give it (`instance_ids`), from
    the identity the sampler's enumeration already read: no NVML lookup, ever (dcgm-exporter
    resolved MIG ids through NVML on every scrape, issue 599)."""

    def __init__(
        self,
        attribution: PodAttribution,
        dra: Callable[[Mapping[DraDevice, tuple[Claim, ...]]], Resolved] = lambda _: NOTHING,
    ) -> None:
        self.attribution = attribution
        self.dra = dra  # DRA claims resolved to UUIDs (collect/k8s/dra_attribution.py)
        self._by_device: DeviceMap = {}
        self._by_instance: dict[str, tuple[PodRef, ...]] = {}  # mig uuid -> pods

    def process(self, devices: list[DeviceSample], _now: float) -> list[DeviceSample]:
        answer = self.attribution.snapshot()  # both maps of one kubelet answer
        resolved = self.dra(answer.claims)
        self._by_device = by_device = _merged(answer.by_device, resolved.holders)
        self._by_instance = {}
        out = []
        for device in devices:
            pods = by_device.get(device.uuid, ())
            instances = []
            for instance in device.instances:
                held = _pods_of_instance(by_device, device, instance)
                if held:
                    self._by_instance[instance.mig_uuid] = held
                    claims = _claim_info(resolved.claims.get(instance.mig_uuid, ()))
                    readings = instance.readings + _pod_info(held) + claims
                    instance = replace(instance, readings=readings)
                instances.append(instance)
            if pods or instances:
                claims = _claim_info(resolved.claims.get(device.uuid, ()))
                readings = device.readings + _pod_info(pods) + claims
                device = replace(device, readings=readings, instances=tuple(instances))
            out.append(device)
        return out

    def holders(self) -> Mapping[str, tuple[PodRef, ...]]:
        """GPU UUID or MIG UUID -> the containers holding it, from this tick's kubelet map."""
        return {**self._by_device, **self._by_instance}

    def labels(self) -> Mapping[str, Labels]:
        """GPU UUID or MIG UUID -> the pod labels of its series."""
        labels = {uuid: pod_labels(pods) for uuid, pods in self._by_device.items()}
        labels.update({uuid: pod_labels(pods) for uuid, pods in self._by_instance.items()})
        return labels


def instance_ids(device: DeviceSample, instance: InstanceSample) -> tuple[str, ...]:
    """Every id a device plugin may hand the kubelet for this MIG device: its MIG UUID (NVIDIA's
    k8s-device-plugin, R470 and newer drivers), `MIG-<parent uuid>/<gi>/<ci>` (the same plugin
    on older drivers) and GKE's `nvidia<minor>/gi<gi>` (its device node and GPU instance)."""
    gi, ci = instance.gpu_instance, instance.compute_instance
    ids = [instance.mig_uuid, f"MIG-{device.uuid}/{gi}/{ci}"]
    minor = device.info.get(MINOR_NUMBER)
    if minor is not None:
        ids.append(f"nvidia{minor}/gi{gi}")
    return tuple(ids)


def _pods_of_instance(
    by_device: DeviceMap, device: DeviceSample, instance: InstanceSample
) -> tuple[PodRef, ...]:
    found: set[PodRef] = set()
    for device_id in instance_ids(device, instance):
        found.update(by_device.get(device_id, ()))
    return tuple(sorted(found))


def _pod_info(pods: tuple[PodRef, ...]) -> tuple[Reading, ...]:
    return tuple(
        Reading(
            "gpu_pod_info",
            1.0,
            (("namespace", p.namespace), ("pod", p.pod), ("container", p.container)),
        )
        for p in pods
    )


def _merged(
    plugin: DeviceMap, claimed: Mapping[str, tuple[PodRef, ...]]
) -> Mapping[str, tuple[PodRef, ...]]:
    """The device plugin's holders and the DRA claims' in one map (a device may be both:
    a cluster moving from one to the other)."""
    if not claimed:
        return plugin
    merged = dict(plugin)
    for uuid, refs in claimed.items():
        merged[uuid] = tuple(sorted({*merged.get(uuid, ()), *refs}))
    return merged


def _claim_info(claims: tuple[tuple[Claim, DraDevice], ...]) -> tuple[Reading, ...]:
    return tuple(
        Reading(
            "gpu_pod_resourceclaim_info",
            1.0,
            (
                ("namespace", claim.holder.namespace),
                ("pod", claim.holder.pod),
                ("container", claim.holder.container),
                ("claim_namespace", claim.claim_namespace),
                ("resourceclaim_name", claim.claim_name),
                ("driver", device.driver),
                ("pool", device.pool),
                ("device", device.device),
            ),
        )
        for claim, device in claims
    )
