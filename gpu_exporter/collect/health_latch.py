"""Each GPU's health verdict, latched until the evidence that it is fixed:
`gpu_health_verdict{verdict}` and `gpu_health_action_info{action, reason}`.

A sampler processor (`HealthLatch.process`). Every tick it reads the GPU's health inputs from the
tick's readings, holds each input that shows a fault until what the verdict table says clears
it (gpu_exporter/model/health_verdict.py, `Clears`), and exports the worst held input:

- a reading's own fault (the recovery action, the volatile uncorrected ECC count, row remap
  pending / failure, pending page retirements, the fabric, gpu_up, a MIG layout that could not
  be read) holds until that reading shows the healthy value; a tick without the reading
  changes nothing;
- gpu_up 0 is a fault (`gpu_lost`) when NVML said so (the GPU lost, the driver gone, every
  call failing, calls still hung) or when the GPU's read missed the deadline LATE_TICKS_TO_HUNG
  ticks running; one late tick is not yet a hang (a busy node can make a healthy GPU's read
  late), and a tick the daemon did not read the GPU in (every reader busy, NVML being
  re-initialised, the source failing) is no evidence either way;
- a critical XID (an increase of gpu_xid_errors_total{xid}) holds until a GPU reset is seen:
  a volatile ECC counter going down, a pending row remap applied, pending page retirements
  done, or the driver's recovery action back to none after it was not;
- an XID whose step is restarting the application holds for EVENT_HOLD_SECONDS.

What clears nothing: time (but for that last kind), a GPU that stops reporting a reading, a GPU
that is down. An exporter restart starts from nothing: it re-derives what the driver still
shows (recovery action, ECC counts, remap and retirement flags, fabric, whether the GPU
answers) and forgets XIDs, which NVML reports only after it registered for them; for an XID
that leaves no other trace (a GPU reset with no ECC error, no remap, a driver without the
recovery action field), restarting the exporter after the fix is what clears it. A node reboot
does that by itself.

Memory: per GPU, the last value of a few readings, the XID counts seen and the held inputs;
a GPU absent from the ticks (not merely down) for FORGET_AFTER_SECONDS is forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpu_exporter.model.health_verdict import (
    EVENT_HOLD_SECONDS,
    FABRIC_ISSUE_ROWS,
    FABRIC_SUMMARY_ROWS,
    GPU_LOST,
    LATE_TICKS_TO_HUNG,
    MIG_INSTANCES_UNKNOWN,
    NO_RECOVERY_ACTION,
    RECOVERY_ACTION_ROWS,
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    UNCORRECTED_ECC,
    VERDICTS,
    XID_ROWS,
    Clears,
    Row,
    decide,
)
from gpu_exporter.model.snapshot import DeviceSample, DownCause, Reading

# A GPU missing from the ticks this long was removed (a lost GPU stays listed, as down).
FORGET_AFTER_SECONDS = 3600.0

VERDICT_FAMILY = "gpu_health_verdict"
ACTION_FAMILY = "gpu_health_action_info"
# The deciding XID as a label of its own, so that rules join it with gpu_xid_*{xid} on equal
# labels (label_replace from `reason` would need a regular expression: RE2 at startup).
XID_FAMILY = "gpu_health_xid_info"
OUTPUT_FAMILIES = frozenset({VERDICT_FAMILY, ACTION_FAMILY, XID_FAMILY})

_VOLATILE_ECC = "gpu_ecc_errors_total"
_FLAGS = {  # a flag's family -> its row; each is also reset evidence when it goes 1 -> 0
    "gpu_row_remap_failure": ROW_REMAP_FAILURE,
    "gpu_row_remap_pending": ROW_REMAP_PENDING,
    "gpu_retired_pages_pending": RETIRED_PAGES_PENDING,
}
_CLEARED_BY_RESET = ("gpu_row_remap_pending", "gpu_retired_pages_pending")


@dataclass
class _Held:
    """An input holding the verdict: its row (XID 48's step is worked out when shown) and, for
    an EXPIRY input, when it lets go."""

    row: Row
    xid: int | None = None
    until: float | None = None


@dataclass
class _Gpu:
    seen_at: float
    held: dict[str, _Held] = field(default_factory=dict)  # reason -> input
    last: dict[str, float] = field(default_factory=dict)  # evidence readings, last known
    recovery_action: str | None = None  # last known; None: never read
    xid_counts: dict[int, float] = field(default_factory=dict)
    xids_since_reset: set[int] = field(default_factory=set)
    shown: str = ""  # the reason exported last tick
    late_ticks: int = 0  # ticks running whose read missed the deadline


@dataclass(frozen=True, slots=True)
class _Inputs:
    """One tick's health readings of a GPU; None (or a missing key) where absent."""

    up: bool
    down_cause: DownCause
    mig_instances_unknown: bool | None  # None: not known (the GPU is down)
    recovery_action: str | None
    volatile_ecc: Mapping[str, float]  # error -> count
    flags: Mapping[str, float]  # family -> value
    fabric_issues: Mapping[str, float]
    fabric_summary: str | None  # the summary whose state-set series is 1
    fabric_summary_read: bool
    xid_counts: Mapping[int, float]


class HealthLatch:
    """A sampler processor: adds gpu_health_verdict and gpu_health_action_info to each GPU."""

    def __init__(self) -> None:
        self._gpus: dict[str, _Gpu] = {}

    def process(self, devices: list[DeviceSample], now: float) -> list[DeviceSample]:
        seen: set[str] = set()
        out = []
        for device in devices:
            key = device.uuid or f"index:{device.index}"  # unidentified: by its position
            seen.add(key)
            gpu = self._gpus.get(key)
            if gpu is None:
                gpu = self._gpus[key] = _Gpu(seen_at=now)
            gpu.seen_at = now
            row = self._judge(gpu, _inputs(device), now)
            out.append(replace(device, readings=device.readings + _readings(row)))
        for key, gpu in list(self._gpus.items()):
            if key not in seen and now - gpu.seen_at > FORGET_AFTER_SECONDS:
                del self._gpus[key]
        return out

    def verdict(self, uuid: str) -> Row | None:
        """The row last exported for the GPU (None: not seen)."""
        gpu = self._gpus.get(uuid)
        if gpu is None:
            return None
        return decide(self._shown_rows(gpu), gpu.shown)

    def _judge(self, gpu: _Gpu, inputs: _Inputs, now: float) -> Row:
        if _reset_seen(gpu, inputs):
            for reason in [r for r, held in gpu.held.items() if held.row.clears is Clears.RESET]:
                del gpu.held[reason]
            gpu.xids_since_reset.clear()
        _hold_readings(gpu, inputs)
        _hold_xids(gpu, inputs, now)
        for reason in [r for r, h in gpu.held.items() if h.until is not None and h.until <= now]:
            del gpu.held[reason]
        row = decide(self._shown_rows(gpu), gpu.shown)
        gpu.shown = row.reason
        return row

    @staticmethod
    def _shown_rows(gpu: _Gpu) -> list[Row]:
        return [
            XID_ROWS[held.xid].row(gpu.xids_since_reset) if held.xid is not None else held.row
            for held in gpu.held.values()
        ]


def _inputs(device: DeviceSample) -> _Inputs:
    recovery: str | None = None
    volatile: dict[str, float] = {}
    flags: dict[str, float] = {}
    issues: dict[str, float] = {}
    summary: str | None = None
    summary_read = False
    xid_counts: dict[int, float] = {}
    for reading in device.readings:
        family, labels, value = reading.family, dict(reading.labels), reading.value
        if value != value:  # NaN: not a reading
            continue
        if family == "gpu_recovery_action":
            if value == 1 and "action" in labels:
                recovery = labels["action"]
        elif family == _VOLATILE_ECC and "error" in labels:
            volatile[labels["error"]] = value
        elif family in _FLAGS and not labels:
            flags[family] = value
        elif family == "gpu_fabric_health_issue" and "issue" in labels:
            issues[labels["issue"]] = value
        elif family == "gpu_fabric_health_summary" and "summary" in labels:
            summary_read = True
            if value == 1:
                summary = labels["summary"]
        elif family == "gpu_xid_errors_total" and labels.get("xid", "").isdecimal():
            xid_counts[int(labels["xid"])] = value
    return _Inputs(
        up=device.up,
        down_cause=device.down_cause,
        mig_instances_unknown=bool(device.instances_unknown) if device.up else None,
        recovery_action=recovery,
        volatile_ecc=volatile,
        flags=flags,
        fabric_issues=issues,
        fabric_summary=summary,
        fabric_summary_read=summary_read,
        xid_counts=xid_counts,
    )


def _reset_seen(gpu: _Gpu, inputs: _Inputs) -> bool:
    """Whether this tick shows the GPU was reset since the last: a volatile ECC counter went
    down, a pending remap or page retirement was done, or the recovery action went back to none.
    Also records the readings it compares next tick (an absent one keeps its last value)."""
    reset = False
    for error, count in inputs.volatile_ecc.items():
        before = gpu.last.get(f"{_VOLATILE_ECC}:{error}")
        reset = reset or (before is not None and count < before)
        gpu.last[f"{_VOLATILE_ECC}:{error}"] = count
    for family in _CLEARED_BY_RESET:
        value = inputs.flags.get(family)
        if value is None:
            continue
        reset = reset or (gpu.last.get(family) == 1 and value == 0)
        gpu.last[family] = value
    if inputs.recovery_action is not None:
        before_action = gpu.recovery_action
        reset = reset or (
            before_action not in (None, NO_RECOVERY_ACTION)
            and inputs.recovery_action == NO_RECOVERY_ACTION
        )
        gpu.recovery_action = inputs.recovery_action
    return reset


def _hold_readings(gpu: _Gpu, inputs: _Inputs) -> None:
    """The inputs judged by their current reading: held while it shows the fault, let go when
    it shows the healthy value, left as they are when absent."""
    _hold_lost(gpu, inputs)
    if inputs.mig_instances_unknown is not None:
        _set(gpu, MIG_INSTANCES_UNKNOWN, inputs.mig_instances_unknown)
    if inputs.recovery_action is not None:
        for action, row in RECOVERY_ACTION_ROWS.items():
            _set(gpu, row, inputs.recovery_action == action)
    uncorrected = inputs.volatile_ecc.get("uncorrected")
    if uncorrected is not None:
        _set(gpu, UNCORRECTED_ECC, uncorrected > 0)
    for family, row in _FLAGS.items():
        value = inputs.flags.get(family)
        if value is not None:
            _set(gpu, row, value == 1)
    for issue, row in FABRIC_ISSUE_ROWS.items():
        value = inputs.fabric_issues.get(issue)
        if value is not None:
            _set(gpu, row, value == 1)
    if inputs.fabric_summary_read:
        for summary, row in FABRIC_SUMMARY_ROWS.items():
            _set(gpu, row, inputs.fabric_summary == summary)


def _hold_lost(gpu: _Gpu, inputs: _Inputs) -> None:
    """gpu_lost: held on NVML's word, or on reads late LATE_TICKS_TO_HUNG ticks running; let go
    when the GPU answers; a tick it was not read in changes nothing."""
    if inputs.up:
        gpu.late_ticks = 0
        _set(gpu, GPU_LOST, False)
    elif inputs.down_cause is DownCause.FAILED:
        _set(gpu, GPU_LOST, True)
    elif inputs.down_cause is DownCause.LATE:
        gpu.late_ticks += 1
        if gpu.late_ticks >= LATE_TICKS_TO_HUNG:
            _set(gpu, GPU_LOST, True)


def _set(gpu: _Gpu, row: Row, faulty: bool) -> None:
    if faulty:
        gpu.held.setdefault(row.reason, _Held(row))
    else:
        gpu.held.pop(row.reason, None)


def _hold_xids(gpu: _Gpu, inputs: _Inputs, now: float) -> None:
    """XIDs whose count rose since the last tick (from 0 for one not seen before: NVML reports
    only events since the exporter registered, so any count is new to this process)."""
    for xid, count in inputs.xid_counts.items():
        before = gpu.xid_counts.get(xid, 0.0)
        gpu.xid_counts[xid] = count
        if count <= before:
            continue
        table = XID_ROWS.get(xid)
        if table is None:  # an XID the table does not grade: counted, not judged
            continue
        gpu.xids_since_reset.add(xid)
        until = now + EVENT_HOLD_SECONDS if table.clears is Clears.EXPIRY else None
        gpu.held[table.reason] = _Held(table.row(), xid, until)


def _readings(row: Row) -> tuple[Reading, ...]:
    verdicts = tuple(
        Reading(VERDICT_FAMILY, float(verdict == row.verdict.value), (("verdict", verdict),))
        for verdict in VERDICTS
    )
    action = Reading(ACTION_FAMILY, 1.0, (("action", row.action.value), ("reason", row.reason)))
    xid = row.reason.removeprefix("xid_")
    if xid != row.reason:
        return (*verdicts, action, Reading(XID_FAMILY, 1.0, (("xid", xid),)))
    return (*verdicts, action)
