"""Snapshot -> Prometheus text format 0.0.4 / OpenMetrics, rendered once per tick.

A scrape returns bytes prepared here; nothing on the scrape path reads NVML. The text format
is rendered eagerly at the end of each tick; OpenMetrics and the gzip forms are rendered on
the first request that asks for them and cached for the rest of the tick.
"""

from __future__ import annotations

import gzip
import platform
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from gpu_exporter import __version__
from gpu_exporter.catalog import BY_NAME, FAMILIES, Family, Kind
from gpu_exporter.snapshot import Labels, Snapshot

CONTENT_TYPE_TEXT = CONTENT_TYPE_LATEST  # text/plain; version=0.0.4; charset=utf-8
CONTENT_TYPE_OPENMETRICS = openmetrics.CONTENT_TYPE_LATEST
DEVICE_LABELS = ("gpu", "uuid")
INFO_LABELS = BY_NAME["gpu_info"].labels


def _binding_version() -> str:
    try:
        return version("nvidia-ml-py")
    except PackageNotFoundError:
        return "unknown"


BUILD_LABELS = (__version__, platform.python_version(), _binding_version())


def _new_family(fam: Family, label_names: list[str]) -> Metric:
    if fam.kind is Kind.COUNTER:
        return CounterMetricFamily(fam.base_name, fam.help, labels=label_names, unit=fam.unit)
    return GaugeMetricFamily(fam.name, fam.help, labels=label_names, unit=fam.unit)


@dataclass(eq=False)  # registries key collectors by identity
class SnapshotCollector:
    """A prometheus_client collector over one immutable snapshot.

    `device_labels` maps a GPU UUID to extra labels (pod attribution) added to its series.
    """

    snapshot: Snapshot
    device_labels: Mapping[str, Labels] = field(default_factory=dict)

    def collect(self) -> Iterator[Metric]:
        yield from self._device_families()
        yield from self._self_families()

    def _device_families(self) -> Iterator[Metric]:
        grouped: dict[str, list[tuple[Labels, Labels, float]]] = defaultdict(list)
        info = GaugeMetricFamily(
            "gpu_info", BY_NAME["gpu_info"].help, labels=[*DEVICE_LABELS, *INFO_LABELS]
        )
        up = GaugeMetricFamily("gpu_up", BY_NAME["gpu_up"].help, labels=list(DEVICE_LABELS))
        for device in self.snapshot.devices:
            base = device.labels + self.device_labels.get(device.uuid, ())
            info_values = [device.info.get(name, "") for name in INFO_LABELS]
            info.add_metric([device.labels[0][1], device.uuid, *info_values], 1.0)
            up.add_metric([device.labels[0][1], device.uuid], 1.0 if device.up else 0.0)
            for reading in device.readings:
                grouped[reading.family].append((base, reading.labels, reading.value))
        yield info
        yield up
        for fam in FAMILIES:  # catalog order keeps the output stable tick to tick
            rows = grouped.get(fam.name)
            if rows:
                yield _family_from_rows(fam, rows)

    def _self_families(self) -> Iterator[Metric]:
        snap, stats = self.snapshot, self.snapshot.stats
        build = GaugeMetricFamily(
            "gpu_exporter_build_info",
            BY_NAME["gpu_exporter_build_info"].help,
            labels=list(BY_NAME["gpu_exporter_build_info"].labels),
        )
        build.add_metric(list(BUILD_LABELS), 1.0)
        yield build
        if stats.bucket_bounds:
            buckets = [
                (_bound(bound), count)
                for bound, count in zip(stats.bucket_bounds, stats.bucket_counts, strict=True)
            ]
            buckets.append(("+Inf", stats.ticks))
            yield HistogramMetricFamily(
                "gpu_exporter_tick_duration_seconds",
                BY_NAME["gpu_exporter_tick_duration_seconds"].help,
                buckets=buckets,
                sum_value=stats.duration_sum,
                unit="seconds",
            )
        yield _gauge("gpu_exporter_last_tick_timestamp_seconds", stats.last_tick_timestamp)
        ticks = CounterMetricFamily("gpu_exporter_ticks", BY_NAME["gpu_exporter_ticks_total"].help)
        ticks.add_metric([], stats.ticks)
        yield ticks
        yield _gauge("gpu_exporter_devices", len(snap.devices))
        fam = BY_NAME["gpu_exporter_errors_total"]
        errors = CounterMetricFamily(fam.base_name, fam.help, labels=list(fam.labels))
        for err in snap.errors:
            errors.add_metric([err.source, err.field, err.error], err.count)
        yield errors


def _family_from_rows(fam: Family, rows: list[tuple[Labels, Labels, float]]) -> Metric:
    """One family with a fixed label schema: the union of every row's label names, "" where a
    row lacks one (Prometheus reads an empty label as absent). Pod labels exist only on GPUs
    that are allocated, so rows of one family can differ."""
    names: list[str] = []
    for base, extra, _ in rows:
        for name, _value in (*base, *extra):
            if name not in names:
                names.append(name)
    metric = _new_family(fam, names)
    for base, extra, value in rows:
        values = dict((*base, *extra))
        metric.add_metric([values.get(name, "") for name in names], value)
    return metric


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    fam = BY_NAME[name]
    return GaugeMetricFamily(name, fam.help, value=value, unit=fam.unit)


def _bound(bound: float) -> str:
    return repr(float(bound))


@dataclass(eq=False)
class _Frozen:
    """Families collected once at render time, so every format shows the same values."""

    families: list[Metric]

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class RenderedMetrics:
    """The exposition of one snapshot in every form a scraper may ask for, each built once."""

    def __init__(
        self,
        snapshot: Snapshot,
        device_labels: Mapping[str, Labels] | None = None,
        extra_collectors: Iterable[Any] = (),
    ):
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(SnapshotCollector(snapshot, device_labels or {}))
        for collector in extra_collectors:
            self._registry.register(_Frozen(list(collector.collect())))
        self.text = generate_latest(self._registry)
        self._lock = threading.Lock()
        self._cache: dict[tuple[bool, bool], bytes] = {(False, False): self.text}

    def body(self, openmetrics_format: bool, gzipped: bool) -> bytes:
        key = (openmetrics_format, gzipped)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        with self._lock:
            if key not in self._cache:
                plain = self._cache.get((openmetrics_format, False))
                if plain is None:
                    plain = openmetrics.generate_latest(self._registry)
                    self._cache[(True, False)] = plain
                self._cache[key] = gzip.compress(plain, compresslevel=6) if gzipped else plain
            return self._cache[key]


def wants_openmetrics(accept: str | None) -> bool:
    """Content negotiation as Prometheus does it: OpenMetrics only when the scraper asks."""
    return bool(accept) and "application/openmetrics-text" in accept


def wants_gzip(accept_encoding: str | None) -> bool:
    if not accept_encoding:
        return False
    for part in accept_encoding.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() == "gzip":
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False
