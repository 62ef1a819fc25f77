"""The scheduled tick: read every source, build one immutable Snapshot, render it, publish it.

APScheduler runs `tick` every `interval` seconds with `max_instances=1` and `coalesce=True`:
a slow tick delays the next one instead of piling up. Consumers (the HTTP layer, and later
the rule evaluator) read `latest` / `rendered`, swapped atomically at the end of a tick.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client.core import Metric

from gpu_exporter.exposition import RenderedMetrics
from gpu_exporter.snapshot import DeviceSample, Labels, Snapshot, TickStats
from gpu_exporter.sources.base import ErrorLog, Source

log = logging.getLogger(__name__)

TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

Listener = Callable[[Snapshot], None]
# Turns one tick's device samples into enriched ones (e.g. the bottleneck classifier).
Processor = Callable[[list[DeviceSample], float], list[DeviceSample]]


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


@dataclass
class _TickAccounting:
    counts: list[int] = field(default_factory=lambda: [0] * len(TICK_BUCKETS))
    total: float = 0.0
    ticks: int = 0

    def observe(self, seconds: float, finished_at: float) -> TickStats:
        for i in range(bisect.bisect_left(TICK_BUCKETS, seconds), len(TICK_BUCKETS)):
            self.counts[i] += 1
        self.total += seconds
        self.ticks += 1
        return TickStats(TICK_BUCKETS, tuple(self.counts), self.total, self.ticks, finished_at)


class Sampler:
    def __init__(
        self,
        source: Source,
        errors: ErrorLog,
        interval: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
        device_labels: Callable[[], Mapping[str, Labels]] | None = None,
    ) -> None:
        self.source = source
        self.errors = errors
        self.interval = interval
        self._wall_clock = wall_clock
        self._device_labels = device_labels or dict
        self._accounting = _TickAccounting()
        self._listeners: list[Listener] = []
        self._processors: list[Processor] = []
        self._collectors: list[Collector] = []
        self._scheduler: BackgroundScheduler | None = None
        self._tick_lock = threading.Lock()
        self.latest: Snapshot | None = None
        self.rendered: RenderedMetrics | None = None
        self.last_tick_monotonic: float | None = None
        self.started_monotonic: float | None = None

    def set_device_labels(self, source: Callable[[], Mapping[str, Labels]]) -> None:
        """Extra labels per GPU UUID for every series (pod attribution), read once per tick."""
        self._device_labels = source

    def add_processor(self, processor: Processor) -> None:
        """Runs on every tick's device samples before the snapshot is built."""
        self._processors.append(processor)

    def add_listener(self, listener: Listener) -> None:
        """Called with each snapshot before it is rendered (the rule engine)."""
        self._listeners.append(listener)

    def add_collector(self, collector: Collector) -> None:
        """Extra self-metrics rendered into every exposition (rules, notifier)."""
        self._collectors.append(collector)

    def tick(self) -> Snapshot:
        """One sample of every device. Never raises: a broken tick is logged and counted."""
        with self._tick_lock:
            started = time.perf_counter()
            try:
                devices: list[DeviceSample] = self.source.sample()
            except Exception:  # the daemon must outlive any source bug
                log.exception("source %s failed", self.source.name)
                self.errors.add(self.source.name, "sample", "exception")
                devices = list(self.latest.devices) if self.latest else []
                devices = [
                    DeviceSample(d.index, d.uuid, d.info, False, (), "source failed")
                    for d in devices
                ]
            now = self._wall_clock()
            for processor in self._processors:
                try:
                    devices = processor(devices, now)
                except Exception:  # a broken enrichment must not cost the raw telemetry
                    log.exception("processor %r failed", processor)
                    self.errors.add("exporter", "processor", "exception")
            elapsed = time.perf_counter() - started
            sequence = self.latest.sequence + 1 if self.latest else 1
            snapshot = Snapshot(
                timestamp=now,
                devices=tuple(devices),
                node_info=self.source.node_info(),
                errors=self.errors.snapshot(),
                tick_seconds=elapsed,
                sequence=sequence,
                stats=self._accounting.observe(elapsed, now),
                device_labels=self._device_labels(),
            )
            for listener in self._listeners:
                try:
                    listener(snapshot)
                except Exception:  # a rule-engine bug must not stop sampling
                    log.exception("snapshot listener %r failed", listener)
                    self.errors.add("exporter", "listener", "exception")
            rendered = RenderedMetrics(snapshot, snapshot.device_labels, self._collectors)
            self.latest, self.rendered = snapshot, rendered  # readers see both or neither
            self.last_tick_monotonic = time.monotonic()
            return snapshot

    def start(self) -> None:
        """Tick now, then every `interval` seconds on a background thread."""
        scheduler = BackgroundScheduler(daemon=True)
        scheduler.add_job(
            self.tick,
            "interval",
            seconds=self.interval,
            id="sample",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(self.interval)),
            next_run_time=datetime.now(UTC),  # first tick at once, not after one interval
        )
        self.started_monotonic = time.monotonic()
        scheduler.start()
        self._scheduler = scheduler

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None

    def seconds_since_start(self) -> float | None:
        if self.started_monotonic is None:
            return None
        return time.monotonic() - self.started_monotonic

    def seconds_since_last_tick(self) -> float | None:
        if self.last_tick_monotonic is None:
            return None
        return time.monotonic() - self.last_tick_monotonic
