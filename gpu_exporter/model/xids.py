"""Which NVIDIA XID errors gpu-exporter treats as faults, defined once.

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

# The GPU (or the node's view of it) is broken or its results can no longer be trusted: drain
# the node, collect nvidia-bug-report.sh, reset or replace the GPU. Alerted as critical.
CRITICAL: Mapping[int, str] = MappingProxyType(
    {
        48: "double-bit (uncorrectable) ECC error",
        62: "internal micro-controller halt",
        64: "ECC page retirement or row remapping recording failure",
        74: "NVLink error",
        79: "GPU has fallen off the bus",
        95: "uncontained ECC error: every application on the GPU is affected; reset the GPU",
        119: "GSP RPC timeout",
        120: "GSP error",
    }
)

# XID 94 is not critical. NVIDIA's catalog calls it a *contained* ECC error: the driver stopped
# only the application(s) that used the affected memory, other work on the GPU goes on, and the
# immediate action is to restart the application; a row remap it leaves pending is
# GpuRowRemapPending's business (reset when convenient). Its uncontained twin, 95,
# where every application on the GPU is affected and the GPU must be reset, is critical.
# Alerted as a warning (GpuXidWarning).
WARNING: Mapping[int, str] = MappingProxyType(
    {
        94: "contained ECC error: only the application that touched the memory was stopped",
    }
)

# Seen often, but raised by applications (bad kernels, page faults) or informational: never
# alerted, listed so that nobody adds them by mistake.
NOT_ALERTED: Mapping[int, str] = MappingProxyType(
    {
        13: "graphics engine exception (usually an application bug)",
        31: "GPU memory page fault (usually an application bug)",
        43: "GPU stopped processing (the application's channel was reset)",
        63: "ECC page retirement or row remapping recording event (informational)",
        92: "high single-bit ECC error rate (corrected)",
    }
)

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
