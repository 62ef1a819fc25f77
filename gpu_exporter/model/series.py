"""The one series model: a tick's `Snapshot` becomes one list of series, built here and only here.

Everything downstream reads that list — the text and OpenMetrics exposition, the rule store, the
JSON API (and through it the status page) and `diagnose` — so what Prometheus scrapes is what the
daemon's own rules see.

Labels of a per-GPU series (the exposition and the store sort them by name):
  - `gpu` and `uuid` (no `uuid` on a GPU whose UUID could not be read: `gpu` tells GPUs apart);
  - on a MIG instance's series, then `gpu_instance`, `compute_instance` (only when its GPU
    instance has several compute instances), `mig_uuid` and `mig_profile`; `gpu`/`uuid` are
    the parent's. Instance series exist only for families the catalog gives instances
    (memory, activity, classes, pods, size); a whole GPU's never carry instance labels;
  - the family's own labels from the catalog (`clock`, `reason`, `peer_gpu`, ...);
  - with pod attribution in `labels` mode, the GPU's (or instance's) `namespace`, `pod` and
    `container` when one container holds it, or `holders` ("ns/pod/container,...") when several
    share it (time-slicing, MPS) — on EVERY per-GPU family, `gpu_up` and `gpu_info` included, so an
    alert on a lost GPU names the pod it hit (or every pod sharing it, never one of them alone), and
    a rule over any family keeps the same labels on both alert paths. The exceptions are the
    families that say whose they are themselves (`gpu_pod_info`, one series per pod holding the GPU;
    the per-pod use `gpu_pod_*`; `gpu_unattributed_*`, the use of no known pod): they carry only
    their own. A MIG parent's own series have none (pods hold its instances: an instance's
    `gpu_mig_instance_up` names them while its GPU is lost). In `info` mode (and without
    attribution) only those families have them.
Empty label values are dropped, as Prometheus reads an empty label as absent.

Every series is checked against the catalog: its family exists, its sample name belongs to the
family, its label names are the family's (plus the device and attribution labels for per-GPU
families), label values are strings and the value is a number. The device series come from the
readings; every other producer (self-metrics, the rule manager, the notifier, attribution's
health) is a `Producer` that may emit only non-per-GPU families of its own catalog `source`s,
each label set once. A producer that raises loses its series for that tick; a series that fails
the check is dropped alone and marks its producer failed; both show as
`gpu_exporter_collector_success{collector} 0` (see `gpu_exporter/model/guard.py`).

Series of readings that are the same objects tick after tick (topology, a few static values)
are built once and reused: at 64 GPUs they are most of the 30,000 series of a tick. A new
reading of a family and labels that passed the check on the same device (and pods) last tick
reuses that checked label set, and only its value is checked.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from importlib.metadata import PackageNotFoundError, version
from types import MappingProxyType
from typing import NamedTuple

from gpu_exporter import __version__
from gpu_exporter.model.catalog import BY_NAME, FAMILIES, INSTANCE_LABELS, POD_LABELS, Family, Kind
from gpu_exporter.model.guard import Guard, merge
from gpu_exporter.model.snapshot import CollectorStatus, Labels, Reading, Snapshot, find_value

DEVICE_LABELS = ("gpu", "uuid")
# What pod attribution adds to a GPU's series in `labels` mode: the pod's namespace, pod and
# container when one container holds the GPU, `holders` (each "namespace/pod/container") when
# several share it, so that no one of them is blamed for the whole GPU.
HOLDERS_LABEL = "holders"
ATTRIBUTION_LABELS = (*POD_LABELS, HOLDERS_LABEL)
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
COLLECTOR_SUCCESS = "gpu_exporter_collector_success"
COLLECTOR_DURATION = "gpu_exporter_collector_duration_seconds"
_CATALOG_ORDER = {fam.name: position for position, fam in enumerate(FAMILIES)}


class Series(NamedTuple):
    """One sample as exposed: `name{labels} value`, of catalog family `family`.

    `name` is the family's name, or for a histogram the family's name plus `_bucket`, `_sum`
    or `_count`. A NamedTuple: a tick builds tens of thousands of them.
    """

    family: str
    name: str
    labels: Labels
    value: float


def series(family: str, value: float, labels: Iterable[tuple[str, str]] = ()) -> Series:
    """A series of a gauge, counter or info family (what producers yield)."""
    return Series(family, family, tuple(labels), value)


@dataclass(frozen=True)
class Producer:
    """A named source of non-per-GPU series; `name` is its `collector` label, `sources` the
    catalog `source`s of the families it may emit."""

    name: str
    produce: Callable[[], Iterable[Series]]
    sources: frozenset[str]


# The activity families people look for first, by a short name ("sm", "tensor", ...): the
# catalog's GPM families without labels of their own (gpu_pipe_active_ratio has `pipe`).
ACTIVITY_FAMILIES: Mapping[str, str] = MappingProxyType(
    {
        fam.name.removeprefix("gpu_").removesuffix("_ratio").removesuffix("_active"): fam.name
        for fam in FAMILIES
        if fam.source == "gpm" and not fam.labels
    }
)


@dataclass(frozen=True)
class InstanceView:
    """One MIG instance as the series list shows it, under its parent's `DeviceView`.

    `identity` holds its INSTANCE_LABELS (compute_instance only when its GPU instance is
    shared); `labels` its attribution labels; `readings` as for a GPU.
    """

    identity: Mapping[str, str]
    labels: Mapping[str, str]
    readings: tuple[Reading, ...]

    @property
    def mig_uuid(self) -> str:
        return self.identity.get("mig_uuid", "")

    @property
    def gpu_instance_id(self) -> int | None:
        """Its GPU instance id (`gpu_instance`), or None when absent or not a number."""
        return self._decimal(self.identity.get("gpu_instance", ""))

    @property
    def compute_instance_id(self) -> int | None:
        """Its compute instance id, or None: the label is there only on a shared GPU instance."""
        return self._decimal(self.identity.get("compute_instance", ""))

    @property
    def order_key(self) -> tuple[int, int, str]:
        """Sorts a GPU's instances: by GPU instance id, compute instance id, then MIG UUID."""
        return (self.gpu_instance_id or 0, self.compute_instance_id or 0, self.mig_uuid)

    @property
    def size(self) -> dict[str, int | None] | None:
        """Its gpu_mig_instance_info labels (slices, SMs, memory) as integers; None without it."""
        info = next((r for r in self.readings if r.family == "gpu_mig_instance_info"), None)
        if info is None:
            return None
        labels = dict(info.labels)
        names = BY_NAME["gpu_mig_instance_info"].labels
        return {name: self._decimal(labels.get(name, "")) for name in names}

    @property
    def up(self) -> bool:
        """Whether it was read in this tick (gpu_mig_instance_up; True without the series)."""
        return self.value("gpu_mig_instance_up") != 0.0

    @property
    def has_activity(self) -> bool:
        """Whether any of the ACTIVITY_FAMILIES has a reading of it this tick."""
        return any(r.family in ACTIVITY_FAMILIES.values() for r in self.readings)

    def pods(self) -> list[tuple[str, str, str]]:
        """The (namespace, pod, container) of each of its gpu_pod_info readings."""
        return self.pods_of(self.readings)

    @staticmethod
    def pods_of(readings: Iterable[Reading]) -> list[tuple[str, str, str]]:
        """The (namespace, pod, container) of each gpu_pod_info reading in `readings` (also
        a whole GPU's: `DeviceView.readings`)."""
        return [
            (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))
            for labels in (dict(r.labels) for r in readings if r.family == "gpu_pod_info")
        ]

    @staticmethod
    def _decimal(text: str) -> int | None:
        return int(text) if text.isdecimal() else None

    def value(self, family: str, **labels: str) -> float | None:
        return find_value(self.readings, family, labels)


@dataclass(frozen=True)
class DeviceView:
    """One GPU as the series list shows it (for the JSON API and diagnose).

    `readings` carries each series' family and its catalog labels only; `labels` are the GPU's
    attribution labels, shared by all its series; `instances` its MIG instances, if any.
    """

    index: int
    uuid: str
    up: bool
    info: Mapping[str, str]
    labels: Mapping[str, str]
    readings: tuple[Reading, ...]
    down_reason: str = ""
    instances: tuple[InstanceView, ...] = ()

    def value(self, family: str, **labels: str) -> float | None:
        """The value of `family` with exactly these catalog labels, or None when absent."""
        return find_value(self.readings, family, labels)


@dataclass(frozen=True)
class SeriesSet:
    """Every series of one tick, grouped by family in catalog order."""

    timestamp: float
    families: Mapping[str, tuple[Series, ...]]
    collectors: tuple[CollectorStatus, ...] = ()
    # Why a GPU is down, by NVML index (an unidentified GPU has no uuid): context for people,
    # not a series.
    down_reasons: Mapping[int, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Series]:
        for rows in self.families.values():
            yield from rows

    def of(self, family: str) -> tuple[Series, ...]:
        return self.families.get(family, ())

    def names(self) -> set[str]:
        return set(self.families)

    def devices(self) -> list[DeviceView]:
        """Per-GPU views, by NVML index; built from `gpu_up` and every per-GPU series, once per
        tick however often the API asks. Grouped by the `gpu` label, not `uuid`: a GPU whose
        UUID could not be read at start has none, and two such GPUs are still two."""
        return self._views

    @cached_property
    def _views(self) -> list[DeviceView]:
        by_index: dict[str, list[Series]] = {}
        by_instance: dict[str, dict[str, list[Series]]] = {}  # gpu -> mig_uuid -> rows
        for row in self:
            if BY_NAME[row.family].per_device:
                gpu, mig_uuid = _label(row.labels, "gpu"), _label(row.labels, "mig_uuid")
                if mig_uuid:
                    by_instance.setdefault(gpu, {}).setdefault(mig_uuid, []).append(row)
                else:
                    by_index.setdefault(gpu, []).append(row)
        views = []
        for up in self.of("gpu_up"):
            gpu = _label(up.labels, "gpu")
            rows = by_index.get(gpu, [])
            info = next((r for r in rows if r.family == "gpu_info"), None)
            index = int(gpu)
            views.append(
                DeviceView(
                    index=index,
                    uuid=_label(up.labels, "uuid"),
                    up=up.value == 1.0,
                    info=_own_labels(BY_NAME["gpu_info"], info.labels) if info else {},
                    labels={k: v for k, v in up.labels if k not in DEVICE_LABELS},
                    down_reason=self.down_reasons.get(index, ""),
                    readings=_view_readings(r for r in rows if r.family not in _IDENTITY),
                    instances=tuple(
                        _instance_view(group) for group in by_instance.get(gpu, {}).values()
                    ),
                )
            )
        return sorted(views, key=lambda view: view.index)

    def extended(self, more: SeriesSet) -> SeriesSet:
        """This set plus families built later in the tick (after rule evaluation)."""
        families = dict(self.families)
        for name, rows in more.families.items():
            families[name] = families.get(name, ()) + rows
        statuses = merge([*self.collectors, *more.collectors])
        return SeriesSet(self.timestamp, _in_catalog_order(families), statuses, self.down_reasons)


_IDENTITY = ("gpu_up", "gpu_info")


def _view_readings(rows: Iterable[Series]) -> tuple[Reading, ...]:
    return tuple(
        Reading(r.family, r.value, tuple(_own_labels(BY_NAME[r.family], r.labels).items()))
        for r in rows
    )


def _instance_view(rows: list[Series]) -> InstanceView:
    # gpu_pod_info carries each holder's pod labels; the others carry the instance's own.
    plain = next((r for r in rows if r.family != "gpu_pod_info"), rows[0]).labels
    identity = {name: value for name, value in plain if name in INSTANCE_LABELS}
    pods = {name: value for name, value in plain if name in ATTRIBUTION_LABELS}
    return InstanceView(identity, pods, _view_readings(rows))


# One cached device series: the reading it came from, the (device, pod) labels it was built
# with, and the series. A hit needs the very same Reading object and equal labels.
_Cached = tuple[Reading, tuple[Labels, Labels], Series]


@dataclass
class _Built:
    """What one tick's device series build fills in (see SeriesBuilder._readings_rows)."""

    cache: dict[Labels, dict[int, _Cached]]
    shapes: dict[Labels, tuple[Labels, dict[tuple[str, Labels], Labels]]]
    rows: list[Series]
    problems: list[str]


class SeriesBuilder:
    """Builds a tick's `SeriesSet` from a snapshot and the registered producers.

    Not thread-safe: one builder per tick loop (the sampler's, or diagnose's own)."""

    def __init__(self, guard: Guard | None = None) -> None:
        self.guard = guard or Guard()
        # device labels (gpu, uuid; uuid empty when unidentified) -> id(reading) -> cached
        self._cache: dict[Labels, dict[int, _Cached]] = {}
        # device labels -> (its pod labels, (family, reading labels) -> exposed labels): the
        # label sets last tick's readings passed the catalog check with. A new reading of the
        # same family and labels on the same device needs only its value checked.
        self._shapes: dict[Labels, tuple[Labels, dict[tuple[str, Labels], Labels]]] = {}

    def build(self, snapshot: Snapshot, producers: Sequence[Producer] = ()) -> SeriesSet:
        """The device series, the exporter's self-metrics and `producers`, each guarded; then
        the collector statuses of the source, the processors and all of these."""
        rows, status = self._device_series(snapshot)
        statuses = [*snapshot.collectors, status]
        exporter = Producer("exporter", partial(exporter_series, snapshot), _EXPORTER)
        for producer in (exporter, *producers):
            produced, status = self._run(producer)
            rows += produced
            statuses.append(status)
        reasons = {d.index: d.down_reason for d in snapshot.devices if d.down_reason}
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

    def _device_series(self, snapshot: Snapshot) -> tuple[list[Series], CollectorStatus]:
        problems: list[str] = []
        nothing: list[Series] = []
        rows, status = self.guard.run(
            "devices", partial(self._device_rows, snapshot, problems), nothing
        )
        return rows, self._with_problems(status, problems)

    def _device_rows(self, snapshot: Snapshot, problems: list[str]) -> list[Series]:
        rows: list[Series] = []
        cache: dict[Labels, dict[int, _Cached]] = {}
        shapes: dict[Labels, tuple[Labels, dict[tuple[str, Labels], Labels]]] = {}
        built = _Built(cache, shapes, rows, problems)
        info_labels = BY_NAME["gpu_info"].labels
        for device in snapshot.devices:
            base = device.labels
            pods = snapshot.device_labels.get(device.uuid, ()) if device.uuid else ()
            info = tuple((name, device.info.get(name, "")) for name in info_labels)
            for identity in (
                series("gpu_info", 1.0, (*base, *info, *pods)),
                series("gpu_up", 1.0 if device.up else 0.0, (*base, *pods)),
            ):
                _keep(_checked(identity, per_device=True), rows, problems)
            where = f"GPU {device.index}"
            self._readings_rows(device.readings, base, pods, where, False, built)
            for instance in device.instances:
                labels = (*base, *instance.labels)
                pods = snapshot.device_labels.get(instance.mig_uuid, ())
                up = series("gpu_mig_instance_up", float(instance.up), (*labels, *pods))
                _keep(_checked(up, per_device=True, instance=True), rows, problems)
                where = f"GPU {device.index} MIG {instance.mig_uuid}"
                self._readings_rows(instance.readings, labels, pods, where, True, built)
        # GPUs, instances, readings and label sets that are gone drop out here.
        self._cache, self._shapes = cache, shapes
        return rows

    def _readings_rows(
        self,
        readings: Sequence[Reading],
        base: Labels,
        pods: Labels,
        where: str,
        instance: bool,
        built: _Built,
    ) -> None:
        """The series of one GPU's (or MIG instance's) readings, reusing last tick's where the
        reading is the same object with the same labels, and last tick's checked label set
        where it is a new reading of the same family and labels."""
        key = (base, pods)
        seen = self._cache.get(base, {})
        prior = self._shapes.get(base)
        known = prior[1] if prior is not None and prior[0] == pods else {}
        shapes: dict[tuple[str, Labels], Labels] = {}
        kept: dict[int, _Cached] = {}
        for reading in readings:
            hit = seen.get(id(reading))
            if hit is not None and hit[0] is reading and hit[1] == key:
                row: Series | str = hit[2]
            else:
                family, value = reading.family, reading.value
                exposed = known.get((family, reading.labels))
                if exposed is not None and (type(value) is float or type(value) is int):
                    row = Series(family, family, exposed, float(value))
                else:
                    series_row = _reading_series(reading, base, pods)
                    row = _checked(series_row, per_device=True, instance=instance)
                if not isinstance(row, str):
                    shapes[(family, reading.labels)] = row.labels
            if isinstance(row, str):
                built.problems.append(f"{where}: {row}")
                continue
            kept[id(reading)] = (reading, key, row)
            built.rows.append(row)
        built.cache[base] = kept
        built.shapes[base] = (pods, shapes)

    def _run(self, producer: Producer) -> tuple[list[Series], CollectorStatus]:
        """The producer's series, guarded; a series the catalog does not give it is dropped
        (alone) and marks the producer failed for this tick."""
        nothing: list[Series] = []
        produced, status = self.guard.run(producer.name, partial(_listed, producer), nothing)
        rows: list[Series] = []
        problems: list[str] = []
        seen: set[tuple[str, Labels]] = set()
        for row in produced:
            checked = _checked(row, per_device=False, sources=producer.sources)
            if not isinstance(checked, str) and (checked.name, checked.labels) in seen:
                checked = f"{row.family}: label set {dict(row.labels)} emitted twice"
            if _keep(checked, rows, problems):
                seen.add((rows[-1].name, rows[-1].labels))
        return rows, self._with_problems(status, problems)

    def _with_problems(self, status: CollectorStatus, problems: list[str]) -> CollectorStatus:
        if not problems:
            return status
        self.guard.report(status.collector, f"{len(problems)} series refused: {problems[0]}")
        return CollectorStatus(status.collector, False, status.duration_seconds)

    @staticmethod
    def _finish(
        timestamp: float,
        rows: list[Series],
        statuses: list[CollectorStatus],
        down_reasons: Mapping[int, str] | None = None,
    ) -> SeriesSet:
        grouped: dict[str, list[Series]] = {}
        for row in rows:
            grouped.setdefault(row.family, []).append(row)
        families = {name: tuple(group) for name, group in grouped.items()}
        reasons = MappingProxyType(dict(down_reasons or {}))
        return SeriesSet(timestamp, _in_catalog_order(families), merge(statuses), reasons)


def with_collector_series(
    late: SeriesSet, first: Sequence[CollectorStatus], evaluated: Sequence[CollectorStatus] = ()
) -> SeriesSet:
    """`late` plus gpu_exporter_collector_success/_duration_seconds for every collector of the
    tick — those of the first set, the listeners' (`evaluated`) and late's own — built last so
    the late producers' outcomes are in it. Its `collectors` are late's own and `evaluated`."""
    own = merge([*late.collectors, *evaluated])
    statuses = merge([*first, *own])
    families = dict(late.families)
    families[COLLECTOR_SUCCESS] = tuple(
        Series(
            COLLECTOR_SUCCESS, COLLECTOR_SUCCESS, (("collector", s.collector),), float(s.success)
        )
        for s in statuses
    )
    families[COLLECTOR_DURATION] = tuple(
        Series(
            COLLECTOR_DURATION,
            COLLECTOR_DURATION,
            (("collector", s.collector),),
            s.duration_seconds,
        )
        for s in statuses
    )
    families = {name: rows for name, rows in families.items() if rows}
    return SeriesSet(late.timestamp, _in_catalog_order(families), own)


# Families whose series say themselves whose they are (gpu_pod_info, the per-pod use, the use of
# no known pod): the GPU's attribution labels describe the GPU, not them.
_OWN_ATTRIBUTION = frozenset(
    fam.name for fam in FAMILIES if set(POD_LABELS) <= set(fam.labels) or fam.source == "processes"
)


def _reading_series(reading: Reading, base: Labels, pods: Labels) -> Series:
    if not pods or reading.family in _OWN_ATTRIBUTION:
        return Series(reading.family, reading.family, (*base, *reading.labels), reading.value)
    labels = (*base, *reading.labels, *pods)
    return Series(reading.family, reading.family, labels, reading.value)


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

_EXPORTER = frozenset({"exporter"})


def _allowed_labels(fam: Family, instance: bool = False) -> frozenset[str]:
    names = set(fam.labels)
    if fam.per_device:
        names |= {*DEVICE_LABELS, *ATTRIBUTION_LABELS}
    if instance:
        names |= set(INSTANCE_LABELS)
    if fam.kind is Kind.HISTOGRAM:
        names.add("le")
    return frozenset(names)


def _sample_names(fam: Family) -> frozenset[str]:
    suffixes = HISTOGRAM_SUFFIXES if fam.kind is Kind.HISTOGRAM else ("",)
    return frozenset(fam.name + suffix for suffix in suffixes)


# Per family, the label names its series may carry, by where the series comes from: a whole
# GPU's readings, a MIG instance's, or a producer (not per GPU). A family absent from a table
# has no series there.
_GPU_LABELS = {fam.name: _allowed_labels(fam) for fam in FAMILIES if fam.on_gpus}
_INSTANCE_LABELS = {
    fam.name: _allowed_labels(fam, instance=True) for fam in FAMILIES if fam.on_instances
}
_PRODUCER_LABELS = {fam.name: _allowed_labels(fam) for fam in FAMILIES if not fam.per_device}
_SAMPLE_NAMES = {fam.name: _sample_names(fam) for fam in FAMILIES}


def _checked(
    row: Series,
    per_device: bool,
    sources: frozenset[str] | None = None,
    instance: bool = False,
) -> Series | str:
    """`row` as exposed (empty labels dropped, value a float), or what is wrong with it.
    `instance`: a MIG instance's series (only families with instance series, with the
    instance labels); otherwise a whole GPU's (never with them)."""
    family = row.family
    table = _INSTANCE_LABELS if instance else _GPU_LABELS if per_device else _PRODUCER_LABELS
    allowed = table.get(family)
    if allowed is None or sources is not None:  # the hot path (device readings) skips this
        problem = _family_problem(row, allowed, per_device, sources, instance)
        if problem or allowed is None:
            return problem or f"{family}: not a family this collector may emit"
    if row.name != family and row.name not in _SAMPLE_NAMES[family]:
        return f"{family}: sample name {row.name!r} does not belong to it"
    empty = False
    for name, label_value in row.labels:
        if name not in allowed:
            return f"{row.family}: label {name!r} is not in the catalog"
        if type(label_value) is not str:
            return f"{row.family}: label {name}={label_value!r} is not a string"
        empty = empty or label_value == ""
    value = row.value
    if type(value) is not float:
        if type(value) is not int:  # bool and None included: not a sample value
            return f"{row.family}: value {value!r} is not a number"
        value = float(value)
    if empty or value is not row.value:
        return Series(row.family, row.name, tuple(p for p in row.labels if p[1] != ""), value)
    return row


def _family_problem(
    row: Series,
    allowed: frozenset[str] | None,
    per_device: bool,
    sources: frozenset[str] | None,
    instance: bool,
) -> str:
    fam = BY_NAME.get(row.family)
    if fam is None:
        return f"series of unknown family {row.family!r}"
    if allowed is None and per_device and fam.per_device:
        return f"{row.family}: not a family of {'MIG instances' if instance else 'whole GPUs'}"
    if allowed is None or (sources is not None and fam.source not in sources):
        return f"{row.family}: not a family this collector may emit"
    return ""


def _keep(checked: Series | str, rows: list[Series], problems: list[str]) -> bool:
    if isinstance(checked, str):
        problems.append(checked)
        return False
    rows.append(checked)
    return True


def _listed(producer: Producer) -> list[Series]:
    return list(producer.produce())


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
