"""Bounded per-series sample history for rule evaluation, with Prometheus' staleness semantics.

Each series (a sorted label tuple including `__name__`) keeps its samples for `retention`
seconds: the longest range any loaded rule selects plus the 5-minute lookback of instant
selectors. A series that was present in one ingest and absent from the next ingest of the same
group gets a staleness marker, exactly as Prometheus writes one when a series disappears from a
scrape, so it stops matching at once instead of lingering for the lookback window. (A tick's
series arrive in two groups, before and after rule evaluation; see `gpu_exporter/sampler.py`.)
"""

from __future__ import annotations

import math
import re
import struct
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

Labels = tuple[tuple[str, str], ...]  # sorted by name; includes ("__name__", metric)
Sample = tuple[float, float]  # (unix seconds, value)

# Prometheus' staleness marker: a NaN with a specific bit pattern, distinct from ordinary NaN.
_STALE_BITS = 0x7FF0000000000002
STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", _STALE_BITS))[0]

DEFAULT_LOOKBACK_SECONDS = 300.0  # Prometheus' --query.lookback-delta default


def is_stale(value: float) -> bool:
    return math.isnan(value) and struct.pack("<d", value) == struct.pack("<Q", _STALE_BITS)


def metric_name(labels: Labels) -> str:
    for name, value in labels:
        if name == "__name__":
            return value
    return ""


def make_labels(name: str | None, pairs: Iterable[tuple[str, str]]) -> Labels:
    """Sorted label tuple; empty values are dropped (Prometheus treats them as absent)."""
    items = {k: v for k, v in pairs if v != ""}
    if name:
        items["__name__"] = name
    return tuple(sorted(items.items()))


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label matcher: `=`, `!=`, `=~`, `!~` (regexes fully anchored, as in PromQL)."""

    name: str
    op: str
    value: str

    def matches(self, labels_value: str) -> bool:
        if self.op == "=":
            return labels_value == self.value
        if self.op == "!=":
            return labels_value != self.value
        matched = _regex(self.value).fullmatch(labels_value) is not None
        return matched if self.op == "=~" else not matched


@lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


class _Series:
    __slots__ = ("times", "values")

    def __init__(self) -> None:
        self.times: deque[float] = deque()
        self.values: deque[float] = deque()


class SeriesStore:
    """Thread-safe store; the sampler appends, the rule engine selects."""

    def __init__(self, retention_seconds: float = 900.0, names: Iterable[str] | None = None):
        self.retention = retention_seconds
        # Only metrics some rule reads are kept: the rest would cost memory for nothing.
        self.names: frozenset[str] | None = frozenset(names) if names is not None else None
        self.retention_by_name: dict[str, float] = {}
        self._by_name: dict[str, dict[Labels, _Series]] = {}
        self._present: dict[str, set[Labels]] = {}  # by ingest group
        self._lock = threading.Lock()

    def configure(
        self,
        retention_seconds: float,
        names: Iterable[str] | None,
        retention_by_name: dict[str, float] | None = None,
    ) -> None:
        """Keep only `names` (None: everything), each for its own retention if given."""
        with self._lock:
            self.retention = retention_seconds
            self.retention_by_name = dict(retention_by_name or {})
            self.names = frozenset(names) if names is not None else None
            if self.names is not None:
                for name in list(self._by_name):
                    if name not in self.names:
                        del self._by_name[name]

    def append(self, labels: Labels, t: float, value: float) -> None:
        with self._lock:
            self._append(labels, t, value)

    def _append(self, labels: Labels, t: float, value: float) -> None:
        name = metric_name(labels)
        if self.names is not None and name not in self.names:
            return
        series = self._by_name.setdefault(name, {}).get(labels)
        if series is None:
            series = self._by_name[name][labels] = _Series()
        if series.times and t <= series.times[-1]:
            return  # out of order or duplicate timestamp: Prometheus rejects these too
        series.times.append(t)
        series.values.append(value)
        horizon = t - self.retention_by_name.get(name, self.retention)
        while series.times and series.times[0] < horizon:
            series.times.popleft()
            series.values.popleft()

    def ingest(
        self, t: float, samples: Iterable[tuple[Labels, float]], group: str = "scrape"
    ) -> None:
        """One scrape's worth of samples at time `t`; vanished series get a staleness marker.

        `group` names a part of a scrape ingested separately (a tick's series arrive in two
        parts, before and after rule evaluation): a series is stale when it vanishes from the
        next ingest of its own group."""
        with self._lock:
            present: set[Labels] = set()
            for labels, value in samples:
                present.add(labels)
                self._append(labels, t, value)
            for labels in self._present.get(group, set()) - present:
                self._append(labels, t, STALE_NAN)
            self._present[group] = present
            self._drop_empty(t)

    def _drop_empty(self, now: float) -> None:
        for name, by_labels in list(self._by_name.items()):
            horizon = now - self.retention_by_name.get(name, self.retention)
            for labels, series in list(by_labels.items()):
                if not series.times or series.times[-1] < horizon:
                    del by_labels[labels]
            if not by_labels:
                del self._by_name[name]

    def _candidates(self, matchers: Sequence[Matcher]) -> list[tuple[Labels, _Series]]:
        name_matcher = next((m for m in matchers if m.name == "__name__" and m.op == "="), None)
        if name_matcher is not None:
            found = list(self._by_name.get(name_matcher.value, {}).items())
        else:
            found = [item for group in self._by_name.values() for item in group.items()]
        return [(labels, series) for labels, series in found if _labels_match(labels, matchers)]

    def select(
        self, matchers: Sequence[Matcher], start: float, end: float
    ) -> Iterator[tuple[Labels, list[Sample]]]:
        """Series matching all matchers, with their samples in [start, end] (markers included)."""
        with self._lock:
            chosen = []
            for labels, series in self._candidates(matchers):
                # Windows sit at the newest end of the history: walk back from there.
                window = []
                for t, v in zip(reversed(series.times), reversed(series.values), strict=True):
                    if t < start:
                        break
                    if t <= end:
                        window.append((t, v))
                if window:
                    window.reverse()
                    chosen.append((labels, window))
        yield from chosen

    def select_latest(
        self, matchers: Sequence[Matcher], end: float
    ) -> Iterator[tuple[Labels, list[Sample]]]:
        """Per matching series, the newest sample at or before `end` (an instant selector)."""
        with self._lock:
            chosen = []
            for labels, series in self._candidates(matchers):
                for t, v in zip(reversed(series.times), reversed(series.values), strict=True):
                    if t <= end:
                        chosen.append((labels, [(t, v)]))
                        break
        yield from chosen

    def series_count(self) -> int:
        with self._lock:
            return sum(len(group) for group in self._by_name.values())

    def sample_count(self) -> int:
        with self._lock:
            return sum(len(s.times) for group in self._by_name.values() for s in group.values())


def _labels_match(labels: Labels, matchers: Sequence[Matcher]) -> bool:
    values = dict(labels)
    return all(m.matches(values.get(m.name, "")) for m in matchers)
