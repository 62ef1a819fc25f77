"""Which pod holds which GPU: the kubelet PodResources v1 API, polled on its own thread.

The kubelet serves `List()` on a unix socket (default
/var/lib/kubelet/pod-resources/kubelet.sock). Every container's devices of the configured
resources (`nvidia.com/gpu`, `nvidia.com/mig-*`, extras) are mapped device id -> pods; with
`kubernetes.dra` on, its devices allocated through ResourceClaims (`dynamic_resources`) by the
configured DRA drivers are mapped (driver, pool, device) -> claims (`map_claims`). Both maps are
rebuilt from one List() every `refresh_seconds` on a background thread and swapped in together,
atomically, so a scrape only ever reads a finished, immutable snapshot and never waits on the
kubelet.

Device ids, as the NVIDIA device plugin reports them to the kubelet (its internal/rm/devices.go
and api/config/v1/replicas.go): the device's UUID, `GPU-<uuid>` or `MIG-<uuid>` (older drivers:
`MIG-GPU-<uuid>/<gi>/<ci>`), whatever `deviceIDStrategy` is (that flag only changes what the
plugin hands to the container). With time-slicing or MPS sharing each physical device is
advertised `replicas` times as `<uuid>::<n>`; we strip `::<n>` so every replica lands on the
physical device, and pods sharing it are listed together. Anything else (an index such as
"0", another plugin's naming) is kept as given, so a consumer can still match it.

DRA devices, as the kubelet reports them (kubernetes pkg/kubelet/apis/podresources/v1 api.proto,
`ContainerResources.dynamic_resources`; filled in since Kubernetes 1.34 by default, feature gate
`KubeletPodResourcesDynamicResources`, alpha since 1.27): per container, each ResourceClaim it
uses (`claim_name`, `claim_namespace`) with the devices allocated to it, each named by its
`driver_name`/`pool_name`/`device_name` triplet. A claim shared by several pods is reported in
each of them; a device shared through consumable capacity carries a `share_id`, which we ignore:
every claim on the device is listed. Which GPU a triplet is, only the driver's ResourceSlices say
(collect/k8s/dra.py).

A failed refresh (socket missing, kubelet restarting or hung, any error) keeps the last maps for a
grace period, `stale_after_seconds` after the last success (3 refresh intervals unless set), and
only then clears them: one failure does not end and restart every per-GPU series. Meanwhile
`gpu_exporter_attribution_up` is 0 and the last success timestamp says how old the map is.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpu_exporter.collect.k8s.dra import Claim, DraDevice
from gpu_exporter.collect.k8s.pod_ref import PodRef
from gpu_exporter.collect.k8s.podresources.v1 import api_pb2
from gpu_exporter.collect.k8s.rpc import RpcError, StatusCode, UnixChannel
from gpu_exporter.collect.settings import KubernetesConfig
from gpu_exporter.model.series import Producer, Series, series

log = logging.getLogger(__name__)

UP = "gpu_exporter_attribution_up"
REFRESHES = "gpu_exporter_attribution_refreshes_total"
LAST_SUCCESS = "gpu_exporter_attribution_last_success_timestamp_seconds"

# "<device id>::<replica>", the NVIDIA device plugin's id for one share of a time-sliced or
# MPS-shared device.
_REPLICA_SUFFIX = re.compile(r"::\d+$")
_OK = "ok"


__all__ = [
    "AttributionSnapshot",
    "ClaimMap",
    "DeviceMap",
    "PodAttribution",
    "PodRef",
    "map_claims",
    "map_devices",
    "normalize_device_id",
]

DeviceMap = Mapping[str, tuple[PodRef, ...]]
ClaimMap = Mapping[DraDevice, tuple[Claim, ...]]
_NO_PODS: DeviceMap = MappingProxyType({})
_NO_CLAIMS: ClaimMap = MappingProxyType({})


@dataclass(frozen=True)
class AttributionSnapshot:
    """What one List() said, both ways a device is held: read together, they always agree."""

    by_device: DeviceMap  # device-plugin device id -> containers
    claims: ClaimMap  # DRA device -> the claims on it


_EMPTY = AttributionSnapshot(_NO_PODS, _NO_CLAIMS)


def normalize_device_id(device_id: str) -> str:
    """The physical device behind a kubelet device id: `GPU-x::3` -> `GPU-x`; others as given."""
    return _REPLICA_SUFFIX.sub("", device_id.strip())


def map_devices(
    pods: Iterable[api_pb2.PodResources], settings: KubernetesConfig
) -> dict[str, tuple[PodRef, ...]]:
    """Device id -> every container holding it, sorted (shared devices have several)."""
    holders: defaultdict[str, set[PodRef]] = defaultdict(set)
    for pod in pods:
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                if not settings.wants(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    if device := normalize_device_id(device_id):
                        holders[device].add(ref)
    return {device: tuple(sorted(refs)) for device, refs in sorted(holders.items())}


def map_claims(
    pods: Iterable[api_pb2.PodResources], settings: KubernetesConfig
) -> dict[DraDevice, tuple[Claim, ...]]:
    """DRA device -> every container's claim on it, sorted: the `dynamic_resources` devices of
    the drivers in `kubernetes.dra.drivers`; empty while `kubernetes.dra.enabled` is off.

    A claim whose `claim_namespace` is empty is the pod's own (a ResourceClaim lives in its
    pod's namespace). A pod's several containers on one claim, or several pods on a shared
    claim, are each listed."""
    if not settings.dra.enabled:
        return {}
    drivers = frozenset(settings.dra.drivers)
    holders: defaultdict[DraDevice, set[Claim]] = defaultdict(set)
    for pod in pods:
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name)
            for resource in container.dynamic_resources:
                claim = Claim(ref, resource.claim_namespace or pod.namespace, resource.claim_name)
                for allocated in resource.claim_resources:
                    if allocated.driver_name not in drivers:
                        continue
                    # No pool or no device name: no ResourceSlice device can be it (api.proto:
                    # a resource of another kind than a device leaves device_name empty).
                    if not (allocated.pool_name and allocated.device_name):
                        continue
                    device = DraDevice(
                        allocated.driver_name, allocated.pool_name, allocated.device_name
                    )
                    holders[device].add(claim)
    return {device: tuple(sorted(claims)) for device, claims in sorted(holders.items())}


@dataclass(frozen=True)
class _Status:
    """Self-telemetry, replaced as a whole so `collect` reads a consistent set without a lock."""

    up: bool = False
    successes: int = 0
    errors: int = 0
    last_success: float = 0.0  # Unix time; 0 until the first success


def _explain(error: Exception) -> tuple[str, str]:
    """(state key, log message) for a failed refresh; the key decides when to log again."""
    if isinstance(error, FileNotFoundError):
        return "missing", "socket missing"
    if not isinstance(error, RpcError):
        return type(error).__name__, f"unexpected error: {error!r}"
    code = error.code()
    if code is StatusCode.UNIMPLEMENTED:
        return (
            code.name,
            "the kubelet does not serve the PodResources v1 API (Kubernetes older than 1.20?)",
        )
    if code is StatusCode.DEADLINE_EXCEEDED:
        return code.name, "the kubelet did not answer List() in time"
    return code.name, f"{code.name}: {error.details()}"


# The service's List method (api.proto: `package v1; service PodResourcesLister`).
_LIST = "/v1.PodResourcesLister/List"


class PodAttribution:
    """Polls the kubelet and keeps the latest device -> pods and DRA device -> claims maps; see
    the module docstring."""

    def __init__(
        self,
        settings: KubernetesConfig,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._clock = clock  # the last-success timestamp
        self._monotonic = monotonic  # the grace period (immune to wall-clock steps)
        self._snapshot = _EMPTY  # replaced as a whole: both maps are always from one answer
        self._succeeded_at: float | None = None  # monotonic time of the last success
        self._status = _Status()
        self._state: str | None = None  # _OK or an error key; a change is logged once
        self._refresh_lock = threading.Lock()  # the thread and a caller may refresh at once
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Refresh now, in the caller's thread, then every `refresh_seconds` on a daemon thread.

        The first refresh is synchronous (bounded by `timeout_seconds`) so that the sampler's
        first tick, started next, already has the pod labels: an unlabelled first sample would
        linger in the rule engine's range windows as a series of its own."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="pod-attribution", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            # An in-flight List() ends at its deadline at the latest.
            thread.join(timeout=self.settings.timeout_seconds + 1.0)

    def _run(self) -> None:
        while not self._stopping.wait(self.settings.refresh_seconds):
            self.refresh()

    def refresh(self) -> bool:
        """One List() call; True when the maps now reflect the kubelet. Never raises."""
        with self._refresh_lock:
            try:
                pods = self._list().pod_resources
                snapshot = AttributionSnapshot(
                    MappingProxyType(map_devices(pods, self.settings)),
                    MappingProxyType(map_claims(pods, self.settings)),
                )
            except Exception as error:  # the refresh thread must survive anything
                self._failed(error)
                return False
            self._succeeded(snapshot)
            return True

    def snapshot(self) -> AttributionSnapshot:
        """Both maps of the latest answer, at once: a refresh between two separate reads of
        `pods_by_device()` and `claims()` could give one map of each answer."""
        return self._snapshot

    def pods_by_device(self) -> DeviceMap:
        """Read-only snapshot: device id (GPU or MIG UUID, as given) -> pods holding it."""
        return self._snapshot.by_device

    def claims(self) -> ClaimMap:
        """Read-only snapshot: DRA device (driver, pool, device) -> the claims on it; kept and
        cleared exactly as `pods_by_device()` is, empty while `kubernetes.dra` is off."""
        return self._snapshot.claims

    def series(self) -> Iterator[Series]:
        """Attribution's own health (the `kubernetes` collector)."""
        status = self._status
        yield series(UP, 1.0 if status.up else 0.0)
        yield series(REFRESHES, status.successes, (("result", "success"),))
        yield series(REFRESHES, status.errors, (("result", "error"),))
        yield series(LAST_SUCCESS, status.last_success)

    def producer(self) -> Producer:
        return Producer("kubernetes", self.series, frozenset({"kubernetes"}))

    def _list(self) -> api_pb2.ListPodResourcesResponse:
        path = self.settings.socket_path
        if not os.path.exists(path):
            raise FileNotFoundError(path)
        # A fresh connection per refresh: a kubelet restart leaves nothing behind to recover
        # from, and a unix-socket connect every few seconds costs nothing.
        with UnixChannel(os.path.abspath(path)) as channel:
            return channel.call(
                _LIST,
                api_pb2.ListPodResourcesRequest(),
                api_pb2.ListPodResourcesResponse,
                timeout=self.settings.timeout_seconds,
            )

    def _succeeded(self, snapshot: AttributionSnapshot) -> None:
        # Pods absent from this answer (finished, evicted) lose their labels here.
        self._snapshot = snapshot
        self._succeeded_at = self._monotonic()
        old = self._status
        self._status = _Status(True, old.successes + 1, old.errors, self._clock())
        if self._state != _OK:
            log.info(
                "pod attribution: kubelet PodResources answered at %s (%d devices held by pods%s)",
                self.settings.socket_path,
                len(snapshot.by_device),
                f", {len(snapshot.claims)} DRA devices" if self.settings.dra.enabled else "",
            )
        self._state = _OK

    def _failed(self, error: Exception) -> None:
        old = self._status
        self._status = _Status(False, old.successes, old.errors + 1, old.last_success)
        state, message = _explain(error)
        grace = self.settings.grace_seconds
        since = None if self._succeeded_at is None else self._monotonic() - self._succeeded_at
        if since is not None and since < grace:
            # A kubelet restart or one slow answer: the pods are most likely where they were.
            if state != self._state:
                log.warning(
                    "pod attribution: the kubelet at %s failed (%s); keeping the last known pod "
                    "labels until %.0f s after the last success",
                    self.settings.socket_path,
                    message,
                    grace,
                )
            self._state = state
            return
        # Past the grace, stale labels are worse than none: a GPU would keep reporting a pod
        # that has finished while another pod uses it.
        old_snapshot = self._snapshot
        dropped = bool(old_snapshot.by_device or old_snapshot.claims)
        self._snapshot = _EMPTY
        if state != self._state or dropped:
            log.warning(
                "pod attribution: no pod labels until the kubelet answers at %s: %s%s",
                self.settings.socket_path,
                message,
                f" (failing for {since:.0f} s since the last success)" if dropped else "",
            )
        self._state = state
