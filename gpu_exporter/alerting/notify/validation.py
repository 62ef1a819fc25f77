"""Refuse, before sending, an alert that Alertmanager would refuse, so it never shares a batch.

The checks are those of Alertmanager's API v2 (api/v2/api.go postAlertsHandler, then
types.Alert.Validate, 0.25): at least one label once empty values are removed, label and
annotation names as in the data model, and an end not before the start. Names starting with `__`
are accepted by Alertmanager, so they are not refused here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_exporter.model.promnames import LABEL_NAME_RULE, is_label_name


def payload_problem(payload: Mapping[str, Any]) -> str | None:
    """Why Alertmanager would refuse this postableAlert, or None when it would take it."""
    labels: Mapping[str, str] = payload["labels"]
    if not labels:
        return "no labels (Alertmanager needs at least one)"
    for kind in ("labels", "annotations"):
        for name in payload.get(kind, {}):
            if not is_label_name(name):
                return f"{kind[:-1]} name {name!r} is not valid ({LABEL_NAME_RULE})"
    ends = payload.get("endsAt")
    # Both are format_timestamp's fixed-width UTC text, so text order is time order.
    if ends is not None and ends < payload["startsAt"]:
        return f"endsAt {ends} is before startsAt {payload['startsAt']}"
    return None
