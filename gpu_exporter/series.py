"""The one series model: a tick's `Snapshot` becomes one list of series, built here and only here.

Everything downstream reads that list — the text and OpenMetrics exposition, the rule store, the
JSON API (and through it the status page) and `diagnose` — so what Prometheus scrapes is exactly
what the daemon's own rules see.

Labels of a per-GPU series, in this order:
  1. `gpu` and `uuid`;
  2. the family's own labels from the catalog (`clock`, `reason`, `peer_gpu`, ...);
  3. with pod attribution in `labels` mode, the GPU's `namespace`, `pod` and `container` — on
     EVERY per-GPU family, `gpu_up` and `gpu_info` included, so an alert on a lost GPU names the
     pod it hit, and a rule over any family keeps the same labels on both alert paths. The one
     exception is `gpu_pod_info`, whose own namespace/pod/container (one series per pod sharing
     the GPU) win. In `info` mode (and without attribution) only `gpu_pod_info` has them.
Empty label values are dropped, as Prometheus reads an empty label as absent.

Producers of series beyond the device readings (self-metrics, the rule manager, the notifier,
attribution's own health) are `Producer`s. Each runs through `Guard`: one that raises, or emits
a family or label the catalog does not declare for it, loses its own families for that tick
only, and `gpu_exporter_collector_success{collector}` says so.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from types import MappingProxyType

from gpu_exporter import __version__
from gpu_exporter.catalog import BY_NAME, FAMILIES, Family, Kind
from gpu_exporter.guard import Guard, merge
from gpu_exporter.snapshot import (
    CollectorStatus,
    DeviceSample,
    Labels,
    Reading,
    Snapshot,
    find_value,
)

DEVICE_LABELS = ("gpu", "uuid")
ATTRIBUTION_LABELS = ("namespace", "pod", "container")
POD_INFO = "gpu_pod_info"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
COLLECTOR_SUCCESS = "gpu_exporter_collector_success"
COLLECTOR_DURATION = "gpu_exporter_collector_duration_seconds"
_CATALOG_ORDER = {fam.name: position for position, fam in enumerate(FAMILIES)}


@dataclass(frozen=True, slots=True)
class Series:
    """One sample as exposed: `name{labels} value`, of catalog family `family`.

    `name` is the family's name, or for a histogram the family's name plus `_bucket`, `_sum`
    or `_count`.
    """

    family: str
    name: str
    labels: Labels
    value: float


def series(family: str, value: float, labels: Iterable[tuple[str, str]] = ()) -> Series:
    """A series of a gauge, counter or info family (what producers yield)."""
    return Series(family, family, _drop_empty(labels), float(value))


@dataclass(frozen=True)
class Producer:
    """A named source of series outside the device readings; `name` is its `collector` label."""

    name: str
    produce: Callable[[], Iterable[Series]]


@dataclass(frozen=True)
class DeviceView:
    """One GPU as the series list shows it (for the JSON API and diagnose).

    `readings` carries each series' family and its catalog labels only; `labels` are the GPU's
    identity and attribution labels, shared by all its series.
    """

    index: int
    uuid: str
    up: bool
    info: Mapping[str, str]
    labels: Mapping[str, str]
    readings: tuple[Reading, ...]
    down_reason: str = ""

    def value(self, family: str, **labels: str) -> float | None:
        """The value of `family` with exactly these catalog labels, or None when absent."""
        return find_value(self.readings, family, labels)


@dataclass(frozen=True)
class SeriesSet:
    """Every series of one tick, grouped by family in catalog order."""

    timestamp: float
    families: Mapping[str, tuple[Series, ...]]
    collectors: tuple[CollectorStatus, ...] = ()
    # Why a GPU is down (by uuid): context for people, not a series.
    down_reasons: Mapping[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Series]:
        for rows in self.families.values():
            yield from rows

    def __len__(self) -> int:
        return sum(len(rows) for rows in self.families.values())

    def of(self, family: str) -> tuple[Series, ...]:
        return self.families.get(family, ())

    def names(self) -> set[str]:
        return set(self.families)

    def devices(self) -> list[DeviceView]:
        """Per-GPU views, by NVML index; built from `gpu_up` and every series with a uuid."""
        by_uuid: dict[str, list[Series]] = {}
        for row in self:
            uuid = _label(row.labels, "uuid")
            if uuid and BY_NAME[row.family].per_device:
                by_uuid.setdefault(uuid, []).append(row)
        views = []
        for up in self.of("gpu_up"):
            uuid = _label(up.labels, "uuid")
            rows = by_uuid.get(uuid, [])
            info = next((r for r in rows if r.family == "gpu_info"), None)
            views.append(
                DeviceView(
                    index=int(_label(up.labels, "gpu")),
                    uuid=uuid,
                    up=up.value == 1.0,
                    info=_own_labels(BY_NAME["gpu_info"], info.labels) if info else {},
                    labels={k: v for k, v in up.labels if k not in DEVICE_LABELS},
                    down_reason=self.down_reasons.get(uuid, ""),
                    readings=tuple(
                        Reading(
                            r.family,
                            r.value,
                            tuple(_own_labels(BY_NAME[r.family], r.labels).items()),
                        )
                        for r in rows
                        if r.family not in ("gpu_up", "gpu_info")
                    ),
                )
            )
        return sorted(views, key=lambda view: view.index)

    def device(self, uuid: str) -> DeviceView | None:
        return next((view for view in self.devices() if view.uuid == uuid), None)

    def extended(self, more: SeriesSet) -> SeriesSet:
        """This set plus families built later in the tick (after rule evaluation)."""
        families = dict(self.families)
        for name, rows in more.families.items():
            families[name] = families.get(name, ()) + rows
        statuses = merge([*self.collectors, *more.collectors])
        return SeriesSet(self.timestamp, _in_catalog_order(families), statuses, self.down_reasons)


class SeriesBuilder:
    """Builds a tick's `SeriesSet` from a snapshot and the registered producers."""

    def __init__(self, guard: Guard | None = None) -> None:
        self.guard = guard or Guard()

    def build(self, snapshot: Snapshot, producers: Sequence[Producer] = ()) -> SeriesSet:
        """The device series, the exporter's self-metrics and `producers`, each guarded; then
        the collector statuses of the source, the processors and all of these."""
        rows: list[Series] = []
        statuses = list(snapshot.collectors)
        for producer in (
            Producer("devices", lambda: device_series(snapshot)),
            Producer("exporter", lambda: exporter_series(snapshot)),
            *producers,
        ):
            produced, status = self._run(producer)
            rows += produced
            statuses.append(status)
        reasons = {d.uuid: d.down_reason for d in snapshot.devices if d.down_reason}
        return self._finish(snapshot.timestamp, rows, statuses, reasons)

    def build_more(self, timestamp: float, producers: Sequence[Producer]) -> SeriesSet:
        """Families produced after the first set was used (the rule manager, the notifier)."""
        rows: list[Series] = []
        statuses: list[CollectorStatus] = []
        for producer in producers:
            produced, status = self._run(producer)
            rows += produced
            statuses.append(status)
        return self._finish(timestamp, rows, statuses)

    def _run(self, producer: Producer) -> tuple[list[Series], CollectorStatus]:
        """The producer's series, guarded; a series the catalog does not declare is dropped
        (alone) and marks the producer failed for this tick."""
        nothing: list[Series] = []
        rows, status = self.guard.run(producer.name, partial(_listed, producer), nothing)
        good, problems = validate(rows)
        if problems:
            self.guard.report(producer.name, f"{len(problems)} series refused: {problems[0]}")
            status = CollectorStatus(status.collector, False, status.duration_seconds)
        return good, status

    @staticmethod
    def _finish(
        timestamp: float,
        rows: list[Series],
        statuses: list[CollectorStatus],
        down_reasons: Mapping[str, str] | None = None,
    ) -> SeriesSet:
        grouped: dict[str, list[Series]] = {}
        for row in rows:
            grouped.setdefault(row.family, []).append(row)
        families = {name: tuple(group) for name, group in grouped.items()}
        reasons = MappingProxyType(dict(down_reasons or {}))
        return SeriesSet(timestamp, _in_catalog_order(families), merge(statuses), reasons)


def with_collector_series(late: SeriesSet, earlier: Sequence[CollectorStatus]) -> SeriesSet:
    """`late` plus gpu_exporter_collector_success/_duration_seconds for every collector of the
    tick (`earlier` and late's own): built last, so the late producers' outcomes are in it."""
    statuses = merge([*earlier, *late.collectors])
    families = dict(late.families)
    families[COLLECTOR_SUCCESS] = tuple(
        series(COLLECTOR_SUCCESS, 1.0 if s.success else 0.0, (("collector", s.collector),))
        for s in statuses
    )
    families[COLLECTOR_DURATION] = tuple(
        series(COLLECTOR_DURATION, s.duration_seconds, (("collector", s.collector),))
        for s in statuses
    )
    families = {name: rows for name, rows in families.items() if rows}
    return SeriesSet(late.timestamp, _in_catalog_order(families), late.collectors)


# -- the device series -------------------------------------------------------------------------


def device_series(snapshot: Snapshot) -> Iterator[Series]:
    """Every per-GPU series of the snapshot, with attribution labels as the module says."""
    attribution = snapshot.device_labels
    info_family = BY_NAME["gpu_info"]
    for device in snapshot.devices:
        base = device.labels
        pods = attribution.get(device.uuid, ())
        info = tuple((name, device.info.get(name, "")) for name in info_family.labels)
        yield series("gpu_info", 1.0, (*base, *info, *pods))
        yield series("gpu_up", 1.0 if device.up else 0.0, (*base, *pods))
        yield from _reading_series(device, base, pods)


def _reading_series(device: DeviceSample, base: Labels, pods: Labels) -> Iterator[Series]:
    # Unknown families and labels are caught by `validate`, which drops just that reading.
    for reading in device.readings:
        own = {name for name, _ in reading.labels}
        extra = tuple(pair for pair in pods if pair[0] not in own)
        yield series(reading.family, reading.value, (*base, *reading.labels, *extra))


# -- the exporter's own series -----------------------------------------------------------------


def _binding_version() -> str:
    try:
        return version("nvidia-ml-py")
    except PackageNotFoundError:
        return "unknown"


BUILD_LABELS = (
    ("version", __version__),
    ("python_version", platform.python_version()),
    ("nvml_binding_version", _binding_version()),
)


def exporter_series(snapshot: Snapshot) -> Iterator[Series]:
    """Build info, the tick histogram and counters, the device count and the read errors."""
    stats = snapshot.stats
    yield series("gpu_exporter_build_info", 1.0, BUILD_LABELS)
    if stats.bucket_bounds:
        yield from histogram_series(
            "gpu_exporter_tick_duration_seconds",
            stats.bucket_bounds,
            stats.bucket_counts,
            stats.ticks,
            stats.duration_sum,
        )
    full = snapshot.full_tick_stats
    if full.bucket_bounds:
        yield from histogram_series(
            "gpu_exporter_full_tick_duration_seconds",
            full.bucket_bounds,
            full.bucket_counts,
            full.ticks,
            full.duration_sum,
        )
    yield series("gpu_exporter_last_tick_timestamp_seconds", stats.last_tick_timestamp)
    yield series("gpu_exporter_ticks_total", stats.ticks)
    yield series("gpu_exporter_devices", len(snapshot.devices))
    for err in snapshot.errors:
        labels = (("source", err.source), ("field", err.field), ("error", err.error))
        yield series("gpu_exporter_errors_total", err.count, labels)


def histogram_series(
    family: str,
    bounds: Sequence[float],
    cumulative_counts: Sequence[int],
    count: int,
    total: float,
) -> Iterator[Series]:
    for bound, n in zip(bounds, cumulative_counts, strict=True):
        yield Series(family, family + "_bucket", (("le", repr(float(bound))),), float(n))
    yield Series(family, family + "_bucket", (("le", "+Inf"),), float(count))
    yield Series(family, family + "_sum", (), float(total))
    yield Series(family, family + "_count", (), float(count))


# -- checks against the catalog ----------------------------------------------------------------


def _allowed_labels(fam: Family) -> frozenset[str]:
    names = set(fam.labels)
    if fam.per_device:
        names |= {*DEVICE_LABELS, *ATTRIBUTION_LABELS}
    if fam.kind is Kind.HISTOGRAM:
        names.add("le")
    return frozenset(names)


def _sample_names(fam: Family) -> frozenset[str]:
    suffixes = HISTOGRAM_SUFFIXES if fam.kind is Kind.HISTOGRAM else ("",)
    return frozenset(fam.name + suffix for suffix in suffixes)


_ALLOWED_LABELS = {fam.name: _allowed_labels(fam) for fam in FAMILIES}
_SAMPLE_NAMES = {fam.name: _sample_names(fam) for fam in FAMILIES}


def validate(rows: Iterable[Series]) -> tuple[list[Series], list[str]]:
    """The rows the catalog declares, and what is wrong with the others (one line each)."""
    good: list[Series] = []
    problems: list[str] = []
    for row in rows:
        allowed = _ALLOWED_LABELS.get(row.family)
        if allowed is None:
            problems.append(f"series of unknown family {row.family!r}")
        elif row.name not in _SAMPLE_NAMES[row.family]:
            problems.append(f"{row.family}: sample name {row.name!r} does not belong to it")
        elif any(name not in allowed for name, _ in row.labels):
            unknown = sorted(name for name, _ in row.labels if name not in allowed)
            problems.append(f"{row.family}: labels {unknown} are not in the catalog")
        elif not isinstance(row.value, float):
            problems.append(f"{row.family}: value {row.value!r} is not a float")
        else:
            good.append(row)
    return good, problems


def _listed(producer: Producer) -> list[Series]:
    return list(producer.produce())


def _drop_empty(labels: Iterable[tuple[str, str]]) -> Labels:
    return tuple((name, value) for name, value in labels if value != "")


def _label(labels: Labels, name: str) -> str:
    for key, value in labels:
        if key == name:
            return value
    return ""


def _own_labels(fam: Family, labels: Labels) -> dict[str, str]:
    own = set(fam.labels)
    return {name: value for name, value in labels if name in own}


def _in_catalog_order(
    families: Mapping[str, tuple[Series, ...]],
) -> Mapping[str, tuple[Series, ...]]:
    ordered = sorted(families.items(), key=lambda item: _CATALOG_ORDER.get(item[0], len(FAMILIES)))
    return MappingProxyType(dict(ordered))
