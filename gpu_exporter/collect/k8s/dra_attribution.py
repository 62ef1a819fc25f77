"""DRA attribution put together: the kubelet's claims (of the tick's `PodAttribution.snapshot`)
resolved through the node's ResourceSlices (`ResourceSlices.devices`) to GPU and MIG UUIDs, once
per tick for `PodsOfTick`, with its own health as series.

While the slice reader is up, a device that leaves the slices is remembered for the grace
period: a driver that restarts replaces its slice (deleted, then published anew: two watch
events the API server may send apart), and a GPU's `uuid` does not change in between, so its
pods keep their labels across the gap instead of flapping. While the reader is down its own
grace decides (it keeps its last map for that long): nothing is remembered on top of it.

Built by the assembly when `kubernetes.dra.enabled`; see docs/kubernetes.md "DRA".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from gpu_exporter.collect.k8s.dra import NOTHING, Claim, DraDevice, Resolved, SliceDevice, resolve
from gpu_exporter.model.series import Producer, Series, series

log = logging.getLogger(__name__)

UNRESOLVED = "gpu_exporter_dra_unresolved_devices"


class SliceSource(Protocol):
    """What DRA attribution needs of the ResourceSlice reader (collect/k8s/resource_slices.py)."""

    def devices(self) -> Mapping[DraDevice, SliceDevice]: ...
    @property
    def up(self) -> bool: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def series(self) -> Iterator[Series]: ...


Claims = Mapping[DraDevice, tuple[Claim, ...]]


class DraAttribution:
    """`resolved(claims)` is what `PodsOfTick` asks each tick; `start`/`stop` run the reader."""

    def __init__(
        self,
        slices: SliceSource,
        grace_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.slices = slices
        self.grace_seconds, self._monotonic = grace_seconds, monotonic
        self._seen: dict[DraDevice, tuple[SliceDevice, float]] = {}  # device -> (it, last seen)
        self._lock = threading.Lock()
        # Both inputs are immutable snapshots swapped whole: resolved again only when one is.
        self._inputs: tuple[object, object] | None = None
        self._resolved = NOTHING
        self._logged: tuple[DraDevice, ...] = ()

    def start(self) -> None:
        self.slices.start()

    def stop(self) -> None:
        self.slices.stop()

    def resolved(self, claims: Claims) -> Resolved:
        """The claims (the kubelet's, of this tick's snapshot) resolved to UUIDs."""
        with self._lock:
            devices = self._remembered(self.slices.devices(), self.slices.up)
            same = self._inputs is not None and self._inputs == (claims, devices)
            if same:
                return self._resolved
            self._inputs, self._resolved = (claims, devices), resolve(claims, devices)
            resolved = self._resolved
            changed = resolved.unresolved != self._logged
            self._logged = resolved.unresolved
        if changed and resolved.unresolved:
            first = resolved.unresolved[0]
            log.warning(
                "DRA attribution: %d claimed device(s) in no ResourceSlice of this node with a "
                "uuid, their pods unattributed (first: driver %s, pool %s, device %s)",
                len(resolved.unresolved), first.driver, first.pool, first.device,
            )  # fmt: skip
        elif changed:
            log.info("DRA attribution: every claimed device is resolved again")
        return resolved

    def _remembered(
        self, devices: Mapping[DraDevice, SliceDevice], up: bool
    ) -> dict[DraDevice, SliceDevice]:
        """The slices' devices, and, while the reader is up, those that left them less than
        the grace period ago."""
        now = self._monotonic()
        if not up:
            self._seen = {device: (published, now) for device, published in devices.items()}
            return dict(devices)
        for device, published in devices.items():
            self._seen[device] = (published, now)
        for device, (_, seen) in list(self._seen.items()):
            if now - seen > self.grace_seconds:
                del self._seen[device]
        return {device: published for device, (published, _) in self._seen.items()}

    def series(self) -> Iterator[Series]:
        yield from self.slices.series()
        with self._lock:
            unresolved = len(self._resolved.unresolved)
        yield series(UNRESOLVED, float(unresolved))

    def producer(self) -> Producer:
        return Producer("dra", self.series, frozenset({"dra"}))
