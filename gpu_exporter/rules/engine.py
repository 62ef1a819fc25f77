"""Rule evaluation over the SeriesStore: groups in order, recording rules feeding later rules.

`GroupEvaluator` is shared by the daemon and by `gpu-exporter rules test`, so the code that
passes the unit tests is the code that raises the alerts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpu_exporter.rules import promql
from gpu_exporter.rules.alerts import AlertingRule, RuleEvaluationError
from gpu_exporter.rules.loader import Group, Rule
from gpu_exporter.store import STALE_NAN, Labels, SeriesStore, make_labels

log = logging.getLogger(__name__)


@dataclass
class RecordingRule:
    rule: Rule
    previous: set[Labels] = field(default_factory=set)
    last_error: str = ""
    last_evaluation: float = 0.0
    last_duration: float = 0.0

    @property
    def name(self) -> str:
        return self.rule.name

    def evaluate(self, now: float, result: Sequence[tuple[Labels, float]], store: SeriesStore):
        current: dict[Labels, float] = {}
        for labels, value in result:
            merged = {k: v for k, v in labels if k != "__name__"} | dict(self.rule.labels)
            series = make_labels(self.rule.name, merged.items())
            if series in current:
                raise RuleEvaluationError("vector contains metrics with the same labelset")
            current[series] = value
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


class GroupEvaluator:
    def __init__(
        self,
        groups: Sequence[Group],
        store: SeriesStore,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
        lookback: float = 300.0,
        previous: GroupEvaluator | None = None,
    ) -> None:
        self.store = store
        self.lookback = lookback
        self.external_labels = dict(external_labels or {})
        old = previous.rule_index() if previous else {}
        self.groups: list[GroupState] = []
        for group in groups:
            states: list[RuleState] = []
            for rule in group.rules:
                if rule.is_alert:
                    state = AlertingRule(rule, self.external_labels, external_url)
                    kept = old.get((group.file, group.name, rule.name, rule.expr_text))
                    if isinstance(kept, AlertingRule):
                        state.active = kept.active  # a reload keeps alerts of unchanged rules
                    states.append(state)
                else:
                    states.append(RecordingRule(rule))
            self.groups.append(GroupState(group, states))

    def rule_index(self) -> dict[tuple[str, str, str, str], RuleState]:
        return {
            (g.group.file, g.group.name, r.rule.name, r.rule.expr_text): r
            for g in self.groups
            for r in g.rules
        }

    def alerting_rules(self) -> list[AlertingRule]:
        return [r for g in self.groups for r in g.rules if isinstance(r, AlertingRule)]

    def evaluate_all(self, now: float) -> list[str]:
        problems: list[str] = []
        for group in self.groups:
            problems += self.evaluate_group(group, now)
        return problems

    def evaluate_group(self, group: GroupState, now: float) -> list[str]:
        """Evaluate each rule in order; a failing rule is reported and the others still run."""
        started = time.perf_counter()
        problems = []
        for state in group.rules:
            rule_started = time.perf_counter()
            try:
                result = promql.evaluate(state.rule.expr, self.store, now, self.lookback)
                elements = [((), result)] if isinstance(result, float) else [
                    (element.labels, element.value) for element in result
                ]  # fmt: skip
                if isinstance(state, AlertingRule):
                    state.evaluate(now, elements)
                else:
                    state.evaluate(now, elements, self.store)
                state.last_error = ""
            except (promql.PromQLError, RuleEvaluationError) as exc:
                state.last_error = str(exc)
                problems.append(f"{state.rule.name}, err: {exc}")
            state.last_evaluation = now
            state.last_duration = time.perf_counter() - rule_started
        group.last_evaluation = now
        group.last_duration = time.perf_counter() - started
        return problems

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

    def retention_seconds(self) -> float:
        longest = max(
            (promql.max_range_seconds(s.rule.expr) for g in self.groups for s in g.rules),
            default=0.0,
        )
        return longest + self.lookback + 60.0

    def retention_by_metric(self) -> dict[str, float]:
        """History each metric needs: its longest range, plus the lookback and a minute."""
        needs: dict[str, float] = {}
        for group in self.groups:
            for state in group.rules:
                for name, seconds in promql.history_by_metric(state.rule.expr).items():
                    if name is not None:
                        needs[name] = max(needs.get(name, 0.0), seconds)
                if isinstance(state, RecordingRule):
                    needs.setdefault(state.rule.name, 0.0)
        return {name: seconds + self.lookback + 60.0 for name, seconds in needs.items()}
