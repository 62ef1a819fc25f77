"""`rules.semantics`: each difference between Prometheus 2.42's and 3.x's PromQL over floats,
on the smallest data that shows it. The expected values are the ones the two versions'
source gives (promql/engine.go, functions.go and quantile.go at v2.42.0 and v3.14.0; several
are the examples of Prometheus' own promqltest files); tests/promql/upstream checks both
modes against those files at large."""

from __future__ import annotations

import math

import pytest

from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.promql import PROMETHEUS_2, PROMETHEUS_3, PromQLError
from gpu_exporter.alerting.rules.series_notation import parse_series, parse_values
from gpu_exporter.alerting.store import SeriesStore

BOTH = (PROMETHEUS_2, PROMETHEUS_3)


def store_of(step_seconds: float, **series: str) -> SeriesStore:
    """`name='{labels} values'`-style input: each keyword's series at step_seconds apart."""
    store = SeriesStore(retention_seconds=math.inf)
    for text in series.values():
        labels_text, values = text.split(" ", 1)
        labels = parse_series(labels_text)
        for i, value in enumerate(parse_values(values)):
            if value is not None:
                store.append(labels, i * step_seconds, value)
    return store


def run(store: SeriesStore, expr: str, t: float, semantics: promql.Semantics) -> object:
    result = promql.evaluate(promql.parse(expr, semantics), store, t, semantics=semantics)
    if isinstance(result, float):
        return result
    return [(dict(e.labels), e.value) for e in sorted(result, key=lambda e: e.labels)]


def values(result: object) -> list[float]:
    assert isinstance(result, list)
    return [value for _, value in result]


def test_range_selectors_drop_their_left_end_in_3() -> None:
    store = store_of(60, a="x 0 1 2 3 4 5")
    assert [values(run(store, "count_over_time(x[5m])", 300, s)) for s in BOTH] == [[6], [5]]


def test_the_lookback_drops_its_left_end_in_3() -> None:
    store = store_of(300, a="x 1")
    assert [values(run(store, "x", 300, s)) for s in BOTH] == [[1.0], []]


def test_subquery_steps_start_after_the_range_start_in_3() -> None:
    # promqltest's subquery.test: 394 in 2.42, 297 in 3.x.
    store = store_of(10, a="metric1 0+1x1000")
    got = [values(run(store, "sum_over_time(metric1[30s:10s])", 1000, s)) for s in BOTH]
    assert got == [[394], [297]]


def test_regex_dot_matches_a_newline_in_3() -> None:
    store = SeriesStore(retention_seconds=math.inf)
    store.append((("__name__", "x"), ("l", "a\nb")), 0, 1.0)
    assert [len(values(run(store, 'x{l=~"a.b"}', 0, s))) for s in BOTH] == [0, 1]
    replaced = 'label_replace(x, "m", "$1", "l", "(a.b)")'
    assert [run(store, replaced, 0, s)[0][0].get("m") for s in BOTH] == [None, "a\nb"]


def test_holt_winters_is_2_42_only() -> None:
    promql.parse("holt_winters(x[5m], 0.5, 0.5)", PROMETHEUS_2)
    with pytest.raises(PromQLError, match="unknown function"):
        promql.parse("holt_winters(x[5m], 0.5, 0.5)", PROMETHEUS_3)


def test_increase_limits_to_the_zero_point_after_the_half_step_rule_in_3() -> None:
    store = store_of(60, a="x _ _ 60+60x3")
    assert [values(run(store, "increase(x[5m])", 300, s)) for s in BOTH] == [[240], [210]]


def test_sum_and_avg_are_compensated_in_3() -> None:
    store = store_of(60, a='x{i="1"} 1e100', b='x{i="2"} 1', c='x{i="3"} -1e100')
    assert [values(run(store, "sum(x)", 0, s)) for s in BOTH] == [[0.0], [1.0]]
    assert [values(run(store, "avg(x)", 0, s)) for s in BOTH] == [[0.0], [1 / 3]]


def test_avg_switches_to_an_incremental_mean_when_the_sum_overflows_in_3() -> None:
    store = store_of(60, a='x{i="1"} 1e308', b='x{i="2"} 1e308', c='x{i="3"} 1e308')
    assert values(run(store, "avg(x)", 0, PROMETHEUS_3)) == [1e308]


def test_avg_over_time_is_a_compensated_mean_in_3() -> None:
    store = store_of(10, a="metric 1 1e100 1 -1e100")
    old, new = (values(run(store, "avg_over_time(metric[2m])", 60, s))[0] for s in BOTH)
    assert old < -1e83 and new == 0.5


def test_stddev_of_one_nan_or_inf_is_nan_in_3() -> None:
    store = store_of(60, a="x NaN", b="y +Inf")
    for expr in ("stddev(x)", "stdvar(y)"):
        old, new = (values(run(store, expr, 0, s))[0] for s in BOTH)
        assert old == 0 and math.isnan(new)


def test_histogram_quantile_ignores_tiny_bucket_differences_in_3() -> None:
    store = store_of(
        60, a='h_bucket{le="1"} 1e12', b='h_bucket{le="2"} 1000000000000.5',
        c='h_bucket{le="+Inf"} 1000000000000.5',
    )  # fmt: skip
    got = [values(run(store, "histogram_quantile(1, h_bucket)", 0, s)) for s in BOTH]
    assert got == [[2.0], [1.0]]


def test_histogram_fraction_reads_classic_buckets_in_3() -> None:
    store = store_of(60, a='h_bucket{le="1"} 1', b='h_bucket{le="2"} 3', c='h_bucket{le="+Inf"} 4')
    assert values(run(store, "histogram_fraction(0, 2, h_bucket)", 0, PROMETHEUS_3)) == [0.75]
    with pytest.raises(promql.UnsupportedConstruct):  # 2.42 knows native histograms only
        promql.parse("histogram_fraction(0, 2, h_bucket)", PROMETHEUS_2)


def test_atan2_drops_the_metric_name_in_3() -> None:
    store = store_of(60, a='x{a="1"} 1', b='y{a="1"} 1')
    names = [run(store, "x atan2 y", 0, s)[0][0].get("__name__") for s in BOTH]
    assert names == ["x", None]


def test_a_filter_checks_matching_before_filtering_in_3() -> None:
    store = store_of(
        60, a='many_side{label="foo",job="test"} 0', b='many_side{label="bar",job="test"} 1',
        c='one_side{job="test"} 1',
    )  # fmt: skip
    expr = "many_side >= on(job) one_side"
    assert values(run(store, expr, 0, PROMETHEUS_2)) == [1.0]
    with pytest.raises(PromQLError, match="many-to-one matching must be explicit"):
        run(store, expr, 0, PROMETHEUS_3)


def test_topk_ties_of_nan_and_small_k() -> None:
    store = store_of(60, a='x{i="a"} NaN', b='x{i="b"} NaN')
    assert [run(store, "topk(1, x)", 0, s)[0][0]["i"] for s in BOTH] == ["b", "a"]
    with pytest.raises(PromQLError, match="overflows int64"):
        run(store, "topk(-Inf, x)", 0, PROMETHEUS_2)
    assert run(store, "topk(-Inf, x)", 0, PROMETHEUS_3) == []
    for semantics in BOTH:
        with pytest.raises(PromQLError):
            run(store, "topk(NaN, x)", 0, semantics)


def test_label_names_may_be_any_utf8_in_3() -> None:
    store = store_of(60, a="x 1")
    for expr in ('count_values("a.b", x)', 'label_join(x, "a.b", ",", "__name__")'):
        with pytest.raises(PromQLError, match="invalid"):
            run(store, expr, 0, PROMETHEUS_2)
        assert run(store, expr, 0, PROMETHEUS_3)


def test_the_same_data_agrees_where_nothing_changed() -> None:
    # No sample on a window boundary (2.42 and 3.x would differ there by design).
    store = store_of(60, a='x{i="1"} 1+1x10', b='x{i="2"} 5-1x10')
    for expr in ("max(x)", "rate(x[4m] offset 30s)", "deriv(x[3m30s])", "topk(1, x)"):
        assert run(store, expr, 590, PROMETHEUS_2) == run(store, expr, 590, PROMETHEUS_3)
