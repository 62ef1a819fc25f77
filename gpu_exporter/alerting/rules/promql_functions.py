"""PromQL's functions over float samples, as Prometheus 2.42 computes them (promql/functions.go
and promql/quantile.go at v2.42.0), step for step where the floating-point result depends on
the order of operations.

Range functions take one series' samples in the selected window; instant functions one
vector. The evaluator (`promql.py`) selects, drops metric names where Prometheus drops them
and checks the result for duplicate label sets.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence

from gpu_exporter.alerting.rules import gomath
from gpu_exporter.alerting.rules.gofloat import go_div, go_max, go_min, parse_float
from gpu_exporter.alerting.rules.promql_values import (
    NAME,
    Element,
    PromQLError,
    Semantics,
    Vector,
    drop_name,
    is_label_name,
    label_value,
    with_label,
)
from gpu_exporter.alerting.store import Labels
from gpu_exporter.support import regex

__all__ = [
    "DATE_FUNCTIONS",
    "MATH_FUNCTIONS",
    "RangeImpl",
    "clamp",
    "date_parts",
    "histogram_fraction",
    "histogram_quantile",
    "label_join",
    "label_replace",
    "quantile",
    "range_impls",
    "round_to",
    "sort_vector",
]


# --- range functions ----------------------------------------------------------------------------

# (times in ms, values, range start ms, range end ms, range ms, evaluation time ms, the
# function's scalar arguments) -> value, None for no output sample.
RangeImpl = Callable[
    [Sequence[int], Sequence[float], int, int, int, int, Sequence[float]], float | None
]


def _extrapolated_rate(is_counter: bool, is_rate: bool, major: int = 2) -> RangeImpl:
    """rate/increase/delta: Prometheus' extrapolatedRate. 2.42 limits the extrapolation to
    the counter's zero point before deciding between the gap and half a step; 3.x (since
    2.51) decides first, then limits."""

    def compute(
        times: Sequence[int],
        values: Sequence[float],
        range_start: int,
        range_end: int,
        range_ms: int,
        *_: object,
    ) -> float | None:
        count = len(values)
        if count < 2:
            return None
        first_t, first_v = times[0], values[0]
        last_t, last_v = times[-1], values[-1]
        result = last_v - first_v
        # Most windows hold no counter reset: found at C speed, and then the loop that adds
        # each reset's value (in Prometheus' order) would add nothing.
        if is_counter and any(map(operator.lt, values[1:], values)):
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
        average_step = go_div(sampled, count - 1)
        # Extrapolate to a range boundary only when it is within 1.1 average steps of the data;
        # otherwise extend by half a step. Never extrapolate a counter below zero.
        threshold = average_step * 1.1
        if major >= 3 and duration_to_start >= threshold:
            duration_to_start = average_step / 2
        if is_counter and result > 0 and first_v >= 0:
            duration_to_zero = sampled * (first_v / result)
            if duration_to_zero < duration_to_start:
                duration_to_start = duration_to_zero
        interval = sampled
        if major >= 3 or duration_to_start < threshold:
            interval += duration_to_start
        else:
            interval += average_step / 2
        interval += duration_to_end if duration_to_end < threshold else average_step / 2
        factor = go_div(interval, sampled)
        if is_rate:
            factor = go_div(factor, _duration_seconds(range_ms))
        return result * factor

    return compute


def _duration_seconds(ms: int) -> float:
    # Go's Duration.Seconds(): whole seconds plus the nanosecond remainder / 1e9.
    return float(ms // 1000) + float((ms % 1000) * 1_000_000) / 1e9


def _instant_value(is_rate: bool) -> RangeImpl:
    """irate/idelta: the last two samples (instantValue)."""

    def compute(times: Sequence[int], values: Sequence[float], *_: object) -> float | None:
        if len(values) < 2:
            return None
        last, previous = values[-1], values[-2]
        result = last if is_rate and last < previous else last - previous
        interval = times[-1] - times[-2]
        if interval == 0:
            return None
        return result / (interval / 1000) if is_rate else result

    return compute


# The loops below inline Prometheus' kahanSumInc (Kahan-Neumaier summation):
#     t = total + inc
#     c += (total - t) + inc  if |total| >= |inc|  else  (inc - t) + total
#     total = t
# a call per sample was most of their cost. Keep the operations in this order.


def _avg_over_time(times: Sequence[int], values: Sequence[float], *_: object) -> float:
    first = values[0]
    if _constant_average(first, values):
        return first
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


def _constant_average(first: float, values: Sequence[float]) -> bool:
    """Whether the incremental mean below of `values` is `first` itself, found without the
    loop: every value is `first`, finite and not -0. (Then the first step gives mean `first`
    and compensation 0, and every later step adds `first/n - first/n`, exactly 0, to both.)
    Flags, verdicts and success ratios are mostly constant over a window."""
    return (
        math.isfinite(first)
        and not (first == 0 and math.copysign(1.0, first) < 0)
        and values.count(first) == len(values)
    )


def _avg_over_time_3(times: Sequence[int], values: Sequence[float], *_: object) -> float:
    """3.x's avg_over_time (3.5+): a Kahan sum divided by the count while the sum stays
    finite; from the sample that would overflow it on, an incremental mean."""
    return kahan_mean(values)


def kahan_mean(values: Sequence[float]) -> float:
    """The mean as Prometheus 3.x computes avg and avg_over_time."""
    total, c = values[0], 0.0
    mean = 0.0
    incremental = False
    count = 1.0
    for value in values[1:]:
        count += 1.0
        if not incremental:
            new_total, new_c = kahan_inc(value, total, c)
            if not math.isinf(new_total):
                total, c = new_total, new_c
                continue
            incremental = True  # the sum would overflow: continue as an incremental mean
            mean = total / (count - 1)
            c /= count - 1
        q = (count - 1) / count
        mean, c = kahan_inc(value / count, q * mean, q * c)
    if incremental:
        return mean + c
    return total / count + c / count


def _sum_over_time(times: Sequence[int], values: Sequence[float], *_: object) -> float:
    total = c = 0.0
    for value in values:
        t = total + value
        if abs(total) >= abs(value):
            c += (total - t) + value
        else:
            c += (value - t) + total
        total = t
    return total if math.isinf(total) else total + c


def _max_over_time(times: Sequence[int], values: Sequence[float], *_: object) -> float:
    if not any(map(math.isnan, values)):
        return max(values)  # the first largest, as the loop below: the same with no NaN
    best = values[0]
    for value in values:
        if value > best or math.isnan(best):
            best = value
    return best


def _min_over_time(times: Sequence[int], values: Sequence[float], *_: object) -> float:
    if not any(map(math.isnan, values)):
        return min(values)  # the first smallest, as the loop below: the same with no NaN
    best = values[0]
    for value in values:
        if value < best or math.isnan(best):
            best = value
    return best


def _kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    """2.42's kahanSumInc (Neumaier)."""
    t = total + inc
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    """3.x's kahansum.Inc: as 2.42's, but the compensation restarts at 0 on an infinite sum."""
    t = total + inc
    if math.isinf(t):
        return t, 0.0
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def _variance(values: Sequence[float]) -> float:
    """stdvar_over_time: Welford's update with Kahan-compensated mean and sum of squares."""
    count = mean = c_mean = aux = c_aux = 0.0
    for value in values:
        count += 1
        delta = value - (mean + c_mean)
        mean, c_mean = _kahan_inc(delta / count, mean, c_mean)
        aux, c_aux = _kahan_inc(delta * (value - (mean + c_mean)), aux, c_aux)
    return (aux + c_aux) / count


def _stddev_over_time(times: Sequence[int], values: Sequence[float], *_: object) -> float:
    variance = _variance(values)
    return math.sqrt(variance) if variance >= 0 or math.isnan(variance) else math.nan


def _stdvar_over_time(times: Sequence[int], values: Sequence[float], *_: object) -> float:
    return _variance(values)


def _changes(times: Sequence[int], values: Sequence[float], *_: object) -> float:
    if not any(map(math.isnan, values)):
        return float(sum(map(operator.ne, values[1:], values)))
    changes = 0
    previous = values[0]
    for value in values[1:]:
        if value != previous and not (math.isnan(value) and math.isnan(previous)):
            changes += 1
        previous = value
    return float(changes)


def _resets(times: Sequence[int], values: Sequence[float], *_: object) -> float:
    return float(sum(map(operator.lt, values[1:], values)))  # NaN compares false, as in Go


def _linear_regression(
    times: Sequence[int], values: Sequence[float], intercept_ms: int
) -> tuple[float, float]:
    """(slope, intercept at intercept_ms): linearRegression's Kahan-summed least squares
    (kahanSumInc inlined for each of the four sums, in Go's order)."""
    n = sum_x = c_x = sum_y = c_y = sum_xy = c_xy = sum_x2 = c_x2 = 0.0
    first = values[0]
    constant = True
    for t, value in zip(times, values, strict=True):
        if constant and value != first:
            constant = False
        n += 1.0
        x = (t - intercept_ms) / 1e3
        s = sum_x + x
        c_x += (sum_x - s) + x if abs(sum_x) >= abs(x) else (x - s) + sum_x
        sum_x = s
        s = sum_y + value
        c_y += (sum_y - s) + value if abs(sum_y) >= abs(value) else (value - s) + sum_y
        sum_y = s
        xy = x * value
        s = sum_xy + xy
        c_xy += (sum_xy - s) + xy if abs(sum_xy) >= abs(xy) else (xy - s) + sum_xy
        sum_xy = s
        x2 = x * x
        s = sum_x2 + x2
        c_x2 += (sum_x2 - s) + x2 if abs(sum_x2) >= abs(x2) else (x2 - s) + sum_x2
        sum_x2 = s
    if constant:
        if math.isinf(first):
            return math.nan, math.nan
        return 0.0, first
    sum_x += c_x
    sum_y += c_y
    sum_xy += c_xy
    sum_x2 += c_x2
    cov_xy = sum_xy - sum_x * sum_y / n
    var_x = sum_x2 - sum_x * sum_x / n
    slope = go_div(cov_xy, var_x)
    intercept = sum_y / n - slope * sum_x / n
    return slope, intercept


def _deriv(times: Sequence[int], values: Sequence[float], *_: object) -> float | None:
    if len(values) < 2:
        return None
    # Regressing around the first sample's time keeps the sums small (Prometheus #2674).
    return _linear_regression(times, values, times[0])[0]


def _predict_linear(
    times: Sequence[int],
    values: Sequence[float],
    lo: int,
    hi: int,
    range_ms: int,
    t_ms: int,
    params: Sequence[float],
) -> float | None:
    if len(values) < 2:
        return None
    slope, intercept = _linear_regression(times, values, t_ms)
    return slope * params[0] + intercept


def _holt_winters(
    times: Sequence[int],
    values: Sequence[float],
    lo: int,
    hi: int,
    range_ms: int,
    t_ms: int,
    params: Sequence[float],
) -> float | None:
    """holt_winters (double exponential smoothing), as funcHoltWinters computes it."""
    sf, tf = params
    if not 0 < sf < 1:
        raise PromQLError(f"invalid smoothing factor. Expected: 0 < sf < 1, got: {sf:f}")
    if not 0 < tf < 1:
        raise PromQLError(f"invalid trend factor. Expected: 0 < tf < 1, got: {tf:f}")
    if len(values) < 2:
        return None
    s0, s1 = 0.0, values[0]
    trend = values[1] - values[0]
    for i in range(1, len(values)):
        x = sf * values[i]
        if i > 1:  # calcTrendValue returns the initial trend for the first step
            trend = tf * (s1 - s0) + (1 - tf) * trend
        y = (1 - sf) * (s1 + trend)
        s0, s1 = s1, x + y
    return s1


def _quantile_over_time(
    times: Sequence[int],
    values: Sequence[float],
    lo: int,
    hi: int,
    range_ms: int,
    t_ms: int,
    params: Sequence[float],
) -> float:
    return quantile(params[0], list(values))


_RANGE_IMPLS_2: dict[str, RangeImpl] = {
    "rate": _extrapolated_rate(is_counter=True, is_rate=True),
    "increase": _extrapolated_rate(is_counter=True, is_rate=False),
    "delta": _extrapolated_rate(is_counter=False, is_rate=False),
    "irate": _instant_value(is_rate=True),
    "idelta": _instant_value(is_rate=False),
    "avg_over_time": _avg_over_time,
    "sum_over_time": _sum_over_time,
    "min_over_time": _min_over_time,
    "max_over_time": _max_over_time,
    "count_over_time": lambda times, values, *_: float(len(values)),
    "last_over_time": lambda times, values, *_: values[-1],
    "present_over_time": lambda times, values, *_: 1.0,
    "stddev_over_time": _stddev_over_time,
    "stdvar_over_time": _stdvar_over_time,
    "quantile_over_time": _quantile_over_time,
    "changes": _changes,
    "resets": _resets,
    "deriv": _deriv,
    "predict_linear": _predict_linear,
    "holt_winters": _holt_winters,
}
_RANGE_IMPLS_3: dict[str, RangeImpl] = {
    **{name: impl for name, impl in _RANGE_IMPLS_2.items() if name != "holt_winters"},
    "rate": _extrapolated_rate(is_counter=True, is_rate=True, major=3),
    "increase": _extrapolated_rate(is_counter=True, is_rate=False, major=3),
    "avg_over_time": _avg_over_time_3,
    "first_over_time": lambda times, values, *_: values[0],  # stable since 3.9 or so
}


def range_impls(semantics: Semantics) -> dict[str, RangeImpl]:
    """The range functions as `semantics`' Prometheus computes them."""
    return _RANGE_IMPLS_3 if semantics.major >= 3 else _RANGE_IMPLS_2


# --- element-wise functions ---------------------------------------------------------------------


def _floor(x: float) -> float:
    # math.Floor: ±0, ±Inf and NaN are their own floor (Python's floor raises or loses -0).
    return x if x == 0 or math.isinf(x) or math.isnan(x) else float(math.floor(x))


def _ceil(x: float) -> float:
    return -_floor(-x)  # math.Ceil, -0 for (-1, 0) included


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _domain(function: Callable[[float], float], overflow: float = math.nan) -> Callable[..., float]:
    """A libm function with Go's answers where Python raises: NaN outside the domain (or
    `overflow`'s sign of infinity where the result overflows)."""

    def compute(x: float) -> float:
        try:
            return function(x)
        except ValueError:
            return math.nan
        except OverflowError:
            return math.copysign(overflow, x) if overflow == math.inf else overflow

    return compute


def _atanh(x: float) -> float:
    if x in (1.0, -1.0):
        return math.copysign(math.inf, x)
    return _domain(math.atanh)(x)


def _sgn(x: float) -> float:
    if x < 0:
        return -1.0
    if x > 0:
        return 1.0
    return x  # ±0 and NaN


def _cosh(x: float) -> float:
    try:
        return math.cosh(x)
    except OverflowError:
        return math.inf


MATH_FUNCTIONS: dict[str, Callable[[float], float]] = {
    "abs": abs,
    "ceil": _ceil,
    "floor": _floor,
    "exp": _exp,
    "sqrt": lambda x: math.nan if x < 0 else math.sqrt(x),
    "ln": gomath.log,
    "log2": gomath.log2,
    "log10": gomath.log10,
    "sin": gomath.sin,
    "cos": gomath.cos,
    "tan": gomath.tan,
    "asin": gomath.asin,
    "acos": gomath.acos,
    "atan": gomath.atan,
    "sinh": _domain(math.sinh, overflow=math.inf),
    "cosh": _cosh,
    "tanh": math.tanh,
    "asinh": math.asinh,
    "acosh": _domain(math.acosh),
    "atanh": _atanh,
    "rad": lambda x: x * math.pi / 180,
    "deg": lambda x: x * 180 / math.pi,
    "sgn": _sgn,
}


def round_to(x: float, to_nearest: float) -> float:
    """round(): ties up, to a multiple of `to_nearest` through its inverse (as funcRound)."""
    inverse = go_div(1.0, to_nearest)
    return go_div(_floor(x * inverse + 0.5), inverse)


def clamp(x: float, lo: float, hi: float) -> float:
    return go_max(lo, go_min(hi, x))


# --- dates: Go's time.Unix(int64(v), 0).UTC() ---------------------------------------------------


def date_parts(seconds: float) -> dict[str, float] | None:
    """The date functions' values for unix time `seconds` (truncated to whole seconds, as
    int64() does), or None where Go's conversion of the float is undefined (NaN, ±Inf or
    beyond int64)."""
    if math.isnan(seconds) or math.isinf(seconds) or abs(seconds) >= 2.0**63:
        return None
    whole = int(seconds)  # towards zero, as Go's int64(v)
    days, second_of_day = divmod(whole, 86_400)
    year, month, day = _civil_from_days(days)
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    month_days = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
    return {
        "year": float(year),
        "month": float(month),
        "day_of_month": float(day),
        "day_of_year": float(sum(month_days[: month - 1]) + day),
        "day_of_week": float((days + 4) % 7),  # 1970-01-01 was a Thursday
        "days_in_month": float(month_days[month - 1]),
        "hour": float(second_of_day // 3600),
        "minute": float(second_of_day % 3600 // 60),
    }


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """Proleptic Gregorian (year, month, day) of a day count from 1970-01-01 (H. Hinnant's
    civil_from_days), exact for any integer, where datetime stops at year 9999."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


DATE_FUNCTIONS = frozenset(
    {"year", "month", "day_of_month", "day_of_year", "day_of_week", "days_in_month", "hour",
     "minute"}
)  # fmt: skip


# --- quantiles ----------------------------------------------------------------------------------


def quantile(q: float, values: list[float]) -> float:
    """The q-quantile of `values`, interpolating between neighbours (quantile.go quantile);
    NaN values sort first, as vectorByValueHeap's Less puts them."""
    if not values or math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(values, key=_nan_first)
    n = float(len(ordered))
    rank = q * (n - 1)
    lower = max(0.0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[int(lower)] * (1 - weight) + ordered[int(upper)] * weight


def _nan_first(value: float) -> tuple[int, float]:
    return (0, 0.0) if math.isnan(value) else (1, value)


def _bucket_groups(vector: Vector) -> list[tuple[Labels, list[tuple[float, float]]]]:
    """Classic buckets per histogram: one group per series ignoring `le` (metric name
    included), labelled without `__name__` and `le`; a bucket without a number in `le` is
    skipped, as Prometheus skips it."""
    groups: dict[Labels, tuple[Labels, list[tuple[float, float]]]] = {}
    for element in vector:
        bound = parse_float(label_value(element.labels, "le"))
        if bound is None:
            continue
        key = tuple(pair for pair in element.labels if pair[0] != "le")
        group = groups.get(key)
        if group is None:
            labels = tuple(pair for pair in key if pair[0] != NAME)
            group = groups[key] = (labels, [])
        group[1].append((bound, element.value))
    return list(groups.values())


def histogram_quantile(q: float, vector: Vector, semantics: Semantics) -> Vector:
    """histogram_quantile over classic `le` buckets."""
    return [
        Element(labels, _bucket_quantile(q, buckets, semantics.major))
        for labels, buckets in _bucket_groups(vector)
    ]


def histogram_fraction(lower: float, upper: float, vector: Vector) -> Vector:
    """3.x's histogram_fraction over classic buckets (quantile.go BucketFraction, 3.4+)."""
    return [
        Element(labels, _bucket_fraction(lower, upper, buckets))
        for labels, buckets in _bucket_groups(vector)
    ]


def _bucket_fraction(lower: float, upper: float, buckets: list[tuple[float, float]]) -> float:
    buckets.sort(key=lambda bucket: bucket[0])
    if not (math.isinf(buckets[-1][0]) and buckets[-1][0] > 0):
        return math.nan
    merged = _coalesce(buckets)
    count = merged[-1][1]
    if count == 0 or math.isnan(lower) or math.isnan(upper):
        return math.nan
    if lower >= upper:
        return 0.0
    rank = lower_rank = upper_rank = 0.0
    lower_set = upper_set = False
    # Positive buckets only when the first bound is above 0: the first starts at 0.
    lower_bound = 0.0 if merged[0][0] > 0 else -math.inf
    for i, (upper_bound, bucket_count) in enumerate(merged):
        if i > 0:
            lower_bound = merged[i - 1][0]

        if not lower_set and lower_bound >= lower:
            lower_rank, lower_set = rank, True
        if not upper_set and lower_bound >= upper:
            upper_rank, upper_set = rank, True
        if lower_set and upper_set:
            break
        bucket = (lower_bound, upper_bound, rank, bucket_count)
        if not lower_set and lower_bound < lower < upper_bound:
            lower_rank, lower_set = _interpolate(lower, *bucket), True
        if not upper_set and lower_bound < upper < upper_bound:
            upper_rank, upper_set = _interpolate(upper, *bucket), True
        if lower_set and upper_set:
            break
        rank = bucket_count
    if not lower_set or lower_rank > count:
        lower_rank = count
    if not upper_set or upper_rank > count:
        upper_rank = count
    return (upper_rank - lower_rank) / count


def _interpolate(v: float, lower: float, upper: float, rank: float, count: float) -> float:
    """The cumulative count at v inside the bucket (lower, upper]; none is interpolated in a
    bucket reaching to -Inf (+Inf adds nothing: the second term is 0)."""
    if lower == -math.inf:
        return count
    return rank + (count - rank) * (v - lower) / (upper - lower)


def _bucket_quantile(q: float, buckets: list[tuple[float, float]], major: int) -> float:
    """quantile.go bucketQuantile (BucketQuantile in 3.x)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets.sort(key=lambda bucket: bucket[0])
    if not (math.isinf(buckets[-1][0]) and buckets[-1][0] > 0):
        return math.nan
    merged = _coalesce(buckets)
    if major >= 3:
        _ensure_monotonic_ignoring_small_deltas(merged)
    else:
        _ensure_monotonic(merged)
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = _go_search(len(merged) - 1, lambda i: merged[i][1] >= rank)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * go_div(rank, count)


def _coalesce(buckets: list[tuple[float, float]]) -> list[list[float]]:
    """Buckets of the same bound (e.g. le="1" and le="1.0") added up."""
    merged: list[list[float]] = [[buckets[0][0], buckets[0][1]]]
    for bound, count in buckets[1:]:
        if bound == merged[-1][0]:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    return merged


def _ensure_monotonic(buckets: list[list[float]]) -> None:
    """Counts never decrease with the bound (ensureMonotonic): scrapes of buckets at slightly
    different times can make them."""
    highest = buckets[0][1]
    for bucket in buckets[1:]:
        if bucket[1] > highest:
            highest = bucket[1]
        elif bucket[1] < highest:
            bucket[1] = highest


def _ensure_monotonic_ignoring_small_deltas(buckets: list[list[float]]) -> None:
    """3.x (2.49+): counts within a relative 1e-12 of the previous one are made equal to it
    in either direction (float noise), smaller ones raised to it."""
    previous = buckets[0][1]
    for bucket in buckets[1:]:
        current = bucket[1]
        if current == previous:
            continue
        if almost_equal(previous, current, 1e-12) or current < previous:
            bucket[1] = previous
            continue
        previous = current


_MIN_NORMAL = 2.2250738585072014e-308


def almost_equal(a: float, b: float, epsilon: float) -> bool:
    """Prometheus' util/almost.Equal (3.x): NaN equals NaN; relative to the magnitudes, or
    absolute (epsilon x the smallest normal) next to zero."""
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < _MIN_NORMAL:
        return diff < epsilon * _MIN_NORMAL
    return diff / min(abs_sum, 1.7976931348623157e308) < epsilon


def _go_search(n: int, predicate: Callable[[int], bool]) -> int:
    """sort.Search: the binary search itself, so a predicate NaN makes non-monotonic
    answers as Go answers."""
    i, j = 0, n
    while i < j:
        h = (i + j) >> 1
        if not predicate(h):
            i = h + 1
        else:
            j = h
    return i


# --- labels -------------------------------------------------------------------------------------


def label_replace(
    vector: Vector, dst: str, replacement: str, src: str, pattern: str, semantics: Semantics
) -> Vector:
    """funcLabelReplace: set `dst` from the anchored `pattern`'s match on `src`'s value."""
    group = "(?s:" if semantics.dot_matches_newline else "(?:"
    try:
        program = regex.compile_go(f"^{group}{pattern})$")
    except regex.RegexError:
        raise PromQLError(f"invalid regular expression in label_replace(): {pattern}") from None
    if not is_label_name(dst, semantics):
        raise PromQLError(f"invalid destination label name in label_replace(): {dst}")
    out: Vector = []
    for element in vector:
        source = label_value(element.labels, src).encode("utf-8", "surrogatepass")
        spans = program.search(source)
        if spans is None:
            out.append(element)
            continue
        parts: list[bytes] = []
        regex.expand(parts.append, replacement, source, spans, program.names)
        value = b"".join(parts).decode("utf-8", "replace")
        out.append(Element(with_label(element.labels, dst, value), element.value))
    return out


def label_join(
    vector: Vector, dst: str, separator: str, sources: Sequence[str], semantics: Semantics
) -> Vector:
    """funcLabelJoin: `dst` set to the `sources`' values joined, removed when that is empty."""
    for src in sources:
        if not is_label_name(src, semantics):
            raise PromQLError(f"invalid source label name in label_join(): {src}")
    if not is_label_name(dst, semantics):
        raise PromQLError(f"invalid destination label name in label_join(): {dst}")
    return [
        Element(
            with_label(
                element.labels,
                dst,
                separator.join(label_value(element.labels, src) for src in sources),
            ),
            element.value,
        )
        for element in vector
    ]


def sort_vector(vector: Vector, descending: bool) -> Vector:
    """sort/sort_desc; NaN last either way. Rule results are sets, so this only orders
    `rules test` output."""
    numbers = [e for e in vector if not math.isnan(e.value)]
    nans = [e for e in vector if math.isnan(e.value)]
    return sorted(numbers, key=lambda e: e.value, reverse=descending) + nans


def drop_names(vector: Vector, function: Callable[[float], float]) -> Vector:
    """An element-wise function's result: metric names dropped, as simpleFunc drops them."""
    return [Element(drop_name(e.labels), function(e.value)) for e in vector]
