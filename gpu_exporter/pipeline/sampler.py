"""The scheduled tick: read every source, build one immutable Snapshot, turn it into the tick's
series, let the rule engine see them, publish them (the exposition is written on the first
scrape of a tick, not here).

APScheduler runs `tick` every `interval` seconds with `max_instances=1` and `coalesce=True`:
a slow tick delays the next one instead of piling up. Consumers (the HTTP layer, the rule
engine) read `published` (or its `latest` / `series` / `rendered`): one object, swapped at the
end of a tick, so no reader mixes two ticks.

Order within a tick, and why:
  1. the source's collectors read NVML (each guarded inside the source);
  2. processors enrich the device samples (classifier, pod info), each guarded, then the pod
     labels and node facts are read, guarded;
  3. `SeriesBuilder.build`: the device series, self-metrics and the producers (attribution);
  4. listeners (the rule manager) ingest those series and evaluate, guarded; the daemon's rule
     manager does it on a thread of its own and the tick waits for it at most a quarter of the
     interval (a slow rule group never slows the sampling; alerting/rules/manager.py);
  5. late producers (the rule manager's and notifier's own metrics, which evaluation changes)
     and the collector statuses are added, then the series count of each exported family
     (gpu_exporter_series), and listeners ingest them at the same timestamp;
  6. the whole set is published; its exposition is written when a scrape first asks for it.
The exposition holds the metrics profile's part of the series (`gpu_exporter/model/profile.py`),
and so does what a listener added with `exported_only` sees (the rule manager): the rule store
holds exactly the series a scrape of the tick returns, with the same labels and values. The
other listeners (/metrics/dcgm) and the readers of `published.series` (the JSON API, the status
page) see every series. Rules over the late families (rule, notifier and collector
self-metrics) see them from the next evaluation on — as Prometheus, which also evaluates what it
scraped before. A late ingest that fails is too late for its own tick's series; the next tick
reports it.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler

from gpu_exporter.collect.settings import DEFAULT_INTERVAL_SECONDS
from gpu_exporter.collect.source import ErrorLog, Source
from gpu_exporter.model.guard import Guard
from gpu_exporter.model.profile import SERIES_FAMILY, ExportFilter, series_counts
from gpu_exporter.model.series import Producer, SeriesBuilder, SeriesSet, with_collector_series
from gpu_exporter.model.snapshot import (
    CollectorStatus,
    DeviceSample,
    DownCause,
    Labels,
    Snapshot,
    TickStats,
)
from gpu_exporter.web.exposition import ExpositionWriter, RenderedMetrics

log = logging.getLogger(__name__)

TICK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# Turns one tick's device samples into enriched ones (e.g. the bottleneck classifier).
Processor = Callable[[list[DeviceSample], float], list[DeviceSample]]


class SeriesListener(Protocol):
    name: str  # its `collector` label

    def on_series(self, series: SeriesSet) -> None:
        """The tick's series, before the late families (step 4)."""

    def on_late_series(self, series: SeriesSet) -> None:
        """The late families of the same tick (step 5)."""


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


@dataclass(frozen=True)
class Published:
    """One tick's results, swapped in as one object so a reader never mixes two ticks."""

    snapshot: Snapshot
    series: SeriesSet  # every series of the tick
    rendered: RenderedMetrics  # the exported ones (the metrics profile's)


class Sampler:
    def __init__(
        self,
        source: Source,
        errors: ErrorLog,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        wall_clock: Callable[[], float] = time.time,
        device_labels: Callable[[], Mapping[str, Labels]] | None = None,
        export: ExportFilter | None = None,
    ) -> None:
        self.source = source
        self.errors = errors
        self.interval = interval
        self._wall_clock = wall_clock
        self._device_labels = device_labels  # None: no pod labels on the series
        self._accounting = _TickAccounting()
        self._full_accounting = _TickAccounting()
        self._full_tick_stats = TickStats()
        self._guard = Guard()
        self._builder = SeriesBuilder(self._guard)
        self._writer = ExpositionWriter()  # its caches span ticks
        self._export = export or ExportFilter("full")
        self._listeners: list[tuple[SeriesListener, bool]] = []  # (listener, exported_only)
        self._processors: list[tuple[str, Processor]] = []
        self._producers: list[Producer] = []
        self._late_producers: list[Producer] = []
        self._carried: list[CollectorStatus] = []  # late-ingest failures, reported next tick
        self._scheduler: BackgroundScheduler | None = None
        self._tick_lock = threading.Lock()
        self.published: Published | None = None
        self.last_tick_monotonic: float | None = None
        self.started_monotonic: float | None = None

    @property
    def latest(self) -> Snapshot | None:
        published = self.published
        return published.snapshot if published else None

    @property
    def series(self) -> SeriesSet | None:
        published = self.published
        return published.series if published else None

    @property
    def rendered(self) -> RenderedMetrics | None:
        published = self.published
        return published.rendered if published else None

    def set_device_labels(self, source: Callable[[], Mapping[str, Labels]]) -> None:
        """Extra labels per GPU UUID for every series (pod attribution), read once per tick,
        after the processors."""
        self._device_labels = source

    def add_processor(self, name: str, processor: Processor) -> None:
        """Runs on every tick's device samples before the snapshot is built; `name` is its
        `collector` label."""
        self._processors.append((name, processor))

    def add_producer(self, producer: Producer) -> None:
        """Series produced with the device series (step 3), e.g. attribution's health."""
        self._producers.append(producer)

    def add_late_producer(self, producer: Producer) -> None:
        """Series that rule evaluation changes (step 5): the rule manager, the notifier."""
        self._late_producers.append(producer)

    def add_listener(self, listener: SeriesListener, exported_only: bool = False) -> None:
        """Sees each tick's series before they are rendered: every series, or with
        `exported_only` the ones the exposition has (the rule engine: it must see what
        Prometheus scrapes)."""
        self._listeners.append((listener, exported_only))

    def tick(self) -> Snapshot | None:
        """One sample of every device. Never raises: whatever breaks is logged and counted, and
        the rest of the tick is still published."""
        with self._tick_lock:
            try:
                return self._tick()
            except Exception:  # a bug outside every guard must not stop the scheduler
                log.exception("sampler tick failed")
                self.errors.add("exporter", "tick", "exception")
                return None

    def _tick(self) -> Snapshot:
        started = time.perf_counter()
        devices, statuses = self._read_devices()
        now = self._wall_clock()
        for name, processor in self._processors:
            devices, status = self._guard.run(name, partial(processor, devices, now), devices)
            statuses.append(status)
        no_labels: Mapping[str, Labels] = {}
        device_labels = no_labels
        if self._device_labels is not None:
            device_labels, status = self._guard.run("pod_labels", self._device_labels, no_labels)
            statuses.append(status)
        no_info: dict[str, str] = {}
        node_info, status = self._guard.run("node_info", self.source.node_info, no_info)
        if not status.success:
            statuses.append(status)
        elapsed = time.perf_counter() - started
        previous = self.latest
        snapshot = Snapshot(
            timestamp=now,
            devices=tuple(devices),
            node_info=node_info,
            errors=self.errors.snapshot(),
            tick_seconds=elapsed,
            sequence=previous.sequence + 1 if previous else 1,
            stats=self._accounting.observe(elapsed, now),
            device_labels=device_labels,
            collectors=tuple(statuses),
            full_tick_stats=self._full_tick_stats,
        )
        first = self._builder.build(snapshot, self._producers)
        first_exported = self._export.apply(first)
        evaluated, self._carried = self._carried, []
        for listener, exported_only in self._listeners:
            seen = first_exported if exported_only else first
            evaluated.append(
                self._guard.run(listener.name, partial(listener.on_series, seen), None)[1]
            )
        late = with_collector_series(
            self._builder.build_more(now, self._late_producers), first.collectors, evaluated
        )
        late_exported = self._export.apply(late)
        if self._export.exports(SERIES_FAMILY):
            counts = SeriesSet(now, {SERIES_FAMILY: series_counts(first_exported, late_exported)})
            late, late_exported = late.extended(counts), late_exported.extended(counts)
        for listener, exported_only in self._listeners:
            seen = late_exported if exported_only else late
            _, status = self._guard.run(listener.name, partial(listener.on_late_series, seen), None)
            if not status.success:  # too late for this tick's series: the next one says it
                self._carried.append(status)
        series_set = first.extended(late)
        exported = first_exported.extended(late_exported)
        self.published = Published(snapshot, series_set, RenderedMetrics(exported, self._writer))
        self.last_tick_monotonic = time.monotonic()
        full = time.perf_counter() - started
        self._full_tick_stats = self._full_accounting.observe(full, self._wall_clock())
        return snapshot

    def _read_devices(self) -> tuple[list[DeviceSample], list[CollectorStatus]]:
        try:
            devices = self.source.sample()
        except Exception:  # the daemon must outlive any source bug
            log.exception("source %s failed", self.source.name)
            self.errors.add(self.source.name, "sample", "exception")
            known = list(self.latest.devices) if self.latest else []
            # The daemon's own failure says nothing of the GPUs: their verdicts stay as they were.
            down = [
                DeviceSample(
                    d.index, d.uuid, d.info, False, (), "source failed", down_cause=DownCause.UNREAD
                )
                for d in known
            ]
            # Every collector failed this tick: say so for each, not only for the source.
            no_names: tuple[str, ...] = ()
            names, _ = self._guard.run(self.source.name, self.source.collector_names, no_names)
            unique = dict.fromkeys((self.source.name, *names))
            return down, [CollectorStatus(name, False, 0.0) for name in unique]
        no_statuses: list[CollectorStatus] = []
        statuses, status = self._guard.run(
            self.source.name, lambda: list(self.source.collector_status()), no_statuses
        )
        return devices, statuses if status.success else [status]

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
