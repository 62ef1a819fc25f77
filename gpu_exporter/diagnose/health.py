"""Health, as the shipped rule pack defines it: its `gpu-health` group evaluated over the series
the profile collected, with the daemon's own rule engine and series store.

So "unhealthy" has one definition: the alerts the daemon and Prometheus would raise (which
XIDs are critical, what counts as a degraded link). A profile lasts seconds, so an alert with
`for:` (GpuLost's minute, the PCIe alerts' ten) never gets past pending here; the condition
held, which is what a one-shot check can know, so pending counts as a finding as firing does.

Each finding carries ordered next steps: take the GPU out of service, keep the evidence,
reset, and replace the GPU when the fault stays. They outrank performance advice: a GPU with
a health finding gets no tuning tips (its numbers describe a broken GPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpu_exporter.alerting.pack import HEALTH_GROUP, default_rule_files
from gpu_exporter.alerting.rules.alerts import Alert, State
from gpu_exporter.alerting.rules.engine import GroupEvaluator
from gpu_exporter.alerting.rules.loader import LoadLimits, RuleFileError, load_rule_files
from gpu_exporter.alerting.rules.manager import store_samples
from gpu_exporter.alerting.store import Labels, SeriesStore
from gpu_exporter.model import xids
from gpu_exporter.model.health_verdict import XID_ROWS, NextStep
from gpu_exporter.model.series import SeriesSet


class Action(StrEnum):
    """What a next step does, in the order the steps are taken: out of service first, the
    evidence before a reset destroys it, the replacement last."""

    DRAIN = "drain"
    COLLECT = "collect"
    RESTART = "restart"
    RESET = "reset"
    CHECK = "check"
    REPLACE = "replace"


ACTION_ORDER = {action: rank for rank, action in enumerate(Action)}


@dataclass(frozen=True)
class Step:
    action: Action
    text: str  # "{gpu}" stands for the GPU's index

    def for_gpu(self, gpu: str) -> str:
        return self.text.replace("{gpu}", gpu)


DRAIN = Step(
    Action.DRAIN,
    "Drain: `kubectl cordon <node>` then `kubectl drain <node> --ignore-daemonsets` (or take "
    "GPU {gpu} out of your scheduler) so that no new job lands on it.",
)
BUG_REPORT = Step(
    Action.COLLECT,
    "Collect `sudo nvidia-bug-report.sh` before any reset: it keeps the driver state and kernel "
    "log that a reset loses; attach it to any case with NVIDIA or the vendor.",
)
KERNEL_LOG = Step(
    Action.COLLECT,
    "Read the cause in the kernel log: `journalctl -k | grep -i xid` (or `dmesg`); NVRM: Xid "
    "lines name the GPU by PCI address (XID 79: it fell off the bus).",
)
RESET = Step(
    Action.RESET,
    "When nothing uses GPU {gpu} (`nvidia-smi --query-compute-apps=pid --format=csv,noheader "
    "-i {gpu}` prints nothing), reset it: `sudo nvidia-smi -r -i {gpu}`; if the reset fails or "
    "the GPU is off the bus, reboot the node.",
)
RESTART_APP = Step(
    Action.RESTART,
    "Restart the application that used GPU {gpu}: the driver stopped only it, other work on "
    "the GPU goes on; reset the GPU if this repeats.",
)
REPORT_ISSUE = Step(
    Action.COLLECT,
    "NVIDIA asks for a bug report for this XID: collect `sudo nvidia-bug-report.sh` and file it "
    "with NVIDIA or the vendor; GPU {gpu} may go on serving, but an XID 62 (a halt) after it "
    "needs a reset.",
)
CHECK_MEMORY = Step(
    Action.CHECK,
    "After the reset, `nvidia-smi -q -d ROW_REMAPPER` (Ampere and newer; `-d PAGE_RETIREMENT` "
    "before) must show no pending remap and no failure.",
)
CHECK_PCIE = Step(
    Action.CHECK,
    "`nvidia-smi -q -d PCI` shows the link and its replay counter: reseat the GPU or its riser, "
    "check the slot, retimers and the BIOS link settings.",
)
CHECK_COUNT = Step(
    Action.COLLECT,
    "`nvidia-smi -L` lists the GPUs the driver still sees; compare with the node's inventory.",
)
REPLACE_IF_REPEATS = Step(
    Action.REPLACE,
    "If it happens again after the reset, replace the GPU (RMA) with the bug report.",
)
REPLACE_NOW = Step(
    Action.REPLACE,
    "No spare memory rows are left: take GPU {gpu} out of service for good and request an RMA "
    "with the bug report.",
)

# The steps for each alert of the gpu-health group that a node can act on (the exporter's own
# alerts are the daemon's business: their description is their step). tests/test_diagnose_*
# fail when an alert of the group that names a GPU has none.
HEALTH_STEPS: Mapping[str, tuple[Step, ...]] = {
    "GpuXidCritical": (DRAIN, BUG_REPORT, RESET, CHECK_MEMORY, REPLACE_IF_REPEATS),
    "GpuXidWarning": (RESTART_APP,),
    "GpuUncorrectableEccErrors": (DRAIN, BUG_REPORT, RESET, CHECK_MEMORY, REPLACE_IF_REPEATS),
    "GpuRowRemapPending": (DRAIN, RESET, CHECK_MEMORY),
    "GpuRowRemapFailure": (DRAIN, BUG_REPORT, REPLACE_NOW),
    "GpuRetiredPagesPending": (DRAIN, RESET, CHECK_MEMORY),
    "GpuPcieLinkWidthDegraded": (DRAIN, CHECK_PCIE, REPLACE_IF_REPEATS),
    "GpuPcieLinkGenerationDegraded": (DRAIN, CHECK_PCIE, REPLACE_IF_REPEATS),
    "GpuLost": (DRAIN, KERNEL_LOG, BUG_REPORT, RESET, REPLACE_IF_REPEATS),
    "GpuRecoveryActionRequired": (DRAIN, BUG_REPORT, RESET),
    "GpuCountDropped": (CHECK_COUNT, KERNEL_LOG, BUG_REPORT),
}

# GpuXidWarning's step for each XID is the verdict table's (gpu_exporter/model/health_verdict.py):
# restart the application for 94, a bug report for 61.
XID_WARNING_STEPS: Mapping[NextStep, tuple[Step, ...]] = {
    NextStep.RESTART_APP: (RESTART_APP,),
    NextStep.REPORT_ISSUE: (REPORT_ISSUE,),
}

# Where XIDs from before the profile are: the profile registers for XID events at its start.
KERNEL_LOG_HINT = (
    "XIDs from before this run are not in the profile (NVML reports only events after it "
    "registered for them): `journalctl -k | grep -i xid` (or `dmesg | grep -i xid`) lists "
    "earlier ones as NVRM: Xid lines."
)


@dataclass(frozen=True)
class HealthFinding:
    alert: str
    severity: str
    state: str  # the furthest the alert got: pending or firing
    active_at_end: bool
    gpu: int | None  # None: about the node, not one GPU
    labels: Mapping[str, str]
    summary: str
    description: str

    @property
    def steps(self) -> tuple[Step, ...]:
        xid = self.labels.get("xid", "")
        if self.alert == "GpuXidWarning" and xid.isdecimal() and int(xid) in XID_ROWS:
            action = XID_ROWS[int(xid)].action
            return XID_WARNING_STEPS.get(action, HEALTH_STEPS[self.alert])
        return HEALTH_STEPS.get(self.alert, ())

    def text(self) -> str:
        """One line: the alert, what it means for an XID (gpu_exporter/model/xids.py), its
        summary."""
        xid = self.labels.get("xid", "")
        meaning = xids.meaning(xid)
        detail = f" (XID {xid}: {meaning})" if meaning else ""
        still = "" if self.active_at_end else ", ended during the profile"
        return (
            f"{self.alert} [{self.severity or 'none'}, {self.state}{still}]: {self.summary}{detail}"
        )

    def to_dict(self) -> dict[str, Any]:
        gpu = "" if self.gpu is None else str(self.gpu)
        return {
            "alert": self.alert,
            "text": self.text(),
            "severity": self.severity,
            "state": self.state,
            "active_at_end": self.active_at_end,
            "labels": dict(self.labels),
            "summary": self.summary,
            "description": self.description,
            "steps": [{"action": s.action.value, "text": s.for_gpu(gpu)} for s in self.steps],
        }


def merged_steps(findings: Sequence[HealthFinding]) -> list[str]:
    """The steps of several findings on one GPU as one ordered list, each step once: by action
    (drain before reset before replace), then by the order of the findings."""
    ranked: list[tuple[int, int, str]] = []
    for position, finding in enumerate(findings):
        gpu = "" if finding.gpu is None else str(finding.gpu)
        for step in finding.steps:
            ranked.append((ACTION_ORDER[step.action], position, step.for_gpu(gpu)))
        if not finding.steps and finding.description:
            ranked.append((len(ACTION_ORDER), position, finding.description))
    return list(dict.fromkeys(text for *_, text in sorted(ranked, key=lambda r: r[:2])))


class HealthRules:
    """The gpu-health group of `files`, fed each tick of the profile and evaluated at once (the
    group's own interval would evaluate a short profile once or twice)."""

    def __init__(self, files: Sequence[str] | None = None) -> None:
        self.files = list(files or default_rule_files())
        groups = [g for g in load_rule_files(self.files, LoadLimits()) if g.name == HEALTH_GROUP]
        if not groups:
            raise RuleFileError(
                [f"{', '.join(self.files)}: no rule group named {HEALTH_GROUP!r} (health is "
                 "that group's alerts)"]
            )  # fmt: skip
        self.store = SeriesStore()
        self.evaluator = GroupEvaluator(groups, self.store)
        default, by_metric = self.evaluator.retention()
        self.store.configure(default, self.evaluator.referenced_metrics(), by_metric)
        self.errors: list[str] = []  # rules that failed to evaluate, each once
        self._seen: dict[tuple[str, Labels], tuple[Alert, State]] = {}
        self._now: set[tuple[str, Labels]] = set()

    def observe(self, series_set: SeriesSet) -> None:
        now = series_set.timestamp
        self.store.ingest(now, store_samples(series_set, self.store.names), group="tick")
        for problem in self.evaluator.evaluate_all(now):
            if problem not in self.errors:
                self.errors.append(problem)
        self._now = set()
        for rule in self.evaluator.alerting_rules():
            for alert in rule.alerts(State.PENDING, State.FIRING):
                key = (rule.name, alert.labels)
                earlier = self._seen.get(key)
                furthest = State.FIRING if alert.state is State.FIRING else State.PENDING
                if earlier is not None and earlier[1] is State.FIRING:
                    furthest = State.FIRING
                self._seen[key] = (alert, furthest)
                self._now.add(key)

    def findings(self) -> list[HealthFinding]:
        """Every alert that was pending or firing at some tick, most severe first."""
        out = []
        for (name, labels), (alert, state) in self._seen.items():
            plain = dict(labels)
            gpu = plain.get("gpu", "")
            out.append(
                HealthFinding(
                    alert=name,
                    severity=plain.get("severity", ""),
                    state=state.value,
                    active_at_end=(name, labels) in self._now,
                    gpu=int(gpu) if gpu.isdecimal() else None,
                    labels={k: v for k, v in plain.items() if k != "alertname"},
                    summary=alert.annotations.get("summary", name),
                    description=alert.annotations.get("description", ""),
                )
            )
        rank = {"critical": 0, "warning": 1}
        return sorted(out, key=lambda f: (rank.get(f.severity, 2), f.alert, f.gpu or 0))
