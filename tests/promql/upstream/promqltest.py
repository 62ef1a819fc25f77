"""Prometheus 3.14's own PromQL test files, run in-process against the daemon's evaluator.

The files (`prometheus-3.14/*.test`, from promql/promqltest/testdata at v3.14.0) are read the
way promql/promqltest/test.go reads them:

- Lines are trimmed; a line starting with `#` counts as blank; a blank line ends a block.
- `load <step>`: series lines `metric{labels} <values>` in the expanding notation, value k at
  k * step ms from the epoch (`_` no sample). Within one load a repeated series replaces the
  earlier line; loads accumulate until `clear`. `load_with_nhcb` also stores each classic
  histogram as a native histogram under its base name; `metric@st <offsets>` lines give start
  timestamps.
- `eval[_fail|_warn|_info|_ordered] instant at <duration> <expr>` or `eval[...] range from <d>
  to <d> step <d> <expr>`, then `expect fail|warn|no_warn|info|no_info|ordered [msg:|regex:]`,
  `expect string "..."`, `expect range vector from .. to .. step ..`, `expected_fail_message`
  / `expected_fail_regexp` (legacy), a bare number (an expected scalar; it ends the block), or
  expected series. No expectation means an empty result.
- Values compare with almost.Equal at 1e-6 (NaN equals NaN, StaleNaN only StaleNaN, a zero
  only an essentially-zero value); labels compare exactly.

How this runner differs from promqltest, on purpose:

- Every eval runs at Prometheus' defaults there (5m lookback, 1m default subquery step) under
  `--semantics` (Prometheus 3 by default). A range eval runs as one instant query per step.
- Warnings and infos are not results: a case expecting one passes on its value alone.
  `expect fail` passes on any PromQLError; a different message is noted, not failed.
- Order is not checked (`ordered` cases are counted, and a different order is noted): rule
  results are sets.
- promqltest also re-runs each instant eval with `@` pinned to other times and as a range
  query around its time; this runner does not.
- Cases needing what the daemon leaves out are skipped with a reason (`Skip`): native
  histograms, feature flags the suite turns on, results rules never produce. Cases that fail
  only because the suite enables delayed name removal are listed in differences.yaml with a
  reason starting `needs delayed name removal:` and counted with the skipped ones.

Nothing in one case can stop the run: what this reader cannot make of a case fails that case.
"""

from __future__ import annotations

import argparse
import codecs
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import yaml

from gpu_exporter.alerting.rules import promql, promql_functions
from gpu_exporter.alerting.rules.series_notation import parse_series, parse_values
from gpu_exporter.alerting.store import Labels, SeriesStore, is_stale

HERE = Path(__file__).resolve().parent
SUITE = HERE / "prometheus-3.14"
DIFFERENCES = SUITE / "differences.yaml"
REPORT = SUITE / "REPORT.md"
TAG = "v3.14.0"
BEGIN = "<!-- conformance:3:begin -->"
END = "<!-- conformance:3:end -->"

LOOKBACK_SECONDS = 300.0  # promqltest's engine: LookbackDelta 0, the 5m default
SUBQUERY_STEP_SECONDS = 60.0  # NoStepSubqueryIntervalFn: 1m
EPSILON = 1e-6  # promqltest's defaultEpsilon
AUTO = "auto: "  # reasons --update may rewrite; any other reason is kept as written


class FormatError(ValueError):
    """Text of a test file this reader does not understand."""


# --- skip reasons ------------------------------------------------------------------------------


class Skip:
    """Why a case is not run (or, for DELAYED, not counted as a daemon failure)."""

    NATIVE = "native histograms"
    EXPERIMENTAL = "experimental functions"
    DURATION = "duration expressions"
    EXTENDED = "extended range selectors (anchored, smoothed)"
    FILL = "fill modifiers of binary operators"
    LIMIT = "limitk and limit_ratio"
    TYPE_UNIT = "type-and-unit labels"
    START_TS = "start timestamps"
    DELAYED = "delayed name removal"
    RESULT = "range-vector or string results"
    RANGE_AT = "@ start()/end() in range queries"


# Why the daemon leaves each out, for the report.
WHY = {
    Skip.NATIVE: "the daemon stores float samples only",
    Skip.EXPERIMENTAL: "behind --enable-feature=promql-experimental-functions",
    Skip.DURATION: "behind --enable-feature=promql-duration-expr",
    Skip.EXTENDED: "behind --enable-feature=promql-extended-range-selectors",
    Skip.FILL: "behind --enable-feature=promql-binop-fill-modifiers",
    Skip.LIMIT: "experimental aggregations, behind promql-experimental-functions",
    Skip.TYPE_UNIT: "`__type__`/`__unit__` labels, which the daemon's series never carry",
    Skip.START_TS: "the daemon's store keeps no start timestamps",
    Skip.DELAYED: "the suite's engine enables EnableDelayedNameRemoval, a feature flag; hand-"
    "classified in differences.yaml and checked to still fail",
    Skip.RESULT: "a rule's result is an instant vector or a scalar",
    Skip.RANGE_AT: "the daemon runs instant queries: there start() = end() = the eval time",
}

# Files about a feature the daemon leaves out, whole.
WHOLE_FILES = {
    "native_histograms.test": Skip.NATIVE,
    "extended_vectors.test": Skip.EXTENDED,
    "fill-modifier.test": Skip.FILL,
    "info.test": Skip.EXPERIMENTAL,
    "limit.test": Skip.LIMIT,
    "start_timestamps.test": Skip.START_TS,
    "type_and_unit.test": Skip.TYPE_UNIT,
}

# Hand-written reasons in differences.yaml with these prefixes reclassify a failure.
HAND_SKIPS = {"needs delayed name removal:": Skip.DELAYED}

# promql/parser/functions.go at v3.14.0: the functions with Experimental: true.
EXPERIMENTAL_FUNCTIONS = frozenset(
    {
        "double_exponential_smoothing", "end", "histogram_quantiles", "info", "mad_over_time",
        "max_of", "min_of", "range", "sort_by_label", "sort_by_label_desc", "start",
        "start_timestamp", "step", "ts_of_first_over_time", "ts_of_last_over_time",
        "ts_of_max_over_time", "ts_of_min_over_time",
    }
)  # fmt: skip
NATIVE_FUNCTIONS = promql.NATIVE_HISTOGRAM_FUNCTIONS | {"histogram_quantiles"}


# --- the file format ---------------------------------------------------------------------------

_SPACE = re.compile(r"[\t ]+")
_LOAD = re.compile(r"^load(?:_(with_nhcb))?\s+(.+?)$")
_EVAL_INSTANT = re.compile(
    r"^eval(?:_(fail|warn|ordered|info))?\s+instant\s+(?:at\s+(.+?))?\s+(.+)$"
)
_EVAL_RANGE = re.compile(
    r"^eval(?:_(fail|warn|info))?\s+range\s+from\s+(.+)\s+to\s+(.+)\s+step\s+(.+?)\s+(.+)$"
)
_EXPECT = re.compile(r"^expect\s+(ordered|fail|warn|no_warn|info|no_info)(?:\s+(regex|msg):(.+))?$")
_RANGE_VECTOR = "expect range vector"
_EXPECT_STRING = "expect string"
_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_DURATION_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_GO_INT = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[oO]?[0-7]*|0[bB][01]+|[1-9][0-9]*)")


def parse_duration(text: str) -> int:
    """model.ParseDuration, in milliseconds."""
    if text == "0":
        return 0
    match = _DURATION.match(text)
    if not text or match is None:
        raise FormatError(f"not a duration: {text!r}")
    return sum(int(g) * ms for g, ms in zip(match.groups(), _DURATION_MS, strict=True) if g)


def parse_number(text: str) -> float:
    """promqltest's parseNumber: strconv.ParseInt(s, 0, 64), else strconv.ParseFloat."""
    if _GO_INT.fullmatch(text):
        digits = text.lstrip("+-")
        base = 8 if len(digits) > 1 and digits[0] == "0" and digits[1] in "01234567oO" else 0
        value = int(text, base) if base else int(text, 0)
        if -(1 << 63) <= value < (1 << 63):
            return float(value)
    if "_" in text or text.strip() != text or not text:
        raise FormatError(f"not a number: {text!r}")
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return float.fromhex(text)
    except ValueError:
        raise FormatError(f"not a number: {text!r}") from None


@dataclass(frozen=True)
class SeriesLine:
    line: int  # 1-based, as all lines here
    labels: Labels
    values: tuple[float | None, ...]  # None: no sample (`_`)


@dataclass(frozen=True)
class Load:
    line: int
    step_ms: int
    nhcb: bool
    series: tuple[SeriesLine, ...]
    histogram_names: frozenset[str]  # metrics with native-histogram samples
    start_timestamps: bool
    errors: tuple[str, ...]  # series lines this reader could not read


@dataclass(frozen=True)
class Clear:
    line: int


@dataclass(frozen=True)
class BadLine:
    """A line outside any command: promqltest would refuse the whole file."""

    line: int
    error: str


@dataclass(frozen=True)
class Expected:
    line: int
    labels: Labels
    values: tuple[float | None, ...]


@dataclass(frozen=True)
class Case:
    file: str
    line: int
    expr: str
    start_ms: int  # an instant eval's time
    end_ms: int | None = None  # range evals only
    step_ms: int | None = None
    fail: bool = False
    fail_message: str | None = None
    fail_regex: str | None = None
    ordered: bool = False
    annotations: tuple[str, ...] = ()  # expect warn/info/no_warn/no_info lines (not checked)
    range_vector: bool = False  # `expect range vector`
    string: str | None = None  # `expect string`
    scalar: float | None = None
    expected: tuple[Expected, ...] = ()
    histogram_values: bool = False  # an expected value is a native histogram
    error: str | None = None  # what this reader could not make of the case

    @property
    def name(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def is_range(self) -> bool:
        return self.end_ms is not None

    def steps(self) -> range:
        assert self.end_ms is not None and self.step_ms
        return range(self.start_ms, self.end_ms + 1, self.step_ms)


Command = Load | Clear | BadLine | Case


def lines_of(text: str) -> list[str]:
    """getLines: trimmed, comments blank."""
    out = []
    for raw in text.split("\n"):
        line = raw.strip()
        out.append("" if line.startswith("#") else line)
    return out


def parse_file(name: str, text: str) -> list[Command]:
    lines = lines_of(text)
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        word = _SPACE.split(line, maxsplit=1)[0].lower() if line else ""
        if not line:
            i += 1
            continue
        if word == "clear":
            commands.append(Clear(i + 1))
        elif word.startswith("load"):
            i, load = _parse_load(lines, i)
            commands.append(load)
        elif word.startswith("eval"):
            i, case = _parse_eval(name, lines, i)
            commands.append(case)
        else:
            commands.append(BadLine(i + 1, f"invalid command {line!r}"))
        i += 1
    return commands


def _block(lines: list[str], i: int) -> Iterator[int]:
    """Indexes of the lines after line i up to the next blank one."""
    j = i + 1
    while j < len(lines) and lines[j]:
        yield j
        j += 1


def split_series(text: str) -> tuple[str, str]:
    """`metric{labels} values` -> the series and the values, as written."""
    i, n = 0, len(text)
    while i < n and text[i] not in "{ \t":
        i += 1
    if i < n and text[i] == "{":
        i = _after_braces(text, i)
    return text[:i], text[i:].strip()


def _after_braces(text: str, i: int) -> int:
    quote = None
    j = i + 1
    while j < len(text):
        ch = text[j]
        if quote:
            if ch == "\\" and quote != "`":
                j += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'`":
            quote = ch
        elif ch == "}":
            return j + 1
        j += 1
    raise FormatError(f"unclosed '{{' in {text!r}")


def _parse_load(lines: list[str], i: int) -> tuple[int, Load]:
    match = _LOAD.match(lines[i])
    header_error = None
    step_ms = 0
    try:
        if match is None:
            raise FormatError("invalid load command")
        step_ms = parse_duration(match.group(2))
    except FormatError as exc:
        header_error = f"line {i + 1}: {exc}"
    series: dict[Labels, SeriesLine] = {}
    hist: set[str] = set()
    errors: list[str] = [header_error] if header_error else []
    start_ts = False
    j = i
    for j in _block(lines, i):
        first = _SPACE.split(lines[j], maxsplit=1)[0]
        if first.endswith("@st"):
            start_ts = True
            continue
        try:
            labels, values = _load_series(lines[j])
        except (FormatError, promql.PromQLError) as exc:
            errors.append(f"line {j + 1}: {exc}")
            continue
        if values is None:
            hist.add(_name(labels))
            continue
        series[labels] = SeriesLine(j + 1, labels, values)
    if match is not None and match.group(1):
        hist |= {_nhcb_base(_name(labels)) for labels in series}
    load = Load(i + 1, step_ms, bool(match and match.group(1)), tuple(series.values()),
                frozenset(hist - {""}), start_ts, tuple(errors))  # fmt: skip
    return j, load


def _load_series(text: str) -> tuple[Labels, tuple[float | None, ...] | None]:
    """A load's series line; None values for a native-histogram series."""
    metric, values = split_series(text)
    labels = series_labels(metric)
    if "{{" in values:
        return labels, None
    return labels, tuple(parse_values(values))


def series_labels(metric: str) -> Labels:
    """The labels of `metric{labels}`; promqltest also accepts `{}`."""
    if re.fullmatch(r"\{\s*\}", metric):
        return ()
    return parse_series(metric)


def _name(labels: Labels) -> str:
    return dict(labels).get("__name__", "")


def _nhcb_base(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return ""


@dataclass
class _EvalHeader:
    expr: str
    start_ms: int
    end_ms: int | None
    step_ms: int | None
    mod: str


def _parse_header(line: str) -> _EvalHeader:
    instant = _EVAL_INSTANT.match(line)
    if instant:
        at = parse_duration(instant.group(2) or "")
        return _EvalHeader(instant.group(3), at, None, None, instant.group(1) or "")
    ranged = _EVAL_RANGE.match(line)
    if ranged is None:
        raise FormatError(f"invalid evaluation command {line!r}")
    start, end, step = (parse_duration(ranged.group(k)) for k in (2, 3, 4))
    if end < start:
        raise FormatError("end timestamp before start timestamp")
    if step <= 0:
        raise FormatError("zero step")  # a range query refuses it
    return _EvalHeader(ranged.group(5), start, end, step, ranged.group(1) or "")


def _parse_eval(file: str, lines: list[str], i: int) -> tuple[int, Case]:
    """An eval command and its expectations; a problem makes it an unreadable case."""
    end = max(_block(lines, i), default=i)
    try:
        header = _parse_header(lines[i])
    except FormatError as exc:
        return end, Case(file, i + 1, lines[i], 0, error=str(exc))
    builder = _CaseBuilder(file, i + 1, header)
    j = i
    try:
        for j in _block(lines, i):
            if builder.add(lines[j], j + 1):
                break  # a scalar or a legacy fail line ends the block, as in test.go
    except (FormatError, promql.PromQLError) as exc:
        return end, builder.case(error=f"line {j + 1}: {exc}")
    return j, builder.case()


@dataclass
class _CaseBuilder:
    file: str
    line: int
    header: _EvalHeader
    fields: dict[str, object] = field(default_factory=dict)
    expected: dict[Labels, Expected] = field(default_factory=dict)
    annotations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        mod = self.header.mod
        self.fields["fail"] = mod == "fail"
        self.fields["ordered"] = mod == "ordered"
        if mod in ("warn", "info"):
            self.annotations.append(f"eval_{mod}")

    def add(self, text: str, line: int) -> bool:
        """One expectation line; True when it ends the block."""
        if self.fields["fail"] and text.startswith("expected_fail_message"):
            self.fields["fail_message"] = text.removeprefix("expected_fail_message").strip()
            return True
        if self.fields["fail"] and text.startswith("expected_fail_regexp"):
            self.fields["fail_regex"] = _checked_regex(
                text.removeprefix("expected_fail_regexp").strip()
            )
            return True
        if text.startswith(_RANGE_VECTOR):
            self.fields["range_vector"] = True
            return False
        if text.startswith(_EXPECT_STRING):
            self.fields["string"] = text.removeprefix(_EXPECT_STRING).strip()
            return False
        if text.split(" ")[0] == "expect":
            self._expect(text)
            return False
        try:
            self.fields["scalar"] = parse_number(text)
            return True
        except FormatError:
            pass
        self._series(text, line)
        return False

    def _expect(self, text: str) -> None:
        match = _EXPECT.match(text.strip())
        if match is None:
            raise FormatError(f"invalid expect statement {text!r}")
        kind, how, what = match.groups()
        if kind == "ordered":
            self.fields["ordered"] = True
        elif kind == "fail":
            self.fields["fail"] = True
            if how == "msg":
                self.fields["fail_message"] = what.strip()
            elif how == "regex":
                self.fields["fail_regex"] = _checked_regex(what.strip())
        else:
            self.annotations.append(text)

    def _series(self, text: str, line: int) -> None:
        metric, values = split_series(text)
        labels = series_labels(metric)
        if "{{" in values:  # a native histogram: the case is skipped
            self.fields["histogram_values"] = True
            self.expected[labels] = Expected(line, labels, (0.0,))
            return
        parsed = tuple(parse_values(values))
        if len(parsed) > 1 and self.header.end_ms is None and not self.fields.get("range_vector"):
            raise FormatError("multiple values in an instant evaluation")
        self.expected[labels] = Expected(line, labels, parsed)

    def case(self, error: str | None = None) -> Case:
        h = self.header
        fields = dict(self.fields)
        return Case(
            self.file, self.line, h.expr, h.start_ms, h.end_ms, h.step_ms,
            annotations=tuple(self.annotations), expected=tuple(self.expected.values()),
            error=error, **fields,  # type: ignore[arg-type]
        )  # fmt: skip


def _checked_regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise FormatError(f"invalid regex {pattern!r}: {exc}") from None
    return pattern


# --- what a case needs -------------------------------------------------------------------------

_STRING = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`""")
_CALL = re.compile(r"([A-Za-z_][\w:]*)\s*\(")
_IDENT = re.compile(r"(?<![\w:])[A-Za-z_:][\w:]*")
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_PLAIN_RANGE = re.compile(r"\s*[\w.]+\s*(?::\s*[\w.]*\s*)?")
_OFFSET_EXPR = re.compile(r"\boffset\s*[-+]?\s*\(", re.I)
_NAME_REGEX = re.compile(r"""__name__\s*=~\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)""")


def _code(expr: str) -> str:
    """`expr` with its string literals emptied, for looking at its syntax."""
    return _STRING.sub('""', expr)


def _calls(code: str) -> Iterator[tuple[str, bool]]:
    """Function names called, and whether the call follows `@` (then it is a modifier)."""
    for match in _CALL.finditer(code):
        before = code[: match.start()].rstrip()
        yield match.group(1).lower(), before.endswith("@")


def feature_needed(case: Case, histograms: frozenset[str]) -> str | None:
    """The Skip reason for a case, from its file, its syntax and its data."""
    if case.file in WHOLE_FILES:
        return WHOLE_FILES[case.file]
    code = _code(case.expr)
    calls = [(name, at) for name, at in _calls(code)]
    names = {name for name, at in calls if not at}
    if names & {"step", "range", "min_of", "max_of"} or _duration_syntax(code):
        return Skip.DURATION
    if re.search(r"\b(anchored|smoothed)\b", code):
        return Skip.EXTENDED
    if names & {"fill", "fill_left", "fill_right"}:
        return Skip.FILL
    if names & {"limitk", "limit_ratio"}:
        return Skip.LIMIT
    if "__type__" in case.expr or "__unit__" in case.expr:
        return Skip.TYPE_UNIT
    if case.histogram_values or names & NATIVE_FUNCTIONS:
        return Skip.NATIVE
    if names & EXPERIMENTAL_FUNCTIONS:
        return Skip.EXPERIMENTAL
    if case.range_vector or case.string is not None:
        return Skip.RESULT
    if case.is_range and any(at and name in ("start", "end") for name, at in calls):
        return Skip.RANGE_AT
    return None


def _duration_syntax(code: str) -> bool:
    """Arithmetic in a range or subquery bracket, or a parenthesised offset."""
    if _OFFSET_EXPR.search(code):
        return True
    return any(not _PLAIN_RANGE.fullmatch(m.group(1)) for m in _BRACKETS.finditer(code))


def reads_histograms(expr: str, histograms: frozenset[str]) -> bool:
    """Whether `expr` may select a native-histogram series of the loaded ones."""
    if not histograms:
        return False
    if set(_IDENT.findall(_code(expr))) & histograms:
        return True
    literals = [_unquote(m.group(0)) for m in _STRING.finditer(expr)]
    if set(literals) & histograms:
        return True  # a quoted metric name: {"name"}
    for m in _NAME_REGEX.finditer(expr):
        try:
            pattern = re.compile(_unquote(m.group(1)), re.S)
        except re.error:
            return True
        if any(pattern.fullmatch(name) for name in histograms):
            return True
    return False


def _unquote(literal: str) -> str:
    """A PromQL string literal's value (close enough to Go's strconv.Unquote for matching)."""
    body = literal[1:-1]
    if literal[0] == "`":
        return body
    try:
        return codecs.decode(body, "unicode_escape")
    except UnicodeDecodeError:
        return body


# --- running -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    case: Case
    verdict: str  # "pass", "fail" or "skip"
    reason: str = ""  # skip: a Skip reason; fail: what went wrong
    mismatch: str | None = None  # the daemon's first disagreement, when the case ran
    notes: tuple[str, ...] = ()

    @property
    def ran(self) -> bool:
        return self.verdict != "skip" or self.mismatch is not None

    @property
    def auto_reason(self) -> str:
        return AUTO + _one_line(self.mismatch or self.reason)


@dataclass
class _Segment:
    """The storage since the last `clear`."""

    store: SeriesStore = field(default_factory=lambda: SeriesStore(retention_seconds=math.inf))
    histograms: frozenset[str] = frozenset()
    errors: tuple[str, ...] = ()

    def load(self, load: Load) -> None:
        for series in load.series:
            for k, value in enumerate(series.values):
                if value is not None:
                    self.store.append(series.labels, k * load.step_ms / 1000, value)
        self.histograms |= load.histogram_names
        self.errors += load.errors


def run_commands(
    commands: Sequence[Command],
    semantics: promql.Semantics,
    differences: dict[str, str] | None = None,
    select: Callable[[Case], bool] | None = None,
) -> list[Outcome]:
    """Run a file's commands in order; `select` limits which cases are evaluated."""
    segment = _Segment()
    outcomes = []
    for command in commands:
        if isinstance(command, Clear):
            segment = _Segment()
        elif isinstance(command, Load):
            segment.load(command)
        elif isinstance(command, Case) and (select is None or select(command)):
            outcome = run_case(command, segment, semantics)
            outcomes.append(_reclassify(outcome, differences or {}))
    return outcomes


def _reclassify(outcome: Outcome, differences: dict[str, str]) -> Outcome:
    """What differences.yaml says overrides the attribution of a failure: listed as needing
    a left-out feature, it counts with the skipped cases; a case reading native histograms
    (skipped when it fails) listed with any other reason counts as a daemon failure."""
    reason = differences.get(outcome.case.name)
    if reason is None or outcome.mismatch is None:
        return outcome
    hand_skip = next((s for p, s in HAND_SKIPS.items() if reason.startswith(p)), None)
    case, mismatch, notes = outcome.case, outcome.mismatch, outcome.notes
    if outcome.verdict == "fail" and hand_skip is not None:
        return Outcome(case, "skip", hand_skip, mismatch, notes)
    if outcome.reason == Skip.NATIVE and hand_skip is None:
        return Outcome(case, "fail", mismatch, mismatch, (*notes, "reads native histograms"))
    return outcome


def run_case(case: Case, segment: _Segment, semantics: promql.Semantics) -> Outcome:
    if case.error is not None:
        return Outcome(case, "fail", f"unreadable case: {case.error}")
    skip = feature_needed(case, segment.histograms)
    if skip is not None:
        return Outcome(case, "skip", skip)
    if segment.errors:
        return Outcome(case, "fail", f"input did not load: {segment.errors[0]}")
    outcome = _run(case, segment.store, semantics)
    if outcome.verdict == "fail" and reads_histograms(case.expr, segment.histograms):
        # Run without the native-histogram series it reads: only a pass says something.
        return Outcome(case, "skip", Skip.NATIVE, outcome.mismatch, outcome.notes)
    return outcome


def _run(case: Case, store: SeriesStore, semantics: promql.Semantics) -> Outcome:
    notes = _notes(case)
    try:
        result = _evaluate(case, store, semantics)
    except promql.UnsupportedConstruct:
        return Outcome(case, "skip", Skip.NATIVE)
    except promql.PromQLError as exc:
        return _on_error(case, str(exc), notes)
    except Exception as exc:  # a crash in the evaluator fails this case only
        return _failed(case, f"crash: {type(exc).__name__}: {exc}", notes)
    if case.fail:
        return _failed(case, f"expected an error, got {_describe(result)}", notes)
    mismatch = compare(case, result)
    if mismatch is not None:
        return _failed(case, mismatch, notes)
    if case.ordered and isinstance(result, list) and not _same_order(case, result):
        notes += ("order differs (not checked)",)
    return Outcome(case, "pass", notes=notes)


def _failed(case: Case, mismatch: str, notes: tuple[str, ...]) -> Outcome:
    return Outcome(case, "fail", mismatch, mismatch, notes)


def _notes(case: Case) -> tuple[str, ...]:
    if case.annotations:
        return ("annotations not checked",)
    return ()


def _on_error(case: Case, message: str, notes: tuple[str, ...]) -> Outcome:
    if not case.fail:
        return _failed(case, f"error: {message}", notes)
    wrong_message = case.fail_message is not None and case.fail_message != message
    if wrong_message or (case.fail_regex is not None and not re.search(case.fail_regex, message)):
        notes += (f"error message differs: {message!r}",)
    return Outcome(case, "pass", notes=notes)


Result = list[promql.Element] | float | dict[Labels, list[tuple[int, float]]]


def _evaluate(case: Case, store: SeriesStore, semantics: promql.Semantics) -> Result:
    expr = promql.parse(case.expr, semantics)

    def at(ms: int) -> list[promql.Element] | float:
        return promql.evaluate(
            expr, store, ms / 1000, lookback=LOOKBACK_SECONDS, semantics=semantics,
            subquery_step=SUBQUERY_STEP_SECONDS,
        )  # fmt: skip

    if not case.is_range:
        return at(case.start_ms)
    matrix: dict[Labels, list[tuple[int, float]]] = {}
    for ms in case.steps():
        value = at(ms)
        elements = [promql.Element((), value)] if isinstance(value, float) else value
        for element in elements:
            matrix.setdefault(element.labels, []).append((ms, element.value))
    return matrix


# --- comparing ---------------------------------------------------------------------------------


def almost_equal(a: float, b: float, epsilon: float = EPSILON) -> bool:
    """util/almost.Equal: the evaluator's (promql_functions), plus its staleness rule: a
    staleness marker equals only another."""
    if is_stale(a) or is_stale(b):
        return is_stale(a) and is_stale(b)
    return promql_functions.almost_equal(a, b, epsilon)


def compare(case: Case, result: Result) -> str | None:
    """The first way `result` differs from what the case expects, or None."""
    if isinstance(result, dict):
        return _compare_matrix(case, result)
    if case.scalar is not None:
        if not isinstance(result, float):
            return f"expected scalar {fmt(case.scalar)}, got vector {_describe(result)}"
        if not almost_equal(case.scalar, result):
            return f"expected scalar {fmt(case.scalar)}, got {fmt(result)}"
        return None
    if isinstance(result, float):
        return f"expected a vector, got scalar {fmt(result)}"
    return _compare_vector(case, result)


def _compare_vector(case: Case, result: list[promql.Element]) -> str | None:
    expected = {e.labels: e.values[0] if e.values else None for e in case.expected}
    for element in result:
        if element.labels not in expected:
            return f"unexpected {fmt_labels(element.labels)} {fmt(element.value)}"
        want = expected[element.labels]
        want = 0.0 if want is None else want
        if not almost_equal(want, element.value):
            return f"{fmt_labels(element.labels)}: expected {fmt(want)}, got {fmt(element.value)}"
    got = {element.labels for element in result}
    for labels, value in expected.items():
        if labels not in got:
            return f"missing {fmt_labels(labels)} {fmt(0.0 if value is None else value)}"
    return None


def _compare_matrix(case: Case, result: dict[Labels, list[tuple[int, float]]]) -> str | None:
    if case.scalar is not None:
        return "expected scalar result, got a matrix"
    assert case.end_ms is not None and case.step_ms
    expected = {e.labels: e for e in case.expected}
    for labels, points in sorted(result.items()):
        if labels not in expected:
            return f"unexpected {fmt_labels(labels)} {_points(points)}"
        want = [
            (case.start_ms + k * case.step_ms, v)
            for k, v in enumerate(expected[labels].values)
            if v is not None
        ]
        if want and want[-1][0] > case.end_ms:
            return f"{fmt_labels(labels)}: more points expected than the range has"
        if [t for t, _ in want] != [t for t, _ in points] or not all(
            almost_equal(w, g) for (_, w), (_, g) in zip(want, points, strict=True)
        ):
            return f"{fmt_labels(labels)}: expected {_points(want)}, got {_points(points)}"
    for labels in expected:
        if labels not in result:
            return f"missing {fmt_labels(labels)}"
    return None


def _same_order(case: Case, result: list[promql.Element]) -> bool:
    return [e.labels for e in result] == [e.labels for e in case.expected]


def fmt(value: float) -> str:
    if is_stale(value):
        return "StaleNaN"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def fmt_labels(labels: Labels) -> str:
    name = _name(labels)
    rest = ", ".join(f"{k}={_quote(v)}" for k, v in labels if k != "__name__")
    return f"{name}{{{rest}}}"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _points(points: Iterable[tuple[int, float]]) -> str:
    return "[" + " ".join(f"{fmt(v)}@{t / 1000:g}s" for t, v in points) + "]"


def _describe(result: Result) -> str:
    if isinstance(result, float):
        return f"scalar {fmt(result)}"
    if isinstance(result, dict):
        items = [f"{fmt_labels(k)} {_points(v)}" for k, v in sorted(result.items())]
    else:
        items = [f"{fmt_labels(e.labels)} {fmt(e.value)}" for e in result]
    shown = ", ".join(items[:3]) + (f", ... ({len(items)} in all)" if len(items) > 3 else "")
    return f"[{shown}]"


def _one_line(text: str, limit: int = 220) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- the suite ---------------------------------------------------------------------------------


@dataclass
class Results:
    semantics: str
    outcomes: list[Outcome]
    bad_lines: list[tuple[str, BadLine]]
    seconds: float

    def by_name(self) -> dict[str, Outcome]:
        return {o.case.name: o for o in self.outcomes}

    def failures(self) -> list[Outcome]:
        """Cases the daemon fails, the hand-reclassified ones included."""
        return [o for o in self.outcomes if o.verdict == "fail" or o.reason == Skip.DELAYED]


def suite_files(suite: Path = SUITE) -> list[Path]:
    return sorted(suite.glob("*.test"))


def parse_suite(suite: Path = SUITE) -> dict[str, list[Command]]:
    return {path.name: parse_file(path.name, path.read_text()) for path in suite_files(suite)}


def run_suite(
    semantics: promql.Semantics = promql.PROMETHEUS_3,
    differences: dict[str, str] | None = None,
    parsed: dict[str, list[Command]] | None = None,
) -> Results:
    started = time.perf_counter()
    parsed = parse_suite() if parsed is None else parsed
    differences = load_differences() if differences is None else differences
    outcomes: list[Outcome] = []
    bad: list[tuple[str, BadLine]] = []
    for name, commands in parsed.items():
        outcomes += run_commands(commands, semantics, differences)
        bad += [(name, c) for c in commands if isinstance(c, BadLine)]
    return Results(semantics.name, outcomes, bad, time.perf_counter() - started)


def count_evals(suite: Path = SUITE) -> int:
    """Eval commands in the files, counted without this module's parser."""
    pattern = re.compile(r"^\s*eval(_\w+)?\s", re.M)
    return sum(len(pattern.findall(path.read_text())) for path in suite_files(suite))


# --- differences.yaml --------------------------------------------------------------------------

_HEADER = """\
# Cases of prometheus-3.14/*.test the daemon fails under its Prometheus 3 semantics:
# `<file>:<line>` of the eval -> one-line reason. Rewritten by
# `python -m tests.promql.upstream.promqltest --update`, which drops cases that pass now,
# adds new failures and refreshes reasons starting 'auto: '; other reasons are kept as
# written. A reason starting 'needs delayed name removal:' counts the case as needing that
# feature flag (the suite's engine enables it), not as a daemon failure.
"""


def load_differences(path: Path = DIFFERENCES) -> dict[str, str]:
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    return {str(k): str(v) for k, v in data.items()}


def updated_differences(results: Results, old: dict[str, str]) -> dict[str, str]:
    new = {}
    for outcome in results.failures():
        name = outcome.case.name
        kept = old.get(name, "")
        new[name] = kept if kept and not kept.startswith(AUTO) else outcome.auto_reason
    return new


def _case_key(name: str) -> tuple[str, int]:
    file, _, line = name.rpartition(":")
    return file, int(line) if line.isdigit() else 0


def render_differences(differences: dict[str, str]) -> str:
    lines = [_HEADER]
    for name in sorted(differences, key=_case_key):
        lines.append(f"{_yaml_str(name)}: {_yaml_str(differences[name])}")
    if not differences:
        lines.append("{}")
    return "\n".join(lines) + "\n"


def _yaml_str(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


# --- the report --------------------------------------------------------------------------------


def counts(results: Results) -> Counter[str]:
    c: Counter[str] = Counter()
    for outcome in results.outcomes:
        c["cases"] += 1
        c[outcome.verdict] += 1
        if outcome.verdict == "skip":
            c[f"skip: {outcome.reason}"] += 1
        if outcome.ran:
            c["run"] += 1
    return c


def print_counts(results: Results, out: TextIO = sys.stdout) -> None:
    c = counts(results)
    print(f"semantics {results.semantics}: {c['cases']} cases, {c['run']} evaluated, "
          f"{c['pass']} pass, {c['fail']} fail, {c['skip']} skipped "
          f"({results.seconds:.1f}s)", file=out)  # fmt: skip
    for file, row in _per_file(results).items():
        print(f"  {file:28} " + "  ".join(f"{k} {v:4}" for k, v in row.items()), file=out)
    for key, value in sorted(c.items()):
        if key.startswith("skip: "):
            print(f"  skipped, {key[6:]}: {value}", file=out)
    for file, bad in results.bad_lines:
        print(f"  {file}:{bad.line}: unreadable line: {bad.error}", file=out)


def _per_file(results: Results) -> dict[str, dict[str, int]]:
    rows: dict[str, dict[str, int]] = {}
    for o in results.outcomes:
        row = rows.setdefault(
            o.case.file, dict.fromkeys(("cases", "run", "pass", "fail", "skip"), 0)
        )
        row["cases"] += 1
        row[o.verdict] += 1
        row["run"] += o.ran
    return rows


def render_report(p3: Results, p2: Results, differences: dict[str, str]) -> str:
    parts = [BEGIN, *_report_summary(p3), *_report_files(p3), *_report_notes(p3),
             *_report_p2(p3, p2), *_report_failures(p3, differences), END]  # fmt: skip
    return "\n".join(parts) + "\n"


def _report_summary(results: Results) -> list[str]:
    c = counts(results)
    lines = [
        f"### Prometheus {TAG[1:]}'s own PromQL tests",
        "",
        f"The 21 files of `promql/promqltest/testdata` at {TAG}, vendored in",
        "`tests/promql/upstream/prometheus-3.14/`, run in-process through the evaluator with its",
        "Prometheus 3 semantics (5m lookback, 1m default subquery step, as promqltest's engine;",
        "a range eval as one instant query per step). Regenerate with",
        "`python -m tests.promql.upstream.promqltest --update --write-report "
        "tests/promql/upstream/prometheus-3.14/REPORT.md`.",
        "",
        "| | cases |",
        "|---|---:|",
        f"| eval commands | {c['cases']} |",
        f"| evaluated by the daemon | {c['run']} |",
        f"| pass | {c['pass']} |",
        f"| fail (listed in `differences.yaml`) | {c['fail']} |",
    ]
    skips = sorted((k[6:], v) for k, v in c.items() if k.startswith("skip: "))
    lines += [f"| skipped, needs {reason}: {WHY[reason]} | {n} |" for reason, n in skips]
    return [*lines, ""]


def _report_files(results: Results) -> list[str]:
    lines = [
        "| file | cases | evaluated | pass | fail | skipped |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for file, r in _per_file(results).items():
        lines.append(f"| {file} | {r['cases']} | {r['run']} | {r['pass']} | {r['fail']} | "
                     f"{r['skip']} |")  # fmt: skip
    return [*lines, ""]


def _report_notes(results: Results) -> list[str]:
    ran = [o for o in results.outcomes if o.ran]
    annotated = sum(1 for o in ran if o.case.annotations and o.verdict == "pass")
    ordered = [o for o in ran if o.case.ordered]
    order_differs = sum(1 for o in ordered if "order differs (not checked)" in o.notes)
    fail_cases = [o for o in ran if o.case.fail and o.verdict == "pass"]
    named = [o for o in fail_cases if o.case.fail_message or o.case.fail_regex]
    messages = sum(1 for o in named if any("message differs" in n for n in o.notes))
    ranges = sum(1 for o in ran if o.case.is_range)
    after = sum(1 for o in ran if o.verdict == "skip")
    return [
        f"Evaluated includes {after} cases counted as skipped after they failed: those needing "
        "delayed name removal, and those reading native-histogram series that fail without "
        "them (the daemon runs such a case on its float series; only a pass says something). "
        f"{ranges} evaluated cases are range evals (run step by step). "
        f"{annotated} passing cases also expect warnings or infos (or their absence), which "
        "are not results: they pass on their values alone. "
        f"{len(ordered)} expect an order, which is not checked (rule results are sets); in "
        f"{order_differs} of them the daemon's order differs. {len(fail_cases)} pass by "
        f"failing as expected; {len(named)} of them name the error, and {messages} of those "
        "messages differ.",
        "",
    ]


def _report_p2(p3: Results, p2: Results) -> list[str]:
    v3 = {o.case.name: o.verdict for o in p3.outcomes}
    v2 = {o.case.name: o.verdict for o in p2.outcomes}
    only3 = sorted((n for n in v3 if v3[n] == "pass" != v2.get(n)), key=_case_key)
    only2 = sorted((n for n in v3 if v2.get(n) == "pass" != v3[n]), key=_case_key)
    by_file = Counter(_case_key(n)[0] for n in only3)
    files = ", ".join(f"{f} {n}" for f, n in sorted(by_file.items()))
    c2 = counts(p2)
    lines = [
        f"The same files with the Prometheus 2 semantics instead: {c2['pass']} pass, "
        f"{c2['fail']} fail. {len(only3) + len(only2)} cases change verdict with the switch: "
        f"{len(only3)} pass only with the Prometheus 3 semantics ({files}), {len(only2)} only "
        "with the Prometheus 2 ones.",
        "",
    ]
    if only2:
        lines += ["Passing only with the Prometheus 2 semantics: " + _names(only2) + ".", ""]
    return lines


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _report_failures(results: Results, differences: dict[str, str]) -> list[str]:
    lines = [
        "Every case the daemon fails, with its reason from `differences.yaml` (those needing "
        "delayed name removal included):",
        "",
        "| failing case | expression | reason |",
        "|---|---|---|",
    ]
    for o in sorted(results.failures(), key=lambda o: _case_key(o.case.name)):
        reason = differences.get(o.case.name, o.auto_reason)
        lines.append(f"| `{o.case.name}` | {_code_cell(o.case.expr)} | {_cell(reason)} |")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code_cell(text: str) -> str:
    return "`" + _cell(text).replace("`", "'") + "`"


# --- command line ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.promql.upstream.promqltest")
    parser.add_argument("--semantics", default="prometheus3", choices=sorted(promql.SEMANTICS))
    parser.add_argument("--update", action="store_true", help="rewrite differences.yaml")
    parser.add_argument("--write-report", metavar="FILE", type=Path)
    parser.add_argument("--failures", action="store_true", help="print every failing case")
    args = parser.parse_args(argv)
    semantics = promql.SEMANTICS[args.semantics]
    parsed = parse_suite()
    differences = load_differences()
    results = run_suite(semantics, differences, parsed)
    print_counts(results)
    if args.failures:
        _print_failures(results, differences)
    if args.update:
        _require_prometheus3(semantics)
        differences = updated_differences(results, differences)
        DIFFERENCES.write_text(render_differences(differences))
        results = run_suite(semantics, differences, parsed)
        print(f"wrote {DIFFERENCES} ({len(differences)} cases)")
    if args.write_report:
        _require_prometheus3(semantics)
        p2 = run_suite(promql.PROMETHEUS_2, differences, parsed)
        print_counts(p2)
        args.write_report.write_text(render_report(results, p2, differences))
        print(f"wrote {args.write_report}")
    return 0


def _require_prometheus3(semantics: promql.Semantics) -> None:
    if semantics is not promql.PROMETHEUS_3:
        raise SystemExit("--update and --write-report are about the Prometheus 3 semantics")


def _print_failures(results: Results, differences: dict[str, str]) -> None:
    for o in results.failures():
        listed = differences.get(o.case.name)
        print(f"{o.case.name}: {o.case.expr}\n    {o.mismatch or o.reason}"
              + (f"\n    listed: {listed}" if listed else ""))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
