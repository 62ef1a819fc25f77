"""Per-GPU health for people (the status page, /api/v1/devices), read from the rule engine.

There is one definition of "unhealthy": the shipped rule pack's `gpu-health` group
(rules/gpu-exporter.rules.yaml: XIDs in the last 10 minutes, uncorrected ECC errors, row remap
pending or failed, retired pages pending, a degraded PCIe link, a lost GPU). A GPU is as
healthy as that group's active alerts for it say: one firing makes it unhealthy, one pending
(waiting out its `for:`) makes it suspect. Nothing here repeats a threshold or an XID list;
without in-daemon rules there is no verdict, and the answer says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpu_exporter.alerting.pack import HEALTH_GROUP  # the pack group that defines health
from gpu_exporter.alerting.rules.manager import NEVER_EVALUATED
from gpu_exporter.model import xids

RULES_DISABLED = "in-daemon rules are disabled (rules.enabled: false): no health verdict"
GROUP_MISSING = f"no rule group named {HEALTH_GROUP!r} is loaded (rules.files): no health verdict"
NOT_YET = f"the {HEALTH_GROUP} rules have not been evaluated yet"


def _problem(rule: str, alert: Mapping[str, Any]) -> dict[str, str]:
    labels = alert.get("labels", {})
    xid = str(labels.get("xid", ""))
    text = f"XID {xid}" if xid else rule
    meaning = xids.meaning(xid)
    return {
        "alertname": rule,
        "state": str(alert.get("state", "")),
        "severity": str(labels.get("severity", "")),
        "text": f"{text}: {meaning}" if meaning else text,
        "summary": str(alert.get("annotations", {}).get("summary", "")),
    }


class HealthView:
    """Each GPU's health from one read of the rule groups (`RuleManager.rules_json()`), or
    from None when in-daemon rules are disabled."""

    def __init__(self, groups: Iterable[Mapping[str, Any]] | None) -> None:
        self._why: str | None = None
        self._problems: dict[str, list[dict[str, str]]] = {}
        if groups is None:
            self._why = RULES_DISABLED
            return
        health = [g for g in groups if g.get("name") == HEALTH_GROUP]
        if not health:
            self._why = GROUP_MISSING
            return
        if all(g.get("lastEvaluation") == NEVER_EVALUATED for g in health):
            self._why = NOT_YET
            return
        for group in health:
            for rule in group.get("rules", []):
                for alert in rule.get("alerts", []) if rule.get("type") == "alerting" else []:
                    gpu = alert.get("labels", {}).get("gpu")
                    if gpu is not None:  # node-wide alerts (GpuCountDropped) belong to no row
                        self._problems.setdefault(str(gpu), []).append(
                            _problem(str(rule.get("name", "")), alert)
                        )

    def of(self, gpu: int) -> dict[str, Any]:
        """`state`: healthy, pending (an alert waits out its `for:`), unhealthy (one fires),
        or unknown (`why` says why); `problems`: the group's active alerts for this GPU,
        firing first."""
        if self._why is not None:
            return {"state": "unknown", "why": self._why, "problems": []}
        unique = {tuple(p.items()): p for p in self._problems.get(str(gpu), [])}
        problems = sorted(
            unique.values(),
            key=lambda p: (p["state"] != "firing", p["alertname"], p["text"]),
        )
        states = {p["state"] for p in problems}
        state = "unhealthy" if "firing" in states else "pending" if states else "healthy"
        return {"state": state, "why": None, "problems": problems}
