"""The in-process PromQL evaluator against promtool (Prometheus 2.42) as the oracle.

Every parity case loads its input series into a SeriesStore, evaluates the expression with our
evaluator and writes the result into a promtool unit-test file as the expected samples: promtool
passing means both engines agree. Cases our evaluator fails must fail in promtool with the same
error. All cases run in two promtool invocations.
"""

from __future__ import annotations

import math
import random
import struct
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.alerting.rules.promql import (
    Element,
    PromQLError,
    RangeCache,
    UnsupportedConstruct,
    check_supported,
    evaluate,
    max_range_seconds,
    parse,
    referenced_metrics,
)
from gpu_exporter.alerting.rules.series_notation import (
    load_input_series,
    parse_series,
    parse_values,
)
from gpu_exporter.alerting.store import STALE_NAN, Matcher, SeriesStore, is_stale
from tests.support import require_tool

Series = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Case:
    expr: str
    series: Series
    times: Sequence[float]  # eval times, seconds
    interval: float = 60.0


# --- input fixtures -------------------------------------------------------------------------------

COUNTERS: Series = (
    ('req_total{job="api",instance="a"}', "0+10x10"),
    ('req_total{job="api",instance="b"}', "0+10x4 5+10x5"),  # reset between 4m and 5m
    ('req_total{job="db",instance="a"}', "100+1x10"),  # zero point far away: no clamp
)
IRREGULAR: Series = (
    ("late", "_x4 10 20 30"),  # starts at 4m: first sample far from the range start
    ("gappy", "0 _ _ 30 40 _ 60"),
    ("two", "1 5"),
    ("resets", "5 1 4 2 8"),
    ("negative", "-5 -3 -10 -1"),
)
STALENESS: Series = (
    ('up{job="x"}', "1 1 stale 1 _ _ _ _ _ _ 1"),
    ('up{job="y"}', "1 1 1"),
)
MATCHING: Series = (
    ('m{a="x",b="1"}', "1"),
    ('m{a="y",b="2"}', "2"),
    ('m{a="z"}', "3"),
    ('n{a="x"}', "4"),
    ('n{a="q",b="2"}', "5"),
    ('m{a="\u0663"}', "6"),  # an Arabic-Indic digit: not a \\d in RE2
)
# A "many" side (per-GPU usage) and a "one" side (per-node info) for group_left/group_right.
GROUPS: Series = (
    ('gpu_util{node="n1",gpu="0"}', "0.5"),
    ('gpu_util{node="n1",gpu="1"}', "0.25"),
    ('gpu_util{node="n2",gpu="0"}', "1"),
    ('gpu_util{node="n2",gpu="1",zone="stale-zone"}', "0.75"),  # n2 has no zone: it is dropped
    ('node_info{node="n1",rack="r1",zone="z"}', "1"),
    ('node_info{node="n2",rack="r2"}', "2"),
    ('node_info{node="n3",rack="r3"}', "3"),
)
PAIRS: Series = (
    ('a{x="1",y="1"}', "10"),
    ('a{x="2",y="1"}', "20"),
    ('a{x="3",y="2"}', "30"),
    ('b{x="1",y="1"}', "2"),
    ('b{x="2",y="9"}', "4"),
    ('b{x="4",y="2"}', "8"),
)
DUPLICATES: Series = (
    ('a{x="1",y="1"}', "1"),
    ('a{x="1",y="2"}', "2"),
    ('b{x="1"}', "3"),
    ('c{x="1",y="1"}', "4"),
)
SPECIAL: Series = (
    ('v{k="nan"}', "NaN"),
    ('v{k="inf"}', "+Inf"),
    ('v{k="ninf"}', "-Inf"),
    ('v{k="zero"}', "0"),
    ('v{k="neg"}', "-3"),
    ('v{k="pos"}', "8"),
)
AGG: Series = (
    ('load{host="h1",gpu="0",job="j"}', "1"),
    ('load{host="h1",gpu="1",job="j"}', "2"),
    ('load{host="h2",gpu="0",job="j"}', "4"),
    ('load{host="h2",gpu="1",job="k"}', "8"),
    ('other{host="h1"}', "3"),
)
OVER_TIME: Series = (
    ("g", "1 2 3 4 5 6"),
    ("nan_first", "NaN 1 2"),
    ("nan_mid", "1 NaN 2"),
    ("nan_last", "1 2 NaN"),
    ("infs", "1 +Inf 2"),
    ("mixed_inf", "+Inf -Inf"),
    ("with_stale", "1 2 stale 4"),
    ("inexact", "0.2 1.1 0.1 0.3"),  # Kahan summation matters for avg_over_time
    ("cancel", "1e16 1 1 -1e16"),  # and for sum_over_time
    ("cancel_avg", "0.3 1e16 -1e16 5 0.7"),
)
NOTATION: Series = (
    ("octal", "010 08 0x2"),
    ("steps", "0.1+0.1x3 4-1.5x2"),
    ("blanks", "1 _x2 4 _ stale 7"),
    ("exp", "1e3 -2.5e-1 +5 -Inf"),
)


def times(*minutes: float) -> tuple[float, ...]:
    return tuple(m * 60 for m in minutes)


CASES: list[Case] = [
    # instant selectors, lookback (inclusive at exactly 5m in 2.42), staleness, offset
    Case('req_total{job="api"}', COUNTERS, times(0, 4, 10)),
    Case("req_total", COUNTERS, (600, 899, 900, 901)),
    Case("up", STALENESS, (60, 120, 150, 180, 240, 480, 600)),
    Case('up{job="x"} offset 1m', STALENESS, times(2, 3, 4)),
    Case('up{job="y"} offset -1m', STALENESS, times(0, 1, 2)),
    Case('m{a="x"}', MATCHING, times(0)),
    Case('m{a!="x"}', MATCHING, times(0)),
    Case('m{a=~"x|y"}', MATCHING, times(0)),
    Case('m{a!~"x|y"}', MATCHING, times(0)),
    Case('m{b=""}', MATCHING, times(0)),
    Case('m{b!=""}', MATCHING, times(0)),
    Case('m{b=~"1|"}', MATCHING, times(0)),
    Case('{__name__=~"m|n", a="x"}', MATCHING, times(0)),
    Case('{__name__!="m", b="2"}', MATCHING, times(0)),
    Case('{__name__="n"}', MATCHING, times(0)),
    Case("m{a=~'X'}", MATCHING, times(0)),  # regexes are case-sensitive and anchored
    Case('m{a=~"."}', MATCHING, times(0)),
    Case('m{a=~"\\\\d|\\\\w"}', MATCHING, times(0)),
    Case('m{a=~"(?i)X|Y"}', MATCHING, times(0)),
    # input notation, through plain selection at every step
    Case("octal", NOTATION, times(0, 1, 2, 3, 4)),
    Case("steps", NOTATION, times(0, 1, 2, 3, 4, 5, 6)),
    Case("blanks", NOTATION, times(0, 1, 2, 3, 4, 5, 6)),
    Case("exp", NOTATION, times(0, 1, 2, 3)),
    Case("last_over_time(blanks[30s])", NOTATION, times(0, 1, 2, 3, 4, 5, 6)),
    # rate / increase / delta: resets, extrapolation edges, offsets
    Case("rate(req_total[5m])", COUNTERS, times(1, 5, 7, 10, 12, 15, 16)),
    Case("increase(req_total[5m])", COUNTERS, times(3, 5, 6, 10, 13)),
    Case("increase(req_total[1m])", COUNTERS, times(1, 5, 6)),
    Case("rate(req_total[90s])", COUNTERS, (90, 300, 330, 360)),
    Case("increase(req_total[5m] offset 2m)", COUNTERS, times(5, 8, 12)),
    Case("delta(req_total[3m])", COUNTERS, times(3, 5, 6)),
    Case("increase(late[5m])", IRREGULAR, times(5, 6, 7, 9)),
    Case("rate(late[10m])", IRREGULAR, times(6, 8)),
    Case("increase(gappy[4m])", IRREGULAR, times(3, 4, 5, 6, 7)),
    Case("increase(two[1m])", IRREGULAR, times(1, 2)),
    Case("increase(two[2m])", IRREGULAR, times(1, 2)),
    Case("increase(resets[10m])", IRREGULAR, times(4, 6)),
    Case("rate(resets[3m])", IRREGULAR, times(3, 4)),
    Case("delta(resets[10m])", IRREGULAR, times(4)),
    Case("delta(negative[5m])", IRREGULAR, times(2, 3)),
    Case("increase(negative[5m])", IRREGULAR, times(3)),
    Case("increase(c[1m])", (("c", "0+1x240"),), (120, 125.5, 130), interval=1.0),
    Case("rate(c[10s])", (("c", "0 1 2 3 4 _ 6 7 8 9 10 11 0 1 2"),), (10, 12, 14), interval=1.0),
    Case("rate({__name__=~'req_total'}[5m])", COUNTERS, times(5)),
    Case("rate((req_total[5m]))", COUNTERS, times(5)),  # parentheses around the range
    # *_over_time, including NaN, Inf, markers and the inclusive range start
    Case("count_over_time(g[2m])", OVER_TIME, times(2, 5, 7, 8)),
    Case("sum_over_time(g[10m])", OVER_TIME, times(5)),
    Case("avg_over_time(g[3m])", OVER_TIME, times(5)),
    Case("min_over_time(g[2m])", OVER_TIME, times(4)),
    Case("max_over_time(g[2m] offset 2m)", OVER_TIME, times(5)),
    Case("last_over_time(g[1m])", OVER_TIME, times(5, 6, 7)),
    Case('max_over_time({__name__=~"nan_.*"}[5m])', OVER_TIME, times(2)),
    Case('min_over_time({__name__=~"nan_.*"}[5m])', OVER_TIME, times(2)),
    Case('sum_over_time({__name__=~"nan_.*|infs|mixed_inf"}[5m])', OVER_TIME, times(2)),
    Case('avg_over_time({__name__=~"infs|mixed_inf|inexact"}[5m])', OVER_TIME, times(1, 3)),
    Case("sum_over_time(inexact[5m])", OVER_TIME, times(3)),
    Case("sum_over_time(cancel[5m]) + avg_over_time(cancel[5m])", OVER_TIME, times(3)),
    Case("avg_over_time(cancel_avg[5m])", OVER_TIME, times(4)),
    Case("count_over_time(with_stale[10m])", OVER_TIME, times(3)),
    Case("last_over_time(with_stale[90s])", OVER_TIME, times(2, 3)),
    Case('absent_over_time(g{a="b"}[1m])', OVER_TIME, times(5, 7, 8)),
    Case("absent_over_time(g[1m])", OVER_TIME, times(5, 6, 6.5)),
    Case("absent_over_time(with_stale[30s])", OVER_TIME, times(1, 2, 3)),
    Case('absent_over_time(nope{a="b",c=~"d"}[1m])', OVER_TIME, times(0)),
    # scalars and scalar/scalar operators
    Case("1 + 2 * 3 - 4 / 8", (), times(0)),
    Case("2 ^ 3 ^ 2", (), times(0)),
    Case("-2 ^ 2", (), times(0)),
    Case("7 % 3 + -7 % 3 + 7.5 % -2", (), times(0)),
    Case("1 / 0", (), times(0)),
    Case("-1 / 0", (), times(0)),
    Case("0 / 0", (), times(0)),
    Case("1 % 0", (), times(0)),
    Case("0 ^ -1", (), times(0)),
    Case("(-8) ^ 0.5", (), times(0)),
    Case("4 ^ 0.5 + 4 ^ -0.5", (), times(0)),
    Case("1.7 ^ 5 + 9.99 ^ 4 + 1.01 ^ 100", (), times(0)),  # Go's repeated squaring, not libm
    Case("(-2.5) ^ -3", (), times(0)),
    Case("2 ^ -1074 + 0.5 ^ 1075", (), times(0)),
    Case("1e300 ^ 2 - (-1e300) ^ 3", (), times(0)),
    Case("5 > bool 3", (), times(0)),
    Case("(5 <= bool 3) + (3 == bool 3) + (3 != bool 3)", (), times(0)),
    Case("time()", (), times(0, 7.5)),
    Case("time() - 60", (), (90.5,)),
    Case("-(1)", (), times(0)),
    Case("NaN > bool NaN", (), times(0)),
    Case("Inf - Inf", (), times(0)),
    # vector/scalar
    Case("m * 2", MATCHING, times(0)),
    Case("10 - m", MATCHING, times(0)),
    Case("m > 1", MATCHING, times(0)),
    Case("1.5 < m", MATCHING, times(0)),
    Case("m >= bool 2", MATCHING, times(0)),
    Case("2 == bool m", MATCHING, times(0)),
    Case("-m", MATCHING, times(0)),
    Case("v / 0", SPECIAL, times(0)),
    Case("v % 3", SPECIAL, times(0)),
    Case("v ^ 2", SPECIAL, times(0)),
    Case("v > 0", SPECIAL, times(0)),
    Case("v != bool v", SPECIAL, times(0)),
    Case("v == v", SPECIAL, times(0)),
    Case("v < Inf", SPECIAL, times(0)),
    Case("v * -1 > -Inf", SPECIAL, times(0)),
    # vector/vector one-to-one
    Case("a + b", PAIRS, times(0)),
    Case("a - ignoring(y) b", PAIRS, times(0)),
    Case("a * on(x) b", PAIRS, times(0)),
    Case("a / on(y) b", PAIRS, times(0)),  # duplicate on both sides
    Case("a > b", PAIRS, times(0)),
    Case("a < ignoring(y) b", PAIRS, times(0)),
    Case("a > bool ignoring(y) b", PAIRS, times(0)),
    Case("a == bool on(x, y) b", PAIRS, times(0)),
    Case("a + on() b", PAIRS, times(0)),
    Case("a ^ ignoring(y) b", PAIRS, times(0)),
    Case("a % ignoring(y) b", PAIRS, times(0)),
    # many-to-one / one-to-many with extra labels
    Case("gpu_util * on(node) group_left node_info", GROUPS, times(0)),
    Case("gpu_util * on(node) group_left(rack, zone) node_info", GROUPS, times(0)),
    Case("gpu_util + ignoring(gpu) group_left(rack) node_info", GROUPS, times(0)),
    Case("node_info * on(node) group_right(rack) gpu_util", GROUPS, times(0)),
    Case("node_info > on(node) group_right gpu_util", GROUPS, times(0)),
    Case("gpu_util > on(node) group_left(rack) (node_info - 1.5)", GROUPS, times(0)),
    Case("gpu_util < bool on(node) group_left node_info", GROUPS, times(0)),
    Case('gpu_util * on(node) group_left(zone) node_info{node="n1"}', GROUPS, times(0)),
    Case("gpu_util * on(node) group_left node_info", GROUPS, times(60 * 6)),  # all expired
    # cardinality and label-set errors (Prometheus fails the query)
    Case("gpu_util * on(node) node_info", GROUPS, times(0)),
    Case('node_info * on(node) gpu_util{node="n1"}', GROUPS, times(0)),
    Case("gpu_util * on(gpu) group_left node_info", GROUPS, times(0)),
    Case("a + ignoring(y) b", DUPLICATES, times(0)),
    Case("b + ignoring(y) a", DUPLICATES, times(0)),
    Case("b + ignoring(y) group_right a", DUPLICATES, times(0)),
    Case("a + on(x) group_left c", DUPLICATES, times(0)),
    Case('{__name__=~"a|c"} + on(x) group_left b', DUPLICATES, times(0)),
    Case('{__name__=~"a|c"} > on(x) group_left b', DUPLICATES, times(0)),
    Case("a > ignoring(y) b", DUPLICATES, times(0)),
    Case("a < ignoring(y) group_left b", DUPLICATES, times(0)),
    Case("(a > 1) + ignoring(y) b", DUPLICATES, times(0)),  # the filter removes the duplicate
    Case("(a > 5) + ignoring(y) b", DUPLICATES, times(0)),  # empty side: no error
    Case("nope + ignoring(y) a", DUPLICATES, times(0)),  # not even for the duplicate "one" side
    Case('{__name__=~"a|c"} * 2', DUPLICATES, times(0)),
    Case('{__name__=~"a|c"} > 0', DUPLICATES, times(0)),
    Case('-{__name__=~"a|c"}', DUPLICATES, times(0)),
    Case('abs({__name__=~"a|c"})', DUPLICATES, times(0)),
    Case('sum_over_time({__name__=~"a|c"}[1m])', DUPLICATES, times(0)),
    Case('last_over_time({__name__=~"a|c"}[1m])', DUPLICATES, times(0)),
    Case('{__name__=~"a|c"} + 0 or b', DUPLICATES, times(0)),
    # set operators
    Case("a and b", PAIRS, times(0)),
    Case("a and on(x) b", PAIRS, times(0)),
    Case("a and ignoring(y) b", PAIRS, times(0)),
    Case("a and on() b", PAIRS, times(0)),
    Case("a or b", PAIRS, times(0)),
    Case("a or on(x) b", PAIRS, times(0)),
    Case("b or ignoring(x) a", PAIRS, times(0)),
    Case("a unless b", PAIRS, times(0)),
    Case("a unless on(x) b", PAIRS, times(0)),
    Case("a unless on(y) b", PAIRS, times(0)),
    Case("a unless on() nope", PAIRS, times(0)),
    Case("nope or b", PAIRS, times(0)),
    Case("a and nope", PAIRS, times(0)),
    Case("(a > 15) or on(x) (b * 100)", PAIRS, times(0)),
    Case("a and on(y) b unless on(x) b", PAIRS, times(0)),
    # aggregations
    Case("sum(load)", AGG, times(0)),
    Case("sum by (host) (load)", AGG, times(0)),
    Case("sum without (gpu) (load)", AGG, times(0)),
    Case("sum without () (load)", AGG, times(0)),
    Case("avg by (job) (load)", AGG, times(0)),
    Case("min by (gpu) (load)", AGG, times(0)),
    Case("max(load) by (host, job)", AGG, times(0)),
    Case("count without (host, gpu) (load)", AGG, times(0)),
    Case('count by (__name__) ({__name__=~"load|other"})', AGG, times(0)),
    Case('sum by (host) ({__name__=~"load|other"})', AGG, times(0)),
    Case("sum by (nope) (load)", AGG, times(0)),
    Case("sum(nope)", AGG, times(0)),
    Case("max(v)", SPECIAL, times(0)),
    Case("min(v)", SPECIAL, times(0)),
    Case('max(v{k!="inf"})', SPECIAL, times(0)),
    Case('min({__name__="v", k=~"nan|pos"})', SPECIAL, times(0)),
    Case('avg(v{k=~"inf|pos|neg"})', SPECIAL, times(0)),
    Case('avg(v{k=~"inf|ninf"})', SPECIAL, times(0)),
    Case("count(v)", SPECIAL, times(0)),
    Case("sum(rate(req_total[5m])) by (job)", COUNTERS, times(10)),
    # functions
    Case("abs(v)", SPECIAL, times(0)),
    Case("clamp_min(v, 0)", SPECIAL, times(0)),
    Case("clamp_max(v, 0)", SPECIAL, times(0)),
    Case("clamp(v, -1, 1)", SPECIAL, times(0)),
    Case("clamp(v, 1, -1)", SPECIAL, times(0)),
    Case("clamp_min(v, NaN)", SPECIAL, times(0)),
    Case("vector(1)", (), times(0)),
    Case("vector(time()) - 30", (), times(1)),
    Case('scalar(v{k="pos"}) * 2', SPECIAL, times(0)),
    Case("scalar(v)", SPECIAL, times(0)),
    Case('v{k="pos"} / scalar(v{k="neg"})', SPECIAL, times(0)),
    Case("absent(v)", SPECIAL, times(0)),
    Case('absent(nope{job="x", instance=~"i.*", env="prod"})', (), times(0)),
    Case('absent(nope{job="x", job="y"})', (), times(0)),
    Case('absent(nope{job="x", job!="y"})', (), times(0)),
    Case('absent((nope{job="x"}))', (), times(0)),
    Case('absent(sum(nope{job="x"}))', (), times(0)),
    Case('absent({__name__="nope", job="x"})', (), times(0)),
    Case('absent(up{job="x"})', STALENESS, (60, 120, 180, 540)),
    Case('absent(nope{job="x"} offset 1m) * 3', (), times(0)),
    # combined alerting-style expressions
    Case(
        "sum by (job) (rate(req_total[5m])) / on(job) group_left count by (job) (req_total) > 0.5",
        COUNTERS,
        times(5, 10),
    ),
    Case('max_over_time(up{job="x"}[2m]) unless up', STALENESS, times(2, 3, 4)),
    Case("clamp_max(increase(req_total[5m]), 40) > bool 35", COUNTERS, times(5, 8)),
]


# --- promtool plumbing ----------------------------------------------------------------------


def series_string(labels: Sequence[tuple[str, str]]) -> str:
    name = ""
    pairs = []
    for key, value in labels:
        if key == "__name__":
            name = value
        else:
            escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            pairs.append(f'{key}="{escaped}"')
    return name + "{" + ",".join(pairs) + "}"


def prom_duration(seconds: float) -> str:
    """Prometheus' model.Duration formatting (as promtool prints eval times), below a day."""
    ms = round(seconds * 1000)
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def samples(result: list[Element] | float) -> list[dict[str, Any]]:
    if isinstance(result, float):
        return [{"labels": "{}", "value": result}]
    return [{"labels": series_string(e.labels), "value": e.value} for e in result]


def has_nan(result: list[Element] | float) -> bool:
    values = [result] if isinstance(result, float) else [e.value for e in result]
    return any(math.isnan(v) for v in values)


def expectations(expr: str, result: list[Element] | float) -> list[tuple[str, list[dict]]]:
    """(expr, exp_samples) pairs; NaN never equals NaN in promtool, so a result with NaN is
    checked as its NaN-ness (`!= bool` itself) plus its non-NaN part (`== itself`)."""
    if not has_nan(result):
        return [(expr, samples(result))]
    if isinstance(result, float):
        return [(f"({expr}) != bool ({expr})", samples(1.0))]
    nan_ness = [
        Element(tuple(p for p in e.labels if p[0] != "__name__"), float(math.isnan(e.value)))
        for e in result
    ]
    finite = [e for e in result if not math.isnan(e.value)]
    return [
        (f"({expr}) != bool ({expr})", samples(nan_ness)),
        (f"({expr}) == ({expr})", samples(finite)),
    ]


# promtool loads input series step by step up to the last evaluation_interval step at or before a
# group's largest eval_time; a fine step (all eval times are multiples of it) loads everything
# up to that time, which is also all our store holds.
EVALUATION_INTERVAL_MS = 100


def build_store(case: Case) -> SeriesStore:
    store = SeriesStore(retention_seconds=1e9)
    entries = [{"series": s, "values": v} for s, v in case.series]
    load_input_series(store, entries, case.interval, until=max(case.times))
    return store


def promtool_group(case: Case, tests: list[dict[str, Any]]) -> dict[str, Any]:
    last = f"{round(max(case.times) * 1000)}ms"
    if all(test["eval_time"] != last for test in tests):
        # Make promtool load as much input as our store holds (see EVALUATION_INTERVAL_MS).
        tests = [*tests, {"expr": "vector(1)", "eval_time": last, "exp_samples": samples(1.0)}]
    return {
        "interval": f"{round(case.interval * 1000)}ms",
        "input_series": [{"series": s, "values": v} for s, v in case.series],
        "promql_expr_test": tests,
    }


def run_promtool(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def write_tests(path: Path, groups: list[dict[str, Any]]) -> None:
    doc = {
        "rule_files": [],
        "evaluation_interval": f"{EVALUATION_INTERVAL_MS}ms",
        "tests": groups,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


# --- parity -------------------------------------------------------------------------------------


def test_parity_with_promtool(tmp_path: Path) -> None:
    passing: list[dict[str, Any]] = []
    failing: list[dict[str, Any]] = []
    expected_errors: list[str] = []
    for case in CASES:
        store = build_store(case)
        expr = parse(case.expr)
        ok_tests, error_tests = [], []
        for t in case.times:
            assert round(t * 1000) % EVALUATION_INTERVAL_MS == 0, (case.expr, t)
            eval_time = f"{round(t * 1000)}ms"
            try:
                result = evaluate(expr, store, t)
            except PromQLError as exc:
                error_tests.append({"expr": case.expr, "eval_time": eval_time, "exp_samples": []})
                quoted = '"' + case.expr.replace("\\", "\\\\").replace('"', '\\"') + '"'
                # Which two series a duplicate message names depends on storage order, and
                # promtool creates series in random order: compare up to the series list (so
                # error cases must have a single duplicated match group).
                message = str(exc).split(": [", 1)[0]
                expected_errors.append(f"expr: {quoted}, time: {prom_duration(t)}, err: {message}")
                continue
            for expr_text, exp in expectations(case.expr, result):
                ok_tests.append({"expr": expr_text, "eval_time": eval_time, "exp_samples": exp})
        if ok_tests:
            passing.append(promtool_group(case, ok_tests))
        if error_tests:
            failing.append(promtool_group(case, error_tests))

    write_tests(tmp_path / "parity.yaml", passing)
    proc = run_promtool(tmp_path / "parity.yaml")
    assert proc.returncode == 0, f"promtool disagrees:\n{proc.stdout}\n{proc.stderr}"

    assert failing, "the case table should contain queries that Prometheus fails"
    write_tests(tmp_path / "errors.yaml", failing)
    proc = run_promtool(tmp_path / "errors.yaml")
    output = proc.stdout + proc.stderr
    missing = [line for line in expected_errors if line not in output]
    assert not missing, (
        "promtool did not fail these the same way:\n"
        + "\n".join(missing)
        + (f"\n--- promtool output:\n{output}")
    )
    # Each of our failures must be a failure in promtool, and nothing else may fail.
    assert output.count("err: ") == len(expected_errors), output
    assert output.count("expr: ") == len(expected_errors), output


def test_promtool_files_in_tests_promql_pass() -> None:
    files = sorted(Path(__file__).parent.glob("promql/*.test.yaml"))
    assert files
    proc = subprocess.run(
        [require_tool("promtool"), "test", "rules", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).parent / "promql",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- evaluator details that need no oracle --------------------------------------------------------


def store_with(*series: tuple[str, str], interval: float = 60.0) -> SeriesStore:
    store = SeriesStore(retention_seconds=1e9)
    load_input_series(store, [{"series": s, "values": v} for s, v in series], interval)
    return store


def test_evaluate_returns_elements_and_scalars() -> None:
    store = store_with(('x{a="1"}', "1 2 3"))
    assert evaluate(parse("x"), store, 120) == [Element((("__name__", "x"), ("a", "1")), 3.0)]
    assert evaluate(parse("x * 2"), store, 120) == [Element((("a", "1"),), 6.0)]
    assert evaluate(parse("time() + 1"), store, 120) == 121.0
    assert evaluate(parse("scalar(x)"), store, 60) == 2.0


def test_lookback_parameter() -> None:
    store = store_with(("x", "1"))
    assert evaluate(parse("x"), store, 60, lookback=60) != []
    assert evaluate(parse("x"), store, 61, lookback=60) == []


def test_evaluation_errors_are_promql_errors() -> None:
    store = store_with(*DUPLICATES)
    with pytest.raises(PromQLError, match="many-to-one matching must be explicit"):
        evaluate(parse("a + ignoring(y) b"), store, 0)
    with pytest.raises(PromQLError, match="found duplicate series for the match group"):
        evaluate(parse("b + ignoring(y) a"), store, 0)
    with pytest.raises(PromQLError, match="same labelset"):
        evaluate(parse('-{__name__=~"a|c"}'), store, 0)
    with pytest.raises(PromQLError, match="grouping labels must ensure unique matches"):
        evaluate(parse('{__name__=~"a|c"} + on(x) group_left b'), store, 0)


# --- what is left unsupported --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "construct"),
    [
        ("histogram_count(rate(x[5m]))", "function histogram_count"),
        ("histogram_sum(x)", "function histogram_sum"),
        ("histogram_fraction(0, 1, x)", "function histogram_fraction"),
        ("sum(rate(x[5m])) + topk(1, histogram_count(y))", "function histogram_count"),
        ("x @ -100", "@ with a negative timestamp"),
        ('x{a="b" or c="d"}', "'or' inside label matchers"),
    ],
)
def test_unsupported_constructs_are_named(expr: str, construct: str) -> None:
    with pytest.raises(UnsupportedConstruct) as info:
        parse(expr)
    assert info.value.construct == construct
    assert construct in str(info.value)


def test_a_negative_at_inside_a_string_is_no_at() -> None:
    parse('x{a="@ -1"}')  # would raise if the string were read as an @ modifier


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("sort_by_label(x)", 'unknown function with name "sort_by_label"'),
        ("mad_over_time(x[5m])", 'unknown function with name "mad_over_time"'),
        ("double_exponential_smoothing(x[5m], 0.5, 0.5)", "unknown function"),
        ("limitk(1, x)", "unknown aggregation"),
    ],
)
def test_what_prometheus_2_42_does_not_know_is_an_error(expr: str, message: str) -> None:
    # promql_parser follows a newer grammar; 2.42 refuses these, so the rule is invalid.
    with pytest.raises(PromQLError) as info:
        parse(expr)
    assert not isinstance(info.value, UnsupportedConstruct)
    assert message in str(info.value)


def test_a_matcher_regex_go_refuses_is_an_error_in_the_rule_worded_as_go() -> None:
    # Prometheus 2.42: `error parsing regexp: invalid repeat count: `{1001}``, a parse error.
    with pytest.raises(PromQLError) as info:
        parse('x{a=~"a{1001}"}')
    assert not isinstance(info.value, UnsupportedConstruct)
    assert str(info.value) == "error parsing regexp: invalid repeat count: `{1001}`"


@pytest.mark.parametrize("expr", ["sum(", 'x{a="b"', "1 +", "rate(x)", "1 > 2", "a and 1", "x[0s]"])
def test_syntax_errors(expr: str) -> None:
    with pytest.raises(PromQLError) as info:
        parse(expr)
    assert not isinstance(info.value, UnsupportedConstruct)
    assert str(info.value) and "\n" not in str(info.value)


def test_supported_subset_parses() -> None:
    for case in CASES:
        check_supported(parse(case.expr))


def test_referenced_metrics() -> None:
    assert referenced_metrics(parse("rate(a[5m]) / on(x) group_left b offset 1m")) == {"a", "b"}
    assert referenced_metrics(parse('{__name__="a", job="j"} + absent(c)')) == {"a", "c"}
    assert referenced_metrics(parse('{__name__=~"a.*"}')) is None
    assert referenced_metrics(parse('sum(a) + {job="j"}')) is None
    assert referenced_metrics(parse("vector(1) + time()")) == frozenset()


def test_max_range_seconds() -> None:
    assert max_range_seconds(parse("rate(a[5m]) + b offset 10m")) == 600
    assert max_range_seconds(parse("rate(a[5m] offset 1m) > 0")) == 360
    assert max_range_seconds(parse("avg_over_time(a[90s]) or b")) == 90
    assert max_range_seconds(parse("vector(1)")) == 0
    assert max_range_seconds(parse("a offset -5m")) == 0
    assert max_range_seconds(parse("max_over_time(a[1h] offset -5m)")) == 3300


# --- series notation ----------------------------------------------------------------------------


def test_parse_values_expands_like_promtool() -> None:
    values = parse_values("1+2x3 _ stale 4-1x2 _x2 5x0 1e3 -2 +Inf NaN")
    assert values[:5] == [1.0, 3.0, 5.0, 7.0, None]
    assert is_stale(values[5])
    assert values[6:15] == [4.0, 3.0, 2.0, None, None, 5.0, 1000.0, -2.0, math.inf]
    assert math.isnan(values[15]) and not is_stale(values[15])
    assert len(values) == 16


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("010 08 0x2", [8.0, 8.0, 0.0, 0.0, 0.0]),  # Go ParseInt base 0; x binds after "0"
        ("0.1+0.1x3", [0.1, 0.2, 0.1 + 0.1 + 0.1, 0.1 + 0.1 + 0.1 + 0.1]),
        ("-1-1x1 .5 5.", [-1.0, -2.0, 0.5, 5.0]),
        ("_x0 1 _x1", [1.0, None]),
        ("  1\t2  ", [1.0, 2.0]),
        ("", []),
        ("inf -nan", [math.inf, "nan"]),
    ],
)
def test_parse_values_details(text: str, expected: list[Any]) -> None:
    got = parse_values(text)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        if e == "nan":
            assert g is not None and math.isnan(g)
        else:
            assert g == e


@pytest.mark.parametrize(
    ("text", "token"),
    [
        ("1 Infx2", "Infx2"),
        ("stalex2", "stalex2"),
        ("1x3+1", "+"),
        ("1_000", "1"),
        ("1+1x-1", "-"),
        ("1+1x1.5", "1.5"),
        ("1 x2", "x"),
        ("1 STALE", "STALE"),
        ("1e", "1e"),
        ("1 2 #", "#"),
        ("1+", "+"),
    ],
)
def test_parse_values_errors_name_the_token(text: str, token: str) -> None:
    with pytest.raises(PromQLError) as info:
        parse_values(text)
    assert repr(token) in str(info.value)


def test_parse_series() -> None:
    assert parse_series('m{b="2",a="1"}') == (("__name__", "m"), ("a", "1"), ("b", "2"))
    assert parse_series('{__name__="m", a=""}') == (("__name__", "m"),)
    assert parse_series("up") == (("__name__", "up"),)
    for bad in ['m{a=~"1"}', "m offset 1m", "sum(m)", "m{", "m[5m]"]:
        with pytest.raises(PromQLError):
            parse_series(bad)


def test_load_input_series_places_values_on_the_grid() -> None:
    store = SeriesStore(retention_seconds=1e9)
    load_input_series(
        store,
        [{"series": 'm{a="1"}', "values": "1 _ stale 4 5"}, {"series": "n", "values": 7}],
        interval_seconds=15,
        start=100,
        until=145,
    )
    (labels, points), *_ = store.select([Matcher("__name__", "=", "m")], 0, 1e6)
    assert labels == (("__name__", "m"), ("a", "1"))
    assert [t for t, _ in points] == [100.0, 130.0, 145.0]  # 160 is after `until`
    assert points[0][1] == 1.0 and is_stale(points[1][1]) and points[2][1] == 4.0
    (_, n_points), *_ = store.select([Matcher("__name__", "=", "n")], 0, 1e6)
    assert n_points == [(100.0, 7.0)]


# --- windows at millisecond resolution ------------------------------------------------------------


def raw_store(*samples: tuple[float, float], name: str = "x") -> SeriesStore:
    store = SeriesStore(retention_seconds=1e9)
    for t, value in samples:
        store.append((("__name__", name),), t, value)
    return store


def test_range_windows_are_inclusive_at_both_ends_in_milliseconds() -> None:
    store = raw_store((1.0, 1.0), (2.0, 2.0), (3.0, 3.0))
    count = parse("count_over_time(x[2s])")
    assert evaluate(count, store, 3.0) == [Element((), 3.0)]
    assert evaluate(count, store, 3.001) == [Element((), 2.0)]  # 1.0 s is now 1 ms too old
    assert evaluate(count, store, 2.999) == [Element((), 2.0)]  # 3.0 s is 1 ms too new
    # Times are rounded to milliseconds as the evaluator always rounded them.
    store = raw_store((0.9996, 1.0), (1.0004, 2.0), (2.0, 3.0))  # 1000 ms, 1000 ms, 2000 ms
    assert evaluate(count, store, 3.0) == [Element((), 2.0)]  # one sample a millisecond
    store = raw_store((0.9994, 1.0), (2.0, 3.0))  # 999 ms
    assert evaluate(count, store, 3.0) == [Element((), 1.0)]


def test_instant_selector_takes_the_newest_sample_at_or_before_the_time() -> None:
    # A sample 1 ms after t - offset must not hide the one before it (Prometheus' Seek).
    store = raw_store((10.0, 1.0), (10.001, 2.0), (11.0, 3.0))
    assert evaluate(parse("x offset 1s"), store, 11.0) == [Element((("__name__", "x"),), 1.0)]
    assert evaluate(parse("x offset 1s"), store, 11.001) == [Element((("__name__", "x"),), 2.0)]
    assert evaluate(parse("x"), store, 10.0) == [Element((("__name__", "x"),), 1.0)]
    assert evaluate(parse("x"), store, 9.999) == []


def test_markers_inside_a_range_are_skipped_and_other_nans_are_not() -> None:
    store = raw_store((1.0, 1.0), (2.0, STALE_NAN), (3.0, 3.0))
    assert evaluate(parse("count_over_time(x[5s])"), store, 3.0) == [Element((), 2.0)]
    assert evaluate(parse("avg_over_time(x[5s])"), store, 3.0) == [Element((), 2.0)]
    assert evaluate(parse("rate(x[5s])"), store, 3.0) == evaluate(
        parse("rate(x[5s])"), raw_store((1.0, 1.0), (3.0, 3.0)), 3.0
    )
    assert evaluate(parse("count_over_time(x[500ms])"), store, 2.0) == []  # only the marker
    assert evaluate(parse("absent_over_time(x[500ms])"), store, 2.0) == [Element((), 1.0)]
    store = raw_store((1.0, 1.0), (2.0, math.nan), (3.0, 3.0))
    assert evaluate(parse("count_over_time(x[5s])"), store, 3.0) == [Element((), 3.0)]
    result = evaluate(parse("avg_over_time(x[5s])"), store, 3.0)
    assert isinstance(result, list) and len(result) == 1 and math.isnan(result[0].value)
    # Windows after the newest NaN read the same as windows of a store that never held one.
    assert evaluate(parse("sum_over_time(x[1s])"), store, 4.0) == [Element((), 3.0)]


def kahan_reference(inc: float, total: float, c: float) -> tuple[float, float]:
    """Prometheus' kahanSumInc, as a function: the inlined loops must compute exactly this."""
    t = total + inc
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def avg_reference(values: list[float]) -> float:
    mean = c = 0.0
    for count, value in enumerate(values, 1):
        if math.isinf(mean):
            if math.isinf(value) and (mean > 0) == (value > 0):
                continue
            if not math.isinf(value) and not math.isnan(value):
                continue
        mean, c = kahan_reference(value / count - mean / count, mean, c)
    return mean if math.isinf(mean) else mean + c


def _sum_reference(values: list[float]) -> float:
    total = c = 0.0
    for value in values:
        total, c = kahan_reference(value, total, c)
    return total if math.isinf(total) else total + c


def test_over_time_sums_are_bit_for_bit_prometheus_kahan_summation() -> None:
    rng = random.Random(3)
    specials = [math.inf, -math.inf, math.nan, 1e308, -1e308, 1e-300, -0.0, 2.0**53, 0.1]
    for _ in range(300):
        values = [
            rng.choice(specials) if rng.random() < 0.1 else rng.uniform(-1e6, 1e6) * rng.random()
            for _ in range(rng.randint(1, 40))
        ]
        store = raw_store(*((float(i), v) for i, v in enumerate(values)))
        t = float(len(values) - 1)
        for function, reference in (("avg", avg_reference), ("sum", _sum_reference)):
            result = evaluate(parse(f"{function}_over_time(x[1h])"), store, t)
            assert isinstance(result, list) and len(result) == 1
            got, expected = result[0].value, reference(values)
            assert struct.pack("<d", got) == struct.pack("<d", expected), (function, values)


# --- sharing range-function results between rules ------------------------------------------------


def test_a_range_cache_gives_what_evaluating_afresh_gives_until_the_store_changes() -> None:
    store = raw_store((1.0, 1.0), (2.0, 3.0))
    cache = RangeCache()
    avg = parse("avg_over_time(x[5s])")
    first = evaluate(avg, store, 2.0, cache=cache)
    assert first == [Element((), 2.0)]
    assert evaluate(parse("avg_over_time(x[5s]) * 2"), store, 2.0, cache=cache) == [
        Element((), 4.0)
    ]
    assert evaluate(parse("avg_over_time(x[2s])"), store, 2.0, cache=cache) == first
    store.append((("__name__", "x"), ("a", "b")), 2.0, 10.0)  # same instant, one more series
    assert evaluate(avg, store, 2.0, cache=cache) == [
        Element((), 2.0),
        Element((("a", "b"),), 10.0),
    ]
    assert evaluate(avg, store, 1.0, cache=cache) == [Element((), 1.0)]  # another instant
    other = raw_store((2.0, 7.0))  # another store
    assert evaluate(avg, other, 2.0, cache=cache) == [Element((), 7.0)]


def test_a_recording_rule_invalidates_the_range_results_of_the_rules_before_it(
    tmp_path: Path,
) -> None:
    from gpu_exporter.alerting.rules.engine import GroupEvaluator
    from gpu_exporter.alerting.rules.loader import load_rule_files

    path = tmp_path / "rules.yaml"
    path.write_text(
        """\
groups:
  - name: g
    rules:
      - record: before
        expr: count_over_time(r[1m])
      - record: r
        expr: vector(1)
      - record: after
        expr: count_over_time(r[1m])
"""
    )
    store = SeriesStore(retention_seconds=1e9)
    evaluator = GroupEvaluator(load_rule_files([path]), store)
    assert evaluator.evaluate_all(10.0) == []
    latest = {labels[0][1]: value for labels, ms, value in store.latest_ms([], 10_000)}
    assert latest == {"r": 1.0, "after": 1.0}  # `before` found no r at 10 s
    assert evaluator.evaluate_all(11.0) == []
    latest = {labels[0][1]: value for labels, ms, value in store.latest_ms([], 11_000)}
    assert latest == {"r": 1.0, "before": 1.0, "after": 2.0}


def test_rate_over_two_samples_on_one_millisecond_agrees_with_prometheus(tmp_path: Path) -> None:
    # Two samples 0.4 ms apart used to make rate/increase divide by a zero sampled interval.
    # Prometheus' TSDB keeps the first sample of a millisecond (a second one is a duplicate
    # timestamp), so its answer is the one for the series without the second sample.
    store = SeriesStore(retention_seconds=1e9)
    labels = (("__name__", "c_total"),)
    for t, value in [(0.0, 0.0), (0.0004, 99.0), (60.0, 10.0), (120.0, 20.0), (120.0003, 1.0)]:
        store.append(labels, t, value)
    case = Case("", (("c_total", "0 10 20"),), [120.0, 150.0])
    tests = []
    for expr in ("rate(c_total[2m])", "increase(c_total[2m])", "delta(c_total[2m])"):
        for t in case.times:
            result = evaluate(parse(expr), store, t)
            assert len(result) == 1 and math.isfinite(result[0].value), (expr, t)
            tests.append(
                {"expr": expr, "eval_time": f"{round(t * 1000)}ms", "exp_samples": samples(result)}
            )
    for expr in ("rate(c_total[2m])", "increase(c_total[2m])"):
        # Raised ZeroDivisionError here: both samples on millisecond 0. One is kept: no result.
        assert evaluate(parse(expr), store, 0.0004) == []
    write_tests(tmp_path / "same_ms.yaml", [promtool_group(case, tests)])
    proc = run_promtool(tmp_path / "same_ms.yaml")
    assert proc.returncode == 0, f"promtool disagrees:\n{proc.stdout}\n{proc.stderr}"


def test_a_series_expands_to_at_most_a_million_values() -> None:
    assert len(parse_values("1x999999")) == 1_000_000
    assert len(parse_values("_x999999 _")) == 1_000_000
    for text in ("1x1000000", "1x999999 2", "0+1x" + "9" * 5000, "_x500000 1x500000"):
        with pytest.raises(PromQLError, match="1000000 values"):
            parse_values(text)
