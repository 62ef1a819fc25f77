"""Rule evaluation over the SeriesStore: groups in order, recording rules feeding later rules.

`GroupEvaluator` is shared by the daemon and by `gpu-exporter rules test`, so the code that
passes the unit tests is the code that raises the alerts.

A group may be given a time budget: once it is spent, the rule being evaluated stops at its
next check (between the steps of a query, every few hundred series of a loop, and every few
dozen steps of a template), and it and the group's remaining rules report the error and keep
their state (alerts stay as they were, recording rules write nothing), as a failed evaluation
does. An alerting rule stopped while expanding an annotation is the exception: its state comes
from its expression, which was evaluated, so its alerts go on with that annotation marked
(alerts.TEMPLATE_STOPPED); the rule reports the error, and the rules after it are stopped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.alerts import TEMPLATE_STOPPED, AlertingRule, RuleEvaluationError
from gpu_exporter.alerting.rules.loader import Group, Rule
from gpu_exporter.alerting.store import STALE_NAN, Labels, Retention, SeriesStore, make_labels

log = logging.getLogger(__name__)


@dataclass
class RecordingRule:
    rule: Rule
    limit: int = 0
    previous: set[Labels] = field(default_factory=set)
    last_error: str = ""
    last_evaluation: float = 0.0
    last_duration: float = 0.0

    @property
    def name(self) -> str:
        return self.rule.name

    def evaluate(
        self,
        now: float,
        result: Sequence[tuple[Labels, float]],
        store: SeriesStore,
        check: Callable[[], None] | None = None,
    ):
        current: dict[Labels, float] = {}
        for i, (labels, value) in enumerate(result):
            if check is not None and not i % promql.Deadline.CHECK_EVERY:
                check()  # nothing is written before this loop ends
            merged = {k: v for k, v in labels if k != "__name__"} | dict(self.rule.labels)
            series = make_labels(self.rule.name, merged.items())
            if series in current:
                raise RuleEvaluationError("vector contains metrics with the same labelset")
            current[series] = value
        if self.limit and len(current) > self.limit:
            raise RuleEvaluationError(f"exceeded limit {self.limit} with {len(current)} series")
        for series, value in current.items():
            store.append(series, now, value)
        for series in self.previous - current.keys():
            store.append(series, now, STALE_NAN)  # as Prometheus does for vanished results
        self.previous = set(current)


RuleState = AlertingRule | RecordingRule


@dataclass
class GroupState:
    group: Group
    rules: list[RuleState]
    last_evaluation: float = 0.0
    last_duration: float = 0.0
    # Rules the last evaluation did not finish because the time budget ran out (0: none).
    last_stopped: int = 0
    # Annotations it left marked, not rendered, because the time budget ran out (0: none).
    last_annotations_stopped: int = 0

    @property
    def over_budget(self) -> bool:
        """Whether the last evaluation was cut short by the group's time budget."""
        return bool(self.last_stopped or self.last_annotations_stopped)


class GroupEvaluator:
    def __init__(
        self,
        groups: Sequence[Group],
        store: SeriesStore,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
        lookback: float = 300.0,
        previous: GroupEvaluator | None = None,
        write_alert_series: bool = False,
        semantics: promql.Semantics = promql.DEFAULT_SEMANTICS,
        subquery_step: float = promql.DEFAULT_SUBQUERY_STEP_SECONDS,
    ) -> None:
        self.store = store
        self.lookback = lookback
        self.semantics = semantics
        self.subquery_step = subquery_step
        self.external_labels = dict(external_labels or {})
        # promtool (and Prometheus) write ALERTS/ALERTS_FOR_STATE; the daemon has no use for them.
        self.write_alert_series = write_alert_series
        self._alert_series: dict[int, set[Labels]] = {}  # per rule: same-name rules are common
        self._range_cache = promql.RangeCache()  # rules of a tick often share a range function
        kept = previous.state_by_identity() if previous else {}
        self.groups: list[GroupState] = []
        for group in groups:
            states: list[RuleState] = []
            for rule in group.rules:
                state: RuleState
                if rule.is_alert:
                    state = AlertingRule(rule, self.external_labels, external_url, group.limit)
                else:
                    state = RecordingRule(rule, group.limit)
                _copy_state(kept.get(_identity(rule), []), state)
                states.append(state)
            self.groups.append(GroupState(group, states))

    def state_by_identity(self) -> dict[tuple, list[RuleState]]:
        """Rules by name and labels, in order (Prometheus' CopyState keys rules the same way)."""
        found: dict[tuple, list[RuleState]] = {}
        for group in self.groups:
            for state in group.rules:
                found.setdefault(_identity(state.rule), []).append(state)
        return found

    def alerting_rules(self) -> list[AlertingRule]:
        return [r for g in self.groups for r in g.rules if isinstance(r, AlertingRule)]

    def evaluate_all(self, now: float) -> list[str]:
        problems: list[str] = []
        for group in self.groups:
            problems += self.evaluate_group(group, now)
        return problems

    def evaluate_group(
        self, group: GroupState, now: float, budget: float | None = None
    ) -> list[str]:
        """Evaluate each rule in order; a failing rule is reported and the others still run.
        With a `budget` (seconds), the rules still running or not started when it is spent are
        stopped and keep their state; their `last_error` says so, `group.last_stopped` counts
        them (they are not in the returned problems)."""
        started = time.perf_counter()
        deadline = promql.Deadline(budget)
        check = None if budget is None else deadline.check
        problems: list[str] = []
        stopped: list[RuleState] = []
        marked: list[AlertingRule] = []  # evaluated, with annotations the budget stopped
        for state in group.rules:
            if isinstance(state, AlertingRule):
                state.annotations_stopped = 0  # of this evaluation only
            if stopped or deadline.expired():
                stopped.append(state)  # not started: its state stays as it was
                continue
            rule_started = time.perf_counter()
            try:
                result = promql.evaluate(
                    state.rule.expr,
                    self.store,
                    now,
                    self.lookback,
                    self._range_cache,
                    deadline,
                    self.semantics,
                    self.subquery_step,
                )
                elements = [((), result)] if isinstance(result, float) else [
                    (element.labels, element.value) for element in result
                ]  # fmt: skip
                if isinstance(state, AlertingRule):
                    state.evaluate(now, elements, check)
                    if state.annotations_stopped:
                        marked.append(state)
                else:
                    state.evaluate(now, elements, self.store, check)
                state.last_error = ""
                if self.write_alert_series and isinstance(state, AlertingRule):
                    self._write_alert_series(state, now)
            except (promql.PromQLError, RuleEvaluationError) as exc:
                state.last_error = str(exc)
                problems.append(f"{state.rule.name}, err: {exc}")
            except promql.EvaluationStopped:
                stopped.append(state)
                continue
            state.last_evaluation = now
            state.last_duration = time.perf_counter() - rule_started
        over = (
            f"group {group.group.name!r} ran past its time budget of {budget or 0:g}s "
            f"(rules.group_time_budget_seconds)"
        )  # only used when stopped, so with a budget
        for state in stopped:  # counted and logged by the caller, not as problems
            state.last_error = f"{over}: evaluation stopped, state kept"
        for rule in marked:
            rule.last_error = (
                f"{over}: {rule.annotations_stopped} annotations not rendered, marked "
                f"{TEMPLATE_STOPPED!r}; the alerts' states were evaluated"
            )
        group.last_stopped = len(stopped)
        group.last_annotations_stopped = sum(rule.annotations_stopped for rule in marked)
        group.last_evaluation = now
        group.last_duration = time.perf_counter() - started
        return problems

    def _write_alert_series(self, rule: AlertingRule, now: float) -> None:
        current = dict(rule.alert_series())
        for labels, value in current.items():
            self.store.append(labels, now, value)
        for labels in self._alert_series.get(id(rule), set()) - current.keys():
            self.store.append(labels, now, STALE_NAN)
        self._alert_series[id(rule)] = set(current)

    def referenced_metrics(self) -> frozenset[str] | None:
        """Metric names any rule reads (None: some selector has no fixed name)."""
        names: set[str] = set()
        for group in self.groups:
            for state in group.rules:
                found = promql.referenced_metrics(state.rule.expr)
                if found is None:
                    return None
                names |= found
                if isinstance(state, RecordingRule):
                    names.add(state.rule.name)
        return frozenset(names)

    def retention(self) -> tuple[Retention, dict[str, Retention]]:
        """What the store must keep for these rules: for metrics no name pins (read only by
        selectors without a fixed name, kept when such a selector exists), and by metric.

        A group evaluates at the timestamp of the tick's ingest just before it (a 15 s group
        too, at every fifteenth tick), so no sample is newer than the evaluation time and a
        series is trimmed only when a newer sample arrives: `x[10m] offset 1m` needs the 11
        minutes before each series' newest sample, an instant selector without offset the
        newest sample alone, while the lookback still reaches it. RETENTION_MARGIN_SECONDS
        more absorbs rounding and a wall clock stepped back a little; newest-only metrics get
        none (their instant selectors see nothing until such a clock catches up)."""
        lookback_ms = round(self.lookback * 1000)
        needs: dict[str | None, promql.History] = {}
        for group in self.groups:
            for state in group.rules:
                for name, need in promql.history_by_metric(state.rule.expr, lookback_ms).items():
                    needs[name] = needs.get(name, promql.History()).merge(need)
                if isinstance(state, RecordingRule):
                    # Its output is kept (newest sample) even if no selector reads it: a series
                    # expiring between a slow group's evaluations would be recreated each time.
                    name, output = state.rule.name, promql.History(newest_ms=lookback_ms)
                    needs[name] = needs.get(name, promql.History()).merge(output)
        unnamed = needs.get(None, promql.History())  # may match any metric: all keep its needs
        by_metric = {name: _retention(need.merge(unnamed)) for name, need in needs.items() if name}
        return _retention(unnamed), by_metric


# Seconds kept beyond what the selectors read (see GroupEvaluator.retention).
RETENTION_MARGIN_SECONDS = 5.0


def _retention(need: promql.History) -> Retention:
    window = need.window_ms / 1000
    if window:
        window += RETENTION_MARGIN_SECONDS
    # A series is dropped once its newest sample is older than anything a selector reads.
    expire = max(need.window_ms, need.newest_ms) / 1000 + RETENTION_MARGIN_SECONDS
    return Retention(window, expire)


def _identity(rule: Rule) -> tuple:
    return (rule.kind, rule.name, tuple(sorted(rule.labels.items())))


def _copy_state(candidates: list[RuleState], state: RuleState) -> None:
    """Take over the state of the first unused rule with the same identity (then consume it)."""
    for index, old in enumerate(candidates):
        if type(old) is not type(state):
            continue
        if isinstance(state, AlertingRule) and isinstance(old, AlertingRule):
            # A copy, never the same dict: two rules must not share (and fight over) alerts.
            state.active = dict(old.active)
        elif isinstance(state, RecordingRule) and isinstance(old, RecordingRule):
            state.previous = set(old.previous)
        del candidates[index]
        return
