"""The metrics profile: which of a tick's series /metrics exports (`metrics.profile`,
`metrics.include`, `metrics.exclude`).

A tick's series are built in full (`gpu_exporter/model/series.py`); the status page, the JSON
API, /metrics/dcgm and `diagnose` read all of them in the process, which costs no time-series
database anything. What Prometheus scrapes, and what the daemon's own rules see (the same
series, so that the rule pack fires in the daemon as in Prometheus), is the profile's part:

- `full`: every series;
- `default`: what the shipped rule pack, recording rules and dashboards read, plus each
  subsystem's `up` and the few self-metrics that say whether the exporter works
  (`gpu_exporter/model/default_profile.py` lists those families and, for some, the part of
  them exported): on an 8-GPU node fewer series than dcgm-exporter's default output for the
  same node (tests/test_metrics_profile.py measures both in one run). Every family not listed
  is exported in `full` only.

`include` exports a family whole whatever the profile, `exclude` never exports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Literal

from gpu_exporter.model.catalog import BY_NAME, Kind
from gpu_exporter.model.default_profile import DEFAULT, SERIES_FAMILY, WHOLE, Part
from gpu_exporter.model.series import Series, SeriesSet
from gpu_exporter.model.snapshot import Labels

ProfileName = Literal["default", "full"]
PROFILES: tuple[ProfileName, ...] = ("default", "full")


def unknown_families(names: Iterable[str]) -> list[str]:
    """The names in `names` that are no family of the catalog, in their order."""
    return [name for name in names if name not in BY_NAME]


def family_of(sample: str) -> str | None:
    """The catalog family of a sample name (a histogram's `_bucket`, `_sum`, `_count` too);
    None for a name no family has."""
    if sample in BY_NAME:
        return sample
    base, _, suffix = sample.rpartition("_")
    family = BY_NAME.get(base)
    histogram = family is not None and family.kind is Kind.HISTOGRAM
    if histogram and suffix in ("bucket", "sum", "count"):
        return base
    return None


def part_of(family: str, profile: ProfileName = "default") -> Part | None:
    """What `profile` exports of `family` (before include and exclude); None: nothing."""
    if profile == "full":
        return WHOLE
    return DEFAULT.get(family)


class ExportFilter:
    """A profile applied to the ticks of one sampler: the series each tick exports.

    Stateful for the `quiet` parts (which series have left their quiet value), so one per
    sampler, fed every tick's sets in order. Not thread-safe: the tick calls it.
    """

    def __init__(
        self,
        profile: ProfileName = "full",
        include: Iterable[str] = (),
        exclude: Iterable[str] = (),
    ) -> None:
        unknown = unknown_families([*include, *exclude])
        if unknown:
            raise ValueError(f"unknown metric families: {', '.join(unknown)}")
        self.profile = profile
        parts = {name: part_of(name, profile) for name in BY_NAME}
        parts.update(dict.fromkeys(include, WHOLE))
        parts.update(dict.fromkeys(exclude, None))
        self._parts: Mapping[str, Part | None] = parts
        self.everything = all(part is not None and part.whole for part in parts.values())
        # Per family, the (sample name, labels) of its series that have left their quiet value
        # (those of the family's last tick only: a series gone is forgotten).
        self._loud: dict[str, set[tuple[str, Labels]]] = {}

    def exports(self, family: str) -> bool:
        """Whether any series of `family` can be exported."""
        return self._parts.get(family) is not None

    def unexported_read(
        self, family: str, equal: Mapping[str, str], also_read: Iterable[str]
    ) -> str | None:
        """Why a selector of `family` (with these `label="value"` matchers, in a query that
        also reads the families `also_read`) sees nothing this profile exports, where it may
        not; None when it sees what it would see in `full`."""
        part = self._parts.get(family)
        if part is None:
            return "does not export it"
        value = equal.get(part.label) if part.label else None
        if value is not None and (
            value in part.omitted or (part.values and value not in part.values)
        ):
            return f'does not export its {part.label}="{value}" series'
        if part.unless and part.unless not in set(also_read):
            better = self._parts.get(part.unless)
            measured = better is not None and (
                not better.label or value is None or not better.values or value in better.values
            )
            if measured:
                return (
                    f"exports it only where {part.unless} has no series of the same labels, "
                    f"and the query does not read {part.unless}"
                )
        return None

    def apply(self, series_set: SeriesSet) -> SeriesSet:
        """The exported part of `series_set` (the same Series objects, in the same order)."""
        if self.everything:
            return series_set
        families: dict[str, tuple[Series, ...]] = {}
        for family, rows in series_set.families.items():
            part = self._parts.get(family)
            if part is None:
                continue
            kept = rows if part.whole else self._kept(family, part, rows, series_set)
            if kept:
                families[family] = kept
        return SeriesSet(
            series_set.timestamp,
            MappingProxyType(families),
            series_set.collectors,
            series_set.down_reasons,
        )

    def _kept(
        self, family: str, part: Part, rows: tuple[Series, ...], series_set: SeriesSet
    ) -> tuple[Series, ...]:
        measured = (
            {_key(row.labels) for row in series_set.of(part.unless)} if part.unless else set()
        )
        was_loud = self._loud.get(family, set())
        loud: set[tuple[str, Labels]] = set()
        kept = []
        for row in rows:
            if part.label:
                value = _label(row.labels, part.label)
                if value in part.omitted or (part.values and value not in part.values):
                    continue
            if measured and _key(row.labels) in measured:
                continue
            if part.quiet is not None:
                key = (row.name, row.labels)
                if row.value != part.quiet or key in was_loud:
                    loud.add(key)
                else:
                    continue
            kept.append(row)
        if part.quiet is not None:
            self._loud[family] = loud
        return tuple(kept)


def series_counts(*exported: SeriesSet) -> tuple[Series, ...]:
    """gpu_exporter_series of a tick whose exported series are the `exported` sets: the series
    each of their families has, and this family's own (one per family, itself included)."""
    counts: dict[str, int] = {}
    for series_set in exported:
        for family, rows in series_set.families.items():
            if rows:
                counts[family] = counts.get(family, 0) + len(rows)
    counts[SERIES_FAMILY] = len(counts) + 1
    return tuple(
        Series(SERIES_FAMILY, SERIES_FAMILY, (("family", family),), float(count))
        for family, count in sorted(counts.items())
    )


def _label(labels: Labels, name: str) -> str:
    for key, value in labels:
        if key == name:
            return value
    return ""


def _key(labels: Labels) -> Labels:
    return tuple(sorted(labels))
