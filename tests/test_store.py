"""SeriesStore: bounded history per metric, staleness markers, selection windows."""

from __future__ import annotations

import math
import random
import struct

from gpu_exporter.alerting.store import (
    STALE_NAN,
    Labels,
    Matcher,
    Retention,
    SeriesStore,
    is_stale,
    make_labels,
)

A = make_labels("a", [("gpu", "0")])
B = make_labels("a", [("gpu", "1")])
C = make_labels("c", [("gpu", "0")])
NAME_A = [Matcher("__name__", "=", "a")]


def test_vanished_series_get_a_staleness_marker() -> None:
    store = SeriesStore()
    store.ingest(1.0, [(A, 1.0), (B, 2.0)])
    store.ingest(2.0, [(A, 1.5)])
    ((_, latest_b),) = [row for row in store.select_latest(NAME_A, 2.0) if row[0] == B]
    assert latest_b[0][0] == 2.0 and is_stale(latest_b[0][1])
    assert not is_stale(float("nan"))


def test_retention_is_per_metric() -> None:
    store = SeriesStore(retention_seconds=10)
    store.configure(10, None, {"c": 100})
    for t in range(60):
        store.ingest(float(t), [(A, 1.0), (C, 2.0)])
    a_window = dict(store.select(NAME_A, 0, 100))[A]
    c_window = dict(store.select([Matcher("__name__", "=", "c")], 0, 100))[C]
    assert len(a_window) == 11  # t = 49..59
    assert len(c_window) == 60


def test_only_named_metrics_are_kept() -> None:
    store = SeriesStore(names=["a"])
    store.ingest(1.0, [(A, 1.0), (C, 2.0)])
    assert store.series_count() == 1


def test_select_windows_and_matchers() -> None:
    store = SeriesStore()
    for t in range(10):
        store.ingest(float(t), [(A, float(t)), (B, -float(t))])
    window = dict(store.select([*NAME_A, Matcher("gpu", "=~", "0|2")], 3.0, 5.0))
    assert window == {A: [(3.0, 3.0), (4.0, 4.0), (5.0, 5.0)]}
    assert dict(store.select([Matcher("gpu", "!~", "0")], 9.0, 9.0)) == {B: [(9.0, -9.0)]}
    assert dict(store.select_latest(NAME_A, 4.5)) == {A: [(4.0, 4.0)], B: [(4.0, -4.0)]}


def test_out_of_order_samples_are_ignored() -> None:
    store = SeriesStore()
    store.append(A, 5.0, 1.0)
    store.append(A, 4.0, 2.0)
    assert dict(store.select(NAME_A, 0, 10)) == {A: [(5.0, 1.0)]}


# --- millisecond windows (what the evaluator reads) ----------------------------------------------


def test_times_are_milliseconds_rounded_once_as_the_evaluator_rounds_them() -> None:
    # Sub-millisecond times, including halves (round() rounds them to even, as before).
    rng = random.Random(7)
    times = sorted({round(rng.uniform(0, 50), 6) for _ in range(300)} | {0.0005, 0.0015, 2.5005})
    store = SeriesStore(retention_seconds=math.inf)
    for t in times:
        store.append(A, t, t)
    ((_, got_times, got_values),) = store.range_ms(NAME_A, -1, 10**9)
    kept = first_per_millisecond([(t, t) for t in times])
    assert len(kept) < len(times)  # some share a millisecond: the first of each stays
    assert list(got_times) == [round(t * 1000) for t, _ in kept]
    assert list(got_values) == [v for _, v in kept]


def first_per_millisecond(samples: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """What Prometheus' TSDB keeps of in-order samples: the first of each millisecond."""
    kept: list[tuple[float, float]] = []
    for t, value in samples:
        if not kept or round(t * 1000) > round(kept[-1][0] * 1000):
            kept.append((t, value))
    return kept


def test_range_windows_are_inclusive_at_both_ends() -> None:
    store = SeriesStore()
    for ms in (1000, 1001, 1002, 1003):
        store.append(A, ms / 1000, float(ms))
    assert window(store, 1001, 1002) == [(1001, 1001.0), (1002, 1002.0)]
    assert window(store, 1001, 1001) == [(1001, 1001.0)]
    assert window(store, 1000, 1003) == [(ms, float(ms)) for ms in (1000, 1001, 1002, 1003)]
    assert window(store, 1004, 2000) == []
    assert window(store, 0, 999) == []
    assert store.range_ms(NAME_A, 1004, 2000) == []  # no sample in the window: no row at all


def test_a_second_sample_on_the_same_millisecond_is_refused_as_prometheus_does() -> None:
    # 1.0001 s is after 1.0 s but lands on the same millisecond: Prometheus' TSDB keeps the
    # first sample of a millisecond and refuses the next (a duplicate timestamp).
    store = SeriesStore()
    store.append(A, 1.0, 1.0)
    store.append(A, 1.0001, 2.0)
    store.append(A, 1.001, 3.0)
    assert window(store, 1000, 1000) == [(1000, 1.0)]
    assert window(store, 1001, 1001) == [(1001, 3.0)]
    assert store.latest_ms(NAME_A, 1000) == [(A, 1000, 1.0)]
    # Ingests too: the second one on a millisecond writes nothing and keeps the times shared.
    store = SeriesStore()
    store.ingest(2.0, [(A, 1.0)])
    store.ingest(2.0004, [(A, 2.0)])
    store.ingest(3.0, [(A, 3.0)])
    assert window(store, 0, 10_000) == [(2000, 1.0), (3000, 3.0)]
    ((_, series),) = store._by_name["a"].items()
    assert series.times is None


def test_staleness_markers_are_left_out_of_windows_and_other_nans_kept() -> None:
    store = SeriesStore()
    for t, value in [(1, 1.0), (2, STALE_NAN), (3, math.nan), (4, 4.0), (5, STALE_NAN), (6, 6.0)]:
        store.append(A, float(t), value)
    got = window(store, 1000, 6000)
    assert [ms for ms, _ in got] == [1000, 3000, 4000, 6000]
    assert math.isnan(got[1][1]) and not is_stale(got[1][1])
    assert window(store, 2000, 2000) == []  # only a marker there
    assert store.range_ms(NAME_A, 2000, 2000) == []
    assert window(store, 5000, 6000) == [(6000, 6.0)]  # the window starts on the newest NaN
    assert window(store, 6000, 6000) == [(6000, 6.0)]  # after every NaN: no filtering needed
    # The newest sample at or before a time is returned even when it is a marker.
    ((_, ms, value),) = store.latest_ms(NAME_A, 5500)
    assert ms == 5000 and is_stale(value)


def test_a_marker_keeps_its_bits_in_storage() -> None:
    store = SeriesStore()
    store.ingest(1.0, [(A, 1.0), (B, 2.0)])
    store.ingest(2.0, [(A, 1.0)])
    ((_, ms, value),) = [row for row in store.latest_ms(NAME_A, 2000) if row[0] == B]
    assert ms == 2000 and is_stale(value)
    assert struct.pack("<d", value) == struct.pack("<d", STALE_NAN)


def test_windows_match_a_plain_filter_over_everything_appended() -> None:
    """range_ms and latest_ms against what the evaluator computed from raw float times before
    the store kept milliseconds: round(t * 1000) per sample, markers dropped from ranges."""
    rng = random.Random(11)
    store = SeriesStore(retention_seconds=math.inf)
    appended: list[tuple[float, float]] = []
    t = 100.0
    for _ in range(400):
        t += rng.choice([1.0, 0.25, 0.0004, 0.0006, 0.001, 1.0003])
        roll = rng.random()
        value = STALE_NAN if roll < 0.05 else math.nan if roll < 0.1 else rng.uniform(-1, 1)
        store.append(A, t, value)
        appended.append((t, value))
    appended = first_per_millisecond(appended)
    for _ in range(300):
        lo = round(rng.uniform(90, t + 5) * 1000)
        hi = lo + rng.choice([0, 1, 2, 999, 1000, 5000, 60_000])
        expected = [
            (round(ts * 1000), v)
            for ts, v in appended
            if lo <= round(ts * 1000) <= hi and not is_stale(v)
        ]
        assert same(window(store, lo, hi), expected), (lo, hi)
        before = [(round(ts * 1000), v) for ts, v in appended if round(ts * 1000) <= hi]
        latest = store.latest_ms(NAME_A, hi)
        if not before:
            assert latest == []
        else:
            ((_, ms, value),) = latest
            assert same([(ms, value)], before[-1:])


def test_out_of_order_and_duplicate_times_are_rejected() -> None:
    store = SeriesStore()
    store.append(A, 5.0, 1.0)
    store.append(A, 5.0, 2.0)  # the same time
    store.append(A, 4.9999, 3.0)  # earlier, though on the same millisecond as 5.0
    store.ingest(3.0, [(A, 4.0)])  # an ingest is no exception
    store.append(A, 5.0002, 5.0)  # later, but on the same millisecond: refused
    store.append(A, 5.0006, 6.0)  # the next millisecond: kept
    assert window(store, 0, 10_000) == [(5000, 1.0), (5001, 6.0)]
    assert dict(store.select(NAME_A, 0, 10)) == {A: [(5.0, 1.0), (5.0006, 6.0)]}


def test_retention_trims_the_front_and_keeps_memory_bounded() -> None:
    store = SeriesStore(retention_seconds=10)
    for t in range(1000):
        store.append(A, float(t), float(t))
    got = window(store, 0, 10**7)
    assert [ms for ms, _ in got] == [t * 1000 for t in range(989, 1000)]  # horizon 989 is kept
    assert store.sample_count() == 11
    ((_, series),) = store._by_name["a"].items()
    # Expired samples are removed in batches: never more than 16 (or an eighth) linger.
    assert len(series.times) == len(series.values) < 11 + 16


def test_retention_horizon_is_inclusive_per_metric() -> None:
    store = SeriesStore(retention_seconds=2.5)
    store.configure(2.5, None, {"c": 1.0})
    for t in (1.0, 2.0, 3.0, 3.5):
        store.ingest(t, [(A, t), (C, t)])
    assert [ms for ms, _ in window(store, 0, 10**6)] == [1000, 2000, 3000, 3500]
    ((_, c_times, _),) = store.range_ms([Matcher("__name__", "=", "c")], 0, 10**6)
    assert list(c_times) == [3000, 3500]  # 2.5 is before 3.5 - 1.0; 3.0 is not


def test_series_whose_newest_sample_expired_are_dropped() -> None:
    store = SeriesStore(retention_seconds=5)
    store.ingest(1.0, [(A, 1.0), (B, 1.0)])
    store.append(B, 2.0, 2.0)
    store.ingest(7.0, [(A, 1.0)], group="other")  # B's newest (2.0) is not older than 7 - 5
    assert store.series_count() == 2
    store.ingest(7.5, [(A, 1.0)], group="other")  # now it is
    assert store.series_count() == 1
    assert store.latest_ms(NAME_A, 10**6) == [(A, 7500, 1.0)]


def test_select_reports_the_newest_time_exactly() -> None:
    store = SeriesStore()
    store.ingest(1.0001, [(A, 1.0)])
    store.ingest(2.123456789, [(A, 2.0)])
    assert dict(store.select_latest(NAME_A, 2.123456789)) == {A: [(2.123456789, 2.0)]}
    assert dict(store.select_latest(NAME_A, 2.1)) == {A: [(1.0, 1.0)]}  # older: milliseconds
    assert dict(store.select(NAME_A, 0, 3)) == {A: [(1.0, 1.0), (2.123456789, 2.0)]}


def test_configure_drops_names_no_rule_reads() -> None:
    store = SeriesStore()
    store.ingest(1.0, [(A, 1.0), (C, 2.0)])
    store.configure(900, ["c"])
    assert store.latest_ms(NAME_A, 10**6) == []
    assert store.latest_ms([Matcher("__name__", "=", "c")], 10**6) == [(C, 1000, 2.0)]
    store.ingest(2.0, [(A, 1.0), (C, 2.0)])
    assert store.series_count() == 1


def window(store: SeriesStore, lo_ms: int, hi_ms: int) -> list[tuple[int, float]]:
    rows = [row for row in store.range_ms(NAME_A, lo_ms, hi_ms) if row[0] == A]
    if not rows:
        return []
    ((_, times, values),) = rows
    assert len(times) == len(values) > 0
    return list(zip(times, values, strict=True))


def same(got: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """Equal, NaNs included (bit for bit)."""
    pack = [(ms, struct.pack("<d", v)) for ms, v in got]
    return pack == [(ms, struct.pack("<d", v)) for ms, v in expected]


def test_clear_forgets_samples_and_presence() -> None:
    store = SeriesStore()
    store.ingest(1.0, [(A, 1.0), (B, 2.0)])
    generation = store.generation
    store.clear()
    assert store.sample_count() == 0 and store.generation > generation
    store.ingest(2.0, [(A, 3.0)])  # B vanished before the clear: no marker for it now
    assert store.series_count() == 1
    assert window(store, 0, 10_000) == [(2000, 3.0)]


def test_a_zero_window_keeps_the_newest_sample_alone_until_it_expires() -> None:
    store = SeriesStore()
    store.configure(900, None, {"a": Retention(window=0.0, expire=5.0)})
    for t in range(1, 50):
        store.ingest(float(t), [(A, float(t)), (C, float(t))])
    assert window(store, 0, 10**6) == [(49_000, 49.0)]
    ((_, series),) = store._by_name["a"].items()
    assert len(series.values) == 1  # nothing expired is left behind
    store.ingest(54.0, [(C, 1.0)], group="other")  # A's newest is 5 s old: kept
    assert store.latest_ms(NAME_A, 10**6) == [(A, 49_000, 49.0)]
    store.ingest(54.5, [(C, 1.0)], group="other")
    assert store.latest_ms(NAME_A, 10**6) == []
    assert store.sample_count() == 49 + 2  # c keeps its 900 s


def test_a_number_of_seconds_is_both_window_and_expiry() -> None:
    assert Retention.of(7) == Retention(7.0, 7.0)
    assert SeriesStore(retention_seconds=3).retention == Retention(3.0, 3.0)


# --- times shared by the series of an ingest group ------------------------------------------


def test_series_in_every_ingest_of_their_group_keep_no_times_of_their_own() -> None:
    store = SeriesStore(retention_seconds=10)
    for t in range(1, 200):
        store.ingest(float(t), [(A, float(t)), (B, -float(t))])
        store.ingest(t + 0.5, [(C, float(t))], group="late")
    assert all(s.times is None for g in store._by_name.values() for s in g.values())
    assert window(store, 0, 10**6) == [(ms, ms / 1000) for ms in range(189_000, 200_000, 1000)]
    ((_, c_times, _),) = store.range_ms([Matcher("__name__", "=", "c")], 0, 10**6)
    assert list(c_times) == list(range(189_500, 199_501, 1000))
    # Each group's times are kept once, for the longest window (and a batch of expired ones).
    assert {name: len(line.times) < 11 + 16 for name, line in store._timelines.items()} == {
        "scrape": True,
        "late": True,
    }


def test_a_series_with_a_gap_keeps_its_own_times_until_its_samples_are_consecutive_again() -> None:
    store = SeriesStore(retention_seconds=10)
    for t in range(1, 26):
        gone = 15 <= t < 19  # a marker at 15, nothing at 16-18
        store.ingest(float(t), [(A, float(t))] if gone else [(A, float(t)), (B, float(t))])
    series = store._by_name["a"][B]
    assert series.times is not None  # 15 (the marker) and 19 ... 25 are kept
    assert [ms for ms, _ in window_of(store, B, 0, 10**6)] == list(range(19_000, 26_000, 1000))
    ((_, ms, value),) = store.latest_ms([Matcher("gpu", "=", "1")], 18_000)
    assert ms == 15_000 and is_stale(value)
    store.ingest(26.0, [(A, 1.0), (B, 26.0)])  # 16 expired: what is kept is 19 ... 26
    assert series.times is None
    assert window_of(store, B, 0, 10**6) == [(ms, ms / 1000) for ms in range(19_000, 27_000, 1000)]


def test_a_series_gone_from_its_group_keeps_its_times_while_the_group_goes_on() -> None:
    # Kept 60 s after its newest sample, long after the group's times of then are trimmed.
    store = SeriesStore()
    store.configure(10, None, {"a": Retention(window=10.0, expire=60.0)})
    for t in range(1, 51):
        store.ingest(float(t), [(A, float(t)), (B, float(t))])
    for t in range(51, 110):
        store.ingest(float(t), [(A, float(t))])  # B: a marker at 51, then nothing
    assert len(store._timelines["scrape"].times) < 30  # its times of 41 ... 50 went
    expected = [(ms, ms / 1000) for ms in range(41_000, 51_000, 1000)]
    assert window_of(store, B, 0, 10**6) == expected
    ((_, ms, value),) = store.latest_ms([Matcher("gpu", "=", "1")], 10**6)
    assert ms == 51_000 and is_stale(value)


def test_shared_times_read_as_a_plain_record_of_every_sample() -> None:
    """Random ingests in two groups (series vanishing and coming back, a clock stepping back,
    same-millisecond times, plain appends between): every window and newest sample read as
    they would from a plain list of what was accepted."""
    rng = random.Random(5)
    store = SeriesStore()
    store.configure(20, None, {"a": Retention(window=20.0, expire=45.0)})
    labelsets = [make_labels("a", [("gpu", str(i))]) for i in range(6)]
    accepted: dict[Labels, list[tuple[float, float]]] = {}
    present: dict[str, set[Labels]] = {}
    seen_shared = seen_own = 0
    away: set[Labels] = set()

    def write(labels: Labels, t: float, value: float) -> None:
        samples = accepted.setdefault(labels, [])
        if not samples or round(t * 1000) > round(samples[-1][0] * 1000):
            samples.append((t, value))

    t = 1000.0
    for _ in range(1500):
        t += rng.choice([1.0, 1.0, 1.0, 0.5, 0.0004, -2.0 if rng.random() < 0.1 else 1.0])
        if rng.random() < 0.05:
            labels, value = rng.choice(labelsets), rng.random()
            store.append(labels, t, value)
            write(labels, t, value)
            continue
        group = rng.choice(["tick", "tick", "late"])  # gpu 0-3 come in the one, 4-5 the other
        mine = labelsets[:4] if group == "tick" else labelsets[4:]
        if rng.random() < 0.05:
            away ^= {rng.choice(labelsets)}  # gone for a while (kept until it expires)
        now = [(labels, rng.random()) for labels in mine if rng.random() < 0.98]
        now = [(labels, value) for labels, value in now if labels not in away]
        store.ingest(t, now, group=group)
        for labels, value in now:
            write(labels, t, value)
        for labels in present.get(group, set()) - {labels for labels, _ in now}:
            write(labels, t, STALE_NAN)
        present[group] = {labels for labels, _ in now}
        for labels in list(accepted):
            if accepted[labels][-1][0] < t - 45.0:
                del accepted[labels]  # its newest sample expired: the series went
        assert store.series_count() == len(accepted)
        for labels, samples in accepted.items():
            series = store._by_name["a"][labels]
            seen_shared += series.times is None
            seen_own += series.times is not None
            newest = round(samples[-1][0] * 1000)
            kept = [
                (round(ts * 1000), v) for ts, v in samples if round(ts * 1000) >= newest - 20_000
            ]
            lo = rng.randint(newest - 20_000, newest + 10)
            hi = lo + rng.choice([0, 1, 999, 1000, 5000, 30_000])
            wanted = [(ms, v) for ms, v in kept if lo <= ms <= hi and not is_stale(v)]
            assert same(window_of(store, labels, lo, hi), wanted), (labels, lo, hi)
            matchers = [Matcher("gpu", "=", labels[1][1])]
            ((_, ms, value),) = store.latest_ms(matchers, newest + 5)
            assert same([(ms, value)], kept[-1:])
            before = [(ms, v) for ms, v in kept if ms <= hi]
            if before and before[0] != kept[0]:  # the newest at or before hi is kept
                ((_, ms, value),) = store.latest_ms(matchers, hi)
                assert same([(ms, value)], before[-1:])
    assert seen_shared > 1000 and seen_own > 100  # both ways of keeping times were read


def window_of(
    store: SeriesStore, labels: Labels, lo_ms: int, hi_ms: int
) -> list[tuple[int, float]]:
    matchers = [Matcher(name, "=", value) for name, value in labels]
    rows = [row for row in store.range_ms(matchers, lo_ms, hi_ms) if row[0] == labels]
    if not rows:
        return []
    ((_, times, values),) = rows
    return list(zip(times, values, strict=True))


# --- the memory cap ------------------------------------------------------------------------------


def gpus(count: int, name: str = "a") -> list[Labels]:
    return [make_labels(name, [("gpu", str(i))]) for i in range(count)]


def test_bytes_count_the_samples_arrays_and_series() -> None:
    from gpu_exporter.alerting.store import _SERIES_BYTES

    store = SeriesStore(retention_seconds=3600)
    for t in range(100):
        store.ingest(1000.0 + t, [(labels, 1.0) for labels in gpus(4)])
    # Four series sharing one timeline: 4 x 100 values, 100 times, four series' overhead.
    assert store.bytes == (4 * 100 + 100) * 8 + 4 * _SERIES_BYTES


def test_over_the_cap_every_history_is_shortened_oldest_first() -> None:
    cap = 64 * 1024
    store, full = SeriesStore(retention_seconds=3600), SeriesStore(retention_seconds=math.inf)
    store.limit_bytes(cap)
    labelsets = gpus(8)
    rng = random.Random(3)
    for t in range(3000):
        samples = [(labels, rng.random()) for labels in labelsets]
        for target in (store, full):
            target.ingest(1000.0 + t, samples)
        assert store.bytes <= cap, t
    limit = store.history_limit_seconds
    assert limit is not None and 0 < limit < 3000
    assert store.cap_dropped_samples > 0
    # What is kept is exactly the newest `limit` seconds of each series, as the full store has it.
    newest = round((1000.0 + 2999) * 1000)
    for labels in labelsets:
        kept = window_of(store, labels, 0, newest)
        assert kept == window_of(full, labels, kept[0][0], newest)
        assert kept[-1][0] == newest
        assert newest - kept[0][0] >= limit * 1000 * 7 / 8  # trimmed in batches, never below


def test_when_the_newest_samples_alone_do_not_fit_new_series_are_refused() -> None:
    from gpu_exporter.alerting.store import _SERIES_BYTES

    store = SeriesStore(retention_seconds=Retention(window=60, expire=5))
    store.limit_bytes(20 * 1024)
    many = 20 * 1024 // _SERIES_BYTES + 10  # more series than the cap holds
    for t in range(3):
        store.ingest(1000.0 + t, [(labels, 1.0) for labels in gpus(many)])
    assert store.history_limit_seconds == 0  # the newest sample of each, and still too much
    before = store.series_count()
    store.ingest(1003.0, [(labels, 1.0) for labels in gpus(many + 30)])
    assert store.series_count() == before  # the 30 new ones were not stored
    assert store.cap_dropped_samples >= 30
    # The series go (expire 5 s after their newest sample), the store is under half its cap:
    # new series are stored again, and the history grows back to what the rules asked for.
    for t in range(1010, 1020):  # the old ones' staleness markers at 1010, gone at 1016
        store.ingest(float(t), [(labels, 2.0) for labels in gpus(2, "b")])
    assert store.series_count() == 2
    for t in range(1020, 1200):
        store.ingest(float(t), [(labels, 2.0) for labels in gpus(2, "b")])
    assert store.history_limit_seconds is None
    assert store.bytes < 20 * 1024
