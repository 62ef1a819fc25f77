"""Prometheus 2.42's PromQL test-file format (`promql/test.go` at v2.42.0), read for conversion.

What test.go does, and what this reader keeps of it:

- Lines are trimmed; a line starting with `#` counts as blank. A blank line ends a `load`
  block and an `eval`'s expectations.
- `load <step>`: series lines `metric{labels} <values>` in the expanding notation; value i of a
  series is at i * step from time 0 (`_` is no sample). Within one load a repeated series
  replaces the earlier line; the loads of a segment (since the last `clear`) all go into the
  same storage, so a series two loads name has the samples of both.
- `eval[_fail|_ordered] instant at <duration> <expr>`, then expectations: a line that is a
  number alone is an expected scalar (and ends the block), others are `metric{labels} value`.
  No expectation line means an empty result. Values compare with a relative epsilon of 1e-6,
  and NaN equals NaN.

Only the reading is here; `convert` decides what promtool can express.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_EVAL = re.compile(r"^eval(?:_(fail|ordered))?\s+instant\s+(?:at\s+(.+?))?\s+(.+)$")
_LOAD = re.compile(r"^load\s+(.+?)$")
_SPACE = re.compile(r"[\t ]+")
_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_DURATION_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_IDENT_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:")
_INT64_MAX = (1 << 63) - 1
_GO_FLOAT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|infinity|nan)", re.I)

EvalKind = Literal["eval", "eval_ordered", "eval_fail"]


class FormatError(ValueError):
    """Upstream text this reader does not understand: conversion must stop, not guess."""


@dataclass(frozen=True)
class SeriesLine:
    line: int
    series: str  # `metric{labels}` exactly as written
    values: str  # the value notation exactly as written


@dataclass(frozen=True)
class Load:
    line: int
    step: str  # as written, e.g. "5m"
    step_ms: int
    series: tuple[SeriesLine, ...]


@dataclass(frozen=True)
class Expectation:
    line: int
    labels: str | None  # None: an expected scalar
    value: str  # as written


@dataclass(frozen=True)
class Eval:
    file: str  # e.g. "functions.test"
    line: int
    kind: EvalKind
    at: str
    expr: str
    expectations: tuple[Expectation, ...]
    loads: tuple[Load, ...]  # everything loaded since the last `clear`, in order

    @property
    def name(self) -> str:
        return f"{self.file}:{self.line}"


def parse_duration_ms(text: str) -> int:
    """Prometheus' model.ParseDuration, in milliseconds ("0" included)."""
    if text == "0":
        return 0
    match = _DURATION.match(text)
    if not text or not match or not any(match.groups()):
        raise FormatError(f"not a Prometheus duration: {text!r}")
    return sum(int(g) * unit for g, unit in zip(match.groups(), _DURATION_MS, strict=True) if g)


def go_number(text: str) -> float:
    """The PromQL parser's number(): Go's ParseInt(s, 0, 64), else ParseFloat."""
    sign, body = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
    as_int: int | None = None
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", body):
        as_int = int(body, 16)
    elif re.fullmatch(r"0[0-7]+", body):
        as_int = int(body, 8)
    elif re.fullmatch(r"[1-9][0-9]*|0", body):
        as_int = int(body)
    if as_int is not None and as_int <= _INT64_MAX:
        return float(-as_int if sign == "-" else as_int)
    if _GO_FLOAT.fullmatch(text):
        return float(text)
    raise FormatError(f"number this reader does not handle: {text!r}")


def split_series(text: str) -> tuple[str, str]:
    """`metric{labels} values...` -> (`metric{labels}`, `values...`), quotes respected."""
    i = 0
    while i < len(text) and text[i] in _IDENT_CHARS:
        i += 1
    if i < len(text) and text[i] == "{":
        i = _end_of_braces(text, i)
    if i == 0:
        raise FormatError(f"no series at the start of {text!r}")
    return text[:i], text[i:].strip()


def _end_of_braces(text: str, start: int) -> int:
    """Index just past the `}` closing the `{` at `start`, skipping quoted label values."""
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == "}":
            return i + 1
        if ch in "\"'`":
            i = _end_of_string(text, i)
        else:
            i += 1
    raise FormatError(f"unterminated label set in {text!r}")


def _end_of_string(text: str, start: int) -> int:
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
        elif text[i] == quote:
            return i + 1
        else:
            i += 1
    raise FormatError(f"unterminated string in {text!r}")


def metric_name(series: str) -> str | None:
    """The metric name of `metric{labels}`, from the name or a `__name__="..."` label."""
    name = series.split("{", 1)[0]
    if name:
        return name
    match = re.search(r"""__name__\s*=\s*(["'`])([^"'`]*)\1""", series)
    return match.group(2) if match else None


def label_key(series: str) -> tuple[str, ...]:
    """An identity for a series line's label set: name and sorted `label=value` texts."""
    name, _, rest = series.partition("{")
    pairs: list[str] = []
    body = rest[:-1] if rest.endswith("}") else rest
    i = 0
    while i < len(body):
        match = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*").match(body, i)
        if not match:
            raise FormatError(f"label set this reader does not handle: {series!r}")
        end = _end_of_string(body, match.end())
        label, value = match.group(1), body[match.end() : end]
        if label == "__name__":
            name = value[1:-1]
        else:
            pairs.append(f"{label}={value[1:-1]}")
        i = end
        comma = re.compile(r"\s*,?\s*").match(body, i)
        i = comma.end() if comma else i
    return (name, *sorted(pairs))


# A value item of the series notation: `_`, `_xN`, `v`, `vxN`, `v+dxN`, `v-dxN`.
_UNSIGNED = r"(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|Inf|NaN|inf|nan)"
_ITEM = re.compile(
    rf"^(?:(_)(?:x(\d+))?|(stale)|([-+]?{_UNSIGNED})(?:([-+])({_UNSIGNED}))?(?:x(\d+))?)$"
)


@dataclass(frozen=True)
class Item:
    """One item of a series' values: `count` consecutive values (None: no sample)."""

    text: str
    values: tuple[float | str | None, ...]  # float, "stale", or None
    start: str = ""  # the first value as written
    stepped: bool = False  # `A+BxN` / `A-BxN`


def parse_items(values: str) -> list[Item]:
    """The items of a value notation with the values each stands for (2.42 grammar)."""
    items = []
    for word in values.split():
        match = _ITEM.match(word)
        if not match:
            raise FormatError(f"series value this reader does not handle: {word!r}")
        blank, blanks, stale, start, sign, step, times = match.groups()
        if blank:  # `_xN` is N blanks, not N + 1
            items.append(Item(word, (None,) * (int(blanks) if blanks else 1)))
        elif stale:
            items.append(Item(word, ("stale",)))
        else:
            values = _expand(start, sign, step, times)
            items.append(Item(word, values, start, step is not None))
    return items


def _expand(start: str, sign: str | None, step: str | None, times: str | None) -> tuple[float, ...]:
    value = go_number(start)
    if times is None:
        return (value,)
    if step is None:
        return (value,) * (int(times) + 1)
    delta = go_number(step) * (-1 if sign == "-" else 1)
    out = [value]
    for _ in range(int(times)):
        value += delta  # repeated addition, as the Go grammar does
        out.append(value)
    return tuple(out)


def is_number_line(text: str) -> bool:
    """test.go's parseNumber: the whole line is one number (an expected scalar)."""
    try:
        go_number(text)
    except FormatError:
        return False
    return True


def parse_file(name: str, text: str) -> list[Eval]:
    """Every eval command of an upstream test file, each with the loads of its segment."""
    lines = [line.strip() for line in text.split("\n")]
    lines = ["" if line.startswith("#") else line for line in lines]
    evals: list[Eval] = []
    loads: list[Load] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        command = _SPACE.split(line, maxsplit=1)[0].lower() if line else ""
        if not line:
            i += 1
        elif command == "clear":
            loads = []
            i += 1
        elif command == "load":
            load, i = _parse_load(lines, i)
            loads.append(load)
        elif command.startswith("eval"):
            ev, i = _parse_eval(name, lines, i, tuple(loads))
            evals.append(ev)
        else:
            raise FormatError(f"{name}:{i + 1}: unknown command {line!r}")
    return evals


def _block(lines: list[str], i: int) -> tuple[list[tuple[int, str]], int]:
    """The non-blank lines after line i, as (1-based line, text), and the index after them."""
    j = i + 1
    block = []
    while j < len(lines) and lines[j]:
        block.append((j + 1, lines[j]))
        j += 1
    return block, j


def _parse_load(lines: list[str], i: int) -> tuple[Load, int]:
    match = _LOAD.match(lines[i])
    if not match:
        raise FormatError(f"line {i + 1}: bad load command {lines[i]!r}")
    block, end = _block(lines, i)
    series = [SeriesLine(number, *split_series(text)) for number, text in block]
    step = match.group(1)
    return Load(i + 1, step, parse_duration_ms(step), tuple(series)), end


def _parse_eval(name: str, lines: list[str], i: int, loads: tuple[Load, ...]) -> tuple[Eval, int]:
    match = _EVAL.match(lines[i])
    if not match:
        raise FormatError(f"{name}:{i + 1}: bad eval command {lines[i]!r}")
    modifier, at, expr = match.groups()
    if at is None:
        raise FormatError(f"{name}:{i + 1}: an eval without `at` (test.go rejects it too)")
    parse_duration_ms(at)
    kind: EvalKind = f"eval_{modifier}" if modifier else "eval"  # type: ignore[assignment]
    expectations: list[Expectation] = []
    j = i + 1
    while j < len(lines) and lines[j]:
        text = lines[j]
        if is_number_line(text):  # a scalar; test.go stops reading expectations here
            expectations.append(Expectation(j + 1, None, text))
            j += 1
            break
        labels, value = split_series(text)
        if len(value.split()) != 1:
            raise FormatError(f"{name}:{j + 1}: an instant expectation has one value: {text!r}")
        expectations.append(Expectation(j + 1, labels, value))
        j += 1
    return Eval(name, i + 1, kind, at, expr, tuple(expectations), loads), j
