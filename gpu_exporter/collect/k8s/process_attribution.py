"""Per-process attribution put together: the container runtime's map, the /proc reader and the
per-pod processor, with their own health as series (`gpu_exporter_process_attribution_*`).

Built by the assembly when `kubernetes.processes.enabled`; see docs/workloads.md.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping

from gpu_exporter.collect.k8s.attribution import PodRef
from gpu_exporter.collect.k8s.pod_use import Holders, PodUse
from gpu_exporter.collect.k8s.processes import ProcessOwners
from gpu_exporter.collect.k8s.runtime import RuntimeContainers
from gpu_exporter.collect.settings import ProcessesConfig
from gpu_exporter.model.series import Producer, Series, series
from gpu_exporter.model.snapshot import DeviceSample

UP = "gpu_exporter_process_attribution_up"
ERRORS = "gpu_exporter_process_attribution_errors_total"
REASONS = ("proc", "runtime")


def _nobody() -> Mapping[str, tuple[PodRef, ...]]:
    return {}


class ProcessAttribution:
    """`process` is the sampler processor; `start`/`stop` run the runtime's refresh thread."""

    def __init__(self, settings: ProcessesConfig, holders: Holders = _nobody) -> None:
        self.runtime = RuntimeContainers(
            settings.runtime_socket, settings.refresh_seconds, settings.timeout_seconds
        )
        self._lock = threading.Lock()
        self._errors: Counter[str] = Counter()
        self._failed_last_tick = False
        self.owners = ProcessOwners(settings.proc_root, self.runtime.lookup, self._count)
        self.pod_use = PodUse(self.owners.owners, holders)

    def start(self) -> None:
        self.runtime.start()

    def stop(self) -> None:
        self.runtime.stop()

    def process(self, devices: list[DeviceSample], now: float) -> list[DeviceSample]:
        """The sampler processor: per-pod use added to each device, or, outside the host's PID
        namespace, nothing at all (NVML would hide other containers' processes: every pod would
        look idle, and an idle holder's 0 is a claim)."""
        with self._lock:
            before = sum(self._errors.values())
        if not self.owners.namespace_problem():
            devices = self.pod_use.process(devices, now)
        with self._lock:
            self._failed_last_tick = sum(self._errors.values()) > before
        return devices

    def _count(self, reason: str) -> None:
        with self._lock:
            self._errors[reason] += 1

    def series(self) -> Iterator[Series]:
        with self._lock:
            errors = dict(self._errors)
            failed = self._failed_last_tick
        up = self.runtime.up and not failed
        yield series(UP, 1.0 if up else 0.0)
        for reason in REASONS:
            total = errors.get(reason, 0) + (self.runtime.failures if reason == "runtime" else 0)
            yield series(ERRORS, float(total), (("reason", reason),))

    def producer(self) -> Producer:
        return Producer("processes", self.series, frozenset({"processes"}))
