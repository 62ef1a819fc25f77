"""The daemon's rule engine: every tick, feed the snapshot to the store, evaluate the groups
that are due, and hand the alerts that need sending to the notifier.

Reloads (SIGHUP, or a rule file changing on disk) replace the rules only when every file
loads; otherwise the error is logged, counted, shown in /api/v1/rules, and the last good rules
stay active.

A rule the loader skips (valid PromQL the daemon does not evaluate, `loader.SkippedRule`) is
logged once per load, listed in /api/v1/rules with health "err" and the reason, counted by
group (gpu_exporter_rule_group_skipped_rules), and never evaluated.

Budgets: a rule reading further back than `max_range_seconds` is refused at load; a group's
evaluation running past its time budget (template expansion included) is stopped (its rules
keep their state and show the error), counted, and logged at most once a minute, as is its
return within the budget; the rule history is capped at `history_max_bytes`
(gpu_exporter/alerting/store.py says how), and rules whose history cannot fit in it for the
series this node has (known once a tick was ingested) are refused.

Threads: once started (`start`, as the daemon does) the manager ingests and evaluates on a
thread of its own (worker.py), so rules never hold up the sampler's tick: a tick hands over
its series and waits for its evaluation at most TICK_WAIT_SHARE of the sampling interval
(then its scrape shows the rules' metrics of that evaluation, as without the thread); one that
finds the previous evaluation still running queues its series for the history only and counts
the evaluation as skipped (gpu_exporter_rule_evaluations_skipped_total). Not started (tests,
benchmarks, golden files), `on_series` does it all on the caller's thread. The views (API,
self-metrics) read the rules while they are evaluated: `self.evaluator` is swapped whole on a
reload, and each rule's alerts are swapped whole by each evaluation (alerts.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.alerts import (
    TEMPLATE_STOPPED,
    Alert,
    AlertingRule,
    State,
    ends_at,
)
from gpu_exporter.alerting.rules.engine import GroupEvaluator, GroupState, RuleState
from gpu_exporter.alerting.rules.loader import (
    LoadLimits,
    Rule,
    RuleFileError,
    SkippedRule,
    costly_templates,
    expand_paths,
    load_rule_files,
    skipped_rules,
)
from gpu_exporter.alerting.rules.runbook import with_runbook_base
from gpu_exporter.alerting.rules.worker import RuleWorker
from gpu_exporter.alerting.settings import AlertingConfig, RulesConfig
from gpu_exporter.alerting.store import Labels, SeriesStore, make_labels
from gpu_exporter.collect.settings import DEFAULT_INTERVAL_SECONDS
from gpu_exporter.model.series import Producer, Series, SeriesSet, series
from gpu_exporter.support.ratelimit import RateLimit

log = logging.getLogger(__name__)


class AlertSink(Protocol):
    def send(self, alerts: Sequence[Any]) -> None: ...


# A group over its time budget is logged at most this often (each time counted).
BUDGET_LOG_SECONDS = 60.0
# How much of the sampling interval a tick waits for its own evaluation on the rule thread.
TICK_WAIT_SHARE = 0.25
# Jobs (two a tick: its series before and after evaluation) the rule thread may have queued;
# past that a tick's series miss the history. 64 ticks, a minute at 1 s: only a stuck
# evaluation gets there, and the memory they hold stays bounded.
MAX_QUEUED_JOBS = 128
_NOT_QUEUED = f"not kept for the rules' history ({MAX_QUEUED_JOBS} jobs queued already)"


def store_samples(
    series_set: SeriesSet, names: frozenset[str] | None = None
) -> Iterator[tuple[Labels, float]]:
    """The tick's series as the store keeps them: exactly the names, labels and values a scrape
    returns. With `names`, only those metrics: building label sets nobody reads is most of the
    cost of ingesting a tick."""
    for row in series_set:
        if names is None or row.name in names:
            yield make_labels(row.name, row.labels), row.value


class _StoreLabels:
    """`store_samples`, reusing each series' label set from the previous feed of its group:
    building and sorting them was most of the cost of feeding the store. Holds one feed's."""

    def __init__(self) -> None:
        self._by_group: dict[str, dict[tuple[str, Labels], Labels]] = {}

    def samples(
        self, series_set: SeriesSet, names: frozenset[str] | None, group: str
    ) -> list[tuple[Labels, float]]:
        previous = self._by_group.get(group, {})
        current: dict[tuple[str, Labels], Labels] = {}
        out = []
        for row in series_set:
            if names is None or row.name in names:
                key = (row.name, row.labels)
                labels = previous.get(key)
                if labels is None:
                    labels = make_labels(row.name, row.labels)
                current[key] = labels
                out.append((labels, row.value))
        self._by_group[group] = current
        return out


class RuleManager:
    name = "rule_evaluation"  # the `collector` label of evaluation; its metrics are "rules"

    def __init__(
        self,
        settings: RulesConfig,
        notifier: AlertSink | None = None,
        store: SeriesStore | None = None,
        *,
        alerting: AlertingConfig | None = None,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        external_labels: Mapping[str, str] | None = None,
        runbook_base_url: str = "",
    ) -> None:
        """`settings` and `alerting` as configured; the rest resolved from other settings and
        the environment (gpu_exporter/config/load.py's rule_manager): `interval_seconds`, the
        sampling interval, is the evaluation interval unless `settings` sets one;
        `external_labels` are the alerts' (None: alerting's as configured);
        `runbook_base_url` makes the shipped runbook links absolute ("": as written)."""
        self.settings = settings
        self.alerting = alerting or AlertingConfig()
        self.evaluation_interval = settings.evaluation_interval_seconds or interval_seconds
        self.tick_seconds = interval_seconds  # rules are evaluated at the sampling ticks
        self.external_labels = dict(
            self.alerting.external_labels if external_labels is None else external_labels
        )
        self.runbook_base_url = runbook_base_url
        self.semantics = promql.SEMANTICS[settings.semantics]
        self.notifier = notifier
        self.store = store or SeriesStore()
        self.store.limit_bytes(settings.history_max_bytes)
        self._store_labels = _StoreLabels()
        self._last_ingest = 0.0
        self._ingest_interval: float | None = None  # seconds between the last two ticks
        self.budget_exceeded_total: dict[str, int] = {}  # by group name, across reloads
        self._budget_log = RateLimit(BUDGET_LOG_SECONDS)  # by group name
        self._over_budget_now: set[str] = set()  # groups whose last evaluation was stopped
        self._budget_back_log = RateLimit(BUDGET_LOG_SECONDS)  # by group name
        self.tick_wait = interval_seconds * TICK_WAIT_SHARE
        self.evaluations_skipped_total = 0
        self._skip_log = RateLimit(BUDGET_LOG_SECONDS)
        self._worker: RuleWorker | None = None
        self.evaluator = GroupEvaluator([], self.store)
        self._lock = threading.Lock()
        self._mtimes: dict[Path, float] = {}
        self._last_reload_check = 0.0
        self.last_reload_success = True
        self.last_reload_error = ""
        self.last_reload_time = 0.0
        self.evaluations_total = 0
        self.evaluation_failures_total = 0
        self.reloads_failed_total = 0
        self._reload_requested = threading.Event()

    @property
    def group_budget(self) -> float:
        """How long one group's evaluation may take: the setting, else half the interval."""
        return self.settings.group_time_budget_seconds or self.evaluation_interval / 2

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> None:
        """Initial load: errors propagate (the daemon refuses to start with broken rules)."""
        self._install(self._load())

    def _load(self) -> GroupEvaluator:
        """The rule files as an evaluator, carrying over the current rules' state; raises
        RuleFileError for a broken file, or for rules whose history cannot fit the cap."""
        groups = load_rule_files(self.settings.files, self._limits())
        groups = with_runbook_base(groups, self.runbook_base_url)
        evaluator = GroupEvaluator(
            groups,
            self.store,
            external_labels=self.external_labels,
            external_url=self.alerting.external_url,
            previous=self.evaluator,
            semantics=self.semantics,
        )
        problem = self._history_problem(evaluator)
        if problem:
            raise RuleFileError([problem])
        return evaluator

    def _history_problem(self, evaluator: GroupEvaluator) -> str | None:
        """Why `evaluator`'s rules cannot keep their history within the cap for the series
        stored now (8 bytes a sample at least, one sample a tick), or None; unknown (None)
        until two ticks were ingested."""
        interval = self._ingest_interval
        if not interval:
            return None
        default, by_metric = evaluator.retention()
        names = evaluator.referenced_metrics()
        counts = self.store.series_by_name()
        need = {
            name: count * (int(by_metric.get(name, default).window / interval) + 1) * 8
            for name, count in counts.items()
            if names is None or name in names  # the others these rules would not keep
        }
        total, cap = sum(need.values()), self.settings.history_max_bytes
        if total <= cap:
            return None
        name = max(need, key=need.__getitem__)
        lookback_ms = round(evaluator.lookback * 1000)
        readers: list[tuple[int, str]] = []  # the rules reading that metric's history
        for group in evaluator.groups:
            for rule in (state.rule for state in group.rules):
                needs = promql.history_by_metric(rule.expr, lookback_ms)
                window = max((needs[k].window_ms for k in (name, None) if k in needs), default=0)
                if window:
                    readers.append((-window, f"{rule.location} ({rule.name})"))
        reading = [where for _, where in sorted(readers)]  # longest first
        return (
            f"these rules would keep at least {_mib(total)} of history for the "
            f"{sum(counts.values())} series stored now (a sample every {interval:g}s), more "
            f"than rules.history_max_bytes ({_mib(cap)}); most for {name}: {counts[name]} "
            f"series, {by_metric.get(name, default).window:g}s each, {_mib(need[name])}, read "
            f"by {', '.join(reading[:3])}; raise rules.history_max_bytes or shorten the ranges"
        )

    def _limits(self) -> LoadLimits:
        return LoadLimits(
            max_range_seconds=self.settings.max_range_seconds, semantics=self.semantics
        )

    def reload(self) -> bool:
        try:
            evaluator = self._load()
        except Exception as exc:  # RuleFileError, or anything unexpected: keep the old rules
            self.last_reload_success = False
            self.last_reload_error = str(exc)
            self.reloads_failed_total += 1
            log.error("rule reload failed, keeping the previous rules:\n%s", exc)
            return False
        self._install(evaluator)
        log.info("rules reloaded: %d groups", len(evaluator.groups))
        return True

    def _install(self, evaluator: GroupEvaluator) -> None:
        with self._lock:
            default, by_metric = evaluator.retention()
            self.store.configure(default, evaluator.referenced_metrics(), by_metric)
            self.evaluator = evaluator
            self._mtimes = self._current_mtimes()
            self.last_reload_success, self.last_reload_error = True, ""
            self.last_reload_time = time.time()
        for skipped in skipped_rules(g.group for g in evaluator.groups):
            log.warning("rule loaded but skipped: %s", skipped.message)
        for line in costly_templates(g.group for g in evaluator.groups):
            log.warning("rule template may be slow: %s", line)

    def _current_mtimes(self) -> dict[Path, float]:
        try:
            paths = expand_paths(self.settings.files)
        except RuleFileError:
            return {}
        out = {}
        for path in paths:
            try:
                out[path] = os.stat(path).st_mtime
            except OSError:
                continue
        return out

    def request_reload(self) -> None:
        """From a signal handler: reload at the next tick."""
        self._reload_requested.set()

    def reload_if_changed(self, now: float) -> None:
        if self._reload_requested.is_set():
            self._reload_requested.clear()
            self.reload()
            self._last_reload_check = now
            return
        if now - self._last_reload_check < self.settings.reload_check_seconds:
            return
        self._last_reload_check = now
        if self._current_mtimes() != self._mtimes and not self.reload():
            self._mtimes = self._current_mtimes()  # report a broken file once, not per check

    # -- evaluation ----------------------------------------------------------------------------

    def start(self) -> None:
        """Ingest and evaluate on a thread of the manager's own from now on."""
        if self._worker is None:
            self._worker = RuleWorker(MAX_QUEUED_JOBS)
            self._worker.start()

    def stop(self) -> None:
        """End the rule thread (after the evaluation it is running, if any)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    def on_series(self, series_set: SeriesSet) -> None:
        """Ingest the tick's series and evaluate the groups that are due: here, or on the rule
        thread once started (waiting at most `tick_wait` for it; skipped, and counted, while
        the previous evaluation still runs). Raises what the rule thread's last job raised."""
        worker = self._worker
        if worker is None:
            self._ingest_and_evaluate(series_set)
            return
        failure = worker.take_failure()
        if worker.evaluating:
            self.evaluations_skipped_total += 1
            queued = worker.submit(partial(self._ingest, series_set))
            kept = "its series kept for the rules' history" if queued else _NOT_QUEUED
            self._log_skipped(series_set.timestamp, f"its evaluation skipped, {kept}")
        else:
            done = worker.submit(partial(self._ingest_and_evaluate, series_set), evaluation=True)
            if done is not None:
                done.wait(self.tick_wait)
        if failure is not None:
            raise RuntimeError(f"rule evaluation failed: {failure!r}") from failure

    def _log_skipped(self, timestamp: float, what: str) -> None:
        passed = self._skip_log.allow()
        if passed is None:
            return
        log.warning(
            "rule evaluation still running at the tick of %s: %s (%d evaluations skipped so "
            "far)%s",
            _rfc3339(timestamp), what, self.evaluations_skipped_total, passed.note,
        )  # fmt: skip

    def _ingest_and_evaluate(self, series_set: SeriesSet) -> None:
        self.reload_if_changed(time.monotonic())
        self._ingest(series_set)
        self._evaluate(series_set.timestamp)

    def _ingest(self, series_set: SeriesSet) -> None:
        now = series_set.timestamp
        if now > self._last_ingest:
            if self._last_ingest:
                self._ingest_interval = now - self._last_ingest
            self._last_ingest = now
        samples = self._store_labels.samples(series_set, self.store.names, "tick")
        self.store.ingest(now, samples, group="tick")

    def _evaluate(self, now: float) -> None:
        budget = self.group_budget
        evaluator = self.evaluator  # a reload swaps it whole
        for group in evaluator.groups:
            if not self._due(group, now):
                continue
            problems = evaluator.evaluate_group(group, now, budget)
            self.evaluations_total += 1
            self.evaluation_failures_total += len(problems)
            for problem in problems:
                log.warning("rule evaluation failed in group %s: %s", group.group.name, problem)
            self._count_budget(group, budget)
            self._send(group, now)

    def _count_budget(self, group: GroupState, budget: float) -> None:
        """Count a group stopped by its time budget; log it, and its return within the budget,
        each at most once a minute."""
        name = group.group.name
        if not group.over_budget:
            if name in self._over_budget_now:
                self._over_budget_now.discard(name)
                if self._budget_back_log.allow(name) is not None:  # a flapping group: rarely
                    log.info(
                        "rule group %s evaluated within its time budget of %gs again (%.3fs)",
                        name, budget, group.last_duration,
                    )  # fmt: skip
            return
        with self._lock:
            self.budget_exceeded_total[name] = self.budget_exceeded_total.get(name, 0) + 1
        self._over_budget_now.add(name)
        passed = self._budget_log.allow(name)
        if passed is None:
            return
        log.warning(
            "rule group %s stopped after %.3fs, over its time budget of %gs "
            "(rules.group_time_budget_seconds): %d of its %d rules not evaluated this time, "
            "their alerts kept as they were; %d annotations not rendered, marked %r%s",
            name, group.last_duration, budget, group.last_stopped, len(group.rules),
            group.last_annotations_stopped, TEMPLATE_STOPPED, passed.note,
        )  # fmt: skip

    def on_late_series(self, series_set: SeriesSet) -> None:
        """The same tick's families built after evaluation (this manager's own, the notifier's,
        the collector statuses), at the same timestamp, as one scrape would have them."""
        worker = self._worker
        if worker is None:
            self._ingest_late(series_set)
        elif worker.submit(partial(self._ingest_late, series_set)) is None:
            self._log_skipped(series_set.timestamp, f"its late series {_NOT_QUEUED}")

    def _ingest_late(self, series_set: SeriesSet) -> None:
        samples = self._store_labels.samples(series_set, self.store.names, "late")
        self.store.ingest(series_set.timestamp, samples, group="late")

    def producer(self) -> Producer:
        return Producer("rules", lambda: self.series(), frozenset({"rules"}))

    def _interval(self, group: GroupState) -> float:
        return group.group.interval_seconds or self.evaluation_interval

    def _due(self, group: GroupState, now: float) -> bool:
        # Half a tick of slack: a group on the sampling interval runs every tick despite jitter,
        # and any other at the tick nearest its interval: half a tick, not half the evaluation
        # interval, which would run a group on a 5 s evaluation interval every 3 ticks of 1 s.
        slack = self.tick_seconds / 2
        return (
            not group.last_evaluation
            or now >= group.last_evaluation + self._interval(group) - slack
        )

    def _send(self, group: GroupState, now: float) -> None:
        if self.notifier is None:
            return
        from gpu_exporter.alerting.notify.alertmanager import OutgoingAlert

        interval = self._interval(group)
        outgoing = []
        for rule in group.rules:
            if not isinstance(rule, AlertingRule):
                continue
            if rule.last_error and not rule.annotations_stopped:
                continue  # as Prometheus: a failed evaluation sends nothing
            for alert in rule.to_send(now, self.alerting.resend_delay_seconds, interval):
                outgoing.append(
                    OutgoingAlert(
                        labels=dict(alert.labels),
                        annotations=dict(alert.annotations),
                        starts_at=alert.fired_at or alert.active_at,
                        ends_at=ends_at(alert, now, self.alerting.resend_delay_seconds, interval),
                        generator_url=f"{self.alerting.external_url}/api/v1/alerts",
                    )
                )
        if outgoing:
            self.notifier.send(outgoing)

    # -- views -----------------------------------------------------------------------------------

    def alerting_rules(self) -> list[AlertingRule]:
        with self._lock:
            return self.evaluator.alerting_rules()

    def alerts_json(self) -> list[dict[str, Any]]:
        return [_alert_json(alert) for rule in self.alerting_rules() for alert in rule.alerts()]

    def rules_json(self, group: str | None = None) -> list[dict[str, Any]]:
        """/api/v1/rules' groups; `group`: only the groups of that name."""
        with self._lock:
            groups = [g for g in self.evaluator.groups if group in (None, g.group.name)]
        return [
            {
                "name": g.group.name,
                "file": g.group.file,
                "interval": self._interval(g),
                "limit": g.group.limit,
                "evaluationTime": g.last_duration,
                "lastEvaluation": _rfc3339(g.last_evaluation),
                "rules": _rules_json(g),
            }
            for g in groups
        ]

    def series(self) -> Iterator[Series]:
        """Self-metrics of rule evaluation."""
        counts: dict[tuple[str, str], int] = {}
        with self._lock:
            for rule in self.evaluator.alerting_rules():
                for state in (State.PENDING, State.FIRING):
                    counts.setdefault((rule.name, state.value), 0)
                for alert in rule.alerts():
                    counts[(rule.name, alert.state.value)] += 1
            durations = [(g.group.name, g.last_duration) for g in self.evaluator.groups]
            skipped: dict[str, int] = {}  # by name: two files may have a group of one name
            for g in self.evaluator.groups:
                skipped[g.group.name] = skipped.get(g.group.name, 0) + len(g.group.skipped)
            over_budget = sorted(self.budget_exceeded_total.items())
        for (name, state_name), count in sorted(counts.items()):
            labels = (("alertname", name), ("state", state_name))
            yield series("gpu_exporter_alerts", count, labels)
        yield series("gpu_exporter_rule_evaluations_total", self.evaluations_total)
        yield series("gpu_exporter_rule_evaluations_skipped_total", self.evaluations_skipped_total)
        yield series("gpu_exporter_rule_evaluation_failures_total", self.evaluation_failures_total)
        yield series("gpu_exporter_rule_reload_failures_total", self.reloads_failed_total)
        yield series("gpu_exporter_rule_reload_success", 1.0 if self.last_reload_success else 0.0)
        for group, seconds in durations:
            yield series("gpu_exporter_rule_group_duration_seconds", seconds, (("group", group),))
        for group, count in skipped.items():
            yield series("gpu_exporter_rule_group_skipped_rules", count, (("group", group),))
        for group, count in over_budget:
            yield series(
                "gpu_exporter_rule_group_budget_exceeded_total", count, (("group", group),)
            )
        store = self.store
        yield series("gpu_exporter_rule_history_bytes", store.bytes)
        yield series("gpu_exporter_rule_history_max_bytes", store.max_bytes or 0)
        yield series("gpu_exporter_rule_history_dropped_samples_total", store.cap_dropped_samples)


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


# lastEvaluation of a group not evaluated yet (Go's zero time, as Prometheus writes it).
NEVER_EVALUATED = "0001-01-01T00:00:00Z"


def _rfc3339(unix: float) -> str:
    if not unix:
        return NEVER_EVALUATED
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(unix)) + f".{int(unix % 1 * 1e3):03d}Z"


def _alert_json(alert: Alert) -> dict[str, Any]:
    return {
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "state": alert.state.value,
        "activeAt": _rfc3339(alert.active_at),
        "value": f"{alert.value:e}",
    }


def _rules_json(group: GroupState) -> list[dict[str, Any]]:
    """The group's rules as written: the skipped ones in their places among the evaluated."""
    skipped = {s.position: s for s in group.group.skipped}
    evaluated = iter(group.rules)
    return [
        _skipped_json(skipped[i]) if i in skipped else _rule_json(next(evaluated))
        for i in range(len(group.rules) + len(skipped))
    ]


def _rule_json(rule: RuleState) -> dict[str, Any]:
    health = "err" if rule.last_error else ("ok" if rule.last_evaluation else "unknown")
    alerts = rule.alerts() if isinstance(rule, AlertingRule) else []
    return _rule_fields(
        rule.rule, health, rule.last_error, rule.last_duration, rule.last_evaluation, alerts
    )


def _skipped_json(skipped: SkippedRule) -> dict[str, Any]:
    return _rule_fields(skipped.rule, "err", skipped.reason, 0.0, 0.0, [])


def _rule_fields(
    rule: Rule, health: str, error: str, duration: float, evaluated: float, alerts: list[Alert]
) -> dict[str, Any]:
    base = {
        "name": rule.name,
        "query": rule.expr_text,
        "labels": dict(rule.labels),
        "health": health,
        "lastError": error,
        "evaluationTime": duration,
        "lastEvaluation": _rfc3339(evaluated),
    }
    if not rule.is_alert:
        return {**base, "type": "recording"}
    states = {a.state for a in alerts}
    state = "firing" if State.FIRING in states else "pending" if states else "inactive"
    return {
        **base,
        "type": "alerting",
        "state": state,
        "duration": rule.for_seconds,
        "keepFiringFor": rule.keep_firing_for_seconds,
        "annotations": dict(rule.annotations),
        "alerts": [_alert_json(a) for a in alerts],
    }
