"""The health verdict in `gpu-exporter diagnose`: each GPU's, as the daemon's latch
(gpu_exporter/collect/health_latch.py) holds it at the end of the profile, the node's (the worst
of its GPUs'), and the node's in the shape of NVIDIA Health Validation's verdict.

Health Validation's verdict schema (https://docs.nvidia.com/health-validation/reference/
verdict-schema): enums serialize as strings; severities PASS, INFO, WARNING, CRITICAL; an
AffectedComponent is `{check_ids, entities, category, max_severity}`. That much is all this
module takes from it; `node` and each component's `recommended_action` are this project's
(README, diagnose). The full schema was not available to check against: consumers should
validate the object against the schema they use.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_exporter.collect.health_latch import HealthLatch
from gpu_exporter.model.health_verdict import HealthVerdict, cleared_by
from gpu_exporter.model.series import DeviceView

# Why a GPU of the report has no verdict: the latch judges a GPU in each tick it is listed, so
# this is a GPU that was in no tick the latch processed (a report built from another profile).
NOT_JUDGED = (
    "the health latch saw this GPU in no tick of the profile, so it has no verdict (no "
    "evidence either way: not the same as pass)"
)
# Verdicts that need attention by themselves (the exit status): info needs nothing done.
ATTENTION_VERDICTS = frozenset({HealthVerdict.WARNING.value, HealthVerdict.CRITICAL.value})
_RANK = {verdict.value: rank for rank, verdict in enumerate(HealthVerdict)}
# Health Validation's AffectedComponent category for a GPU.
GPU_CATEGORY = "GPU"


def gpu_verdict(latch: HealthLatch, view: DeviceView) -> dict[str, Any] | None:
    """The GPU's verdict, next step (`action`), the input deciding it (`reason`), what that
    input means and what clears it; None when the latch has none (NOT_JUDGED)."""
    # The latch keys a GPU whose UUID could not be read by its position (HealthLatch.process).
    row = latch.verdict(view.uuid or f"index:{view.index}")
    if row is None:
        return None
    return {
        "verdict": row.verdict.value,
        "action": row.action.value,
        "reason": row.reason,
        "meaning": row.meaning,
        "cleared_by": cleared_by(row) if row.verdict is not HealthVerdict.PASS else None,
    }


def node_verdict(devices: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The worst verdict of the node's GPUs (pass when all pass, or when none was judged),
    the GPUs at it, and the GPUs without a verdict."""
    judged = [d for d in devices if d["health_verdict"] is not None]
    worst = max(
        (d["health_verdict"]["verdict"] for d in judged),
        key=_RANK.__getitem__,
        default=HealthVerdict.PASS.value,
    )
    return {
        "verdict": worst,
        "gpus": [d["index"] for d in judged if d["health_verdict"]["verdict"] == worst],
        "not_judged": [d["index"] for d in devices if d["health_verdict"] is None],
    }


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """$NODE_NAME (the DaemonSet's downward API, as the daemon reads it), else the hostname."""
    environ = os.environ if environ is None else environ
    return environ.get("NODE_NAME") or socket.gethostname()


def health_validation(
    node: str, verdict: Mapping[str, Any], devices: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The node's verdict shaped as Health Validation's: one AffectedComponent per GPU whose
    verdict is not pass (its check id: the verdict's reason; its entity: the GPU's UUID, which
    NVML writes GPU-<uuid>, or index:<n> for a GPU whose UUID could not be read)."""
    components = [
        {
            "check_ids": [d["health_verdict"]["reason"]],
            "entities": [d["uuid"] or f"index:{d['index']}"],
            "category": GPU_CATEGORY,
            "max_severity": d["health_verdict"]["verdict"].upper(),
            "recommended_action": d["health_verdict"]["action"],
        }
        for d in devices
        if d["health_verdict"] is not None
        and d["health_verdict"]["verdict"] != HealthVerdict.PASS.value
    ]
    return {
        "node": node,
        "verdict": verdict["verdict"].upper(),
        "affected_components": components,
    }
