"""Bounded per-series sample history for rule evaluation, with Prometheus' staleness semantics.

Each series (a sorted label tuple including `__name__`) keeps what its metric's `Retention`
says, which the rule engine derives from what the loaded rules' selectors read: a metric read
through `x[10m]` keeps ten minutes, one read only by instant selectors without offset keeps its
newest sample alone (markers included). A series that was present in one ingest and absent
from the next ingest of the same group gets a staleness marker, exactly as Prometheus writes
one when a series disappears from a scrape, so it stops matching at once instead of lingering
for the lookback window. (A tick's series arrive in two groups, before and after rule
evaluation; see `gpu_exporter/pipeline/sampler.py`.)

Times are kept as integer milliseconds, `round(t * 1000)` once at ingest: that is the
resolution PromQL evaluates at, so the evaluator reads windows as they are stored
(`range_ms`, `latest_ms`). Times and values sit in typed arrays. Every series of an ingest
group is written at the same times, so each group keeps its ingests' times once (`_Timeline`)
and a series present in each of its samples' ingests keeps only values (8 bytes a sample, not
16); one that missed an ingest or was written outside one keeps its own times until its
retained samples are all consecutive ingests' again.

Memory is capped (`limit_bytes`): `bytes` is what the samples' arrays and the series hold,
counted at each ingest. Over the cap, every series' history is shortened at once, oldest
samples first, to what fits in three quarters of it (its newest sample always stays, so
instant selectors keep working; range functions see the shorter window), and stays that short
until the store is under half the cap again; if even the newest samples do not fit, series not
yet stored are refused until it is. Both are counted (`cap_dropped_samples`) and logged once.
"""

from __future__ import annotations

import logging
import math
import struct
import sys
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpu_exporter.support.regex import label_matcher

log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]  # sorted by name; includes ("__name__", metric)
Sample = tuple[float, float]  # (unix seconds, value)
# One series' samples in a window: labels, times (unix milliseconds), values.
Window = tuple[Labels, "array[int]", "array[float]"]

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
class Retention:
    """What one metric keeps. `window`: seconds before each series' newest sample whose samples
    stay (a sample exactly that old stays; 0 keeps the newest alone; samples go only when a
    newer one is appended, so the newest always stays). `expire`: a series whose newest sample
    is older than this many seconds at an ingest is dropped whole."""

    window: float
    expire: float

    @classmethod
    def of(cls, value: float | Retention) -> Retention:
        """A plain number of seconds is both."""
        return value if isinstance(value, Retention) else cls(float(value), float(value))


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
        matched = label_matcher(self.value).match(labels_value) is not None
        return matched if self.op == "=~" else not matched


# No NaN (so no staleness marker) stored yet: older than any sample.
_NO_NAN = -(1 << 63)
# Loops over many series (here and in the rule engine) call their `check` (the rule group's
# deadline) every this many series; a power of two, so a loop may test `i & (CHECK_EVERY - 1)`.
CHECK_EVERY = 256
# Expired samples are dropped from the arrays' front in batches of at least this many, and
# once they are an eighth of the array: trimming stays amortized O(1) per sample.
_COMPACT_MIN = 16


class _Timeline:
    """The times (ms) of one ingest group's ingests, in order; entry i is `times[i - base]`."""

    __slots__ = ("base", "last_ms", "times")

    def __init__(self) -> None:
        self.times = array("q")
        self.base = 0  # entries before this were trimmed
        self.last_ms = _NO_NAN  # of the newest ingest: older than any


class _Series:
    __slots__ = (
        "last_ms", "last_t", "nan_ms", "next", "run", "start", "timeline", "times", "values",
    )  # fmt: skip

    def __init__(self) -> None:
        # Unix milliseconds, non-decreasing; None while the times are `timeline`'s entries
        # next - len(values) ... next - 1 (the series was in each of those ingests).
        self.times: array[int] | None = array("q")
        self.values = array("d")
        self.start = 0  # samples before this index have expired
        # The newest time exactly as given (dropping a series whose newest sample expired
        # compares float seconds), and in milliseconds: a sample not after it is refused.
        self.last_t = -math.inf
        self.last_ms = _NO_NAN
        self.nan_ms = _NO_NAN  # time of the newest NaN value: windows after it need no filter
        self.timeline: _Timeline | None = None  # that of the ingest of the newest sample
        self.next = 0  # the timeline entry after the newest sample's
        self.run = 0  # own times only: how many newest samples sit on consecutive entries

    def __len__(self) -> int:
        return len(self.values) - self.start

    def view(self) -> tuple[array[int], int]:
        """The array holding the times, and the offset of values[i]'s time in it."""
        if self.times is not None:
            return self.times, 0
        timeline = self.timeline
        assert timeline is not None
        return timeline.times, self.next - len(self.values) - timeline.base

    def seconds(self, index: int) -> float:
        """Time of sample `index` in seconds: the newest exactly as given, older ones in ms."""
        if index == len(self.values) - 1:
            return self.last_t
        times, offset = self.view()
        return times[index + offset] / 1000

    def own_times(self) -> None:
        """Copy the retained samples' times out of the timeline (it goes on without them)."""
        times, offset = self.view()
        self.times = times[self.start + offset : len(self.values) + offset]
        del self.values[: self.start]
        self.start = 0

    def share_times(self) -> None:
        """Drop the own times: the retained samples all sit on the timeline's entries."""
        del self.values[: self.start]
        self.start = 0
        self.times = None


# What one stored series costs besides its samples' 8 bytes each: its object and the headers
# of its two arrays (the allocator's slack is not counted).
_SERIES_BYTES = sys.getsizeof(_Series()) + 2 * sys.getsizeof(array("d"))
_SAMPLE_BYTES = 8  # a value, or a time (ms), in a typed array
# Over the cap, the history is shortened to fit this share of it.
_CAP_TARGET = 0.75


class SeriesStore:
    """Thread-safe store; the sampler appends, the rule engine selects."""

    def __init__(
        self, retention_seconds: float | Retention = 900.0, names: Iterable[str] | None = None
    ):
        self.retention = Retention.of(retention_seconds)
        # Only metrics some rule reads are kept: the rest would cost memory for nothing.
        self.names: frozenset[str] | None = frozenset(names) if names is not None else None
        self.retention_by_name: dict[str, Retention] = {}
        # Per metric: the window in milliseconds (None: forever) and the expiry in seconds.
        self._window_ms: dict[str, int | None] = {}
        self._expire: dict[str, float] = {}
        self._default_window_ms = _window_ms(self.retention)
        self._longest_ms: int | None = self._default_window_ms  # what timelines keep
        self._by_name: dict[str, dict[Labels, _Series]] = {}
        # By ingest group: the series of its last ingest, those it wrote markers for, its times.
        self._present: dict[str, set[Labels]] = {}
        self._marked: dict[str, set[Labels]] = {}
        self._timelines: dict[str, _Timeline] = {}
        self._lock = threading.Lock()
        # Counts changes to the contents: results computed from them stay valid while it stays.
        self.generation = 0
        # The memory cap (None: none); what the arrays and series held at the last ingest; the
        # windows as configured, before the cap shortens them; the longest history the cap
        # allows (None: not shortening); whether series not yet stored are taken in.
        self.max_bytes: int | None = None
        self.bytes = 0
        self.cap_dropped_samples = 0
        self._configured_default_ms = self._default_window_ms
        self._configured_ms: dict[str, int | None] = {}
        self._cap_window_ms: int | None = None
        self._admitting = True

    def configure(
        self,
        retention_seconds: float | Retention,
        names: Iterable[str] | None,
        retention_by_name: Mapping[str, float | Retention] | None = None,
    ) -> None:
        """Keep only `names` (None: everything), each for its own retention if given (the
        others for `retention_seconds`). Takes effect at each series' next sample."""
        with self._lock:
            self.retention = Retention.of(retention_seconds)
            self.retention_by_name = {
                name: Retention.of(value) for name, value in (retention_by_name or {}).items()
            }
            self._configured_default_ms = _window_ms(self.retention)
            self._configured_ms = {n: _window_ms(r) for n, r in self.retention_by_name.items()}
            self._expire = {n: r.expire for n, r in self.retention_by_name.items()}
            self._apply_windows()
            self.names = frozenset(names) if names is not None else None
            self.generation += 1
            if self.names is not None:
                for name in list(self._by_name):
                    if name not in self.names:
                        del self._by_name[name]

    def limit_bytes(self, max_bytes: int | None) -> None:
        """Cap the history's memory at `max_bytes` (None: no cap), from the next ingest."""
        with self._lock:
            self.max_bytes = max_bytes

    @property
    def history_limit_seconds(self) -> float | None:
        """The longest history the cap lets a series keep now (None: the cap is not biting;
        0: the newest sample alone)."""
        window = self._cap_window_ms
        return None if window is None else window / 1000

    def _apply_windows(self) -> None:
        """The windows in use: as configured, none longer than the cap allows."""
        cap = self._cap_window_ms

        def capped(window: int | None) -> int | None:
            return window if cap is None or (window is not None and window <= cap) else cap

        self._default_window_ms = capped(self._configured_default_ms)
        self._window_ms = {name: capped(w) for name, w in self._configured_ms.items()}
        windows = [self._default_window_ms, *self._window_ms.values()]
        self._longest_ms = None if None in windows else max(w for w in windows if w is not None)

    def clear(self) -> None:
        """Forget every sample, and which series each ingest group saw last (no markers)."""
        with self._lock:
            self._by_name.clear()
            self._present.clear()
            self._marked.clear()
            self._timelines.clear()
            self.generation += 1

    def append(self, labels: Labels, t: float, value: float) -> None:
        with self._lock:
            self._append(labels, t, round(t * 1000), value)

    def _append(
        self,
        labels: Labels,
        t: float,
        ms: int,
        value: float,
        timeline: _Timeline | None = None,
        entry: int = 0,
    ) -> None:
        """One sample; from an ingest, `entry` is its time's entry in the group's timeline."""
        name = metric_name(labels)
        if self.names is not None and name not in self.names:
            return
        by_labels = self._by_name.get(name)
        if by_labels is None:
            by_labels = self._by_name[name] = {}
        series = by_labels.get(labels)
        if series is None:
            if not self._admitting:  # over the memory cap even with the newest samples alone
                self.cap_dropped_samples += 1
                return
            series = by_labels[labels] = _Series()
        if ms <= series.last_ms:
            # Out of order, or on the newest sample's millisecond: Prometheus' TSDB keeps the
            # first sample of a millisecond (tsdb/head_append.go, 2.42: a duplicate timestamp
            # is refused), so its range functions never see two samples at one time.
            return
        series.last_t, series.last_ms = t, ms
        self.generation += 1
        times = series.times
        if timeline is not None and series.timeline is timeline and series.next == entry:
            series.next = entry + 1  # in this ingest too, as in the last of its group
            if times is not None:
                times.append(ms)
                series.run += 1
        else:
            if times is None:
                series.own_times()
                times = series.times
                assert times is not None
            times.append(ms)
            if timeline is None:
                series.timeline, series.run = None, 0
            else:
                series.timeline, series.next, series.run = timeline, entry + 1, 1
        series.values.append(value)
        if value != value:
            series.nan_ms = ms
        window_ms = self._window_ms.get(name, self._default_window_ms)
        if window_ms is not None:
            if window_ms == self._cap_window_ms:  # shortened by the cap: count what it drops
                before = len(series.values) - series.start
                self._trim(series, ms - window_ms)
                self.cap_dropped_samples += before - (len(series.values) - series.start)
            else:
                self._trim(series, ms - window_ms)
        if times is not None and series.run >= len(series):
            series.share_times()

    def _trim(self, series: _Series, horizon: int, now: bool = False) -> None:
        # In milliseconds, as the evaluator's windows: [t - range, t] read at a sample's own
        # time is exactly what a window of `range` before it keeps. `now`: free the memory at
        # once (the cap), however few samples go.
        values = series.values
        times, timeline = series.times, series.timeline
        if times is None:  # series.view(), inlined: this runs for every sample
            assert timeline is not None
            times, offset = timeline.times, series.next - len(values) - timeline.base
        else:
            offset = 0
        start = series.start
        if now:
            start = bisect_left(times, horizon, start + offset, len(values) + offset) - offset
        while start < len(values) and times[start + offset] < horizon:
            start += 1
        # Batched (amortized O(1) a sample), except that a series down to its newest sample
        # (an instant-only metric's every append) drops the rest at once.
        if (
            (start >= _COMPACT_MIN and start * 8 >= len(values))
            or 0 < start == len(values) - 1
            or (now and start)
        ):
            if series.times is not None:
                del series.times[:start]
            del values[:start]
            start = 0
        series.start = start

    def ingest(
        self, t: float, samples: Iterable[tuple[Labels, float]], group: str = "scrape"
    ) -> None:
        """One scrape's worth of samples at time `t`; vanished series get a staleness marker.

        `group` names a part of a scrape ingested separately (a tick's series arrive in two
        parts, before and after rule evaluation): a series is stale when it vanishes from the
        next ingest of its own group."""
        ms = round(t * 1000)
        with self._lock:
            timeline = self._timelines.get(group)
            if timeline is None:
                timeline = self._timelines[group] = _Timeline()
            if ms > timeline.last_ms:
                timeline.times.append(ms)
                timeline.last_ms = ms
                entry = timeline.base + len(timeline.times) - 1
                shared: _Timeline | None = timeline
            else:  # a clock stepped back (or not past the last ingest's millisecond): no
                # shared time (nor, mostly, a sample) this time
                entry, shared = 0, None
            present: set[Labels] = set()
            for labels, value in samples:
                present.add(labels)
                self._append(labels, t, ms, value, shared, entry)
            # Series marked stale last time and still gone leave the timeline, as it goes on.
            for labels in self._marked.get(group, set()) - present:
                series = self._by_name.get(metric_name(labels), {}).get(labels)
                if series is not None and series.times is None and series.timeline is timeline:
                    series.own_times()
            marked = self._present.get(group, set()) - present
            for labels in marked:
                self._append(labels, t, ms, STALE_NAN, shared, entry)
            self._present[group], self._marked[group] = present, marked
            self._trim_timeline(timeline, ms)
            self._sweep(t)
            if self.max_bytes is not None:
                self._enforce_cap(t)

    def _trim_timeline(self, timeline: _Timeline, ms: int, now: bool = False) -> None:
        # Each series on it was written by its newest ingest and keeps no more than its own
        # window (a series that missed two of its ingests has copied its times out).
        if self._longest_ms is None:
            return
        expired = bisect_left(timeline.times, ms - self._longest_ms)
        if (expired >= _COMPACT_MIN and expired * 8 >= len(timeline.times)) or (now and expired):
            del timeline.times[:expired]
            timeline.base += expired

    def _sweep(self, now: float) -> None:
        """Drop series that are empty or whose newest sample expired; count the bytes kept."""
        elements = stored = 0
        for name, by_labels in list(self._by_name.items()):
            horizon = now - self._expire.get(name, self.retention.expire)
            for labels, series in list(by_labels.items()):
                count = len(series.values)
                if count == series.start or series.last_t < horizon:
                    del by_labels[labels]
                    self.generation += 1
                    continue
                stored += 1
                elements += count if series.times is None else count + len(series.times)
            if not by_labels:
                del self._by_name[name]
        elements += sum(len(timeline.times) for timeline in self._timelines.values())
        self.bytes = elements * _SAMPLE_BYTES + stored * _SERIES_BYTES

    def _enforce_cap(self, now: float) -> None:
        cap = self.max_bytes
        assert cap is not None
        if self.bytes > cap:
            self._shorten(now, cap)
        elif self.bytes < cap // 2 and (self._cap_window_ms is not None or not self._admitting):
            self._relax()

    def _shorten(self, now: float, cap: int) -> None:
        """Shorten every series' history until the store fits in _CAP_TARGET of the cap."""
        target = int(cap * _CAP_TARGET)
        was_capping = self._cap_window_ms is not None
        window = self._cap_window_ms
        if window is None:  # start from the history actually held, not the rules' ranges
            span = self._span_ms()
            window = span if self._longest_ms is None else min(self._longest_ms, span)
        while self.bytes > target and window > 0:
            stored = self._series_count()
            fixed = stored * (_SERIES_BYTES + _SAMPLE_BYTES)  # each series' newest sample
            shrinking = self.bytes - fixed
            share = max(0, target - fixed) / shrinking if shrinking > 0 else 0.0
            window = min(window - 1, int(window * share))
            window = window if window >= 1000 else 0  # under a second: the newest sample only
            self._cap_window_ms = window
            self._apply_windows()
            self._trim_all()
            self._sweep(now)
        if not was_capping and self._cap_window_ms is not None:
            log.warning(
                "rule history reached its memory cap of %d bytes (rules.history_max_bytes) with "
                "%d series: each keeps at most %gs of history now, oldest samples dropped "
                "first; rules reading further back see less (raise the cap, or shorten the "
                "rules' ranges)",
                cap, self._series_count(), self._cap_window_ms / 1000,
            )  # fmt: skip
        if self.bytes > cap and self._admitting:
            self._admitting = False
            log.warning(
                "rule history over its memory cap of %d bytes (rules.history_max_bytes) with "
                "the newest sample of each of its %d series alone: new series are not stored "
                "until it is under half the cap",
                cap, self._series_count(),
            )  # fmt: skip

    def _trim_all(self) -> None:
        """Every series and timeline down to its window now (the cap shortened them)."""
        for name, by_labels in self._by_name.items():
            window = self._window_ms.get(name, self._default_window_ms)
            if window is None:
                continue
            for series in by_labels.values():
                before = len(series.values) - series.start
                self._trim(series, series.last_ms - window, now=True)
                self.cap_dropped_samples += before - (len(series.values) - series.start)
        for timeline in self._timelines.values():
            self._trim_timeline(timeline, timeline.last_ms, now=True)

    def _relax(self) -> None:
        """Under half the cap: take new series in again, and let the history grow back
        (twice as long each time, until the configured windows apply again)."""
        if not self._admitting:
            self._admitting = True
            log.info("rule history under half its memory cap: new series are stored again")
        window = self._cap_window_ms
        if window is None:
            return
        window = max(2 * window, 1000)
        configured = [self._configured_default_ms, *self._configured_ms.values()]
        if None not in configured and window >= max(w for w in configured if w is not None):
            self._cap_window_ms = None
            log.info("rule history under half its memory cap: the rules' full ranges are kept")
        else:
            self._cap_window_ms = window
        self._apply_windows()

    def _span_ms(self) -> int:
        """The longest history any series holds (for a store keeping everything)."""
        longest = 0
        for by_labels in self._by_name.values():
            for series in by_labels.values():
                if len(series):
                    times, offset = series.view()
                    longest = max(longest, series.last_ms - times[series.start + offset])
        return longest

    def _series_count(self) -> int:
        return sum(len(group) for group in self._by_name.values())

    def _candidates(
        self, matchers: Sequence[Matcher], check: Callable[[], None] | None = None
    ) -> list[tuple[Labels, _Series]]:
        name_matcher = next((m for m in matchers if m.name == "__name__" and m.op == "="), None)
        if name_matcher is not None:
            found = list(self._by_name.get(name_matcher.value, {}).items())
            if len(matchers) == 1:
                return found  # the name is all there is to match
        else:
            found = [item for group in self._by_name.values() for item in group.items()]
        if check is None:
            return [(labels, s) for labels, s in found if _labels_match(labels, matchers)]
        chosen: list[tuple[Labels, _Series]] = []
        for start in range(0, len(found), CHECK_EVERY):
            check()
            part = found[start : start + CHECK_EVERY]
            chosen += [(labels, s) for labels, s in part if _labels_match(labels, matchers)]
        return chosen

    def range_ms(
        self,
        matchers: Sequence[Matcher],
        lo_ms: int,
        hi_ms: int,
        check: Callable[[], None] | None = None,
    ) -> list[Window]:
        """Per matching series, its times (ms) and values in [lo_ms, hi_ms], both ends
        inclusive, staleness markers left out (as PromQL's range selectors drop them);
        series with no such sample are left out. Unordered. `check` (a deadline's) is called
        every few series and may raise to stop the selection."""
        with self._lock:
            chosen = []
            for i, (labels, series) in enumerate(self._candidates(matchers, check)):
                if check is not None and not i % CHECK_EVERY:
                    check()
                times, offset = series.view()
                values = series.values
                first = bisect_left(times, lo_ms, series.start + offset, len(values) + offset)
                end = bisect_right(times, hi_ms, first, len(values) + offset)
                if first == end:
                    continue
                if series.nan_ms < times[first]:  # no NaN in the window: no marker to drop
                    window_values = values[first - offset : end - offset]
                    chosen.append((labels, times[first:end], window_values))
                    continue
                kept = [i for i in range(first, end) if not _is_marker(values[i - offset])]
                if kept:
                    window_times = array("q", [times[i] for i in kept])
                    window_values = array("d", [values[i - offset] for i in kept])
                    chosen.append((labels, window_times, window_values))
        return chosen

    def latest_ms(
        self, matchers: Sequence[Matcher], end_ms: int, check: Callable[[], None] | None = None
    ) -> list[tuple[Labels, int, float]]:
        """Per matching series, its newest sample at or before `end_ms` as (labels, ms,
        value), markers included. Unordered. `check` as for range_ms."""
        with self._lock:
            chosen = []
            for i, (labels, series) in enumerate(self._candidates(matchers, check)):
                if check is not None and not i % CHECK_EVERY:
                    check()
                times, offset = series.view()
                index = len(series.values) - 1 + offset
                low = series.start + offset
                if index < low:
                    continue
                if times[index] > end_ms:
                    index = bisect_right(times, end_ms, low, index) - 1
                    if index < low:
                        continue
                chosen.append((labels, times[index], series.values[index - offset]))
        return chosen

    def select(
        self, matchers: Sequence[Matcher], start: float, end: float
    ) -> Iterator[tuple[Labels, list[Sample]]]:
        """Series matching all matchers, with their samples in [start, end] seconds (markers
        included; times as `_Series.seconds` gives them)."""
        with self._lock:
            chosen = []
            for labels, series in self._candidates(matchers):
                window = [
                    (t, series.values[i])
                    for i in range(series.start, len(series.values))
                    if start <= (t := series.seconds(i)) <= end
                ]
                if window:
                    chosen.append((labels, window))
        yield from chosen

    def select_latest(
        self, matchers: Sequence[Matcher], end: float
    ) -> Iterator[tuple[Labels, list[Sample]]]:
        """Per matching series, the newest sample at or before `end` seconds."""
        with self._lock:
            chosen = []
            for labels, series in self._candidates(matchers):
                for i in range(len(series.values) - 1, series.start - 1, -1):
                    if (t := series.seconds(i)) <= end:
                        chosen.append((labels, [(t, series.values[i])]))
                        break
        yield from chosen

    def series_count(self) -> int:
        with self._lock:
            return self._series_count()

    def series_by_name(self) -> dict[str, int]:
        """How many series each metric has now."""
        with self._lock:
            return {name: len(group) for name, group in self._by_name.items()}

    def sample_count(self) -> int:
        with self._lock:
            return sum(len(s) for group in self._by_name.values() for s in group.values())


def _window_ms(retention: Retention) -> int | None:
    return None if retention.window == math.inf else round(retention.window * 1000)


def _is_marker(value: float) -> bool:
    return value != value and is_stale(value)


def _labels_match(labels: Labels, matchers: Sequence[Matcher]) -> bool:
    values = dict(labels)
    return all(m.matches(values.get(m.name, "")) for m in matchers)
