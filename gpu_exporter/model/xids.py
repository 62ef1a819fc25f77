"""Which NVIDIA XID errors gpu-exporter alerts on, read from the health verdict table
(gpu_exporter/model/health_verdict.py, XID_ROWS), where each XID's verdict is defined once.

`gpu-exporter diagnose` reads these sets; the shipped rule pack (rules/gpu-exporter.rules.yaml)
has to spell the same numbers in its GpuXidCritical and GpuXidWarning matchers, because
Prometheus reads the YAML and nothing else. tests/test_xid_facts.py fails when the two drift.

Meanings and recommended actions: NVIDIA, "XID Errors" and its Xid catalog,
https://docs.nvidia.com/deploy/xid-errors/ (catalog for Ampere and newer:
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from gpu_exporter.model.health_verdict import XID_ROWS, HealthVerdict


def _graded(*verdicts: HealthVerdict) -> Mapping[int, str]:
    return MappingProxyType(
        {xid: row.meaning for xid, row in sorted(XID_ROWS.items()) if row.verdict in verdicts}
    )


# The GPU (or the node's view of it) is broken or its results can no longer be trusted: the
# XIDs whose verdict is critical in gpu_exporter/model/health_verdict.py (NVSentinel's
# RESET_GPU, RESTART_BM, RESTART_VM and the XID 48 / NVLink workflows). Alerted as critical
# (GpuXidCritical) while the GPU's verdict stays critical because of one of them.
CRITICAL: Mapping[int, str] = _graded(HealthVerdict.CRITICAL)

# The GPU goes on serving, but something is wrong: 94, a *contained* ECC error (NVIDIA's
# catalog: the driver stopped only the application(s) that used the affected memory, other
# work on the GPU goes on, restart the application; a row remap it leaves pending is
# GpuRowRemapPending's business), and 61, a micro-controller warning NVIDIA wants a bug report
# for. Alerted as a warning (GpuXidWarning). 94's uncontained twin, 95, is critical.
WARNING: Mapping[int, str] = _graded(HealthVerdict.WARNING)

# Seen often, but raised by applications (bad kernels, page faults) or informational (the
# verdict's info): never alerted, listed so that nobody adds them by mistake.
NOT_ALERTED: Mapping[int, str] = _graded(HealthVerdict.INFO, HealthVerdict.PASS)

CRITICAL_XIDS = frozenset(CRITICAL)
WARNING_XIDS = frozenset(WARNING)

# The XIDs whose gpu_xid_errors_total series exist at 0 before the first one, in numeric order:
# a counter born at 1 shows no increase() for its first sample, and these are the XIDs alerted
# on. Only these: one series per possible XID would be hundreds per GPU for nothing.
ALWAYS_EXPORTED: tuple[int, ...] = tuple(sorted(CRITICAL_XIDS | WARNING_XIDS))


def meaning(xid: int | str) -> str:
    """NVIDIA's meaning of an XID as listed above, or "" for one not listed (or not a number)."""
    if isinstance(xid, str):
        if not xid.isdecimal():
            return ""
        xid = int(xid)
    return CRITICAL.get(xid) or WARNING.get(xid) or NOT_ALERTED.get(xid, "")


def xid_severity(xid: int) -> str:
    """The severity label the rule pack gives `xid` (GpuXidCritical: "critical", GpuXidWarning:
    "warning"), or "" for an XID it does not alert on."""
    if xid in CRITICAL_XIDS:
        return "critical"
    if xid in WARNING_XIDS:
        return "warning"
    return ""


def matcher(xids: Iterable[int]) -> str:
    """The value of a `xid=~"..."` label matcher selecting exactly `xids`, in numeric order."""
    return "|".join(str(x) for x in sorted(set(xids)))
