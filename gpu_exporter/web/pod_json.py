"""Per-pod use of a GPU or MIG instance as /api/v1/devices answers it (and the status page
shows it): one entry per container with a per-pod series (model/pod_shares.py), each marked
waste when it holds the device and does nothing with it, and one per reason for processes of no
known container. Empty lists without per-process attribution: nothing is invented as 0.

"Waste" is what the shipped GpuAllocatedButIdle says, read from the rule engine rather than
repeated here: the alert firing for the container on this device, or the per-process terms of
its expression holding now (the container runs no process there, or its processes ran no
kernel in the last tick), which is what the alert waits out its `for:` on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_exporter.alerting.pack import ALLOCATED_BUT_IDLE
from gpu_exporter.model.pod_shares import Container, PodShare, pod_shares, unattributed_use
from gpu_exporter.model.snapshot import Reading

# (gpu index, mig_uuid or "", namespace, pod, container)
_AlertKey = tuple[str, str, str, str, str]


class IdleAlerts:
    """GpuAllocatedButIdle's active alerts by device and container, from one read of the rule
    engine's alerts (`RuleManager.alerts_json()`); None: in-daemon rules are disabled."""

    def __init__(self, alerts: Iterable[Mapping[str, Any]] | None = None) -> None:
        self._states: dict[_AlertKey, str] = {}
        for alert in alerts or ():
            labels = alert.get("labels", {})
            if labels.get("alertname") != ALLOCATED_BUT_IDLE:
                continue
            gpu, mig_uuid, namespace, pod, container = (
                str(labels.get(name, ""))
                for name in ("gpu", "mig_uuid", "namespace", "pod", "container")
            )
            key = (gpu, mig_uuid, namespace, pod, container)
            if self._states.get(key) != "firing":  # firing wins over pending
                self._states[key] = str(alert.get("state", ""))

    def state(self, gpu: int, mig_uuid: str, container: Container) -> str | None:
        """ "firing", "pending", or None when the alert is not active for it."""
        return self._states.get((str(gpu), mig_uuid, *container))


def pod_use_json(
    readings: Iterable[Reading], gpu: int, mig_uuid: str = "", idle: IdleAlerts | None = None
) -> list[dict[str, Any]]:
    """The containers' use of one device (whole GPU: `mig_uuid` ""), as the Device and
    Instance models' `pod_use` declare it."""
    alerts = idle or IdleAlerts()
    return [
        _share_json(share, alerts.state(gpu, mig_uuid, share.key)) for share in pod_shares(readings)
    ]


def unattributed_json(readings: Iterable[Reading]) -> list[dict[str, Any]]:
    """Processes of no known container on one device, by reason."""
    return [
        {
            "reason": use.reason,
            "processes": _count(use.processes),
            "memory_bytes": _finite(use.memory_bytes),
            "utilization": _finite(use.utilization),
        }
        for use in unattributed_use(readings)
    ]


def _share_json(share: PodShare, alert: str | None) -> dict[str, Any]:
    why = [f"{ALLOCATED_BUT_IDLE} is firing for it"] if alert == "firing" else []
    if share.idle_now:
        why.append(share.idle_now)
    return {
        "namespace": share.namespace,
        "pod": share.pod,
        "container": share.container,
        "allocated": share.allocated,
        "processes": _count(share.processes),
        "memory_bytes": _finite(share.memory_bytes),
        "utilization": _finite(share.utilization),
        "encoder": _finite(share.encoder),
        "decoder": _finite(share.decoder),
        "energy_joules": _finite(share.energy_joules),
        "attribution": share.attribution,
        "idle_alert": alert if alert in ("pending", "firing") else None,
        "waste": bool(why),
        "waste_reason": "; ".join(why) or None,
    }


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _count(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) else None
