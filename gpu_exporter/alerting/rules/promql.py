"""PromQL over the daemon's own sample history: Prometheus' float PromQL, with the
semantics of Prometheus 2.42 (default) or 3.x.

Parsing is done by `promql_parser`; this module compiles its AST into a plan, refusing at
parse time what the daemon cannot evaluate (`UnsupportedConstruct`, naming the first such
construct in pre-order: only the native-histogram functions remain, as the daemon stores no
native histograms), and evaluates instant queries the way Prometheus' engine does, so rule
results match what the same rule file gives under `promtool test rules`.

Covered: number and string literals; unary minus and plus; parentheses; instant and range
selectors with every matcher, `offset` and `@` (`start()`, `end()`, a timestamp); subqueries
(with step, offset and `@`; the default step is the test file's `evaluation_interval` in
`rules test`, one minute in `serve`, Prometheus' default global evaluation interval); every
arithmetic, comparison and set operator (`atan2` included) with vector matching and
`bool`; every aggregation (`sum avg min max count group stddev stdvar topk bottomk quantile
count_values`) with `by`/`without`; and every function of Prometheus 2.42 over floats
(`holt_winters` under that name), `histogram_quantile` over classic `le` buckets.

Semantics (`Semantics`): Prometheus 2.42 selects ranges [t - range, t] and keeps a sample
exactly the lookback old; 3.x excludes the left end of both, aligns subquery steps
accordingly, matches `.` in label-matcher regexes against newlines too, and knows
`holt_winters` no more.

Known limits of the parity:

- `^`, `exp`, the logarithms and trigonometry use the C library where Go has its own
  implementations, so the last bit of a fractional result can differ.
- Float `sum`/`avg`/`stddev` add in the store's label order; Prometheus adds in the order its
  TSDB returns series (creation order). Each ordering's rounding error is bounded by
  (n - 1) * 2**-53 * sum(|x|) for n samples, so the two can differ by twice that.
- promql_parser (2.45+ grammar) accepts a few spellings 2.42 rejects: unit-less durations
  (`x[90]`) and quoted names (`{"x"}`).
- A selector with `@ <timestamp>` reads only what the store still holds: in `serve` it keeps a
  series as far back as rules read relative to now, so a fixed timestamp further back reads
  nothing (`rules test` keeps everything).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from operator import itemgetter

import promql_parser as P

from gpu_exporter.alerting.rules import promql_functions as F
from gpu_exporter.alerting.rules.gofloat import go_div, go_max, go_min, go_mod, go_pow
from gpu_exporter.alerting.rules.promql_aggregate import (
    AGGREGATIONS,
    PARAMETER_AGGREGATIONS,
    Grouping,
    aggregate,
)
from gpu_exporter.alerting.rules.promql_values import (
    NAME,
    Element,
    PromQLError,
    Semantics,
    UnsupportedConstruct,
    Vector,
    drop_name,
    unique,
)
from gpu_exporter.alerting.settings import DEFAULT_RULE_SEMANTICS, RULE_SEMANTICS
from gpu_exporter.alerting.store import CHECK_EVERY, Labels, Matcher, SeriesStore, Window, is_stale
from gpu_exporter.support.regex import RegexError, check_label_matcher

__all__ = [
    "DEFAULT_SEMANTICS",
    "DEFAULT_SUBQUERY_STEP_SECONDS",
    "NATIVE_HISTOGRAM_FUNCTIONS",
    "PROMETHEUS_2",
    "PROMETHEUS_3",
    "SEMANTICS",
    "Deadline",
    "Element",
    "EvaluationStopped",
    "History",
    "PromQLError",
    "RangeCache",
    "Semantics",
    "UnsupportedConstruct",
    "check_supported",
    "evaluate",
    "format_labels",
    "history_by_metric",
    "max_range_seconds",
    "parse",
    "reach_seconds",
    "referenced_metrics",
    "referenced_selectors",
]


class EvaluationStopped(Exception):
    """The evaluation ran past its deadline (the rule group's time budget) and was stopped.
    Not a PromQLError: the query is fine, the time ran out."""


class Deadline:
    """When an evaluation must stop. `check` is called between steps and every
    CHECK_EVERY elements of the loops over series, so even a query over very many series
    stops within about one such stretch of its deadline."""

    CHECK_EVERY = CHECK_EVERY

    __slots__ = ("at", "budget")

    def __init__(self, budget: float | None = None) -> None:
        self.budget = budget
        self.at = math.inf if budget is None else time.perf_counter() + budget

    def expired(self) -> bool:
        return time.perf_counter() > self.at

    def check(self) -> None:
        if time.perf_counter() > self.at:
            raise EvaluationStopped(f"time budget of {self.budget:g}s exceeded")


NO_DEADLINE = Deadline()
_MASK = Deadline.CHECK_EVERY - 1

Value = Vector | float | str


# --- semantics ----------------------------------------------------------------------------------

# Prometheus 2.42's functions (promql/parser/functions.go at v2.42.0).
_FUNCTIONS_2_42 = frozenset(
    {
        "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
        "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh",
        "count_over_time", "days_in_month", "day_of_month", "day_of_week", "day_of_year", "deg",
        "delta", "deriv", "exp", "floor", "histogram_count", "histogram_sum",
        "histogram_fraction", "histogram_quantile", "holt_winters", "hour", "idelta",
        "increase", "irate", "label_replace", "label_join", "last_over_time", "ln", "log10",
        "log2", "max_over_time", "min_over_time", "minute", "month", "pi", "predict_linear",
        "present_over_time", "quantile_over_time", "rad", "rate", "resets", "round", "scalar",
        "sgn", "sin", "sinh", "sort", "sort_desc", "sqrt", "stddev_over_time",
        "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector",
        "year",
    }
)  # fmt: skip
# Functions over native histograms: they read nothing from float samples, and the daemon
# stores no native histograms, so a rule using them is left to Prometheus.
NATIVE_HISTOGRAM_FUNCTIONS = frozenset(
    {"histogram_count", "histogram_sum", "histogram_fraction", "histogram_avg",
     "histogram_stddev", "histogram_stdvar"}
)  # fmt: skip


PROMETHEUS_2 = Semantics("prometheus2", 2, _FUNCTIONS_2_42)
# 3.14 without feature flags: holt_winters is gone (its successor needs a flag), the
# native-histogram functions of 3.x are known (and histogram_fraction reads classic buckets),
# first_over_time is stable (promql/parser/functions.go at v3.14.0).
PROMETHEUS_3 = Semantics(
    "prometheus3",
    3,
    (_FUNCTIONS_2_42 - {"holt_winters"}) | NATIVE_HISTOGRAM_FUNCTIONS | {"first_over_time"},
)
SEMANTICS = {s.name: s for s in (PROMETHEUS_2, PROMETHEUS_3)}
assert tuple(SEMANTICS) == RULE_SEMANTICS
DEFAULT_SEMANTICS = SEMANTICS[DEFAULT_RULE_SEMANTICS]

# promql_parser follows the 3.x grammar, which calls 2.42's holt_winters
# double_exponential_smoothing (behind a feature flag): teach it the 2.42 name.
P.register_extra_functions(
    [
        P.Function(
            "holt_winters",
            [P.ValueType.Matrix, P.ValueType.Scalar, P.ValueType.Scalar],
            P.ValueType.Vector,
        )
    ]
)

ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "^", "atan2"})
# atan2 keeps the metric name in 2.42 (shouldDropMetricName lists the six others only),
# drops it in 3.x (2.47+).
DROPS_NAME = frozenset({"+", "-", "*", "/", "%", "^"})
COMPARISONS = frozenset({"==", "!=", ">", "<", ">=", "<="})
SET_OPERATORS = frozenset({"and", "or", "unless"})

_MATCH_OPS = {
    str(P.MatchOp.Equal): "=",
    str(P.MatchOp.NotEqual): "!=",
    str(P.MatchOp.Re): "=~",
    str(P.MatchOp.NotRe): "!~",
}
_CARDINALITY = {
    str(P.VectorMatchCardinality.OneToOne): "one-to-one",
    str(P.VectorMatchCardinality.ManyToOne): "many-to-one",
    str(P.VectorMatchCardinality.OneToMany): "one-to-many",
    str(P.VectorMatchCardinality.ManyToMany): "many-to-many",
}
_AT_START = str(P.AtModifierType.Start)
_AT_END = str(P.AtModifierType.End)


# --- parsing and the plan -----------------------------------------------------------------------


def parse(text: str, semantics: Semantics = DEFAULT_SEMANTICS) -> P.Expr:
    """Parse `text` and check the evaluator can run it under `semantics`."""
    if _negative_at(text):
        # promql_parser cannot represent a timestamp before 1970 (reading it panics).
        raise UnsupportedConstruct("@ with a negative timestamp")
    try:
        expr = P.parse(text)
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException as exc:  # pyo3 panics (PanicException) are BaseExceptions
        raise PromQLError(_clean_message(str(exc))) from None
    check_supported(expr, semantics)
    return expr


def _negative_at(text: str) -> bool:
    """Whether `text` has `@ -...` outside string literals and comments."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'`":
            i += 1
            while i < n and text[i] != c:
                i += 2 if text[i] == "\\" and c != "`" else 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c == "@" and text[i + 1 :].lstrip().startswith("-"):
            return True
        i += 1
    return False


def _clean_message(message: str) -> str:
    text = " ".join(message.split())
    return text or "invalid PromQL expression"


def check_supported(expr: P.Expr, semantics: Semantics = DEFAULT_SEMANTICS) -> None:
    """Raise UnsupportedConstruct for the first (pre-order) construct outside what the
    evaluator runs, PromQLError for what `semantics`' Prometheus refuses."""
    _compile(expr, semantics)


def referenced_metrics(expr: P.Expr) -> frozenset[str] | None:
    """Metric names `expr` reads; None when some selector has no fixed metric name."""
    names: set[str] = set()
    for selector in _selectors(_compile(expr)):
        name = selector.metric
        if name is None:
            return None
        names.add(name)
    return frozenset(names)


def referenced_selectors(expr: P.Expr) -> list[tuple[str | None, tuple[Matcher, ...]]]:
    """Each selector of `expr`: its fixed metric name (None without one) and its matchers."""
    return [(selector.metric, selector.matchers) for selector in _selectors(_compile(expr))]


def max_range_seconds(expr: P.Expr) -> float:
    """Longest history (ranges, offsets and subqueries) any selector of `expr` reads before
    the evaluation time, 0 if none."""
    longest = 0
    for read in _reads(_compile(expr)):
        longest = max(longest, read.range_ms + read.before_ms)
    return longest / 1000


def reach_seconds(expr: P.Expr, lookback: float) -> float:
    """How far before the evaluation time `expr` reads samples (`history_by_metric`'s longest
    window: what the rule store must keep for it), 0 if it reads the newest samples only."""
    needs = history_by_metric(expr, round(lookback * 1000))
    return max((need.window_ms for need in needs.values()), default=0) / 1000


@dataclass(frozen=True, slots=True)
class History:
    """How far before the evaluation time the selectors of one metric read."""

    # Every sample this far back: a range selector's range plus offset, an instant selector's
    # offset plus the lookback (its newest sample at or before t - offset may be anywhere there),
    # each plus the subqueries around it.
    window_ms: int = 0
    # An instant selector read at the evaluation time (no offset, or a negative one, outside
    # subqueries): only the newest sample, and only while it is no older than this (the
    # lookback).
    newest_ms: int = 0

    def merge(self, other: History) -> History:
        return History(max(self.window_ms, other.window_ms), max(self.newest_ms, other.newest_ms))


def history_by_metric(expr: P.Expr, lookback_ms: int) -> dict[str | None, History]:
    """What history each metric's selectors in `expr` read (the key None stands for selectors
    without a fixed metric name). The store keeps each metric only that long, so a `[1h]` on
    one gauge does not make every series keep an hour at 1 s resolution."""
    needs: dict[str | None, History] = {}
    for read in _reads(_compile(expr)):
        if read.is_range:
            # [t - before - range, t - before]; a negative offset reads less of the past.
            need = History(window_ms=max(0, read.range_ms + read.before_ms))
        elif read.before_ms > 0:
            need = History(window_ms=read.before_ms + lookback_ms)
        else:  # the newest sample at or before t (or later): the newest there is
            need = History(newest_ms=lookback_ms)
        metric = read.selector.metric
        needs[metric] = needs.get(metric, History()).merge(need)
    return needs


@dataclass(frozen=True, slots=True)
class _Read:
    """One selector as evaluation reads it: `before_ms` before the evaluation time (offsets
    and the subqueries around it), over `range_ms` (0 for an instant selector)."""

    selector: _Selector
    range_ms: int
    before_ms: int
    is_range: bool


def _reads(node: _Node, before_ms: int = 0) -> Iterator[_Read]:
    """Every selector of the plan with how far back it reads. Selectors pinned by `@` to a
    timestamp are left out: they read a fixed time, not a window before now."""
    if isinstance(node, _Selector | _Range):
        selector = node.selector if isinstance(node, _Range) else node
        before = _before(selector.at, selector.offset_ms, before_ms)
        if before is not None:
            range_ms = node.range_ms if isinstance(node, _Range) else 0
            yield _Read(selector, range_ms, before, isinstance(node, _Range))
        return
    if isinstance(node, _Subquery):
        before = _before(node.at, node.offset_ms, before_ms)
        if before is not None:
            yield from _reads(node.expr, before + node.range_ms)
        return
    for child in _children(node):
        yield from _reads(child, before_ms)


def _before(at: _At | None, offset_ms: int, outer_ms: int) -> int | None:
    if at is None:
        return outer_ms + offset_ms
    if at.kind != "time":  # start() and end(): the query's own time, whatever the subquery
        return offset_ms
    return None


@dataclass(frozen=True, slots=True)
class _At:
    kind: str  # "time", "start" or "end"
    ms: int = 0


@dataclass(frozen=True, slots=True)
class _Number:
    value: float


@dataclass(frozen=True, slots=True)
class _String:
    value: str


@dataclass(frozen=True, slots=True)
class _Selector:
    metric: str | None  # fixed metric name, if an equality matcher pins it
    matchers: tuple[Matcher, ...]
    offset_ms: int
    at: _At | None
    absent_labels: Labels  # what absent()/absent_over_time() report for this selector

    @property
    def selector(self) -> _Selector:
        return self


@dataclass(frozen=True, slots=True)
class _Range:
    selector: _Selector
    range_ms: int


@dataclass(frozen=True, slots=True)
class _Subquery:
    expr: _Node
    range_ms: int
    step_ms: int  # 0: the default step
    offset_ms: int
    at: _At | None


@dataclass(frozen=True, slots=True)
class _Negate:
    expr: _Node


@dataclass(frozen=True, slots=True)
class _Call:
    name: str
    args: tuple[_Node, ...]
    range_index: int  # the argument that is a range or subquery, -1 if none


@dataclass(frozen=True, slots=True)
class _Aggregate:
    op: str
    grouping: Grouping
    param: _Node | None
    expr: _Node


@dataclass(frozen=True, slots=True)
class _Binary:
    op: str
    lhs: _Node
    rhs: _Node
    return_bool: bool
    card: str
    on: bool
    matching: frozenset[str]
    include: tuple[str, ...]
    drops_name: bool  # arithmetic drops the metric name (atan2 too in 3.x)
    # 3.x (3.9+) checks vector matching's cardinality before a comparison filters a pair out.
    match_before_filter: bool


_Node = _Number | _String | _Selector | _Range | _Subquery | _Negate | _Call | _Aggregate | _Binary


def _compile(expr: P.Expr, semantics: Semantics = DEFAULT_SEMANTICS) -> _Node:
    """Translate a promql_parser AST into a plan, rejecting unsupported constructs in pre-order.
    promql_parser has type-checked it: ranges appear only where a function takes one."""
    if isinstance(expr, P.ParenExpr):
        # Prometheus unwraps parentheses around function arguments, ranges included.
        return _compile(expr.expr, semantics)
    if isinstance(expr, P.NumberLiteral):
        return _Number(float(expr.val))
    if isinstance(expr, P.StringLiteral):
        return _String(expr.val)
    if isinstance(expr, P.VectorSelector):
        return _compile_selector(expr, semantics)
    if isinstance(expr, P.MatrixSelector):
        selector = _compile_selector(expr.vector_selector, semantics)
        return _Range(selector, _millis(expr.range))
    if isinstance(expr, P.SubqueryExpr):
        inner = _compile(expr.expr, semantics)
        step = _millis(expr.step) if expr.step is not None else 0
        offset = _millis(expr.offset) if expr.offset is not None else 0
        assert expr.range is not None  # a subquery always has a range
        return _Subquery(inner, _millis(expr.range), step, offset, _compile_at(expr.at))
    if isinstance(expr, P.UnaryExpr):
        return _Negate(_compile(expr.expr, semantics))
    if isinstance(expr, P.Call):
        return _compile_call(expr, semantics)
    if isinstance(expr, P.AggregateExpr):
        return _compile_aggregate(expr, semantics)
    if isinstance(expr, P.BinaryExpr):
        return _compile_binary(expr, semantics)
    raise UnsupportedConstruct(f"expression {type(expr).__name__}")


def _compile_at(at: P.AtModifier | None) -> _At | None:
    if at is None:
        return None
    kind = str(at.type)
    if kind == _AT_START:
        return _At("start")
    if kind == _AT_END:
        return _At("end")
    assert at.at is not None  # an @ with neither start() nor end() has its time
    return _At("time", round(at.at.timestamp() * 1000))


def _compile_selector(vs: P.VectorSelector, semantics: Semantics) -> _Selector:
    if vs.matchers.or_matchers:
        raise UnsupportedConstruct("'or' inside label matchers")
    matchers = []
    for m in vs.matchers.matchers:
        op = _MATCH_OPS[str(m.op)]
        value = m.value
        if "~" in op:
            value = _checked_regex(value)
            if semantics.dot_matches_newline:
                value = f"(?s:{value})"
        matchers.append(Matcher(m.name, op, value))
    if vs.name:
        matchers.append(Matcher(NAME, "=", vs.name))
    metric = next((m.value for m in matchers if m.name == NAME and m.op == "="), None)
    offset = _millis(vs.offset) if vs.offset is not None else 0
    return _Selector(metric, tuple(matchers), offset, _compile_at(vs.at), _absent_labels(matchers))


def _checked_regex(pattern: str) -> str:
    """`pattern` unchanged, once RE2 accepts it (the store matches it, anchored). A pattern
    refused here is refused by Prometheus too: an error in the rule, worded as Go words it."""
    try:
        check_label_matcher(pattern)
    except RegexError as exc:
        raise PromQLError(exc.go_message) from None
    return pattern


def _absent_labels(matchers: Sequence[Matcher]) -> Labels:
    """absent() labels: names pinned by exactly one equality matcher (Prometheus'
    createLabelsForAbsentFunction; a name with any other matcher as well is dropped)."""
    labels: dict[str, str] = {}
    dropped: list[str] = []
    for m in matchers:
        if m.name == NAME:
            continue
        if m.op == "=" and m.name not in labels:
            if m.value:  # setting an empty value deletes, as labels.Builder does
                labels[m.name] = m.value
        else:
            dropped.append(m.name)
    for name in dropped:
        labels.pop(name, None)
    return tuple(sorted(labels.items()))


def _compile_call(call: P.Call, semantics: Semantics) -> _Call:
    name = call.func.name
    classic = name == "histogram_fraction" and semantics.major >= 3  # 3.4+ reads `le` buckets
    if name in NATIVE_HISTOGRAM_FUNCTIONS and name in semantics.functions and not classic:
        raise UnsupportedConstruct(f"function {name}")
    if name not in semantics.functions:
        # What promql_parser knows beyond this Prometheus (newer or experimental functions).
        raise PromQLError(f'unknown function with name "{name}"')
    args = tuple(_compile(arg, semantics) for arg in call.args)
    ranges = [i for i, arg in enumerate(args) if isinstance(arg, _Range | _Subquery)]
    return _Call(name, args, ranges[0] if ranges else -1)


def _compile_aggregate(agg: P.AggregateExpr, semantics: Semantics) -> _Aggregate:
    op = str(agg.op)
    if op not in AGGREGATIONS:
        raise PromQLError(f"unknown aggregation {op!r} in {semantics.name} PromQL")
    modifier = agg.modifier
    without = modifier is not None and modifier.type == P.AggModifierType.Without
    labels = frozenset(modifier.labels) if modifier is not None else frozenset()
    param = None
    if op in PARAMETER_AGGREGATIONS:
        assert agg.param is not None  # promql_parser requires it
        param = _compile(agg.param, semantics)
    return _Aggregate(op, Grouping(without, labels), param, _compile(agg.expr, semantics))


def _compile_binary(binary: P.BinaryExpr, semantics: Semantics) -> _Binary:
    op = str(binary.op)
    if op not in ARITHMETIC and op not in COMPARISONS and op not in SET_OPERATORS:
        raise UnsupportedConstruct(f"operator {op}")
    modifier = binary.modifier
    card = "many-to-many" if op in SET_OPERATORS else "one-to-one"
    on, return_bool = False, False
    matching: frozenset[str] = frozenset()
    include: tuple[str, ...] = ()
    if modifier is not None:
        fill = modifier.fill_values
        if fill is not None and (fill.lhs is not None or fill.rhs is not None):
            raise PromQLError("fill modifiers need Prometheus 3.x's experimental feature flag")
        card = _CARDINALITY[str(modifier.card)]
        return_bool = modifier.return_bool
        if modifier.matching is not None:
            on = modifier.matching.type == P.LabelModifierType.Include
            matching = frozenset(modifier.matching.labels)
        include = tuple(modifier.group_labels or ())
    lhs, rhs = _compile(binary.lhs, semantics), _compile(binary.rhs, semantics)
    drops_name = op in DROPS_NAME or (op == "atan2" and semantics.major >= 3)
    return _Binary(
        op, lhs, rhs, return_bool, card, on, matching, include, drops_name, semantics.major >= 3
    )


def _millis(duration: timedelta) -> int:
    return (duration.days * 86_400 + duration.seconds) * 1000 + duration.microseconds // 1000


def _children(node: _Node) -> tuple[_Node, ...]:
    if isinstance(node, _Range):
        return (node.selector,)
    if isinstance(node, _Negate | _Subquery):
        return (node.expr,)
    if isinstance(node, _Call):
        return node.args
    if isinstance(node, _Aggregate):
        return (node.expr,) if node.param is None else (node.param, node.expr)
    if isinstance(node, _Binary):
        return (node.lhs, node.rhs)
    return ()


def _walk(node: _Node) -> Iterator[_Node]:
    yield node
    for child in _children(node):
        yield from _walk(child)


def _selectors(node: _Node) -> Iterator[_Selector]:
    return (n for n in _walk(node) if isinstance(n, _Selector))


# --- evaluation ---------------------------------------------------------------------------------

DEFAULT_SUBQUERY_STEP_SECONDS = 60.0  # Prometheus' default global evaluation_interval


def evaluate(
    expr: P.Expr,
    storage: SeriesStore,
    t: float,
    lookback: float = 300.0,
    cache: RangeCache | None = None,
    deadline: Deadline = NO_DEADLINE,
    semantics: Semantics = DEFAULT_SEMANTICS,
    subquery_step: float = DEFAULT_SUBQUERY_STEP_SECONDS,
) -> list[Element] | float:
    """Instant query at unix time `t`; a scalar expression gives a float.

    Raises PromQLError where Prometheus fails the query (ambiguous vector matching, duplicate
    label sets in a result, a result that is neither an instant vector nor a scalar),
    EvaluationStopped once `deadline` has passed. `cache` shares range-function results
    between queries; `subquery_step` is the step of subqueries that give none.
    """
    plan = _plan(expr, semantics)
    if isinstance(plan, _Range | _Subquery | _String):
        raise PromQLError("rule result is not a vector or scalar")
    context = _Context(
        storage, round(lookback * 1000), cache, deadline, semantics, round(subquery_step * 1000)
    )
    result = _Evaluator(context, round(t * 1000)).eval(plan)
    assert not isinstance(result, str)  # only function arguments are strings
    return result


# Compiled plans of the expressions evaluated lately: a rule's expression is parsed once at
# load and evaluated every tick, and compiling it was half the cost of evaluating it. Keyed
# by identity (the cache holds the expression, so its id is not reused meanwhile).
_PLANS: dict[tuple[int, str], tuple[P.Expr, _Node]] = {}
_PLANS_MAX = 4096


def _plan(expr: P.Expr, semantics: Semantics) -> _Node:
    key = (id(expr), semantics.name)
    found = _PLANS.get(key)
    if found is not None and found[0] is expr:
        return found[1]
    plan = _compile(expr, semantics)
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()  # rule files were reloaded many times: start afresh
    _PLANS[key] = (expr, plan)
    return plan


class RangeCache:
    """Range-function results over one state of one store, for the queries after it that
    compute the same function of the same range at the same time (the shipped rules average
    gpu_utilization_ratio over 5m in four rules). A write to the store starts it afresh."""

    def __init__(self) -> None:
        self._key: tuple[SeriesStore, int] | None = None
        self._results: dict[tuple[_Call, int], tuple[Element, ...]] = {}

    def lookup(self, key: tuple[SeriesStore, int], node: _Call, t_ms: int) -> Vector | None:
        if key != self._key:
            self._key, self._results = key, {}
            return None
        found = self._results.get((node, t_ms))
        return None if found is None else list(found)

    def remember(
        self, key: tuple[SeriesStore, int], node: _Call, t_ms: int, result: Vector
    ) -> None:
        if key == self._key:  # else the store changed meanwhile: the key is stale
            self._results[node, t_ms] = tuple(result)


@dataclass(frozen=True, slots=True)
class _Context:
    """What stays the same through one query, subquery steps included."""

    storage: SeriesStore
    lookback_ms: int
    cache: RangeCache | None
    deadline: Deadline
    semantics: Semantics
    subquery_step_ms: int


class _Evaluator:
    """Evaluates a plan at one instant `t_ms`; a subquery evaluates its expression with one
    of these per step, `query_ms` (what `start()` and `end()` mean) staying the query's time."""

    def __init__(self, context: _Context, t_ms: int, query_ms: int | None = None):
        self.context = context
        self.storage = context.storage
        self.t_ms = t_ms
        self.query_ms = t_ms if query_ms is None else query_ms
        self.check = context.deadline.check
        self.store_check = None if context.deadline is NO_DEADLINE else context.deadline.check
        self.left_open = context.semantics.left_open

    def eval(self, node: _Node) -> Value:
        self.check()
        if isinstance(node, _Number):
            return node.value
        if isinstance(node, _Selector):
            return self.instant_selector(node)
        if isinstance(node, _Negate):
            return self.negate(node)
        if isinstance(node, _Call):
            return self.call(node)
        if isinstance(node, _Aggregate):
            return self.aggregate(node)
        if isinstance(node, _Binary):
            return self.binary(node)
        if isinstance(node, _String):
            return node.value
        # promql_parser admits a range or subquery only as a function's matrix argument.
        raise PromQLError("rule result is not a vector or scalar")

    def vector(self, node: _Node) -> Vector:
        value = self.eval(node)
        if not isinstance(value, list):
            raise PromQLError("expected an instant vector")
        return value

    def scalar(self, node: _Node) -> float:
        value = self.eval(node)
        if not isinstance(value, float):
            raise PromQLError("expected a scalar")
        return value

    def string(self, node: _Node) -> str:
        value = self.eval(node)
        if not isinstance(value, str):
            raise PromQLError("expected a string")
        return value

    def reference_ms(self, offset_ms: int, at: _At | None) -> int:
        """The time a selector or subquery reads at: `@`'s time (or now), minus the offset."""
        if at is None:
            return self.t_ms - offset_ms
        if at.kind == "time":
            return at.ms - offset_ms
        return self.query_ms - offset_ms

    # selectors: the store keeps times in the milliseconds evaluation works in (round(t * 1000)
    # once at ingest); rows are sorted by labels, the TSDB's series order.

    def selected(self, node: _Selector) -> list[tuple[Labels, int, float]]:
        # The newest sample at or before t - offset, if it is no older than the lookback delta
        # (2.42 keeps a sample exactly lookback old, 3.x does not) and is not a staleness marker.
        ref = self.reference_ms(node.offset_ms, node.at)
        lo = ref - self.context.lookback_ms + (1 if self.left_open else 0)
        rows = self.storage.latest_ms(node.matchers, ref, self.store_check)
        rows.sort(key=itemgetter(0))
        return [row for row in rows if row[1] >= lo and not is_stale(row[2])]

    def instant_selector(self, node: _Selector) -> Vector:
        return [Element(labels, value) for labels, _, value in self.selected(node)]

    def range_points(self, node: _Range | _Subquery) -> tuple[int, int, list[Window]]:
        """(range start, range end, the selected series), the ends in ms. 2.42 selects
        [t - offset - range, t - offset], 3.x leaves out its start; markers are left out."""
        if isinstance(node, _Subquery):
            return self.subquery_points(node)
        hi = self.reference_ms(node.selector.offset_ms, node.selector.at)
        lo = hi - node.range_ms
        rows = self.storage.range_ms(
            node.selector.matchers, lo + (1 if self.left_open else 0), hi, self.store_check
        )
        rows.sort(key=itemgetter(0))
        return lo, hi, rows

    def subquery_points(self, node: _Subquery) -> tuple[int, int, list[Window]]:
        """The subquery's expression at every step in its range, as series. Steps are the
        multiples of the step (from the epoch) from the first one in the range to its end."""
        end = self.reference_ms(node.offset_ms, node.at)
        start_bound = end - node.range_ms
        step = node.step_ms or self.context.subquery_step_ms
        start = step * _go_quotient(start_bound, step)
        if start < start_bound or (self.left_open and start == start_bound):
            start += step
        series: dict[Labels, tuple[list[int], list[float]]] = {}
        for ts in range(start, end + 1, step):
            for element in _Evaluator(self.context, ts, self.query_ms).vector(node.expr):
                times, values = series.setdefault(element.labels, ([], []))
                times.append(ts)
                values.append(element.value)
        rows = [(labels, times, values) for labels, (times, values) in sorted(series.items())]
        return start_bound, end, rows  # type: ignore[return-value]  # lists serve as arrays

    # operators

    def negate(self, node: _Negate) -> Value:
        value = self.eval(node.expr)
        if isinstance(value, float):
            return -value
        assert isinstance(value, list)
        return unique([Element(drop_name(e.labels), -e.value) for e in value])

    def aggregate(self, node: _Aggregate) -> Vector:
        param: float | str | None = None
        if node.param is not None:
            value = self.eval(node.param)
            assert not isinstance(value, list)  # promql_parser type-checks it
            param = value
        vector = self.vector(node.expr)
        semantics = self.context.semantics
        return unique(aggregate(node.op, node.grouping, param, vector, self.check, semantics))

    def binary(self, node: _Binary) -> Value:
        lhs, rhs = self.eval(node.lhs), self.eval(node.rhs)
        assert not isinstance(lhs, str) and not isinstance(rhs, str)
        if isinstance(lhs, float):
            if isinstance(rhs, float):
                value, keep = _elem_binop(node.op, lhs, rhs)
                return float(keep) if node.op in COMPARISONS else value
            return unique(_vector_scalar(node, rhs, lhs, True, self.check))
        if isinstance(rhs, float):
            return unique(_vector_scalar(node, lhs, rhs, False, self.check))
        self.check()
        if node.op in SET_OPERATORS:
            return unique(_set_operation(node, lhs, rhs))
        return unique(_vector_binop(node, lhs, rhs, self.check))

    # functions

    def call(self, node: _Call) -> Value:
        name = node.name
        if node.range_index >= 0:
            return self.range_call(node)
        if name == "time":
            return self.t_ms / 1000
        if name == "pi":
            return math.pi
        if name == "timestamp":
            return unique(self.timestamp(node.args[0]))
        if name == "absent":
            if self.vector(node.args[0]):
                return []
            arg = node.args[0]
            return [Element(arg.absent_labels if isinstance(arg, _Selector) else (), 1.0)]
        if name in F.DATE_FUNCTIONS and not node.args:
            return [Element((), _date_part(name, self.t_ms / 1000))]
        args = [self.eval(arg) for arg in node.args]
        if name == "scalar":
            vector = _vector_arg(args[0])
            return vector[0].value if len(vector) == 1 else math.nan
        if name == "vector":
            return [Element((), _scalar_arg(args[0]))]
        return unique(_instant_function(name, args, self.context.semantics))

    def timestamp(self, arg: _Node) -> Vector:
        # A selector's samples keep their own times; any other vector is computed at t.
        if isinstance(arg, _Selector):
            return [Element(drop_name(labels), ms / 1000) for labels, ms, _ in self.selected(arg)]
        return [Element(drop_name(e.labels), self.t_ms / 1000) for e in self.vector(arg)]

    def range_call(self, node: _Call) -> Vector:
        cache = self.context.cache
        if cache is None or self.t_ms != self.query_ms:
            return self._range_call(node)  # subquery steps are not shared between rules
        # The generation is read before the store is: a write during the read stales the key.
        key = (self.storage, self.storage.generation)
        result = cache.lookup(key, node, self.t_ms)
        if result is None:
            result = self._range_call(node)
            cache.remember(key, node, self.t_ms, result)
        return result

    def _range_call(self, node: _Call) -> Vector:
        index = node.range_index
        arg = node.args[index]
        assert isinstance(arg, _Range | _Subquery)
        params = [self.scalar(a) for i, a in enumerate(node.args) if i != index]
        lo, hi, series = self.range_points(arg)
        if node.name == "absent_over_time":
            if series:
                return []
            return [Element(arg.selector.absent_labels if isinstance(arg, _Range) else (), 1.0)]
        function = F.range_impls(self.context.semantics)[node.name]
        check = self.check
        keeps_name = node.name in ("last_over_time", "first_over_time")  # they act as offsets
        range_ms = arg.range_ms
        out: Vector = []
        for i, (labels, times, values) in enumerate(series):
            if not i & _MASK:
                check()
            value = function(times, values, lo, hi, range_ms, self.t_ms, params)
            if value is None:
                continue
            out.append(Element(labels if keeps_name else drop_name(labels), value))
        return unique(out)


def _go_quotient(a: int, b: int) -> int:
    """a / b for Go integers: truncated towards zero."""
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


# --- label helpers ------------------------------------------------------------------------------


def format_labels(labels: Labels) -> str:
    """Labels as Prometheus prints them: {a="b", c="d"}."""
    return "{" + ", ".join(f"{name}={_go_quote(value)}" for name, value in labels) + "}"


def _go_quote(value: str) -> str:
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
    out.append('"')
    return "".join(out)


def _signature(labels: Labels, on: bool, names: frozenset[str]) -> Labels:
    if on:
        return tuple(pair for pair in labels if pair[0] in names)
    return tuple(pair for pair in labels if pair[0] not in names and pair[0] != NAME)


# --- binary operators ---------------------------------------------------------------------------


def _elem_binop(op: str, lhs: float, rhs: float) -> tuple[float, bool]:
    """(value, keep) like Prometheus' vectorElemBinop: comparisons keep the left value."""
    if op == "+":
        return lhs + rhs, True
    if op == "-":
        return lhs - rhs, True
    if op == "*":
        return lhs * rhs, True
    if op == "/":
        return go_div(lhs, rhs), True
    if op == "%":
        return go_mod(lhs, rhs), True
    if op == "^":
        return go_pow(lhs, rhs), True
    if op == "atan2":
        return math.atan2(lhs, rhs), True
    if op == "==":
        return lhs, lhs == rhs
    if op == "!=":
        return lhs, lhs != rhs
    if op == ">":
        return lhs, lhs > rhs
    if op == "<":
        return lhs, lhs < rhs
    if op == ">=":
        return lhs, lhs >= rhs
    if op == "<=":
        return lhs, lhs <= rhs
    raise UnsupportedConstruct(f"operator {op}")


def _vector_scalar(
    node: _Binary, vector: Vector, scalar: float, swapped: bool, check: Callable[[], None]
) -> Vector:
    drop = node.drops_name or node.return_bool
    out: Vector = []
    for i, element in enumerate(vector):
        if not i & _MASK:
            check()
        lhs, rhs = (scalar, element.value) if swapped else (element.value, scalar)
        value, keep = _elem_binop(node.op, lhs, rhs)
        if node.op in COMPARISONS:
            value = element.value  # a filter always yields the vector's own value
        if node.return_bool:
            value, keep = float(keep), True
        if keep:
            out.append(Element(drop_name(element.labels) if drop else element.labels, value))
    return out


def _set_operation(node: _Binary, lhs: Vector, rhs: Vector) -> Vector:
    def sig(element: Element) -> Labels:
        return _signature(element.labels, node.on, node.matching)

    if node.op == "and":
        if not lhs or not rhs:
            return []
        right = {sig(e) for e in rhs}
        return [e for e in lhs if sig(e) in right]
    if node.op == "or":
        if not lhs or not rhs:
            return lhs + rhs
        left = {sig(e) for e in lhs}
        return lhs + [e for e in rhs if sig(e) not in left]
    if not lhs or not rhs:  # unless
        return lhs
    right = {sig(e) for e in rhs}
    return [e for e in lhs if sig(e) not in right]


def _vector_binop(node: _Binary, lhs: Vector, rhs: Vector, check: Callable[[], None]) -> Vector:
    """Arithmetic/comparison between vectors, Prometheus' VectorBinop step by step."""
    if not lhs or not rhs:
        return []  # nothing can match, and no cardinality error is raised either
    swapped = node.card == "one-to-many"
    if swapped:  # work as many-to-one with the sides exchanged
        lhs, rhs = rhs, lhs
    right: dict[Labels, Element] = {}
    for i, element in enumerate(rhs):
        if not i & _MASK:
            check()
        sig = _signature(element.labels, node.on, node.matching)
        if sig in right:
            side = "left" if swapped else "right"
            raise PromQLError(
                f"found duplicate series for the match group {format_labels(sig)} on the "
                f"{side} hand-side of the operation: [{format_labels(element.labels)}, "
                f"{format_labels(right[sig].labels)}];many-to-many matching not allowed: "
                "matching labels must be unique on one side"
            )
        right[sig] = element
    matched: dict[Labels, set[Labels]] = {}
    out: Vector = []
    for i, element in enumerate(lhs):
        if not i & _MASK:
            check()
        sig = _signature(element.labels, node.on, node.matching)
        other = right.get(sig)
        if other is None:
            continue
        vl, vr = (other.value, element.value) if swapped else (element.value, other.value)
        value, keep = _elem_binop(node.op, vl, vr)
        if node.return_bool:
            value = float(keep)
        elif not keep and not node.match_before_filter:
            continue  # 2.42 filters before the uniqueness checks below
        labels = _result_labels(element.labels, other.labels, node)
        seen = matched.get(sig)
        if node.card == "one-to-one":
            if seen is not None:
                raise PromQLError(
                    "multiple matches for labels: many-to-one matching must be explicit "
                    "(group_left/group_right)"
                )
            matched[sig] = set()
        else:
            if seen is None:
                seen = matched[sig] = set()
            elif labels in seen:
                raise PromQLError(
                    "multiple matches for labels: grouping labels must ensure unique matches"
                )
            seen.add(labels)
        if keep or node.return_bool:
            out.append(Element(labels, value))
    return out


def _result_labels(many: Labels, one: Labels, node: _Binary) -> Labels:
    """Result labels of a vector/vector operation (Prometheus' resultMetric)."""
    labels = dict(many)
    if node.drops_name:
        labels.pop(NAME, None)
    if node.card == "one-to-one":
        if node.on:
            labels = {k: v for k, v in labels.items() if k in node.matching}
        else:
            for name in node.matching:
                labels.pop(name, None)
    if node.include:
        one_side = dict(one)
        for name in node.include:  # group_x(extra) labels come from the "one" side
            if one_side.get(name):
                labels[name] = one_side[name]
            else:
                labels.pop(name, None)
    if node.return_bool:
        labels.pop(NAME, None)
    return tuple(sorted(labels.items()))


# --- functions ----------------------------------------------------------------------------------


def _vector_arg(value: Value) -> Vector:
    # promql_parser type-checks function arguments: a vector parameter never gets a scalar.
    assert isinstance(value, list), "function argument should be an instant vector"
    return value


def _scalar_arg(value: Value) -> float:
    # promql_parser type-checks function arguments: a scalar parameter never gets a vector.
    assert isinstance(value, float), "function argument should be a scalar"
    return value


def _string_arg(value: Value) -> str:
    assert isinstance(value, str), "function argument should be a string"
    return value


def _date_part(name: str, seconds: float) -> float:
    parts = F.date_parts(seconds)
    # Go converts NaN, ±Inf and out-of-range floats to int64 as the CPU does (undefined in
    # Go's spec); no date is the honest answer.
    return math.nan if parts is None else parts[name]


def _instant_function(name: str, args: list[Value], semantics: Semantics) -> Vector:
    if name == "histogram_quantile":
        return F.histogram_quantile(_scalar_arg(args[0]), _vector_arg(args[1]), semantics)
    if name == "histogram_fraction":  # 3.x only: 2.42's compiles as unsupported
        lower, upper = _scalar_arg(args[0]), _scalar_arg(args[1])
        return F.histogram_fraction(lower, upper, _vector_arg(args[2]))
    vector = _vector_arg(args[0])
    if name in F.MATH_FUNCTIONS:
        return F.drop_names(vector, F.MATH_FUNCTIONS[name])
    if name in F.DATE_FUNCTIONS:
        return F.drop_names(vector, lambda v: _date_part(name, v))
    if name == "round":
        to_nearest = _scalar_arg(args[1]) if len(args) > 1 else 1.0
        return F.drop_names(vector, lambda v: F.round_to(v, to_nearest))
    if name == "clamp_min":
        floor = _scalar_arg(args[1])
        return F.drop_names(vector, lambda v: go_max(floor, v))
    if name == "clamp_max":
        ceiling = _scalar_arg(args[1])
        return F.drop_names(vector, lambda v: go_min(ceiling, v))
    if name == "clamp":
        lo, hi = _scalar_arg(args[1]), _scalar_arg(args[2])
        return [] if hi < lo else F.drop_names(vector, lambda v: F.clamp(v, lo, hi))
    if name == "label_replace":
        dst, replacement, src, pattern = (_string_arg(a) for a in args[1:5])
        return F.label_replace(vector, dst, replacement, src, pattern, semantics)
    if name == "label_join":
        dst, separator, *sources = (_string_arg(a) for a in args[1:])
        return F.label_join(vector, dst, separator, sources, semantics)
    if name in ("sort", "sort_desc"):
        return F.sort_vector(vector, descending=name == "sort_desc")
    raise UnsupportedConstruct(f"function {name}")
