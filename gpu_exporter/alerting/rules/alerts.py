"""Alert states as Prometheus keeps them: inactive -> pending (`for`) -> firing -> resolved.

`AlertingRule.evaluate` follows Prometheus 2.42's `AlertingRule.Eval`: a new result starts
pending at its first evaluation and fires once it has been active for `for`; a firing alert
whose expression stops returning it keeps firing for `keep_firing_for`, then resolves; resolved
alerts are kept for 15 minutes so Alertmanager hears that they ended. `needs_sending` and
`ends_at` follow Prometheus' `sendAlerts`.

Templates run under the group's deadline too (Prometheus has no such budget). An annotation
whose expansion is stopped by it reads TEMPLATE_STOPPED and the alert goes on (its state comes
from the expression, which was evaluated); a label whose expansion is stopped stops the rule,
which keeps its state, since a marked label would make another alert.

The daemon evaluates on a thread of its own while the HTTP layer and the tick read the alerts:
an evaluation builds a new `active` dict of new Alert objects and swaps it in whole, so a
reader always holds one evaluation's alerts and none is changed under it (the sender's
bookkeeping, `last_sent_at`, is the evaluating thread's alone).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gpu_exporter.alerting.rules import promql, template
from gpu_exporter.alerting.rules.loader import Rule
from gpu_exporter.alerting.store import Labels, make_labels

RESOLVED_RETENTION_SECONDS = 15 * 60

# An annotation whose expansion the group's time budget stopped: the alert goes on with this.
TEMPLATE_STOPPED = "<template stopped: the rule group's time budget ran out>"


class State(StrEnum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"


@dataclass
class Alert:
    labels: Labels  # without __name__, with rule labels and alertname
    annotations: dict[str, str]
    value: float
    active_at: float
    state: State = State.PENDING
    fired_at: float = 0.0
    resolved_at: float = 0.0
    last_sent_at: float = 0.0
    keep_firing_since: float = 0.0

    def needs_sending(self, now: float, resend_delay: float) -> bool:
        if self.state is State.PENDING:
            return False
        if self.resolved_at > self.last_sent_at:
            return True  # resolution not sent yet
        return self.last_sent_at + resend_delay < now


class RuleEvaluationError(RuntimeError):
    pass


@dataclass
class AlertingRule:
    rule: Rule
    external_labels: Mapping[str, str] = field(default_factory=dict)
    external_url: str = ""
    limit: int = 0  # the group's `limit`: more alerts than this fail the evaluation
    active: dict[Labels, Alert] = field(default_factory=dict)
    last_error: str = ""
    last_evaluation: float = 0.0
    last_duration: float = 0.0
    # Annotations the last evaluation left TEMPLATE_STOPPED (0: all rendered).
    annotations_stopped: int = 0

    @property
    def name(self) -> str:
        return self.rule.name

    def _expand(
        self,
        text: str,
        labels: Mapping[str, str],
        value: float,
        check: Callable[[], None] | None,
    ) -> str:
        # A template that fails at run time does not stop the alert: Prometheus puts the
        # error into the text instead, and so do we. promql.EvaluationStopped propagates.
        try:
            return template.expand(
                text,
                labels=labels,
                value=value,
                external_labels=self.external_labels,
                external_url=self.external_url,
                check=check,
            )
        except template.TemplateError as exc:
            return f"<error expanding template: {exc}>"

    def _annotation(
        self,
        text: str,
        labels: Mapping[str, str],
        value: float,
        check: Callable[[], None] | None,
    ) -> str:
        try:
            return self._expand(text, labels, value, check)
        except promql.EvaluationStopped:
            self.annotations_stopped += 1
            return TEMPLATE_STOPPED

    def evaluate(
        self,
        now: float,
        result: Sequence[tuple[Labels, float]],
        check: Callable[[], None] | None = None,
    ) -> None:
        """Update states from one evaluation's result (the expression's elements). `check`
        (the group's deadline) may stop it while the alerts are built, before any changes: in
        the loop, or expanding a label; an annotation it stops is marked TEMPLATE_STOPPED."""
        self.annotations_stopped = 0
        current: dict[Labels, Alert] = {}
        for i, (sample_labels, value) in enumerate(result):
            if check is not None and not i % promql.Deadline.CHECK_EVERY:
                check()
            visible = dict(sample_labels)  # $labels keeps __name__, as in Prometheus
            sample = {k: v for k, v in sample_labels if k != "__name__"}
            extra = {k: self._expand(v, visible, value, check) for k, v in self.rule.labels.items()}
            labels = make_labels(None, {**sample, **extra, "alertname": self.name}.items())
            if labels in current:
                raise RuleEvaluationError(
                    "vector contains metrics with the same labelset after applying alert labels"
                )
            annotations = {
                k: self._annotation(v, visible, value, check)
                for k, v in self.rule.annotations.items()
            }
            current[labels] = Alert(labels, annotations, value, active_at=now)
        # Copies: a reader on another thread keeps the alerts of the evaluation it took.
        active = {labels: copy.copy(alert) for labels, alert in self.active.items()}
        for labels, alert in current.items():
            existing = active.get(labels)
            if existing is not None and existing.state is not State.INACTIVE:
                existing.value, existing.annotations = alert.value, alert.annotations
                continue
            active[labels] = alert
        for labels, alert in list(active.items()):
            if labels not in current:
                keep_firing = self._keep_firing(alert, now)
                if alert.state is State.PENDING or (
                    alert.resolved_at and now - alert.resolved_at > RESOLVED_RETENTION_SECONDS
                ):
                    del active[labels]
                if alert.state is not State.INACTIVE and not keep_firing:
                    alert.state = State.INACTIVE
                    alert.resolved_at = now
                if not keep_firing:
                    continue
            else:
                alert.keep_firing_since = 0.0
            if alert.state is State.PENDING and now - alert.active_at >= self.rule.for_seconds:
                alert.state = State.FIRING
                alert.fired_at = now
        live = sum(a.state is not State.INACTIVE for a in active.values())
        if self.limit and live > self.limit:
            self.active = {}  # as Prometheus: the rule's alerts are dropped, the eval fails
            raise RuleEvaluationError(f"exceeded limit of {self.limit} with {live} alerts")
        self.active = active

    def _keep_firing(self, alert: Alert, now: float) -> bool:
        if alert.state is not State.FIRING or self.rule.keep_firing_for_seconds <= 0:
            return False
        if not alert.keep_firing_since:
            alert.keep_firing_since = now
        return now - alert.keep_firing_since < self.rule.keep_firing_for_seconds

    def alert_series(self) -> list[tuple[Labels, float]]:
        """Prometheus' ALERTS and ALERTS_FOR_STATE samples for the active alerts."""
        out = []
        for alert in self.alerts():
            pairs = (*alert.labels, ("alertstate", alert.state.value))
            out.append((make_labels("ALERTS", pairs), 1.0))
            out.append((make_labels("ALERTS_FOR_STATE", alert.labels), alert.active_at))
        return out

    def alerts(self, *states: State) -> list[Alert]:
        wanted = set(states) or {State.PENDING, State.FIRING}
        return [a for a in self.active.values() if a.state in wanted]

    def to_send(self, now: float, resend_delay: float, interval: float) -> list[Alert]:
        """Alerts due to Alertmanager now; marks them sent (Prometheus `sendAlerts`)."""
        due = []
        for alert in self.active.values():
            if alert.needs_sending(now, resend_delay):
                alert.last_sent_at = now
                due.append(alert)
        return due


def ends_at(alert: Alert, now: float, resend_delay: float, interval: float) -> float:
    """Firing: far enough ahead to survive three missed resends; resolved: when it resolved."""
    if alert.state is State.INACTIVE:
        return alert.resolved_at
    return now + 4 * max(resend_delay, interval)
