"""What Prometheus and Alertmanager accept as metric and label names, written once.

The patterns are the data model's (prometheus/common model/metric.go `MetricNameRE`, model/labels.go
`LabelNameRE`); Alertmanager's API refuses an alert whose label names do not match them, and
names starting with `__` are reserved for Prometheus' internal use.
"""

from __future__ import annotations

import re

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
LABEL_NAME_RULE = "letters, digits and _, not starting with a digit"  # LABEL_NAME, for a person


def is_metric_name(name: object) -> bool:
    return isinstance(name, str) and METRIC_NAME.fullmatch(name) is not None


def is_label_name(name: object) -> bool:
    return isinstance(name, str) and LABEL_NAME.fullmatch(name) is not None


def label_name_problem(name: object) -> str | None:
    """Why `name` cannot be a label name on an alert, or None when it can."""
    if not is_label_name(name):
        return f"{name!r} is not a valid label name ({LABEL_NAME_RULE})"
    assert isinstance(name, str)
    if name.startswith("__"):
        return f"{name!r} is reserved: names starting with __ are Prometheus' own"
    return None
