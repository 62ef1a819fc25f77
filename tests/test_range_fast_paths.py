"""The range functions' fast paths give, bit for bit, what Prometheus' loops give.

avg_over_time of a constant window, max/min_over_time and changes without NaN, resets, and
rate's counter resets are found at C speed (`gpu_exporter/alerting/rules/promql_functions.py`).
Each is held here to the loop it replaces, written out as Prometheus 2.42 runs it
(promql/functions.go: funcAvgOverTime, funcMaxOverTime, funcMinOverTime, funcChanges,
funcResets, extrapolatedRate), on windows made to hit the edges: constant runs, both zeros,
subnormals, the largest float, infinities and NaN.
"""

from __future__ import annotations

import math
import struct
from array import array
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_exporter.alerting.rules import promql_functions as F
from gpu_exporter.alerting.rules.promql_values import Semantics
from tests.test_promql import avg_reference  # Prometheus' incremental mean, step for step

EDGES = [0.0, -0.0, 1.0, 0.1, -3.5, 5e-324, -5e-324, 1.7976931348623157e308, math.inf, -math.inf]
VALUE = st.sampled_from([*EDGES, math.nan]) | st.floats(allow_nan=True, width=64)
WINDOW = (
    st.lists(VALUE, min_size=1, max_size=40)
    | st.builds(lambda x, n: [x] * n, VALUE, st.integers(1, 600))  # a constant window
    | st.builds(lambda x, n, y: [x] * n + [y], VALUE, st.integers(1, 50), VALUE)
)
CHECKS = settings(max_examples=400, deadline=None)
IMPLS = F.range_impls(Semantics("prometheus2", 2, frozenset()))


def bits(value: float | None) -> bytes | None:
    """Equal for the same float bit for bit (NaNs all alike: Prometheus prints NaN once)."""
    if value is None:
        return None
    return b"nan" if math.isnan(value) else struct.pack("<d", value)


def call(name: str, values: Sequence[float]) -> float | None:
    times = array("q", range(0, 15_000 * len(values), 15_000))
    return IMPLS[name](times, array("d", values), -15_000, times[-1] + 1, 60_000, times[-1], ())


def go_max_over_time(values: Sequence[float]) -> float:
    best = values[0]
    for v in values:
        if v > best or math.isnan(best):
            best = v
    return best


def go_min_over_time(values: Sequence[float]) -> float:
    best = values[0]
    for v in values:
        if v < best or math.isnan(best):
            best = v
    return best


def go_changes(values: Sequence[float]) -> float:
    changes, previous = 0, values[0]
    for v in values[1:]:
        if v != previous and not (math.isnan(v) and math.isnan(previous)):
            changes += 1
        previous = v
    return float(changes)


def go_resets(values: Sequence[float]) -> float:
    resets, previous = 0, values[0]
    for v in values[1:]:
        if v < previous:
            resets += 1
        previous = v
    return float(resets)


def go_increase_before_extrapolation(values: Sequence[float]) -> float:
    result, previous = values[-1] - values[0], values[0]
    for v in values[1:]:
        if v < previous:
            result += previous
        previous = v
    return result


@CHECKS
@given(WINDOW)
def test_avg_over_time_is_prometheus_loop(values: list[float]) -> None:
    assert bits(call("avg_over_time", values)) == bits(avg_reference(values))


@CHECKS
@given(WINDOW)
def test_max_and_min_over_time_are_prometheus_loops(values: list[float]) -> None:
    assert bits(call("max_over_time", values)) == bits(go_max_over_time(values))
    assert bits(call("min_over_time", values)) == bits(go_min_over_time(values))


@CHECKS
@given(WINDOW)
def test_changes_and_resets_are_prometheus_loops(values: list[float]) -> None:
    assert call("changes", values) == go_changes(values)
    assert call("resets", values) == go_resets(values)


@CHECKS
@given(WINDOW)
def test_increase_adds_each_counter_reset_in_prometheus_order(values: list[float]) -> None:
    """increase over a window whose ends sit on the range's: no extrapolation, so the result
    is last - first plus the resets' values, as extrapolatedRate sums them."""
    if len(values) < 2:
        return
    times = array("q", range(0, 15_000 * len(values), 15_000))
    got = IMPLS["increase"](
        times, array("d", values), times[0], times[-1], times[-1], times[-1], ()
    )
    # Both ends on the data: the factor is sampled / sampled, exactly 1.
    assert bits(got) == bits(go_increase_before_extrapolation(values))


def test_a_constant_window_of_minus_zero_takes_the_loop() -> None:
    """-0 is the one constant whose incremental mean is not itself (0 + -0 is +0)."""
    assert bits(call("avg_over_time", [-0.0] * 5)) == bits(avg_reference([-0.0] * 5))
    assert bits(call("avg_over_time", [-0.0] * 5)) == bits(0.0)
