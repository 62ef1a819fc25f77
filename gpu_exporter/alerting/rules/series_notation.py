"""promtool's `input_series` notation (Prometheus 2.42 `ParseSeriesDesc`), for rule unit tests.

A series is `metric{label="value", ...}`; its values are space-separated items, the first at
`start`, the next one `interval` later, and so on:

- `1.5`, `-2`, `+Inf`, `NaN`: one value. Integers go through Go's `ParseInt(s, 0, 64)` first, so a
  leading zero means octal (`010` is 8) unless that fails (`08` is 8 again).
- `_`: one missing value; `_xN`: N missing values (N, not N+1 — promtool 2.42's grammar).
- `stale`: a staleness marker. It cannot be repeated with `x` (promtool reads `stalex2` as one
  unknown word).
- `AxN`: A repeated N+1 times; `A+BxN` / `A-BxN`: N+1 values A, A+B, ... by repeated addition.
- `Inf`/`NaN` followed directly by `x` form one unknown word as well, so they cannot be repeated.

A series expands to at most MAX_VALUES_PER_SERIES values (promtool has no limit): a typo such
as `1x100000000000` is refused before anything is built. Bad notation raises PromQLError.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import promql_parser as P

from gpu_exporter.alerting.rules.promql import PromQLError
from gpu_exporter.alerting.store import STALE_NAN, Labels, SeriesStore, make_labels

__all__ = ["load_input_series", "parse_series", "parse_values"]

# promtool would try to build any list; a typo like 1x100000000000 must fail instead. A
# million values is two years at one a minute, and about 30 MB while expanded.
MAX_VALUES_PER_SERIES = 1_000_000

_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # SPACE ADD SUB TIMES BLANK NUMBER IDENTIFIER
    text: str
    pos: int

    def describe(self) -> str:
        if self.kind == "NUMBER":
            return f"number {self.text!r}"
        if self.kind == "IDENTIFIER":
            return f"identifier {self.text!r}"
        return repr(self.text)


def _is_digit(ch: str) -> bool:
    return "0" <= ch <= "9"


def _is_alpha(ch: str) -> bool:
    return ch == "_" or "a" <= ch <= "z" or "A" <= ch <= "Z"


def _tokens(text: str) -> Iterator[_Token]:
    """The 2.42 lexer in series-values mode (ASCII classes, like Go's isAlpha/isDigit)."""
    i, n = 0, len(text)
    single = {"+": "ADD", "-": "SUB", "x": "TIMES", "_": "BLANK"}
    while i < n:
        ch = text[i]
        if ch in " \t\n\r":
            j = i
            while j < n and text[j] in " \t\n\r":
                j += 1
            yield _Token("SPACE", text[i:j], i)
            i = j
        elif ch in single:
            yield _Token(single[ch], ch, i)
            i += 1
        elif _is_digit(ch) or (ch == "." and i + 1 < n and _is_digit(text[i + 1])):
            j = _scan_number(text, i)
            yield _Token("NUMBER", text[i:j], i)
            i = j
        elif _is_alpha(ch):
            j = i
            while j < n and (_is_alpha(text[j]) or _is_digit(text[j]) or text[j] == ":"):
                j += 1
            word = text[i:j]
            kind = "NUMBER" if word.lower() in ("inf", "nan") else "IDENTIFIER"
            yield _Token(kind, word, i)
            i = j
        else:
            raise PromQLError(f"unexpected character {ch!r} at position {i} in series values")


def _scan_number(text: str, i: int) -> int:
    n = len(text)

    def run(j: int, chars: str) -> int:
        while j < n and text[j] in chars:
            j += 1
        return j

    j = run(i, "0123456789")  # no hex here: "0x3" is 0 repeated
    if j < n and text[j] == ".":
        j = run(j + 1, "0123456789")
    if j < n and text[j] in "eE":
        j += 1
        if j < n and text[j] in "+-":
            j += 1
        j = run(j, "0123456789")
    # Only the repetition `x` may follow a number directly.
    if j < n and text[j] != "x" and (_is_alpha(text[j]) or _is_digit(text[j])):
        raise PromQLError(f"bad number syntax {text[i:j]!r} at position {i} in series values")
    return j


def _number(token: _Token) -> float:
    text = token.text
    if text.isdigit() and text.isascii():
        # Go's ParseInt(s, 0, 64): a leading 0 selects octal; on failure ParseFloat decides.
        base = 8 if len(text) > 1 and text[0] == "0" else 10
        try:
            value = int(text, base)
        except ValueError:
            value = None
        if value is not None and value <= _INT64_MAX:
            return float(value)
    try:
        return float(text)
    except ValueError:
        raise PromQLError(f"error parsing number {text!r} in series values") from None


def _count(token: _Token, room: int) -> int:
    """The repetition count `token` gives, if its values (count + 1 at most) fit in `room`."""
    if not (token.kind == "NUMBER" and token.text.isdigit() and token.text.isascii()):
        raise PromQLError(f"invalid repetition {token.text!r} in series values")
    # Measured as text first: int() of a huge digit string is slow, and refused past 4300.
    digits = token.text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_VALUES_PER_SERIES)) or int(digits) >= room:
        raise PromQLError(
            f"repetition {token.text!r} in series values is too large: a series expands to "
            f"at most {MAX_VALUES_PER_SERIES} values"
        )
    return int(digits)


def parse_values(text: str) -> list[float | None]:
    """Expand promtool's value notation; None is a missing value, STALE_NAN a marker."""
    items: list[list[_Token]] = [[]]
    for token in _tokens(text):
        if token.kind == "SPACE":
            items.append([])
        else:
            items[-1].append(token)
    values: list[float | None] = []
    for item in items:
        if item:
            values.extend(_expand(item, MAX_VALUES_PER_SERIES - len(values)))
    if len(values) > MAX_VALUES_PER_SERIES:
        raise PromQLError(f"series values expand to more than {MAX_VALUES_PER_SERIES} values")
    return values


# The item shapes the 2.42 grammar accepts; SIGN is `+` or `-`.
_VALUE_SHAPES = (("IDENTIFIER",), ("NUMBER",), ("SIGN", "NUMBER"))
_SHAPES = (
    ("BLANK",),
    ("BLANK", "TIMES", "NUMBER"),
    *(v for v in _VALUE_SHAPES),
    *((*v, "TIMES", "NUMBER") for v in _VALUE_SHAPES),
    *((*v, "SIGN", "NUMBER", "TIMES", "NUMBER") for v in _VALUE_SHAPES),
)


def _kind(token: _Token) -> str:
    return "SIGN" if token.kind in ("ADD", "SUB") else token.kind


def _shape(item: list[_Token]) -> tuple[str, ...]:
    """The shape `item` matches, or a PromQLError naming the first token that fits none."""
    kinds = tuple(_kind(t) for t in item)
    if kinds in _SHAPES:
        return kinds
    for i in range(len(kinds)):
        if not any(shape[: i + 1] == kinds[: i + 1] for shape in _SHAPES):
            bad = item[i]
            if bad.kind == "IDENTIFIER":
                raise PromQLError(
                    f"unexpected identifier {bad.text!r} at position {bad.pos} in series "
                    'values, expected number or "stale"'
                )
            raise _unexpected(bad)
    last = item[-1]
    raise PromQLError(
        f"unexpected end of item after {last.describe()} at position {last.pos} in series values"
    )


def _expand(item: list[_Token], room: int) -> list[float | None]:
    """One item's values; a repetition whose values would not fit in `room` is refused."""
    shape = _shape(item)
    if shape[0] == "BLANK":
        return [None] * (_count(item[2], room + 1) if len(item) == 3 else 1)
    start = _value(item)
    rest = item[2 if shape[0] == "SIGN" else 1 :]
    if not rest:
        return [start]
    if len(rest) == 2:  # A x N
        return [start] * (_count(rest[1], room) + 1)
    step = _number(rest[1])
    if rest[0].kind == "SUB":
        step = -step
    values: list[float | None] = [start]
    current = start
    for _ in range(_count(rest[3], room)):
        current += step  # repeated addition, like promtool (no multiplication)
        values.append(current)
    return values


def _value(item: list[_Token]) -> float:
    first = item[0]
    if first.kind == "IDENTIFIER":
        if first.text != "stale":
            raise PromQLError(
                f"unexpected identifier {first.text!r} at position {first.pos} in series values,"
                ' expected number or "stale"'
            )
        return STALE_NAN
    if first.kind == "NUMBER":
        return _number(first)
    value = _number(item[1])
    return -value if first.kind == "SUB" else value


def _unexpected(token: _Token) -> PromQLError:
    return PromQLError(f"unexpected {token.describe()} at position {token.pos} in series values")


def parse_series(text: str) -> Labels:
    """Labels of `metric{label="value", ...}` (equality matchers only)."""
    try:
        expr = P.parse(text)
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except BaseException as exc:  # pyo3 panics (PanicException) are BaseExceptions
        raise PromQLError(f"bad series {text!r}: {' '.join(str(exc).split())}") from None
    if not isinstance(expr, P.VectorSelector) or expr.offset is not None or expr.at is not None:
        raise PromQLError(f'bad series {text!r}: expected metric{{label="value", ...}}')
    if expr.matchers.or_matchers:
        raise PromQLError(f"bad series {text!r}: 'or' is not allowed in a series")
    pairs: list[tuple[str, str]] = []
    name = expr.name
    for m in expr.matchers.matchers:
        if m.op != P.MatchOp.Equal:
            raise PromQLError(f"bad series {text!r}: only '=' label matchers are allowed")
        if m.name == "__name__":
            name = m.value
        else:
            pairs.append((m.name, m.value))
    return make_labels(name, pairs)


def load_input_series(
    storage: SeriesStore,
    input_series: Iterable[Mapping[str, Any]],
    interval_seconds: float,
    start: float = 0.0,
    until: float | None = None,
) -> None:
    """Append promtool `input_series` entries: value i at start + i * interval, `_` skipped.

    `until` drops later samples. promtool loads input lazily, one evaluation_interval step at a
    time, and its promql_expr_test queries run after the last step at or before the group's
    largest eval_time: samples after that step are invisible to them.
    """
    interval_ms = round(interval_seconds * 1000)
    start_ms = round(start * 1000)
    until_ms = None if until is None else round(until * 1000)
    # A series given twice keeps its last values only: promtool (promql/test.go's load)
    # replaces the whole sample list, checked against promtool 2.42.
    values_by_series: dict[Labels, list[float | None]] = {}
    for entry in input_series:
        labels = parse_series(str(entry["series"]))
        raw = entry.get("values", "")
        values_by_series.pop(labels, None)  # a redefinition takes the later position too
        values_by_series[labels] = parse_values("" if raw is None else str(raw))
    for labels, values in values_by_series.items():
        for i, value in enumerate(values):
            t_ms = start_ms + i * interval_ms
            if until_ms is not None and t_ms > until_ms:
                break
            if value is not None:
                storage.append(labels, t_ms / 1000, value)
