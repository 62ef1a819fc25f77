"""The values PromQL evaluation passes around, its errors, and the label helpers every part of
the evaluator (operators, functions, aggregations) shares."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.store import Labels

NAME = "__name__"


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


def label_value(labels: Labels, name: str) -> str:
    for key, value in labels:
        if key == name:
            return value
    return ""
