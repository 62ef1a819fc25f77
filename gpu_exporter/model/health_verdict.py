"""The health verdict table, defined once: each input the exporter reads about a GPU's health,
the verdict it gives and the next step, and what clears it.

Verdicts are NVIDIA Health Validation's (https://docs.nvidia.com/health-validation/, "Overview":
PASS, INFO, WARNING, CRITICAL; its UNKNOWN is not used: an input that could not be read is no
evidence either way, and a GPU with no evidence of a fault is `pass`). A GPU's verdict is the
worst of its inputs (`decide`); `gpu_exporter/collect/health_latch.py` holds each input until
what clears it (`Clears`) is seen, and exports `gpu_health_verdict{verdict}` and
`gpu_health_action_info{action, reason}`.

XIDs are graded by the resolution bucket NVIDIA's NVSentinel gives each in its XID mapping
(NVIDIA/NVSentinel, distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv,
after NVIDIA's XID catalog https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).
`gpu_exporter/model/xids.py` derives the alerted XID lists from `XID_ROWS`, so the rule pack,
`gpu-exporter diagnose` and the verdict read one table.

`python -m gpu_exporter.model.health_verdict` prints the table embedded in docs/runbook.md.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType


class HealthVerdict(StrEnum):
    """NVIDIA Health Validation's verdicts, from no finding to a broken GPU (in this order)."""

    PASS = "pass"
    INFO = "info"  # something happened that needs nothing done to the GPU
    WARNING = "warning"  # the GPU works; schedule the step before it gets worse
    CRITICAL = "critical"  # the GPU is broken or its results cannot be trusted: act now


# The `verdict` label values of gpu_health_verdict, in order of severity.
VERDICTS: tuple[str, ...] = tuple(v.value for v in HealthVerdict)
_VERDICT_RANK = {verdict: rank for rank, verdict in enumerate(HealthVerdict)}


class NextStep(StrEnum):
    """The `action` label of gpu_health_action_info, from the least to the most thorough: when
    several inputs are equally bad, the more thorough step is shown (a node reboot also resets
    its GPUs; a replacement makes every other step moot). docs/runbook.md says what each means."""

    NONE = "none"
    RESTART_APP = "restart_app"
    REPORT_ISSUE = "report_issue"  # NVIDIA's UNEXPECTED_ERR_REPORT_ISSUE: a bug report
    UNKNOWN = "unknown"  # a recovery action newer than this exporter: read it with nvidia-smi
    CHECK_FABRIC = "check_fabric"  # NVLink fabric: links, NVSwitch trays, Fabric Manager / NMX
    DRAIN_P2P = "drain_p2p"
    RECOVER_IMEX_DOMAIN = "recover_imex_domain"
    RESET_GPU = "reset_gpu"
    DRAIN_AND_RESET = "drain_and_reset"
    BUS_RESET = "bus_reset"
    RESTART_VM = "restart_vm"
    REBOOT_NODE = "reboot_node"
    SERVICE = "service"  # take the GPU out of service and have it replaced (RMA)


ACTIONS: tuple[str, ...] = tuple(a.value for a in NextStep)
_ACTION_RANK = {action: rank for rank, action in enumerate(NextStep)}


class Clears(StrEnum):
    """What ends an input's hold on the verdict. Nothing else does: a reading that is absent in
    a tick (a failed read, a GPU that is down) is no evidence, and the hold stays."""

    # The input's own reading shows the healthy value again (the counter at 0, the flag off,
    # the recovery action back to none, the lost GPU answering under its UUID).
    READING = "reading"
    # Evidence of a GPU reset: a volatile ECC counter went down (a reset or driver reload zeroes
    # them), a pending row remap was applied, pending page retirements were done, or the
    # driver's recovery action went back to none. An XID leaves no other trace; an exporter
    # restart forgets it (NVML reports only XIDs after it registered for them).
    RESET = "reset"
    # EVENT_HOLD_SECONDS after the event's last occurrence: the step (restarting the
    # application) leaves no trace the exporter could see.
    EXPIRY = "expiry"


# How long an EXPIRY input holds the verdict after its last occurrence; GpuXidWarning's window
# in rules/gpu-exporter.rules.yaml is the same (tests/test_health_verdict.py).
EVENT_HOLD_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class Row:
    """One input's verdict: `reason` is the `reason` label of gpu_health_action_info."""

    reason: str
    verdict: HealthVerdict
    action: NextStep
    clears: Clears
    meaning: str  # one line for the runbook

    @property
    def rank(self) -> tuple[int, int]:
        return _VERDICT_RANK[self.verdict], _ACTION_RANK[self.action]


V, A, C = HealthVerdict, NextStep, Clears

# The reason shown for a GPU without any finding.
HEALTHY = Row("healthy", V.PASS, A.NONE, C.READING, "no input shows a fault")

# -- the driver's recovery action -------------------------------------------------------------
# gpu_recovery_action{action}: NVML field 230, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h,
# nvmlDeviceGpuRecoveryAction_t). Meanings: NVIDIA, "A100 GPU Memory Error Management", Error
# Recovery and Response Flags (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/
# error-recovery-and-response-flags.html). Every action but none is set for an uncorrectable
# error the driver cannot recover from by itself, so each is critical; `unknown` (a value newer
# than this exporter) is a warning: the driver asks for something, we cannot say what.
RECOVERY_ACTION_ROWS: Mapping[str, Row] = MappingProxyType(
    {
        # NONE: "The GPU can be immediately used again by starting a new GPU process": no row.
        # GPU_RESET: "a fault that requires a reset to recover".
        "gpu_reset": Row(
            "recovery_action_gpu_reset",
            V.CRITICAL,
            A.RESET_GPU,
            C.READING,
            "the driver asks for a GPU reset",
        ),
        # NODE_REBOOT: "may have left the OS in an inconsistent state. Reboot".
        "node_reboot": Row(
            "recovery_action_node_reboot",
            V.CRITICAL,
            A.REBOOT_NODE,
            C.READING,
            "the driver asks for a reboot: the OS may be inconsistent",
        ),
        # DRAIN_P2P: "requires all peer-to-peer traffic to be quiesced": critical, not a
        # warning, because every multi-GPU job using the GPU must be stopped now, and the state
        # leads to another action once drained (the field is read again then).
        "drain_p2p": Row(
            "recovery_action_drain_p2p",
            V.CRITICAL,
            A.DRAIN_P2P,
            C.READING,
            "the driver asks to stop all peer-to-peer traffic of the GPU",
        ),
        # DRAIN_AND_RESET: "Drain P2P and Reset Gpu" (nvml.h).
        "drain_and_reset": Row(
            "recovery_action_drain_and_reset",
            V.CRITICAL,
            A.DRAIN_AND_RESET,
            C.READING,
            "the driver asks to drain the GPU's work, then reset it",
        ),
        # RECOVER_IMEX_DOMAIN: "Recover IMEX Domain" (nvml.h; multi-node NVLink).
        "recover_imex_domain": Row(
            "recovery_action_recover_imex_domain",
            V.CRITICAL,
            A.RECOVER_IMEX_DOMAIN,
            C.READING,
            "the driver asks to recover the GPU's IMEX domain",
        ),
        # BUS_RESET: "Reset the GPU's PCIe bus" (nvml.h).
        "bus_reset": Row(
            "recovery_action_bus_reset",
            V.CRITICAL,
            A.BUS_RESET,
            C.READING,
            "the driver asks for a reset of the GPU's PCIe bus",
        ),
        # SYSTEM_REBOOT: "Reboot the system" (nvml.h).
        "system_reboot": Row(
            "recovery_action_system_reboot",
            V.CRITICAL,
            A.REBOOT_NODE,
            C.READING,
            "the driver asks for a reboot of the system",
        ),
        # A value this exporter does not know (the collector reports values >= 8 as unknown).
        "unknown": Row(
            "recovery_action_unknown",
            V.WARNING,
            A.UNKNOWN,
            C.READING,
            "the driver asks for a recovery action this exporter does not know",
        ),
    }
)
NO_RECOVERY_ACTION = "none"


# -- XIDs --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class XidRow:
    """An XID's meaning, its NVSentinel resolution bucket and its verdict."""

    xid: int
    meaning: str
    resolution: str  # the bucket in NVSentinel's xiderrorsmapping.csv
    verdict: HealthVerdict
    action: NextStep
    clears: Clears

    @property
    def reason(self) -> str:
        return f"xid_{self.xid}"

    def row(self, seen_with: Iterable[int] = ()) -> Row:
        """Its row; XID 48's step depends on the XIDs seen with it since the last GPU reset
        (NVSentinel's WORKFLOW_XID_48: "Solo: RESET_GPU; with 63 or 64: DRAIN_AND_RESET")."""
        action = self.action
        if self.xid == 48 and set(seen_with) & {63, 64}:
            action = A.DRAIN_AND_RESET
        return Row(
            self.reason, self.verdict, action, self.clears, f"XID {self.xid}: {self.meaning}"
        )


def _xid(
    xid: int,
    meaning: str,
    resolution: str,
    verdict: HealthVerdict,
    action: NextStep,
    clears: Clears,
) -> tuple[int, XidRow]:
    return xid, XidRow(xid, meaning, resolution, verdict, action, clears)


# Each row cites NVSentinel's bucket (the CSV's third column) for the XID.
XID_ROWS: Mapping[int, XidRow] = MappingProxyType(
    dict(
        [
            # RESTART_APP, NONFATAL: the driver stopped the application that caused it; the GPU
            # serves others. Raised by applications (bad kernels, page faults): info.
            _xid(
                13,
                "graphics engine exception (usually an application bug)",
                "RESTART_APP",
                V.INFO,
                A.RESTART_APP,
                C.EXPIRY,
            ),
            _xid(
                31,
                "GPU memory page fault (usually an application bug)",
                "RESTART_APP",
                V.INFO,
                A.RESTART_APP,
                C.EXPIRY,
            ),
            _xid(
                68,
                "video decoder (NVDEC) exception",
                "RESTART_APP",
                V.INFO,
                A.RESTART_APP,
                C.EXPIRY,
            ),
            _xid(
                69,
                "graphics engine class error (usually an application bug)",
                "RESTART_APP",
                V.INFO,
                A.RESTART_APP,
                C.EXPIRY,
            ),
            # RESTART_APP too, but a memory fault, not an application's: NVIDIA's catalog calls
            # 94 a contained ECC error (only the applications that used the memory were
            # stopped); a warning, since the memory is failing (its row remap, if pending, is
            # gpu_row_remap_pending's). Its uncontained twin, 95, is RESET_GPU.
            _xid(
                94,
                "contained ECC error: only the application that touched the memory was stopped",
                "RESTART_APP",
                V.WARNING,
                A.RESTART_APP,
                C.EXPIRY,
            ),
            # IGNORE, NONFATAL: informational, nothing to do.
            _xid(
                43,
                "GPU stopped processing (the application's channel was reset)",
                "IGNORE",
                V.INFO,
                A.NONE,
                C.EXPIRY,
            ),
            _xid(
                63,
                "ECC page retirement or row remapping recording event (informational)",
                "IGNORE",
                V.INFO,
                A.NONE,
                C.EXPIRY,
            ),
            _xid(
                92,
                "high single-bit ECC error rate (corrected)",
                "IGNORE",
                V.INFO,
                A.NONE,
                C.EXPIRY,
            ),
            # UNEXPECTED_ERR_REPORT_ISSUE, FATAL: NVIDIA wants a bug report; the GPU may go on
            # (62, a halt, usually follows when it does not).
            _xid(
                61,
                "internal micro-controller breakpoint or warning",
                "UNEXPECTED_ERR_REPORT_ISSUE",
                V.WARNING,
                A.REPORT_ISSUE,
                C.EXPIRY,
            ),
            # RESET_GPU, FATAL.
            _xid(
                46,
                "GPU stopped responding (timeout)",
                "RESET_GPU",
                V.CRITICAL,
                A.RESET_GPU,
                C.RESET,
            ),
            _xid(
                62, "internal micro-controller halt", "RESET_GPU", V.CRITICAL, A.RESET_GPU, C.RESET
            ),
            _xid(
                64,
                "ECC page retirement or row remapping recording failure",
                "RESET_GPU",
                V.CRITICAL,
                A.RESET_GPU,
                C.RESET,
            ),
            _xid(
                95,
                "uncontained ECC error: every application on the GPU is affected; reset the GPU",
                "RESET_GPU",
                V.CRITICAL,
                A.RESET_GPU,
                C.RESET,
            ),
            _xid(109, "context switch timeout", "RESET_GPU", V.CRITICAL, A.RESET_GPU, C.RESET),
            _xid(119, "GSP RPC timeout", "RESET_GPU", V.CRITICAL, A.RESET_GPU, C.RESET),
            _xid(120, "GSP error", "RESET_GPU", V.CRITICAL, A.RESET_GPU, C.RESET),
            _xid(
                140,
                "unrecovered ECC error (escaped containment)",
                "RESET_GPU",
                V.CRITICAL,
                A.RESET_GPU,
                C.RESET,
            ),
            _xid(143, "GPU initialization failure", "RESET_GPU", V.CRITICAL, A.RESET_GPU, C.RESET),
            _xid(
                155, "NVLink software-defined error", "RESET_GPU", V.CRITICAL, A.RESET_GPU, C.RESET
            ),
            _xid(156, "resource retirement event", "RESET_GPU", V.CRITICAL, A.RESET_GPU, C.RESET),
            _xid(158, "GPU fatal timeout", "RESET_GPU", V.CRITICAL, A.RESET_GPU, C.RESET),
            # WORKFLOW_XID_48, FATAL: "Solo: RESET_GPU; with 63 or 64: DRAIN_AND_RESET" (XidRow.row)
            _xid(
                48,
                "double-bit (uncorrectable) ECC error",
                "WORKFLOW_XID_48",
                V.CRITICAL,
                A.RESET_GPU,
                C.RESET,
            ),
            # WORKFLOW_NVLINK_ERR (74) and WORKFLOW_NVLINK5_ERR (144-150), FATAL: the workflow
            # reads the error registers in the kernel log's XID line, which NVML's event does
            # not carry; the step is Health Validation's for NVLink faults (drain, then reset).
            _xid(74, "NVLink error", "WORKFLOW_NVLINK_ERR", V.CRITICAL, A.RESET_GPU, C.RESET),
            _xid(144, "NVLink SAW error", "WORKFLOW_NVLINK5_ERR", V.CRITICAL, A.RESET_GPU, C.RESET),
            _xid(145, "NVLink RLW error", "WORKFLOW_NVLINK5_ERR", V.CRITICAL, A.RESET_GPU, C.RESET),
            _xid(146, "NVLink TLW error", "WORKFLOW_NVLINK5_ERR", V.CRITICAL, A.RESET_GPU, C.RESET),
            _xid(
                147, "NVLink TREX error", "WORKFLOW_NVLINK5_ERR", V.CRITICAL, A.RESET_GPU, C.RESET
            ),
            _xid(
                148,
                "NVLink NVLPW control error",
                "WORKFLOW_NVLINK5_ERR",
                V.CRITICAL,
                A.RESET_GPU,
                C.RESET,
            ),
            _xid(
                149, "NVLink NETIR error", "WORKFLOW_NVLINK5_ERR", V.CRITICAL, A.RESET_GPU, C.RESET
            ),
            _xid(150, "NVLink MSE error", "WORKFLOW_NVLINK5_ERR", V.CRITICAL, A.RESET_GPU, C.RESET),
            # RESTART_BM, FATAL: restart the bare-metal node.
            _xid(
                79, "GPU has fallen off the bus", "RESTART_BM", V.CRITICAL, A.REBOOT_NODE, C.RESET
            ),
            _xid(160, "channel retirement event", "RESTART_BM", V.CRITICAL, A.REBOOT_NODE, C.RESET),
            # RESTART_VM, FATAL: restart the virtual machine (confidential computing).
            _xid(
                151,
                "key rotation error (confidential computing)",
                "RESTART_VM",
                V.CRITICAL,
                A.RESTART_VM,
                C.RESET,
            ),
        ]
    )
)

# -- memory -----------------------------------------------------------------------------------
# gpu_ecc_errors_total{error="uncorrected"}: the volatile count (nvml.h NVML_VOLATILE_ECC,
# cleared by a GPU reset or driver reload). Results computed since may be wrong: drain the GPU's
# work, then reset it (NVIDIA, "GPU Memory Error Management").
UNCORRECTED_ECC = Row(
    "uncorrected_ecc",
    V.CRITICAL,
    A.DRAIN_AND_RESET,
    C.READING,
    "uncorrectable ECC errors since the last GPU reset or driver load",
)
# gpu_row_remap_failure: "the GPU ran out of spare rows" (RMA Policy Thresholds for
# Row-Remapping, same guide): only a replacement helps.
ROW_REMAP_FAILURE = Row(
    "row_remap_failure", V.CRITICAL, A.SERVICE, C.READING, "a memory row could not be remapped"
)
# gpu_row_remap_pending: "row-remapping will happen at the next GPU reset"; "unaffected
# applications can continue running" (Error Recovery and Response Flags): a warning.
ROW_REMAP_PENDING = Row(
    "row_remap_pending",
    V.WARNING,
    A.RESET_GPU,
    C.READING,
    "a memory row remap waits for a GPU reset",
)
# gpu_retired_pages_pending (pre-Ampere): pages are retired at the next driver reload (NVIDIA,
# "Dynamic Page Retirement"), i.e. a reboot of the node.
RETIRED_PAGES_PENDING = Row(
    "retired_pages_pending",
    V.WARNING,
    A.REBOOT_NODE,
    C.READING,
    "memory pages wait to be retired at the next driver load",
)

# -- the GPU's presence -------------------------------------------------------------------------
# gpu_up 0: NVML does not answer for the GPU (GPU_IS_LOST, or calls that hang). Reset it (a GPU
# that fell off the bus says so with XID 79, whose row asks for a reboot).
# A read that misses the deadline once may be a busy node's, not the GPU's: a GPU counts as
# hung when its reads are late this many ticks running.
LATE_TICKS_TO_HUNG = 2
GPU_LOST = Row(
    "gpu_lost",
    V.CRITICAL,
    A.RESET_GPU,
    C.READING,
    "the GPU does not answer NVML: lost, or hung "
    f"(its reads late {LATE_TICKS_TO_HUNG} ticks running)",
)

# -- the MIG layout ----------------------------------------------------------------------------
# A GPU that answers NVML but whose MIG layout could not be read (an identity call of its
# enumeration failed or hung): its instances are unknown (gpu_mig_instance_up 0) until the
# call answers. Nothing to do to the GPU for it; a GPU whose calls keep hanging goes down, and
# gpu_lost says so.
MIG_INSTANCES_UNKNOWN = Row(
    "mig_instances_unknown",
    V.WARNING,
    A.NONE,
    C.READING,
    "the GPU answers, but its MIG instances cannot be listed (an NVML call failed or hung)",
)

# -- the NVLink fabric --------------------------------------------------------------------------
# gpu_fabric_health_issue{issue}: nvmlGpuFabricInfo_v3 healthMask (nvml.h, "Fabric
# definitions", NVML_GPU_FABRIC_HEALTH_MASK_*). A recovery the fabric is making is info; a
# fabric that works at reduced bandwidth is a warning (jobs run, slower); routes that do not
# work or a GPU the fabric cannot place (wrong SysGUID, chassis, partition, NVLinks, firmware)
# break its multi-GPU work: critical.
FABRIC_ISSUE_ROWS: Mapping[str, Row] = MappingProxyType(
    {
        "degraded_bandwidth": Row(
            "fabric_degraded_bandwidth",
            V.WARNING,
            A.CHECK_FABRIC,
            C.READING,
            "the NVLink fabric runs at reduced bandwidth",
        ),
        "route_recovery": Row(
            "fabric_route_recovery",
            V.INFO,
            A.NONE,
            C.READING,
            "the fabric is recovering a route",
        ),
        "route_unhealthy": Row(
            "fabric_route_unhealthy",
            V.CRITICAL,
            A.CHECK_FABRIC,
            C.READING,
            "a fabric route of the GPU is unhealthy",
        ),
        "access_timeout_recovery": Row(
            "fabric_access_timeout_recovery",
            V.INFO,
            A.NONE,
            C.READING,
            "the fabric is recovering from an access timeout",
        ),
        "incorrect_configuration": Row(
            "fabric_incorrect_configuration",
            V.CRITICAL,
            A.CHECK_FABRIC,
            C.READING,
            "the GPU's fabric configuration is wrong (SysGUID, chassis, partition, NVLinks, "
            "firmware)",
        ),
    }
)
# gpu_fabric_health_summary{summary}: nvmlGpuFabricInfo_v3 healthSummary
# (NVML_GPU_FABRIC_HEALTH_SUMMARY_*); healthy has no row.
FABRIC_SUMMARY_ROWS: Mapping[str, Row] = MappingProxyType(
    {
        "unhealthy": Row(
            "fabric_unhealthy",
            V.CRITICAL,
            A.CHECK_FABRIC,
            C.READING,
            "the driver sums up the GPU's fabric health as unhealthy",
        ),
        "limited_capacity": Row(
            "fabric_limited_capacity",
            V.WARNING,
            A.CHECK_FABRIC,
            C.READING,
            "the driver sums up the GPU's fabric health as limited capacity",
        ),
    }
)

# Every row but the XIDs', in the order that breaks ties (after the XIDs, by number).
STATE_ROWS: tuple[Row, ...] = (
    *RECOVERY_ACTION_ROWS.values(),
    GPU_LOST,
    MIG_INSTANCES_UNKNOWN,
    ROW_REMAP_FAILURE,
    UNCORRECTED_ECC,
    ROW_REMAP_PENDING,
    RETIRED_PAGES_PENDING,
    *FABRIC_SUMMARY_ROWS.values(),
    *FABRIC_ISSUE_ROWS.values(),
)


def _order(row: Row) -> tuple[int, int]:
    """Where a row sits in the table: XIDs first, by number (the fault as the driver logged
    it, which the other readings often show again: a double-bit ECC error is XID 48 and a count
    of uncorrected errors), then the driver's recovery action, then the other readings."""
    if row.reason.startswith("xid_"):
        return 0, int(row.reason.removeprefix("xid_"))
    return 1, _STATE_ORDER.get(row.reason, len(_STATE_ORDER))


_STATE_ORDER = {row.reason: position for position, row in enumerate(STATE_ROWS)}


def decide(rows: Iterable[Row], shown: str = "") -> Row:
    """What a GPU's held inputs (`rows`) add up to, as one row: the worst verdict; the most
    thorough step any input at that verdict asks for (one step that covers the others: a node
    reboot also resets the GPU); and, as the reason, an input at that verdict: an XID before
    the other readings, the one shown so far (`shown`) before the others of its kind, so that
    an alert about it keeps its labels while it holds, else the first in table order.
    HEALTHY when nothing is held."""
    candidates = list(rows)
    if not candidates:
        return HEALTHY
    verdict = max(candidates, key=lambda row: row.rank).verdict
    at_verdict = [row for row in candidates if row.verdict is verdict]
    action = max(at_verdict, key=lambda row: row.rank).action
    reason = min(at_verdict, key=lambda row: (_order(row)[0], row.reason != shown, _order(row)[1]))
    return replace(reason, action=action)


def all_rows() -> tuple[Row, ...]:
    """Every row of the table (XID 48 as it is alone), for the runbook and the tests."""
    return (*(r.row() for r in sorted(XID_ROWS.values(), key=lambda r: r.xid)), *STATE_ROWS)


_CLEARED_BY = {
    Clears.RESET: "GPU reset evidence, or an exporter restart",
    Clears.EXPIRY: f"{EVENT_HOLD_SECONDS / 60:g} minutes after the last one",
}
# What "its reading healthy again" is, for each READING row (by reason prefix).
_READING_CLEARED_BY = {
    "recovery_action_": "the recovery action back to none",
    "gpu_lost": "the GPU answering again under its UUID",
    "mig_instances_unknown": "its MIG instances listed again",
    "uncorrected_ecc": "the volatile count back to 0 (a GPU reset or driver reload)",
    "row_remap_failure": "the flag back to 0 (in practice a new GPU, with a new UUID)",
    "row_remap_pending": "the remap applied (a GPU reset)",
    "retired_pages_pending": "the retirement done (a driver reload)",
    "fabric_": "the driver no longer reporting it",
}


def cleared_by(row: Row) -> str:
    """What clears `row`, in words (the runbook's column)."""
    if row.clears is not Clears.READING:
        return _CLEARED_BY[row.clears]
    for prefix, text in _READING_CLEARED_BY.items():
        if row.reason.startswith(prefix):
            return text
    return "its reading healthy again"


def markdown_table() -> str:
    """The verdict table embedded in docs/runbook.md (checked for drift by a test)."""
    lines = [
        "| reason | verdict | action | cleared by | meaning |",
        "|---|---|---|---|---|",
    ]
    for row in all_rows():
        meaning = row.meaning
        if row.reason == "xid_48":
            meaning += " (with XID 63 or 64 since the last reset: drain_and_reset)"
        lines.append(
            f"| `{row.reason}` | {row.verdict.value} | `{row.action.value}` "
            f"| {cleared_by(row)} | {meaning} |"
        )
    lines.append(f"| `{HEALTHY.reason}` | pass | `none` | — | {HEALTHY.meaning} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - used to regenerate the runbook's table
    sys.stdout.write(markdown_table() + "\n")
