"""The values PromQL evaluation passes around, its errors, and the label helpers every part of
the evaluator (operators, functions, aggregations) shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_exporter.alerting.store import Labels

NAME = "__name__"


@dataclass(frozen=True, slots=True)
class Semantics:
    """Which Prometheus' PromQL a query is evaluated as."""

    name: str
    major: int  # 2: Prometheus 2.42; 3: Prometheus 3.x (3.14)
    # Functions known without feature flags.
    functions: frozenset[str]
    # 3.x: range selectors select (t - range, t], the lookback (t - lookback, t], and
    # subquery steps start after t - offset - range.
    left_open: bool = field(init=False)
    # 3.x: `.` in label-matcher and label_replace regexes matches a newline too.
    dot_matches_newline: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "left_open", self.major >= 3)
        object.__setattr__(self, "dot_matches_newline", self.major >= 3)


class PromQLError(ValueError):
    """A query that cannot be parsed, or whose evaluation fails as it would in Prometheus."""


class UnsupportedConstruct(PromQLError):
    """Valid PromQL that the in-process evaluator does not implement."""

    def __init__(self, construct: str):
        super().__init__(f"unsupported PromQL construct: {construct}")
        self.construct = construct


@dataclass(frozen=True, slots=True)
class Element:
    """One sample of an instant vector result."""

    labels: Labels
    value: float


Vector = list[Element]


def drop_name(labels: Labels) -> Labels:
    if labels and any(name == NAME for name, _ in labels):
        return tuple(pair for pair in labels if pair[0] != NAME)
    return labels


def unique(vector: Vector) -> Vector:
    # Prometheus checks every computed instant vector for this after dropping metric names.
    if len(vector) > 1 and len({e.labels for e in vector}) != len(vector):
        raise PromQLError("vector cannot contain metrics with the same labelset")
    return vector


def with_label(labels: Labels, name: str, value: str) -> Labels:
    """`labels` with `name` set to `value`, or removed for an empty value (labels.Builder)."""
    kept = [pair for pair in labels if pair[0] != name]
    if value:
        kept.append((name, value))
        kept.sort()
    return tuple(kept)


def is_label_name(name: str, semantics: Semantics) -> bool:
    """model.LabelName.IsValid: [a-zA-Z_][a-zA-Z0-9_]* in 2.42; 3.x takes any UTF-8 text."""
    if semantics.major >= 3:
        return bool(name)  # a Python str is valid Unicode: UTF-8 once encoded
    if not name or not (name[0].isascii() and (name[0].isalpha() or name[0] == "_")):
        return False
    return all(ch.isascii() and (ch.isalnum() or ch == "_") for ch in name)


def label_value(labels: Labels, name: str) -> str:
    for key, value in labels:
        if key == name:
            return value
    return ""
