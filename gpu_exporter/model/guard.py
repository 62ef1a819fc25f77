"""Running a producer of series so that its failure costs only its own output.

Every producer runs through `Guard.run`: each NVML collector per GPU (topology included, in
`collect/`), the processors (classifier, pod info), the pod labels, the rule evaluation and
late ingest, and the `Producer`s of `series.py` (self-metrics, attribution's health, the rule
manager's and notifier's metrics). An exception is caught, logged once per distinct error (a
bug that fires every tick must not flood the log; the set of logged errors is bounded), and
reported as `CollectorStatus(success=False)`, which becomes
`gpu_exporter_collector_success{collector} 0`. `report` does the same for output found wrong
after the producer returned (series the catalog refuses).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from gpu_exporter.model.snapshot import CollectorStatus

log = logging.getLogger(__name__)

T = TypeVar("T")


class Guard:
    """Thread-safe: per-GPU collectors run on one worker thread per GPU."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logged: set[tuple[str, str, str]] = set()

    def run(
        self, collector: str, produce: Callable[[], T], fallback: T
    ) -> tuple[T, CollectorStatus]:
        """`produce()`, or `fallback` when it raises; and how it went."""
        started = time.perf_counter()
        try:
            result = produce()
        except Exception as exc:  # the point of the guard: any bug in a producer
            self._log_once(collector, exc)
            return fallback, CollectorStatus(collector, False, time.perf_counter() - started)
        return result, CollectorStatus(collector, True, time.perf_counter() - started)

    def report(self, collector: str, problem: str) -> None:
        """A failure found after the producer returned (output the catalog refuses)."""
        if self._first_time((collector, "refused", problem)):
            log.error("collector %s: %s", collector, problem)

    def _first_time(self, key: tuple[str, str, str]) -> bool:
        with self._lock:
            # Bounded: an error text with a counter in it would otherwise grow this for ever;
            # past the bound the failures are still counted, just no longer logged.
            if key in self._logged or len(self._logged) >= 1000:
                return False
            self._logged.add(key)
            return True

    def _log_once(self, collector: str, exc: Exception) -> None:
        if not self._first_time((collector, type(exc).__name__, str(exc))):
            return
        log.error("collector %s failed; its series are missing this tick", collector, exc_info=exc)


def merge(statuses: list[CollectorStatus]) -> tuple[CollectorStatus, ...]:
    """One status per collector: failed if it failed anywhere, durations summed, sorted."""
    merged: dict[str, CollectorStatus] = {}
    for status in statuses:
        seen = merged.get(status.collector)
        if seen is None:
            merged[status.collector] = status
        else:
            merged[status.collector] = CollectorStatus(
                status.collector,
                seen.success and status.success,
                seen.duration_seconds + status.duration_seconds,
            )
    return tuple(merged[name] for name in sorted(merged))
