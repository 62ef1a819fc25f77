"""Prometheus rule files (`groups:` / `rules:`), validated for what the daemon can evaluate.

The format is Prometheus' own, so the same file goes to `promtool check rules`, into a
PrometheusRule, and into the daemon. On top of promtool's checks, every expression must be
PromQL the chosen Prometheus (`rules.semantics`) accepts (`rules/promql.py`), and every
template within the template subset (`rules/template.py`); anything else is refused with the
file, line, rule and reason. One exception: a rule using native-histogram functions, which the
daemon has no data for, is valid for Prometheus, so its file loads; the rule is kept in its
group's `skipped` (listed, reported, never evaluated) instead of refusing the file.

What Prometheus' rulefmt (model/rulefmt/rulefmt.go, 2.42) or Alertmanager's API (an alert
whose label or annotation names are not label names, or whose values are not UTF-8) would
refuse is refused here, at load, rather than at evaluation or at the first notification; and
labels starting with `__` (Prometheus' own) and an `alertname` label on an alerting rule
(Prometheus replaces it with the rule's name, rules/alerting.go) as well. A rule reading
further back than `max_range_seconds` is refused too: the daemon keeps no more history.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import promql_parser as P
from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag
from pydantic_core import PydanticCustomError

from gpu_exporter.alerting.rules import promql, template, template_cost
from gpu_exporter.alerting.store import DEFAULT_LOOKBACK_SECONDS
from gpu_exporter.model.promnames import is_label_name, is_metric_name, label_name_problem
from gpu_exporter.support.validation import InputError, Wording, validate
from gpu_exporter.support.yamlfile import LocatedYaml, YamlFileError, load_yaml_file

_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_UNITS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
MAX_RANGE_SETTING = "rules.max_range_seconds"
# Only the functions of native histograms (promql.NATIVE_HISTOGRAM_FUNCTIONS: the daemon has
# none; each takes an instant vector last and returns one) make a rule skipped rather than
# refused.
# How /api/v1/rules, the log and `rules check` say that a skipped rule is not evaluated.
NOT_EVALUATED = "not evaluated in the daemon"


class RuleFileError(ValueError):
    """One or more problems in rule files; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# --- the file's shape (Prometheus 2.42 model/rulefmt), validated by pydantic -------------------


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _non_empty(what: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise PydanticCustomError("name", f"{what} must be a non-empty string")
        return value

    return check


def _non_negative(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PydanticCustomError("limit", "must be a non-negative integer")
    return value


def _mapping_or_nothing(value: Any) -> Any:
    if value is not None and not isinstance(value, dict):
        raise PydanticCustomError("mapping", "must be a mapping")
    return value


# A value rulefmt reads as text (`for: 5m`, `expr: 1`); checked by what reads it.
Scalar = Any
Mapping_ = Annotated[dict[Any, Any] | None, BeforeValidator(_mapping_or_nothing)]


class AlertShape(_Shape):
    alert: Annotated[str, BeforeValidator(_non_empty("alert name"))]
    expr: Scalar = None
    for_: Scalar = Field(default=None, alias="for")
    keep_firing_for: Scalar = None
    labels: Mapping_ = None
    annotations: Mapping_ = None


class RecordShape(_Shape):
    record: Annotated[str, BeforeValidator(_non_empty("record name"))]
    expr: Scalar = None
    labels: Mapping_ = None


def _rule_kind(value: Any) -> str | None:
    if isinstance(value, dict) and ("alert" in value) != ("record" in value):
        return "alert" if "alert" in value else "record"
    return None  # pydantic reports the discriminator's custom error


RuleShape = Annotated[
    Annotated[AlertShape, Tag("alert")] | Annotated[RecordShape, Tag("record")],
    Discriminator(
        _rule_kind,
        custom_error_type="rule_kind",
        custom_error_message="a rule is a mapping with exactly one of `alert` or `record`",
    ),
]


class GroupShape(_Shape):
    name: Annotated[str, BeforeValidator(_non_empty("a group's name"))]
    interval: Scalar = None
    limit: Annotated[int, BeforeValidator(_non_negative)] = 0
    rules: list[RuleShape] | None = None


class RuleFileShape(_Shape):
    groups: list[GroupShape] | None = None


_WORDING = Wording(
    unknown_key="key not allowed here; allowed: {known}",
    missing_key="`{key}` is required",
    not_a_mapping="must be a mapping, not {kind}",
    not_a_list="must be a list, not {kind}",
)


def parse_duration(text: str) -> float:
    """Prometheus duration (`1h30m`, `90s`, `0s`, `100ms`) -> seconds."""
    match = _DURATION.match(text) if text else None
    if text == "0":
        return 0.0
    if not match or not any(match.groups()):
        raise ValueError(f"not a duration: {text!r} (expected e.g. 30s, 5m, 1h30m)")
    return float(sum(int(n) * unit for n, unit in zip(match.groups(), _UNITS, strict=True) if n))


@dataclass(frozen=True)
class Rule:
    kind: str  # "alert" or "record"
    name: str
    expr_text: str
    expr: Any = field(repr=False, compare=False)
    for_seconds: float = 0.0
    keep_firing_for_seconds: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    location: str = ""  # file:line, for errors at evaluation time

    @property
    def is_alert(self) -> bool:
        return self.kind == "alert"


@dataclass(frozen=True)
class SkippedRule:
    """A valid rule the daemon loads but never evaluates: Prometheus evaluates it."""

    rule: Rule  # its `expr` is None
    group: str
    position: int  # its index among the group's rules, as written
    construct: str  # what the daemon does not evaluate, e.g. "function histogram_count"
    where: str  # `file:line: groups[0].rules[3].expr`

    @property
    def reason(self) -> str:
        """Its `lastError` in /api/v1/rules."""
        return f"{NOT_EVALUATED}: unsupported PromQL construct: {self.construct}"

    @property
    def message(self) -> str:
        """The line the log and `rules check` give."""
        rule = self.rule
        return f"{self.where}: {rule.kind} {rule.name} in group {self.group!r}: {self.reason}"


@dataclass(frozen=True)
class Group:
    name: str
    file: str
    rules: tuple[Rule, ...]  # the rules the daemon evaluates, in order
    interval_seconds: float | None = None  # None: the evaluator's default interval
    limit: int = 0
    skipped: tuple[SkippedRule, ...] = ()
    # Templates whose estimated cost is high (template_cost.py), each as `file:line: ...`.
    costly: tuple[str, ...] = ()


def skipped_rules(groups: Iterable[Group]) -> list[SkippedRule]:
    return [skipped for group in groups for skipped in group.skipped]


def costly_templates(groups: Iterable[Group]) -> list[str]:
    return [line for group in groups for line in group.costly]


def expand_paths(patterns: Iterable[str | Path]) -> list[Path]:
    """Files named by paths or globs, in order, without duplicates; a pattern matching
    nothing is an error (a typo must not silently disable alerting)."""
    found, missing = _expand(patterns)
    if missing:
        raise RuleFileError(missing)
    return found


def _expand(patterns: Iterable[str | Path]) -> tuple[list[Path], list[str]]:
    """(the files found, a problem for each pattern matching nothing)."""
    found: list[Path] = []
    missing: list[str] = []
    for pattern in patterns:
        text = str(pattern)
        matches = sorted(glob.glob(text)) if glob.has_magic(text) else [text]
        matches = [m for m in matches if Path(m).is_file()]
        if not matches:
            missing.append(f"{text}: no rule file matches")
        for match in matches:
            path = Path(match)
            if path not in found:
                found.append(path)
    return found, missing


@dataclass(frozen=True)
class LoadLimits:
    """What the daemon can evaluate beyond the format: how far back a rule may read (None: no
    limit), with the lookback an instant selector with an offset reads besides."""

    max_range_seconds: float | None = None
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS
    semantics: promql.Semantics = promql.DEFAULT_SEMANTICS  # which Prometheus' PromQL


def load_rule_files(
    patterns: Iterable[str | Path], limits: LoadLimits | None = None
) -> list[Group]:
    """Every group of every file; raises RuleFileError listing every problem found (a pattern
    matching nothing does not hide the problems of the files the others match)."""
    groups: list[Group] = []
    paths, problems = _expand(patterns)
    for path in paths:
        try:
            located = load_yaml_file(path)
        except YamlFileError as exc:
            problems.append(str(exc))
            continue
        file_groups, file_problems = _parse_file(located, limits or LoadLimits())
        groups += file_groups
        problems += file_problems
    if problems:
        raise RuleFileError(problems)
    return groups


def _parse_file(located: LocatedYaml, limits: LoadLimits) -> tuple[list[Group], list[str]]:
    problems: list[str] = []

    def problem(path: tuple, message: str) -> None:
        problems.append(f"{located.where(path)}: {message}")

    if located.data is None:
        return [], []
    try:
        shape = validate(RuleFileShape, located, wording=_WORDING)
    except InputError as exc:
        return [], list(exc.problems)
    groups: list[Group] = []
    seen: set[str] = set()
    for gi, raw in enumerate(shape.groups or ()):
        path = ("groups", gi)
        name = raw.name
        if name in seen:
            problem((*path, "name"), f"group name {name!r} repeated in this file")
        seen.add(name)
        interval = None
        if raw.interval is not None:
            interval = _duration(raw.interval, (*path, "interval"), problem)
            if interval == 0:
                problem((*path, "interval"), "must be greater than 0")
        rules: list[Rule] = []
        skipped: list[SkippedRule] = []
        costly: list[str] = []
        for ri, raw_rule in enumerate(raw.rules or ()):
            rule_path = (*path, "rules", ri)
            parsed = _parse_rule(raw_rule, rule_path, located, problem, limits, costly)
            if parsed is None:
                continue
            rule, construct = parsed
            if construct is None:
                rules.append(rule)
            else:
                where = located.where((*rule_path, "expr"))
                skipped.append(SkippedRule(rule, name, ri, construct, where))
        groups.append(
            Group(
                name, located.filename, tuple(rules), interval, raw.limit, tuple(skipped),
                tuple(costly),
            )
        )  # fmt: skip
    return groups, problems


def _duration(value: Any, path: tuple, problem) -> float:
    try:
        return parse_duration(str(value))
    except ValueError as exc:
        problem(path, str(exc))
        return 0.0


def _parse_rule(
    raw: AlertShape | RecordShape,
    path: tuple,
    located: LocatedYaml,
    problem,
    limits: LoadLimits,
    costly: list[str],
) -> tuple[Rule, str | None] | None:
    """The rule, with the construct that makes the daemon skip it (None: it is evaluated); None
    when it is refused (its problems reported). Templates whose estimated cost is high are
    added to `costly`."""
    kind, name = ("alert", raw.alert) if isinstance(raw, AlertShape) else ("record", raw.record)
    label = f"{kind} {name}"
    if kind == "record" and not is_metric_name(name):
        problem((*path, kind), f"{label}: not a valid metric name")
    if not _is_utf8(name):  # an alert's name is its `alertname` label value
        problem((*path, kind), f"{label}: the name is not valid UTF-8")
    raw_expr = raw.expr
    # A number is an expression too (YAML reads `expr: 1` as one; rulefmt takes its text).
    is_number = isinstance(raw_expr, int | float) and not isinstance(raw_expr, bool)
    expr_text = raw_expr if isinstance(raw_expr, str) else str(raw_expr) if is_number else ""
    expr, skipped_for = None, None
    if not expr_text.strip():
        problem((*path, "expr"), f"{label}: `expr` is required")
    else:
        expr, skipped_for = _parse_expr(
            expr_text, (*path, "expr"), label, problem, limits.semantics
        )
    if expr is not None and limits.max_range_seconds is not None:
        reach = _reach_problem(expr, limits)
        if reach:
            problem((*path, "expr"), f"{label}: {reach}")
    labels = _string_map(raw.labels, (*path, "labels"), label, problem, kind=kind)
    annotations: dict[str, str] = {}
    for_seconds = keep = 0.0
    if isinstance(raw, AlertShape):
        annotations = _string_map(raw.annotations, (*path, "annotations"), label, problem)
        for_seconds = _duration(raw.for_ or "0s", (*path, "for"), problem)
        keep = _duration(raw.keep_firing_for or "0s", (*path, "keep_firing_for"), problem)
    for where, texts in (("labels", labels), ("annotations", annotations)):
        for key, text in texts.items():
            try:
                cost = template_cost.estimate(text)
            except template.TemplateError as exc:
                problem((*path, where, key), f"{label}: template: {exc}")
                continue
            if cost.costly:
                costly.append(f"{located.where((*path, where, key))}: {label}: {cost.describe()}")
    if expr is None and skipped_for is None:
        return None
    return Rule(
        kind, name, expr_text, expr, for_seconds, keep, labels, annotations,
        f"{located.filename}:{located.line_of(path) or '?'}",
    ), skipped_for  # fmt: skip


def _parse_expr(
    text: str, path: tuple, label: str, problem, semantics: promql.Semantics
) -> tuple[Any, str | None]:
    """The parsed expression and None; or None and the construct the daemon skips the rule for;
    or None, None once the reason it is refused has been reported."""
    try:
        return promql.parse(text, semantics), None
    except promql.UnsupportedConstruct as exc:
        refused = _beyond_native_histograms(text, semantics)
        if refused is None:  # the native-histogram calls are all it has outside the subset
            return None, exc.construct
    except promql.PromQLError as exc:
        refused = exc
    if isinstance(refused, promql.UnsupportedConstruct):
        problem(path, f"{label}: unsupported construct: {refused.construct}")
    else:
        problem(path, f"{label}: invalid PromQL: {refused}")
    return None, None


def _beyond_native_histograms(text: str, semantics: promql.Semantics) -> promql.PromQLError | None:
    """What promql.parse refuses in `text` (parsed before) besides its native-histogram calls,
    or None. promql.parse stops at the first unsupported construct, so a bad regex or newer
    PromQL inside such a call would go unnoticed: the calls are replaced by their vector
    arguments, and those and their other arguments checked."""
    others: list[P.Expr] = []

    def unwrap(node: P.Expr) -> P.Expr | None:
        if isinstance(node, P.Call) and node.func.name in promql.NATIVE_HISTOGRAM_FUNCTIONS:
            *scalars, vector = node.args  # its children are unwrapped already
            others.extend(scalars)
            return vector
        return None

    stripped = P.transform(P.parse(text), post_visit=unwrap)
    for expr in (stripped, *others):
        try:
            promql.check_supported(expr, semantics)
        except promql.PromQLError as exc:
            return exc
    return None


def _reach_problem(expr: Any, limits: LoadLimits) -> str | None:
    """Why `expr` reads further back than the limit allows, or None."""
    assert limits.max_range_seconds is not None
    reach = promql.reach_seconds(expr, limits.lookback_seconds)
    if reach <= limits.max_range_seconds:
        return None
    return (
        f"reads {format_duration(reach)} back (a range plus its offset, or an offset plus the "
        f"{format_duration(limits.lookback_seconds)} lookback), more than the "
        f"{format_duration(limits.max_range_seconds)} of history the daemon keeps "
        f"({MAX_RANGE_SETTING}; set it to at least {reach:g} to load this rule)"
    )


def format_duration(seconds: float) -> str:
    """Prometheus' duration spelling (model.Duration): 7d, 1h30m, 90ms."""
    ms = round(seconds * 1000)
    parts = []
    for unit, size in (("y", 365 * 86_400_000), ("w", 7 * 86_400_000), ("d", 86_400_000),
                       ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):  # fmt: skip
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _is_utf8(text: str) -> bool:
    # A YAML escape such as "\ud800" gives a lone surrogate, which no UTF-8 encoder accepts.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _string_map(value: Any, path: tuple, label: str, problem, kind: str | None = None) -> dict:
    """A rule's `labels` (`kind` given: the rule's kind) or `annotations` (None), checked as
    rulefmt and Alertmanager check them."""
    if value is None:
        return {}
    what = "label" if kind else "annotation"
    out = {}
    for key, item in value.items():
        if kind:
            reason = label_name_problem(key)
            if reason is None and key == "alertname" and kind == "alert":
                reason = (
                    "'alertname' is the rule's name: Prometheus replaces this label with it "
                    "(rules/alerting.go)"
                )
        else:
            reason = None if is_label_name(key) else f"{key!r} is not a valid annotation name"
        if reason:
            problem((*path, key), f"{label}: {reason}")
            continue
        if isinstance(item, bool) or item is None or isinstance(item, dict | list):
            problem((*path, key), f"{label}: {what} value must be a string")
            continue
        text = str(item)
        if not _is_utf8(text):
            problem((*path, key), f"{label}: {what} value is not valid UTF-8")
            continue
        out[str(key)] = text
    return out
