"""What every telemetry source gives the sampler, and the errors it may raise."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Protocol

from gpu_exporter.model.snapshot import CollectorStatus, DeviceSample, ErrorCount


class SourceUnavailableError(RuntimeError):
    """The source cannot start at all (no driver, no library); the message is for a person."""


class TooManyDevicesError(SourceUnavailableError):
    """More GPUs than the configured maximum (`nvml.max_devices`): a configuration to fix."""


class ErrorLog:
    """Thread-safe cumulative counts of failed reads, exported as gpu_exporter_errors_total."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()

    def add(self, source: str, field: str, error: str) -> None:
        with self._lock:
            self._counts[(source, field, error)] += 1

    def snapshot(self) -> tuple[ErrorCount, ...]:
        with self._lock:
            items = sorted(self._counts.items())
        return tuple(ErrorCount(s, f, e, n) for (s, f, e), n in items)

    def count(self, source: str | None = None, field: str | None = None) -> int:
        with self._lock:
            return sum(
                n
                for (s, f, _), n in self._counts.items()
                if (source is None or s == source) and (field is None or f == field)
            )


class Source(Protocol):
    """A source of per-device samples. NVML today; DCGM's profiling fields can plug in here."""

    name: str

    def start(self) -> None:
        """Initialise; raise SourceUnavailableError with a one-sentence reason if impossible."""

    def sample(self) -> list[DeviceSample]:
        """Read every device once. Must return within the configured deadline."""

    def node_info(self) -> dict[str, str]:
        """Node-level facts (driver version, ...)."""

    def collector_names(self) -> tuple[str, ...]:
        """The source's enabled collectors, in order: when `sample()` raises as a whole, the
        sampler reports each of them failed for that tick."""

    def collector_status(self) -> tuple[CollectorStatus, ...]:
        """How each of the source's collectors did in the last `sample()`, one per collector."""

    def close(self) -> None:
        """Release everything; safe to call twice."""
