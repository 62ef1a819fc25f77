"""SeriesStore: bounded history per metric, staleness markers, selection windows."""

from __future__ import annotations

from gpu_exporter.store import Matcher, SeriesStore, is_stale, make_labels

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
