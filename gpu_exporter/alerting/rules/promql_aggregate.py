"""PromQL's aggregation operators over float samples, as Prometheus 2.42's
`evaluator.aggregation` (promql/engine.go at v2.42.0) or 3.x's (`aggregation`,
`aggregationK` at v3.14.0) compute them: the same accumulation order, and for topk/bottomk
the same heap operations, so ties pick the same series.

3.x differs: `sum` and `avg` are Kahan-compensated (`avg` a sum divided by the count until
the sum would overflow), a stddev/stdvar group starting at NaN or ±Inf is NaN, topk/bottomk
never let a NaN displace a NaN and return nothing for k < 1 whatever k is, and label names
may be any UTF-8 text."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpu_exporter.alerting.rules.gofloat import format_float, format_g
from gpu_exporter.alerting.rules.promql_functions import kahan_inc, quantile
from gpu_exporter.alerting.rules.promql_values import (
    NAME,
    Element,
    PromQLError,
    Semantics,
    Vector,
    is_label_name,
    with_label,
)
from gpu_exporter.alerting.store import CHECK_EVERY, Labels

__all__ = ["AGGREGATIONS", "PARAMETER_AGGREGATIONS", "aggregate"]

AGGREGATIONS = frozenset(
    {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk",
     "quantile", "count_values"}
)  # fmt: skip
PARAMETER_AGGREGATIONS = frozenset({"topk", "bottomk", "quantile", "count_values"})
_MASK = CHECK_EVERY - 1
_INT64 = 2.0**63


@dataclass(frozen=True, slots=True)
class Grouping:
    without: bool
    labels: frozenset[str]


def aggregate(
    op: str,
    grouping: Grouping,
    param: float | str | None,
    vector: Vector,
    check: Callable[[], None],
    semantics: Semantics,
) -> Vector:
    """`op` over `vector`, groups in order of first appearance."""
    later = semantics.major >= 3
    if op in ("topk", "bottomk"):
        assert isinstance(param, float)
        k = _k(param, later)
        if k < 1:
            return []
        top = _top_3 if later else _top
        return top(vector, grouping, min(k, len(vector)), op == "topk", check)
    if op == "count_values":
        assert isinstance(param, str)
        if not is_label_name(param, semantics):
            raise PromQLError(f"invalid label name {_go_quote(param)}")
        vector = [
            Element(with_label(e.labels, param, format_float(e.value)), e.value) for e in vector
        ]
        if not grouping.without:
            grouping = Grouping(False, grouping.labels | {param})
        op = "count"
    groups: dict[Labels, list] = {}
    for i, element in enumerate(vector):
        if not i & _MASK:
            check()
        key = group_labels(element.labels, grouping)
        group = groups.get(key)
        value = element.value
        if group is None:
            # [value, mean or Kahan compensation, count, values]; stddev and stdvar start
            # their sum of squares at 0 (3.x: at NaN for a NaN or infinite first value).
            first = 1.0 if op == "group" else value
            if op in ("stddev", "stdvar"):
                first = math.nan if later and (math.isnan(value) or math.isinf(value)) else 0.0
            second = 0.0 if later and op in ("sum", "avg") else value
            groups[key] = [first, second, 1, [value] if op == "quantile" else None]
            continue
        if later and op in ("sum", "avg"):
            _accumulate_3(op, group, value)
        else:
            _accumulate(op, group, value)
    out: Vector = []
    for labels, (value, mean, count, values) in groups.items():
        if later and op == "sum":
            value = value if math.isinf(value) else value + mean  # mean holds the compensation
        elif later and op == "avg":
            value = _kahan_avg_result(value, mean, count, values)
        elif op == "avg":
            value = mean
        elif op == "count":
            value = float(count)
        elif op == "stdvar":
            value = value / count
        elif op == "stddev":
            value = math.sqrt(value / count) if value >= 0 else math.nan
        elif op == "quantile":
            assert isinstance(param, float)
            value = quantile(param, values)
        out.append(Element(labels, value))
    return out


def _accumulate(op: str, group: list, value: float) -> None:
    if op == "sum":
        group[0] += value
    elif op == "avg":
        group[2] += 1
        group[1] = mean_step(group[1], value, group[2])
    elif op == "max":
        if group[0] < value or math.isnan(group[0]):
            group[0] = value
    elif op == "min":
        if group[0] > value or math.isnan(group[0]):
            group[0] = value
    elif op == "count":
        group[2] += 1
    elif op in ("stddev", "stdvar"):
        group[2] += 1
        delta = value - group[1]
        group[1] += delta / group[2]
        group[0] += delta * (value - group[1])
    elif op == "quantile":
        group[3].append(value)
    # group: nothing to add


def _accumulate_3(op: str, group: list, value: float) -> None:
    """3.x's Kahan sum, and its avg: a Kahan sum while finite, then an incremental mean
    (group[3] holds the mean once the sum would overflow)."""
    group[2] += 1
    if op == "sum" or group[3] is None:
        total, c = kahan_inc(value, group[0], group[1])
        if op == "sum" or not math.isinf(total):
            group[0], group[1] = total, c
            return
        count = group[2]
        group[3] = [group[0] / (count - 1)]  # from here on an incremental mean
        group[1] /= count - 1
    count = group[2]
    q = (count - 1) / count
    group[3][0], group[1] = kahan_inc(value / count, q * group[3][0], q * group[1])


def _kahan_avg_result(total: float, c: float, count: int, incremental: list | None) -> float:
    if incremental is not None:
        return incremental[0] + c
    return total / count + c / count


def _k(param: float, later: bool) -> int:
    """topk/bottomk's k: 2.42 refuses what int64 cannot hold (NaN too); 3.x gives nothing for
    k < 1 first, then refuses NaN and what int64 cannot hold."""
    if later:
        if param < 1:
            return 0
        if math.isnan(param):
            raise PromQLError("Parameter value is NaN")
        if param >= _INT64:
            raise PromQLError(f"Scalar value {format_g(param)} overflows int64")
        return int(param)
    if not -_INT64 <= param <= _INT64:  # convertibleToInt64 (compared as floats)
        raise PromQLError(f"Scalar value {format_g(param)} overflows int64")
    return int(param)


def group_labels(labels: Labels, grouping: Grouping) -> Labels:
    if grouping.without:
        return tuple(p for p in labels if p[0] not in grouping.labels and p[0] != NAME)
    return tuple(p for p in labels if p[0] in grouping.labels)


def mean_step(mean: float, value: float, count: int) -> float:
    """One step of Prometheus' incremental mean (avg and avg_over_time)."""
    if math.isinf(mean):
        # Inf plus a finite value, or the same Inf again, stays; "Inf - Inf" would give NaN.
        if math.isinf(value) and (mean > 0) == (value > 0):
            return mean
        if not math.isinf(value) and not math.isnan(value):
            return mean
    return mean + (value / count - mean / count)


# --- topk / bottomk: Go's container/heap over vectorByValueHeap ---------------------------------


def _top(
    vector: Vector, grouping: Grouping, k: int, largest: bool, check: Callable[[], None]
) -> Vector:
    # topk keeps a min-heap of the k largest (its Less: NaN first, then <); bottomk a
    # max-heap of the k smallest (NaN first, then >). A new element enters when the heap has
    # room, beats the root, or the root is NaN.
    less = _less(largest)
    heaps: dict[Labels, list[Element]] = {}
    for i, element in enumerate(vector):
        if not i & _MASK:
            check()
        key = group_labels(element.labels, grouping)
        heap = heaps.get(key)
        if heap is None:
            heaps[key] = [element]
            continue
        root = heap[0].value
        if len(heap) < k or less(root, element.value) or math.isnan(root):
            if len(heap) == k:
                if k == 1:  # replaced in place, as Prometheus does for k == 1
                    heap[0] = element
                    continue
                _pop(heap, less)
            _push(heap, element, less)
    return _in_result_order(heaps.values(), largest)


def _top_3(
    vector: Vector, grouping: Grouping, k: int, largest: bool, check: Callable[[], None]
) -> Vector:
    # 3.x's aggregationK: push while the heap has room; else a new element replaces the root
    # when it beats it, or when the root is NaN and it is not, and the heap is fixed.
    less = _less(largest)
    heaps: dict[Labels, list[Element]] = {}
    for i, element in enumerate(vector):
        if not i & _MASK:
            check()
        heap = heaps.setdefault(group_labels(element.labels, grouping), [])
        if len(heap) < k:
            _push(heap, element, less)
            continue
        root = heap[0].value
        beats = root < element.value if largest else root > element.value
        if beats or (math.isnan(root) and not math.isnan(element.value)):
            heap[0] = element
            if k > 1:
                _fix_root(heap, less)
    return _in_result_order(heaps.values(), largest)


def _in_result_order(heaps: Iterable[list[Element]], largest: bool) -> Vector:
    """Each group's heap sorted in reverse (largest first for topk), NaN last, as Prometheus
    returns them; only `rules test` output shows the order."""
    out: Vector = []
    for heap in heaps:
        numbers = [e for e in heap if not math.isnan(e.value)]
        out.extend(sorted(numbers, key=lambda e: e.value, reverse=largest))
        out.extend(e for e in heap if math.isnan(e.value))
    return out


def _less(largest: bool) -> Callable[[float, float], bool]:
    """vectorByValueHeap's Less (topk), vectorByReverseValueHeap's (bottomk): NaN first."""

    def less(a: float, b: float) -> bool:
        if math.isnan(a):
            return True
        return a < b if largest else a > b

    return less


def _push(heap: list[Element], element: Element, less: Callable[[float, float], bool]) -> None:
    heap.append(element)
    _up(heap, len(heap) - 1, less)


def _up(heap: list[Element], j: int, less: Callable[[float, float], bool]) -> None:
    while j > 0:  # container/heap's up
        parent = (j - 1) // 2
        if not less(heap[j].value, heap[parent].value):
            break
        heap[parent], heap[j] = heap[j], heap[parent]
        j = parent


def _down(heap: list[Element], i0: int, n: int, less: Callable[[float, float], bool]) -> bool:
    i = i0
    while True:  # container/heap's down over the first n
        child = 2 * i + 1
        if child >= n:
            break
        right = child + 1
        if right < n and less(heap[right].value, heap[child].value):
            child = right
        if not less(heap[child].value, heap[i].value):
            break
        heap[i], heap[child] = heap[child], heap[i]
        i = child
    return i > i0


def _pop(heap: list[Element], less: Callable[[float, float], bool]) -> None:
    n = len(heap) - 1
    heap[0], heap[n] = heap[n], heap[0]
    _down(heap, 0, n, less)
    heap.pop()


def _fix_root(heap: list[Element], less: Callable[[float, float], bool]) -> None:
    if not _down(heap, 0, len(heap), less):  # container/heap's Fix
        _up(heap, 0, less)


def _go_quote(value: str) -> str:
    # %q of a label name that is not one: letters, digits and ASCII punctuation suffice here.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
