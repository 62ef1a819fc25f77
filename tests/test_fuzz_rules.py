"""Property-based tests (hypothesis) of what reads user input on the rule path: the rule loader
(rule-file structures and texts) and promtool's series notation. Whatever the input, each fails
only with its documented error (RuleFileError, PromQLError), within bounded memory, and valid
notation expands exactly as promtool's grammar says. Deterministic (derandomized, no example
database) and a few seconds in all."""

from __future__ import annotations

import struct
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_exporter.alerting.rules.loader import LoadLimits, RuleFileError, load_rule_files
from gpu_exporter.alerting.rules.promql import PromQLError
from gpu_exporter.alerting.rules.series_notation import parse_values
from gpu_exporter.alerting.store import STALE_NAN

# Peak Python allocation one input may cost (the largest legal notation, a million values,
# stays under it).
MEMORY_BOUND = 64 * 2**20

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextmanager
def bounded_memory() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, f"peak {peak / 2**20:.1f} MiB"


def only(error: type[Exception], call: Callable[[], Any]) -> None:
    """`call` returns, or raises `error` (anything else fails the test)."""
    with suppress(error):
        call()


# --- the rule loader ------------------------------------------------------------------------------

KEYS = [
    "groups", "name", "rules", "alert", "record", "expr", "for", "keep_firing_for", "labels",
    "annotations", "interval", "limit", "severity", "alertname", "__name__", "__x", "0a", "a-b",
]  # fmt: skip
EXPRS = [
    "up", "up == 0", "rate(c_total[5m]) > 0", "sum by (gpu) (g)", "g offset 2h",
    "avg_over_time(g[7d])", "histogram_quantile(0.9, x)", "x[5m]", "(", "absent(nope)",
    '{__name__=~"gpu_.+"}', 'g{a=~"(?P<x>"}', "1", "vector(1) @ 0", "g + on(a) group_left h",
]  # fmt: skip
DURATIONS = ["5m", "0s", "0", "1h30m", "-1m", "90", "1y", "100ms", "5m5m", ""]
TEMPLATES = [
    "{{ $labels.gpu }}", "{{ $value | humanize }}", "{{", "{{ end }}", "{{ range . }}x",
    "{{ .Nope }}", "{{ template \"x\" }}", "plain",
]  # fmt: skip
SCALARS = st.one_of(
    st.sampled_from(EXPRS + DURATIONS + TEMPLATES + KEYS),
    st.text(max_size=12),
    st.integers(-3, 10**12),
    st.floats(),
    st.booleans(),
    st.none(),
)
ANY = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(KEYS) | st.text(max_size=6) | st.integers(0, 3), inner, max_size=4
        )
    ),
    max_leaves=12,
)
MAPPING = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6) | st.integers(0, 2), SCALARS,
                          max_size=3)  # fmt: skip


def mostly(usual: st.SearchStrategy[Any], other: st.SearchStrategy[Any] = SCALARS) -> Any:
    """`usual` four times in five, else `other` (a plain `|` would weigh each of SCALARS'
    branches like `usual`)."""
    return st.integers(0, 4).flatmap(lambda roll: other if roll == 0 else usual)


NAMES = mostly(st.sampled_from(["A", "B", "g", "h", "r:x", "gpu:util:avg5m", "", "a b", "1r"]))
EXPR = mostly(st.sampled_from(EXPRS))
DURATION = mostly(st.sampled_from(DURATIONS[:4] + DURATIONS))  # valid ones twice as often
LABELS = st.dictionaries(st.sampled_from(KEYS), mostly(st.sampled_from(TEMPLATES)), max_size=3)
ANNOTATIONS = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(TEMPLATES), max_size=3)
RULE_OPTIONS = {
    "for": DURATION,
    "keep_firing_for": DURATION,
    "labels": mostly(LABELS, MAPPING | ANY),
    "annotations": mostly(ANNOTATIONS, MAPPING | ANY),
}
# Mostly rule-shaped (so the checks past the shape run), sometimes anything at all.
RULE = st.one_of(
    st.fixed_dictionaries({"alert": NAMES, "expr": EXPR}, optional=RULE_OPTIONS),
    st.fixed_dictionaries(
        {"record": NAMES, "expr": EXPR},
        optional={"labels": LABELS, "annotations": ANNOTATIONS, "for": DURATION},
    ),
    st.fixed_dictionaries(
        {}, optional={"alert": NAMES, "record": NAMES, "expr": SCALARS, "junk": ANY, **RULE_OPTIONS}
    ),
)
GROUP_OPTIONS = {"interval": DURATION, "limit": mostly(st.integers(-1, 3))}
GROUP = st.one_of(
    st.fixed_dictionaries(
        {"name": NAMES, "rules": st.lists(RULE, max_size=4)}, optional=GROUP_OPTIONS
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "name": NAMES,
            "rules": st.lists(RULE | ANY, max_size=3) | ANY,
            "query_offset": ANY,
            **GROUP_OPTIONS,
        },
    ),
)
DOCUMENT = st.one_of(
    st.fixed_dictionaries({"groups": st.lists(GROUP, min_size=1, max_size=3)}),
    st.fixed_dictionaries({}, optional={"groups": st.lists(GROUP | ANY, max_size=3) | ANY}) | ANY,
)
LIMITS = st.sampled_from([None, LoadLimits(max_range_seconds=3600.0)])


def load_text(text: str, limits: LoadLimits | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rules.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        with bounded_memory():
            only(RuleFileError, lambda: load_rule_files([path], limits))


@FUZZ
@given(DOCUMENT, LIMITS)
def test_the_loader_fails_only_with_rule_file_errors_on_any_structure(
    document: Any, limits: LoadLimits | None
) -> None:
    load_text(yaml.safe_dump(document, allow_unicode=True), limits)


VALID_FILE = """\
groups:
  - name: g
    interval: 30s
    rules:
      - alert: Hot
        expr: avg_over_time(gpu_temperature_celsius[5m]) > 80
        for: 2m
        labels: {severity: warning}
        annotations:
          summary: "GPU {{ $labels.gpu }} at {{ $value | humanize }}C"
      - record: gpu:util:avg5m
        expr: avg by (gpu) (rate(c_total[5m]))
"""


@FUZZ
@given(st.data(), LIMITS)
def test_the_loader_fails_only_with_rule_file_errors_on_any_text(
    data: st.DataObject, limits: LoadLimits | None
) -> None:
    text = VALID_FILE
    for _ in range(data.draw(st.integers(1, 4))):  # a few edits of a valid file, anywhere
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 8))
        pieces = st.sampled_from(list(":-{}[]'\"|>&*!%@`# \n\t\\")) | st.text(max_size=3)
        insert = data.draw(st.lists(pieces, max_size=4).map("".join))
        text = text[:at] + insert + text[at + cut :]
    load_text(text, limits)


@FUZZ
@given(st.text(max_size=200), LIMITS)
def test_the_loader_fails_only_with_rule_file_errors_on_random_text(
    text: str, limits: LoadLimits | None
) -> None:
    load_text(text, limits)


# --- the series notation ----------------------------------------------------------------------

# Pieces of notation: items shaped like the grammar's (value, step, repetition) from them are
# near-valid, so every check past the lexer runs; random pieces and text cover the lexer.
NOTATION_PIECES = [
    "0", "1", "08", "010", "1.5", ".5", "5.", "1e3", "1e", "-2", "+3", "Inf", "NaN", "inf",
    "stale", "_", "e", ":", "#", "1000000", "99999999999999999999",
]  # fmt: skip
PIECE = st.sampled_from(NOTATION_PIECES)


@st.composite
def notation_item(draw: st.DrawFn) -> str:
    parts = [draw(PIECE)]
    if draw(st.booleans()):
        parts += [draw(st.sampled_from(["+", "-", ""])), draw(PIECE)]
    if draw(st.booleans()):
        parts += [draw(st.sampled_from(["x", "x ", " x"])), draw(PIECE)]
    return "".join(parts)


NOTATION_ITEM = notation_item() | st.lists(PIECE | st.sampled_from(["+", "-", "x"]), min_size=1,
                                           max_size=5).map("".join)  # fmt: skip


@FUZZ
@given(st.lists(NOTATION_ITEM, max_size=6).map(" ".join) | st.text(max_size=40))
def test_the_series_notation_fails_only_with_promql_errors(text: str) -> None:
    with bounded_memory():
        only(PromQLError, lambda: parse_values(text))


# One notation item and what promtool 2.42 expands it to.
Item = tuple[str, list[float | None]]
NUMBERS = st.integers(-1000, 1000) | st.floats(-1e6, 1e6, allow_nan=False).map(
    lambda f: round(f, 3)
)  # fmt: skip
COUNTS = st.integers(0, 30)


def number(value: float | int) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


@st.composite
def items(draw: st.DrawFn) -> Item:
    kind = draw(st.sampled_from(["value", "special", "stale", "blank", "blanks", "repeat", "step"]))
    if kind == "value":
        value = draw(NUMBERS)
        return number(value), [float(value)]
    if kind == "special":
        text = draw(st.sampled_from(["Inf", "+Inf", "-Inf", "NaN"]))
        return text, [float(text.replace("Inf", "inf"))]
    if kind == "stale":
        return "stale", [STALE_NAN]
    if kind == "blank":
        return "_", [None]
    count = draw(COUNTS)
    if kind == "blanks":
        return f"_x{count}", [None] * count  # N missing values, not N + 1
    start = draw(NUMBERS)
    if kind == "repeat":
        return f"{number(start)}x{count}", [float(start)] * (count + 1)
    step = draw(st.integers(0, 100) | st.floats(0, 100, allow_nan=False).map(lambda f: round(f, 2)))
    sign = draw(st.sampled_from(["+", "-"]))
    expanded, current = [float(start)], float(start)
    for _ in range(count):  # repeated addition, as promtool does (no multiplication)
        current += float(step) if sign == "+" else -float(step)
        expanded.append(current)
    return f"{number(start)}{sign}{number(step)}x{count}", expanded


def bits(values: list[float | None]) -> list[bytes | None]:
    return [None if v is None else struct.pack("<d", v) for v in values]


@FUZZ
@given(st.lists(items(), max_size=8), st.sampled_from([" ", "  ", "\t", " \n "]))
def test_valid_series_notation_expands_as_promtool_does(parts: list[Item], space: str) -> None:
    text = space.join(text for text, _ in parts)
    expected = [value for _, values in parts for value in values]
    got = parse_values(text)
    assert bits(got) == bits(expected), text
