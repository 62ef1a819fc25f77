"""A PromQL subset evaluated over the daemon's own sample history, with Prometheus 2.42 semantics.

Parsing is done by `promql_parser`; this module rejects everything outside the subset below at
parse time (`UnsupportedConstruct`, naming the first offending construct in pre-order) and
evaluates instant queries the way Prometheus 2.42's engine does, so rule results match what the
same rule file gives under `promtool test rules`.

Supported subset:

- number literals; unary minus; parentheses
- instant vector selectors with `=`, `!=`, `=~`, `!~` matchers (also on `__name__`) and `offset`
- range vector selectors (with `offset`), only as the argument of a range function below
- binary `+ - * / % ^` and `== != > < >= <=` (with or without `bool`) between scalars and/or
  vectors; vector matching with `on`/`ignoring` and `group_left`/`group_right` (extra labels too)
- set operators `and`, `or`, `unless` (with `on`/`ignoring`)
- aggregations `sum avg min max count` with `by`/`without`
- range functions `rate increase delta avg_over_time min_over_time max_over_time sum_over_time
  count_over_time last_over_time absent_over_time`
- functions `absent time clamp_min clamp_max clamp abs vector scalar`

Not supported: `@`, subqueries, string literals, `atan2`, every other function and aggregation,
and a range selector anywhere but as a range function's argument.

Known limits of the parity:

- `^` follows Go's `math.Pow` algorithm, exact for integer exponents; for fractional ones it
  uses the C library's exp/log where Go has its own, so the last bit can differ.
- Regular expressions run on RE2 (`rules/regex.py`), anchored as Prometheus anchors them;
  a pattern RE2 refuses is UnsupportedConstruct, as Prometheus refuses it at load.
- promql_parser (2.45+ grammar) accepts a few spellings 2.42 rejects: unit-less durations
  (`x[90]`) and quoted names (`{"x"}`).
- Float sums (`sum`, `avg`) depend on input order; Prometheus' order is the TSDB's series order
  (creation order in promtool), ours is label order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from operator import itemgetter

import promql_parser as P

from gpu_exporter.rules.regex import RegexError, check_label_matcher
from gpu_exporter.store import CHECK_EVERY, Labels, Matcher, SeriesStore, Window, is_stale

__all__ = [
    "Deadline",
    "Element",
    "EvaluationStopped",
    "History",
    "PromQLError",
    "RangeCache",
    "UnsupportedConstruct",
    "check_supported",
    "evaluate",
    "format_labels",
    "history_by_metric",
    "max_range_seconds",
    "parse",
    "reach_seconds",
    "referenced_metrics",
]

NAME = "__name__"


class PromQLError(ValueError):
    """A query that cannot be parsed, or whose evaluation fails as it would in Prometheus."""


class UnsupportedConstruct(PromQLError):
    """Valid PromQL that the in-process evaluator does not implement."""

    def __init__(self, construct: str):
        super().__init__(f"unsupported PromQL construct: {construct}")
        self.construct = construct


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


@dataclass(frozen=True, slots=True)
class Element:
    """One sample of an instant vector result."""

    labels: Labels
    value: float


Vector = list[Element]
Value = Vector | float


# --- parsing and the supported subset --------------------------------------------------------

RANGE_FUNCTIONS = frozenset(
    {
        "rate",
        "increase",
        "delta",
        "avg_over_time",
        "min_over_time",
        "max_over_time",
        "sum_over_time",
        "count_over_time",
        "last_over_time",
        "absent_over_time",
    }
)
INSTANT_FUNCTIONS = frozenset(
    {"absent", "time", "clamp_min", "clamp_max", "clamp", "abs", "vector", "scalar"}
)
AGGREGATIONS = frozenset({"sum", "avg", "min", "max", "count"})
ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "^"})
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


def parse(text: str) -> P.Expr:
    """Parse `text` and check it stays within the supported subset."""
    try:
        expr = P.parse(text)
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException as exc:  # pyo3 panics (PanicException) are BaseExceptions
        raise PromQLError(_clean_message(str(exc))) from None
    check_supported(expr)
    return expr


def _clean_message(message: str) -> str:
    text = " ".join(message.split())
    return text or "invalid PromQL expression"


def check_supported(expr: P.Expr) -> None:
    """Raise UnsupportedConstruct for the first (pre-order) construct outside the subset."""
    _compile(expr)


def referenced_metrics(expr: P.Expr) -> frozenset[str] | None:
    """Metric names `expr` reads; None when some selector has no fixed metric name."""
    names: set[str] = set()
    for selector in _selectors(_compile(expr)):
        name = selector.metric
        if name is None:
            return None
        names.add(name)
    return frozenset(names)


def max_range_seconds(expr: P.Expr) -> float:
    """Longest history (range plus offset) any selector of `expr` reads, 0 if none."""
    longest = 0
    for node in _walk(_compile(expr)):
        if isinstance(node, _Range):
            longest = max(longest, node.range_ms + node.selector.offset_ms)
        elif isinstance(node, _Selector):
            longest = max(longest, node.offset_ms)
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
    # offset plus the lookback (its newest sample at or before t - offset may be anywhere there).
    window_ms: int = 0
    # An instant selector without (or with a negative) offset: only the newest sample, and only
    # while it is no older than this (the lookback).
    newest_ms: int = 0

    def merge(self, other: History) -> History:
        return History(max(self.window_ms, other.window_ms), max(self.newest_ms, other.newest_ms))


def history_by_metric(expr: P.Expr, lookback_ms: int) -> dict[str | None, History]:
    """What history each metric's selectors in `expr` read (the key None stands for selectors
    without a fixed metric name). The store keeps each metric only that long, so a `[1h]` on
    one gauge does not make every series keep an hour at 1 s resolution."""
    needs: dict[str | None, History] = {}
    for node in _walk(_compile(expr)):
        if isinstance(node, _Range):
            # [t - offset - range, t - offset]; a negative offset reads less of the past.
            selector = node.selector
            need = History(window_ms=max(0, node.range_ms + selector.offset_ms))
        elif isinstance(node, _Selector):
            selector = node
            if node.offset_ms > 0:
                need = History(window_ms=node.offset_ms + lookback_ms)
            else:  # the newest sample at or before t (or later): the newest there is
                need = History(newest_ms=lookback_ms)
        else:
            continue
        needs[selector.metric] = needs.get(selector.metric, History()).merge(need)
    return needs


# --- compiled plan: the checked AST in plain Python objects -----------------------------------


@dataclass(frozen=True, slots=True)
class _Number:
    value: float


@dataclass(frozen=True, slots=True)
class _Selector:
    metric: str | None  # fixed metric name, if an equality matcher pins it
    matchers: tuple[Matcher, ...]
    offset_ms: int
    absent_labels: Labels  # what absent()/absent_over_time() report for this selector


@dataclass(frozen=True, slots=True)
class _Range:
    selector: _Selector
    range_ms: int


@dataclass(frozen=True, slots=True)
class _Negate:
    expr: _Node


@dataclass(frozen=True, slots=True)
class _Call:
    name: str
    args: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Aggregate:
    op: str
    without: bool
    grouping: frozenset[str]
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


_Node = _Number | _Selector | _Range | _Negate | _Call | _Aggregate | _Binary


def _compile(expr: P.Expr, range_allowed: bool = False) -> _Node:
    """Translate a promql_parser AST into a plan, rejecting unsupported constructs in pre-order."""
    if isinstance(expr, P.ParenExpr):
        # Prometheus unwraps parentheses around function arguments, ranges included.
        return _compile(expr.expr, range_allowed)
    if isinstance(expr, P.NumberLiteral):
        return _Number(float(expr.val))
    if isinstance(expr, P.VectorSelector):
        return _compile_selector(expr)
    if isinstance(expr, P.MatrixSelector):
        if not range_allowed:
            raise UnsupportedConstruct("range selector outside a range function")
        selector = _compile_selector(expr.vector_selector)
        return _Range(selector, _millis(expr.range))
    if isinstance(expr, P.UnaryExpr):
        return _Negate(_compile(expr.expr))
    if isinstance(expr, P.Call):
        return _compile_call(expr)
    if isinstance(expr, P.AggregateExpr):
        return _compile_aggregate(expr)
    if isinstance(expr, P.BinaryExpr):
        return _compile_binary(expr)
    if isinstance(expr, P.SubqueryExpr):
        raise UnsupportedConstruct("subquery")
    if isinstance(expr, P.StringLiteral):
        raise UnsupportedConstruct("string literal")
    raise UnsupportedConstruct(f"expression {type(expr).__name__}")


def _compile_selector(vs: P.VectorSelector) -> _Selector:
    if vs.at is not None:
        raise UnsupportedConstruct("@ modifier")
    if vs.matchers.or_matchers:
        raise UnsupportedConstruct("'or' inside label matchers")
    matchers = []
    for m in vs.matchers.matchers:
        op = _MATCH_OPS[str(m.op)]
        matchers.append(Matcher(m.name, op, _checked_regex(m.value) if "~" in op else m.value))
    if vs.name:
        matchers.append(Matcher(NAME, "=", vs.name))
    metric = next((m.value for m in matchers if m.name == NAME and m.op == "="), None)
    offset = _millis(vs.offset) if vs.offset is not None else 0
    return _Selector(metric, tuple(matchers), offset, _absent_labels(matchers))


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


def _compile_call(call: P.Call) -> _Call:
    name = call.func.name
    if name not in RANGE_FUNCTIONS and name not in INSTANT_FUNCTIONS:
        raise UnsupportedConstruct(f"function {name}")
    args = tuple(_compile(arg, range_allowed=name in RANGE_FUNCTIONS) for arg in call.args)
    return _Call(name, args)


def _compile_aggregate(agg: P.AggregateExpr) -> _Aggregate:
    op = str(agg.op)
    if op not in AGGREGATIONS:
        raise UnsupportedConstruct(f"aggregation {op}")
    modifier = agg.modifier
    without = modifier is not None and modifier.type == P.AggModifierType.Without
    grouping = frozenset(modifier.labels) if modifier is not None else frozenset()
    return _Aggregate(op, without, grouping, _compile(agg.expr))


def _compile_binary(binary: P.BinaryExpr) -> _Binary:
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
            raise UnsupportedConstruct("fill modifier")
        card = _CARDINALITY[str(modifier.card)]
        return_bool = modifier.return_bool
        if modifier.matching is not None:
            on = modifier.matching.type == P.LabelModifierType.Include
            matching = frozenset(modifier.matching.labels)
        include = tuple(modifier.group_labels or ())
    lhs, rhs = _compile(binary.lhs), _compile(binary.rhs)
    return _Binary(op, lhs, rhs, return_bool, card, on, matching, include)


def _millis(duration: timedelta) -> int:
    return (duration.days * 86_400 + duration.seconds) * 1000 + duration.microseconds // 1000


def _walk(node: _Node) -> Iterator[_Node]:
    yield node
    if isinstance(node, _Range):
        yield from _walk(node.selector)
    elif isinstance(node, _Negate | _Aggregate):
        yield from _walk(node.expr)
    elif isinstance(node, _Call):
        for arg in node.args:
            yield from _walk(arg)
    elif isinstance(node, _Binary):
        yield from _walk(node.lhs)
        yield from _walk(node.rhs)


def _selectors(node: _Node) -> Iterator[_Selector]:
    return (n for n in _walk(node) if isinstance(n, _Selector))


# --- evaluation ---------------------------------------------------------------------------------


def evaluate(
    expr: P.Expr,
    storage: SeriesStore,
    t: float,
    lookback: float = 300.0,
    cache: RangeCache | None = None,
    deadline: Deadline = NO_DEADLINE,
) -> list[Element] | float:
    """Instant query at unix time `t`; a scalar expression gives a float.

    Raises PromQLError where Prometheus fails the query (ambiguous vector matching, duplicate
    label sets in a result), EvaluationStopped once `deadline` has passed. `cache` shares
    range-function results between queries.
    """
    plan = _compile(expr)
    evaluator = _Evaluator(storage, round(t * 1000), round(lookback * 1000), cache, deadline)
    return evaluator.eval(plan)


class RangeCache:
    """Range-function results at one instant over one state of one store, for the queries
    after it that compute the same function of the same range (the shipped rules average
    gpu_utilization_ratio over 5m in four rules). A write to the store starts it afresh."""

    def __init__(self) -> None:
        self._key: tuple[SeriesStore, int, int] | None = None
        self._results: dict[_Call, tuple[Element, ...]] = {}

    def lookup(self, key: tuple[SeriesStore, int, int], node: _Call) -> Vector | None:
        if key != self._key:
            self._key, self._results = key, {}
            return None
        found = self._results.get(node)
        return None if found is None else list(found)

    def remember(self, key: tuple[SeriesStore, int, int], node: _Call, result: Vector) -> None:
        if key == self._key:  # else the store changed meanwhile: the key is stale
            self._results[node] = tuple(result)


class _Evaluator:
    def __init__(
        self,
        storage: SeriesStore,
        t_ms: int,
        lookback_ms: int,
        cache: RangeCache | None = None,
        deadline: Deadline = NO_DEADLINE,
    ):
        self.storage = storage
        self.t_ms = t_ms
        self.lookback_ms = lookback_ms
        self.cache = cache
        self.check = deadline.check
        self.store_check = None if deadline is NO_DEADLINE else deadline.check

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
        # _compile admits a _Range only as a range function's argument, read by range_call.
        raise UnsupportedConstruct("range selector outside a range function")

    def vector(self, node: _Node) -> Vector:
        value = self.eval(node)
        if isinstance(value, float):
            raise PromQLError("expected an instant vector, got a scalar")
        return value

    # selectors: the store keeps times in the milliseconds evaluation works in (round(t * 1000)
    # once at ingest); rows are sorted by labels, the TSDB's series order.

    def instant_selector(self, node: _Selector) -> Vector:
        # The newest sample at or before t - offset, if it is no older than the lookback delta
        # (2.42 keeps a sample exactly lookback old) and is not a staleness marker.
        ref = self.t_ms - node.offset_ms
        lo = ref - self.lookback_ms
        rows = self.storage.latest_ms(node.matchers, ref, self.store_check)
        rows.sort(key=itemgetter(0))
        return [
            Element(labels, value) for labels, ms, value in rows if ms >= lo and not is_stale(value)
        ]

    def range_points(self, node: _Range) -> tuple[int, int, list[Window]]:
        # 2.42 selects [t - offset - range, t - offset], both ends inclusive, minus markers
        # (the store leaves them out).
        hi = self.t_ms - node.selector.offset_ms
        lo = hi - node.range_ms
        rows = self.storage.range_ms(node.selector.matchers, lo, hi, self.store_check)
        rows.sort(key=itemgetter(0))
        return lo, hi, rows

    # operators

    def negate(self, node: _Negate) -> Value:
        value = self.eval(node.expr)
        if isinstance(value, float):
            return -value
        return _unique([Element(_drop_name(e.labels), -e.value) for e in value])

    def aggregate(self, node: _Aggregate) -> Vector:
        return _unique(_aggregate(node, self.vector(node.expr), self.check))

    def binary(self, node: _Binary) -> Value:
        lhs, rhs = self.eval(node.lhs), self.eval(node.rhs)
        if isinstance(lhs, float):
            if isinstance(rhs, float):
                value, keep = _elem_binop(node.op, lhs, rhs)
                return float(keep) if node.op in COMPARISONS else value
            return _unique(_vector_scalar(node, rhs, lhs, True, self.check))
        if isinstance(rhs, float):
            return _unique(_vector_scalar(node, lhs, rhs, False, self.check))
        self.check()
        if node.op in SET_OPERATORS:
            return _unique(_set_operation(node, lhs, rhs))
        return _unique(_vector_binop(node, lhs, rhs, self.check))

    # functions

    def call(self, node: _Call) -> Value:
        if node.name in RANGE_FUNCTIONS:
            return self.range_call(node)
        args = [self.eval(arg) for arg in node.args]
        if node.name == "time":
            return self.t_ms / 1000
        if node.name == "scalar":
            vec = _vector_arg(args[0])
            return vec[0].value if len(vec) == 1 else math.nan
        if node.name == "vector":
            return [Element((), _scalar_arg(args[0]))]
        if node.name == "absent":
            if args[0]:
                return []
            arg = node.args[0]
            return [Element(arg.absent_labels if isinstance(arg, _Selector) else (), 1.0)]
        return _unique(_instant_function(node.name, args))

    def range_call(self, node: _Call) -> Vector:
        if self.cache is None:
            return self._range_call(node)
        # The generation is read before the store is: a write during the read stales the key.
        key = (self.storage, self.storage.generation, self.t_ms)
        result = self.cache.lookup(key, node)
        if result is None:
            result = self._range_call(node)
            self.cache.remember(key, node, result)
        return result

    def _range_call(self, node: _Call) -> Vector:
        arg = node.args[0]
        assert isinstance(arg, _Range)
        lo, hi, series = self.range_points(arg)
        if node.name == "absent_over_time":
            return [] if series else [Element(arg.selector.absent_labels, 1.0)]
        function = _RANGE_IMPLS[node.name]
        check = self.check
        out: Vector = []
        for i, (labels, times, values) in enumerate(series):
            if not i & _MASK:
                check()
            value = function(times, values, lo, hi, arg.range_ms)
            if value is None:
                continue
            # last_over_time acts like an offset and keeps the name; the others drop it.
            out.append(
                Element(labels if node.name == "last_over_time" else _drop_name(labels), value)
            )
        return _unique(out)


# --- label helpers ------------------------------------------------------------------------------


def _drop_name(labels: Labels) -> Labels:
    if labels and any(name == NAME for name, _ in labels):
        return tuple(pair for pair in labels if pair[0] != NAME)
    return labels


def _unique(vector: Vector) -> Vector:
    # Prometheus checks every computed instant vector for this after dropping metric names.
    if len(vector) > 1 and len({e.labels for e in vector}) != len(vector):
        raise PromQLError("vector cannot contain metrics with the same labelset")
    return vector


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


# --- aggregation --------------------------------------------------------------------------------


def _aggregate(node: _Aggregate, vector: Vector, check: Callable[[], None]) -> Vector:
    # group labels -> [value, mean, count]; groups come out in order of first appearance.
    groups: dict[Labels, list] = {}
    for i, element in enumerate(vector):
        if not i & _MASK:
            check()
        key = _group_labels(element.labels, node)
        group = groups.get(key)
        value = element.value
        if group is None:
            groups[key] = [value, value, 1]
            continue
        if node.op == "sum":
            group[0] += value
        elif node.op == "avg":
            group[2] += 1
            group[1] = _mean_step(group[1], value, group[2])
        elif node.op == "max":
            if group[0] < value or math.isnan(group[0]):
                group[0] = value
        elif node.op == "min":
            if group[0] > value or math.isnan(group[0]):
                group[0] = value
        else:  # count
            group[2] += 1
    out: Vector = []
    for labels, (value, mean, count) in groups.items():
        if node.op == "avg":
            value = mean
        elif node.op == "count":
            value = float(count)
        out.append(Element(labels, value))
    return out


def _group_labels(labels: Labels, node: _Aggregate) -> Labels:
    if node.without:
        return tuple(p for p in labels if p[0] not in node.grouping and p[0] != NAME)
    return tuple(p for p in labels if p[0] in node.grouping)


def _mean_step(mean: float, value: float, count: int) -> float:
    """One step of Prometheus' incremental mean (avg and avg_over_time)."""
    if math.isinf(mean):
        # Inf plus a finite value, or the same Inf again, stays; "Inf - Inf" would give NaN.
        if math.isinf(value) and (mean > 0) == (value > 0):
            return mean
        if not math.isinf(value) and not math.isnan(value):
            return mean
    return mean + (value / count - mean / count)


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
        return _go_div(lhs, rhs), True
    if op == "%":
        return _go_mod(lhs, rhs), True
    if op == "^":
        return _go_pow(lhs, rhs), True
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
    drop = node.op in ARITHMETIC or node.return_bool
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
            out.append(Element(_drop_name(element.labels) if drop else element.labels, value))
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
        elif not keep:
            continue  # filtered out before the uniqueness checks below, as in Prometheus
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
        out.append(Element(labels, value))
    return out


def _result_labels(many: Labels, one: Labels, node: _Binary) -> Labels:
    """Result labels of a vector/vector operation (Prometheus' resultMetric)."""
    labels = dict(many)
    if node.op in ARITHMETIC:
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


# --- Go float semantics -------------------------------------------------------------------------


def _go_div(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _go_mod(a: float, b: float) -> float:
    # Go's math.Mod: NaN for x = ±Inf, y = 0 or a NaN operand; x for y = ±Inf.
    if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan
    return math.fmod(a, b)


def _is_odd_int(x: float) -> bool:
    if abs(x) >= 1 << 53 or math.isinf(x) or math.isnan(x):
        return False
    return x == int(x) and int(x) % 2 == 1


def _go_pow(x: float, y: float) -> float:
    """Go's math.Pow: its special cases, then x**yf * x**yi by repeated squaring."""
    special = _go_pow_special(x, y)
    if special is not None:
        return special
    yf, yi = math.modf(abs(y))
    if yf != 0 and x < 0:
        return math.nan
    if yi >= 1 << 63:  # overflows or underflows for every x but -1 (1 was handled)
        if x == -1:
            return 1.0
        return 0.0 if (abs(x) < 1) == (y > 0) else math.inf
    a1, ae = 1.0, 0
    if yf != 0:
        if yf > 0.5:
            yf -= 1
            yi += 1
        a1 = math.exp(yf * math.log(x))  # libm here, Go's own Exp/Log there: may differ by 1ulp
    x1, xe = math.frexp(x)
    i = int(yi)
    while i != 0:
        if not -(1 << 12) <= xe <= 1 << 12:
            ae += xe  # catastrophic over/underflow: leave it to ldexp
            break
        if i & 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    if y < 0:
        a1 = 1 / a1
        ae = -ae
    try:
        return math.ldexp(a1, ae)
    except OverflowError:
        return math.copysign(math.inf, a1)


def _go_pow_special(x: float, y: float) -> float | None:
    if y == 0 or x == 1:
        return 1.0
    if y == 1:
        return x
    if math.isnan(x) or math.isnan(y):
        return math.nan
    if x == 0:
        odd_negative_zero = math.copysign(1.0, x) < 0 and _is_odd_int(y)
        if y < 0:
            return -math.inf if odd_negative_zero else math.inf
        return x if odd_negative_zero else 0.0
    if math.isinf(y):
        if x == -1:
            return 1.0
        return 0.0 if (abs(x) < 1) == (y > 0) else math.inf
    if math.isinf(x):
        if x < 0:
            return _go_pow(-0.0, -y)
        return 0.0 if y < 0 else math.inf
    if y == 0.5:
        return math.sqrt(x) if x >= 0 else math.nan
    if y == -0.5:
        return 1 / math.sqrt(x) if x >= 0 else math.nan
    return None


def _go_max(a: float, b: float) -> float:
    if (math.isinf(a) and a > 0) or (math.isinf(b) and b > 0):
        return math.inf
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == 0 and b == 0:
        return b if math.copysign(1.0, a) < 0 else a  # +0 wins over -0
    return a if a > b else b


def _go_min(a: float, b: float) -> float:
    if (math.isinf(a) and a < 0) or (math.isinf(b) and b < 0):
        return -math.inf
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == 0 and b == 0:
        return a if math.copysign(1.0, a) < 0 else b  # -0 wins over +0
    return a if a < b else b


# --- functions ----------------------------------------------------------------------------------


def _vector_arg(value: Value) -> Vector:
    # promql_parser type-checks function arguments: a vector parameter never gets a scalar.
    assert isinstance(value, list), "function argument should be an instant vector"
    return value


def _scalar_arg(value: Value) -> float:
    # promql_parser type-checks function arguments: a scalar parameter never gets a vector.
    assert not isinstance(value, list), "function argument should be a scalar"
    return value


def _instant_function(name: str, args: list[Value]) -> Vector:
    vector = _vector_arg(args[0])
    if name == "abs":
        return [Element(_drop_name(e.labels), abs(e.value)) for e in vector]
    if name == "clamp_min":
        floor = _scalar_arg(args[1])
        return [Element(_drop_name(e.labels), _go_max(floor, e.value)) for e in vector]
    if name == "clamp_max":
        ceiling = _scalar_arg(args[1])
        return [Element(_drop_name(e.labels), _go_min(ceiling, e.value)) for e in vector]
    if name == "clamp":
        lo, hi = _scalar_arg(args[1]), _scalar_arg(args[2])
        if hi < lo:
            return []
        return [Element(_drop_name(e.labels), _go_max(lo, _go_min(hi, e.value))) for e in vector]
    raise UnsupportedConstruct(f"function {name}")


# (times in ms, values, range start ms, range end ms, range ms) -> value, None for no sample.
RangeImpl = Callable[[Sequence[int], Sequence[float], int, int, int], float | None]


def _extrapolated_rate(is_counter: bool, is_rate: bool) -> RangeImpl:
    """rate/increase/delta: Prometheus 2.42's extrapolatedRate."""

    def compute(
        times: Sequence[int],
        values: Sequence[float],
        range_start: int,
        range_end: int,
        range_ms: int,
    ) -> float | None:
        count = len(values)
        if count < 2:
            return None
        first_t, first_v = times[0], values[0]
        last_t, last_v = times[-1], values[-1]
        result = last_v - first_v
        if is_counter:
            previous = first_v
            for value in values[1:]:
                if value < previous:  # a counter reset: the counter restarted from zero
                    result += previous
                previous = value
        duration_to_start = (first_t - range_start) / 1000
        duration_to_end = (range_end - last_t) / 1000
        sampled = (last_t - first_t) / 1000
        # The store keeps one sample per millisecond (as Prometheus' TSDB), so `sampled` is
        # positive here; Go's float division keeps any other input from raising.
        average_step = _go_div(sampled, count - 1)
        if is_counter and result > 0 and first_v >= 0:
            # Do not extrapolate the counter below zero.
            duration_to_zero = sampled * (first_v / result)
            if duration_to_zero < duration_to_start:
                duration_to_start = duration_to_zero
        # Extrapolate to a range boundary only when it is within 1.1 average steps of the data;
        # otherwise extend by half a step.
        threshold = average_step * 1.1
        interval = sampled
        interval += duration_to_start if duration_to_start < threshold else average_step / 2
        interval += duration_to_end if duration_to_end < threshold else average_step / 2
        factor = _go_div(interval, sampled)
        if is_rate:
            factor = _go_div(factor, _duration_seconds(range_ms))
        return result * factor

    return compute


def _duration_seconds(ms: int) -> float:
    # Go's Duration.Seconds(): whole seconds plus the nanosecond remainder / 1e9.
    return float(ms // 1000) + float((ms % 1000) * 1_000_000) / 1e9


# The loops below inline Prometheus' kahanSumInc (Kahan-Neumaier summation):
#     t = total + inc
#     c += (total - t) + inc  if |total| >= |inc|  else  (inc - t) + total
#     total = t
# a call per sample was most of their cost. Keep the operations in this order.


def _avg_over_time(times: Sequence[int], values: Sequence[float], *_bounds: int) -> float:
    isinf = math.isinf  # a local: this loop runs once per sample
    mean = c = 0.0
    count = 0.0  # a float counts exactly (< 2**53) and divides as the int did
    for value in values:
        count += 1.0
        if isinf(mean):
            # Inf plus a finite value, or the same Inf again, stays; "Inf - Inf" would give NaN.
            if isinf(value) and (mean > 0) == (value > 0):
                continue
            if not isinf(value) and value == value:
                continue
        inc = value / count - mean / count
        t = mean + inc
        if abs(mean) >= abs(inc):
            c += (mean - t) + inc
        else:
            c += (inc - t) + mean
        mean = t
    return mean if math.isinf(mean) else mean + c


def _sum_over_time(times: Sequence[int], values: Sequence[float], *_bounds: int) -> float:
    total = c = 0.0
    for value in values:
        t = total + value
        if abs(total) >= abs(value):
            c += (total - t) + value
        else:
            c += (value - t) + total
        total = t
    return total if math.isinf(total) else total + c


def _max_over_time(times: Sequence[int], values: Sequence[float], *_bounds: int) -> float:
    best = values[0]
    for value in values:
        if value > best or math.isnan(best):
            best = value
    return best


def _min_over_time(times: Sequence[int], values: Sequence[float], *_bounds: int) -> float:
    best = values[0]
    for value in values:
        if value < best or math.isnan(best):
            best = value
    return best


_RANGE_IMPLS: dict[str, RangeImpl] = {
    "rate": _extrapolated_rate(is_counter=True, is_rate=True),
    "increase": _extrapolated_rate(is_counter=True, is_rate=False),
    "delta": _extrapolated_rate(is_counter=False, is_rate=False),
    "avg_over_time": _avg_over_time,
    "sum_over_time": _sum_over_time,
    "min_over_time": _min_over_time,
    "max_over_time": _max_over_time,
    "count_over_time": lambda times, values, *_: float(len(values)),
    "last_over_time": lambda times, values, *_: values[-1],
}
