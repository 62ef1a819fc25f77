"""The rule engine's budgets: how far back a rule may read, how long a group may evaluate, and
how much memory the rule history may hold. Each is refused at load where it can be known
there, enforced at run time where it cannot, counted, and shown."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.alerting.rules import promql, template
from gpu_exporter.alerting.rules.alerts import TEMPLATE_STOPPED
from gpu_exporter.alerting.rules.loader import RuleFileError
from gpu_exporter.alerting.rules.manager import RuleManager
from gpu_exporter.alerting.settings import RulesConfig
from gpu_exporter.model.series import SeriesSet, series
from tests.daemon import command, free_port, parse_samples, serve

WEEK = 7 * 86400
WEEK_RULE = """\
groups:
  - name: g
    rules:
      - alert: Hot
        expr: gpu_temperature_celsius > 80
      - alert: HotAllWeek
        expr: avg_over_time(gpu_temperature_celsius[7d]) > 80
"""


def write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def node(t: float, gpus: int = 8, families: int = 1, value: float = 90.0) -> SeriesSet:
    """One tick of a node: `families` per-GPU gauges (gpu_temperature_celsius first)."""
    names = ["gpu_temperature_celsius", *(f"gpu_extra_{i}" for i in range(families - 1))]
    rows = {
        name: tuple(
            series(name, value, (("gpu", str(g)), ("uuid", f"GPU-{g}"))) for g in range(gpus)
        )
        for name in names
    }
    return SeriesSet(t, rows)


def metric(manager: RuleManager, name: str, **labels: str) -> float:
    for row in manager.series():
        if row.name == name and all(dict(row.labels).get(k) == v for k, v in labels.items()):
            return row.value
    raise AssertionError(f"{name} {labels} not exported")


# --- maximum range ------------------------------------------------------------------------------


def test_a_7d_range_is_refused_at_load_by_the_1h_default(tmp_path: Path) -> None:
    path = write(tmp_path, WEEK_RULE)
    manager = RuleManager(RulesConfig(files=[str(path)]))
    with pytest.raises(RuleFileError) as caught:
        manager.load()
    (problem,) = caught.value.problems
    assert problem.startswith(f"{path}:7: groups[0].rules[1].expr: alert HotAllWeek: reads 1w")
    assert "more than the 1h of history the daemon keeps" in problem
    assert "rules.max_range_seconds; set it to at least 604800" in problem


def test_what_the_limit_counts_is_what_the_store_keeps(tmp_path: Path) -> None:
    # Range + offset for a range selector, offset + the 5m lookback for an instant one.
    text = """\
groups:
  - name: g
    rules:
      - record: exactly_an_hour
        expr: rate(c_total[50m] offset 10m) + (g offset 55m)
      - record: past_it
        expr: g offset 56m
"""
    manager = RuleManager(RulesConfig(files=[str(write(tmp_path, text))]))
    with pytest.raises(RuleFileError) as caught:
        manager.load()
    (problem,) = caught.value.problems
    assert "record past_it: reads 1h1m back" in problem


def test_raising_the_limit_loads_the_rule(tmp_path: Path) -> None:
    path = write(tmp_path, WEEK_RULE)
    manager = RuleManager(RulesConfig(files=[str(path)], max_range_seconds=WEEK))
    manager.load()
    assert [r["name"] for r in manager.rules_json()[0]["rules"]] == ["Hot", "HotAllWeek"]


def test_a_reload_past_the_limit_is_refused_and_the_old_rules_stay(tmp_path: Path) -> None:
    path = write(tmp_path, WEEK_RULE.split("      - alert: HotAllWeek")[0])
    manager = RuleManager(RulesConfig(files=[str(path)], reload_check_seconds=3600))
    manager.load()
    manager.on_series(node(1000.0))
    path.write_text(WEEK_RULE)
    manager.request_reload()  # what SIGHUP does; a changed file goes the same way
    manager.on_series(node(1001.0))
    assert manager.last_reload_success is False
    assert "HotAllWeek: reads 1w back" in manager.last_reload_error
    assert metric(manager, "gpu_exporter_rule_reload_failures_total") == 1
    assert [r["name"] for r in manager.rules_json()[0]["rules"]] == ["Hot"]
    assert len(manager.alerts_json()) == 8  # still evaluated: one alert per GPU


def test_rules_check_applies_the_default_limit_and_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, WEEK_RULE)
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "rules", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "at most 1h of history (rules.max_range_seconds = 3600, the daemon's default)" in (
        result.stdout
    )
    assert f"{path}:7: groups[0].rules[1].expr: alert HotAllWeek: reads 1w back" in result.stdout


def test_rules_check_with_a_wider_limit_accepts_the_rule(tmp_path: Path) -> None:
    path = write(tmp_path, WEEK_RULE)
    command = [sys.executable, "-m", "gpu_exporter", "rules", "check"]
    result = subprocess.run(
        [*command, "--max-range-seconds", "604800", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout
    assert "at most 1w of history (rules.max_range_seconds = 604800, the daemon's setting" in (
        result.stdout
    )
    refused = subprocess.run(
        [*command, "--max-range-seconds", "-1", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2
    assert "must be a positive number of seconds" in refused.stderr


def test_serve_exits_2_naming_the_rule_past_the_limit(tmp_path: Path) -> None:
    path = write(tmp_path, WEEK_RULE)
    listen = f"127.0.0.1:{free_port()}"
    result = subprocess.run(
        command("serve", "--simulate", "--rules", str(path), "--listen-address", listen),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 2, result.stderr
    assert f"{path}:7: groups[0].rules[1].expr: alert HotAllWeek: reads 1w back" in result.stderr


# --- group time budget --------------------------------------------------------------------------

# 20,000 series and a query that reads them 40 times over: seconds of work without a budget.
HEAVY_TERMS = 40
HEAVY = f"""\
groups:
  - name: heavy
    rules:
      - alert: Hot
        expr: gpu_temperature_celsius > 80
      - record: heavy
        expr: sum({" + ".join(["(gpu_temperature_celsius > 0)"] * HEAVY_TERMS)})
      - alert: After
        expr: gpu_temperature_celsius > 85
  - name: light
    rules:
      - alert: Light
        expr: vector(1) > 0
"""


def test_a_group_past_its_budget_stops_is_counted_and_the_tick_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, HEAVY)
    settings = RulesConfig(files=[str(path)], group_time_budget_seconds=0.05)
    manager = RuleManager(settings)
    manager.load()
    started = time.perf_counter()
    manager.on_series(node(1000.0, gpus=20_000))
    elapsed = time.perf_counter() - started
    heavy = manager.evaluator.groups[0]
    assert heavy.last_stopped >= 2  # `heavy` and `After` at least
    assert elapsed < 5.0, elapsed  # generous: unbudgeted, the heavy rule alone takes longer
    assert metric(manager, "gpu_exporter_rule_group_budget_exceeded_total", group="heavy") == 1
    rules = {r["name"]: r for g in manager.rules_json() for r in g["rules"]}
    for name in ("heavy", "After"):
        assert rules[name]["health"] == "err"
        assert "ran past its time budget of 0.05s" in rules[name]["lastError"]
    assert rules["Light"]["health"] == "ok"  # the next group had its own budget
    assert len(manager.alerting_rules()[-1].alerts()) == 1
    assert "rule group heavy stopped after" in caplog.text
    # Counted every time, logged once a minute.
    manager.on_series(node(1001.0, gpus=20_000))
    assert metric(manager, "gpu_exporter_rule_group_budget_exceeded_total", group="heavy") == 2
    assert caplog.text.count("rule group heavy stopped after") == 1


def test_a_stopped_evaluation_keeps_firing_alerts_firing(tmp_path: Path) -> None:
    path = write(tmp_path, HEAVY.split("  - name: light")[0])
    settings = RulesConfig(files=[str(path)], group_time_budget_seconds=60)
    manager = RuleManager(settings)
    manager.load()
    manager.on_series(node(1000.0, gpus=4))
    firing = manager.alerts_json()
    assert {a["labels"]["alertname"] for a in firing} == {"Hot", "After"}
    assert {a["state"] for a in firing} == {"firing"}
    # Spent before the first rule starts.
    manager.settings = settings.model_copy(update={"group_time_budget_seconds": 1e-9})
    manager.on_series(node(1001.0, gpus=4, value=20.0))  # would resolve every alert
    assert manager.evaluator.groups[0].last_stopped == 3
    assert manager.alerts_json() == firing  # same alerts, states, activeAt and values
    manager.settings = settings
    manager.on_series(node(1002.0, gpus=4, value=20.0))  # evaluated again: now they resolve
    assert manager.alerts_json() == []
    rules = {r["name"]: r for g in manager.rules_json() for r in g["rules"]}
    assert rules["Hot"]["health"] == "ok" and rules["Hot"]["lastError"] == ""


def test_the_default_budget_is_half_the_evaluation_interval() -> None:
    assert RuleManager(RulesConfig(), interval_seconds=1.0).group_budget == 0.5
    budget = RulesConfig(group_time_budget_seconds=0.2)
    assert RuleManager(budget, interval_seconds=1.0).group_budget == 0.2


# --- history memory -----------------------------------------------------------------------------

FAMILIES = ["gpu_temperature_celsius", "gpu_extra_0", "gpu_extra_1", "gpu_extra_2"]
WEEK_OF_ALL = "groups:\n  - name: week\n    rules:\n" + "".join(
    f"      - record: week_of_{name}\n        expr: count_over_time({name}[7d])\n"
    for name in FAMILIES
)


def test_a_7d_rule_on_8_gpus_stays_under_the_history_cap(tmp_path: Path) -> None:
    # A week of 1 s ticks of 8 GPUs x 4 families would need 4 x 8 x 604,800 samples (155 MB)
    # uncapped; with a 1 MiB cap the history shortens itself and stays under it.
    path = write(tmp_path, WEEK_OF_ALL)
    cap = 1 << 20
    manager = RuleManager(
        RulesConfig(files=[str(path)], max_range_seconds=WEEK, history_max_bytes=cap)
    )
    manager.load()
    peak = 0.0
    for tick in range(6000):  # an accelerated clock: one tick a second
        manager.on_series(node(1_000_000.0 + tick, families=4))
        peak = max(peak, metric(manager, "gpu_exporter_rule_history_bytes"))
    assert metric(manager, "gpu_exporter_rule_history_max_bytes") == cap
    assert 0 < peak <= cap + 64 * 1024  # at most one ingest's samples over, between ingests
    assert metric(manager, "gpu_exporter_rule_history_bytes") <= cap
    assert metric(manager, "gpu_exporter_rule_history_dropped_samples_total") > 0
    limit = manager.store.history_limit_seconds
    assert limit is not None and 0 < limit < 6000
    # The rule still sees every series, over the history that fits (a sample a second).
    counts = promql.evaluate(promql.parse('{__name__=~"week_of_.+"}'), manager.store, 1_005_999.0)
    assert len(counts) == 32
    assert all(limit <= e.value <= limit + 2 for e in counts), (limit, counts[:3])


def test_a_reload_whose_history_cannot_fit_the_node_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, WEEK_RULE.split("      - alert: HotAllWeek")[0])
    manager = RuleManager(
        RulesConfig(
            files=[str(path)], max_range_seconds=WEEK, history_max_bytes=1 << 20,
            reload_check_seconds=3600,
        )
    )  # fmt: skip
    manager.load()
    for tick in range(3):
        manager.on_series(node(1000.0 + tick, gpus=8))
    path.write_text(WEEK_RULE)
    manager.request_reload()
    manager.on_series(node(1003.0, gpus=8))
    assert manager.last_reload_success is False
    error = manager.last_reload_error
    assert "these rules would keep at least 36.9 MiB of history" in error, error
    assert "more than rules.history_max_bytes (1.0 MiB)" in error
    assert "most for gpu_temperature_celsius: 8 series" in error
    assert error.endswith(
        f"read by {path}:6 (HotAllWeek); raise rules.history_max_bytes or shorten the ranges"
    )
    assert [r["name"] for r in manager.rules_json()[0]["rules"]] == ["Hot"]


class CountingDeadline(promql.Deadline):
    """Counts its checks; runs out at check number `stop_at` (0: never)."""

    def __init__(self, stop_at: int = 0) -> None:
        super().__init__(None)
        self.checks, self.stop_at = 0, stop_at

    def check(self) -> None:
        self.checks += 1
        if self.checks == self.stop_at:
            raise promql.EvaluationStopped("stopped")


def test_queries_check_their_deadline_inside_the_loops_over_series() -> None:
    from gpu_exporter.alerting.store import SeriesStore, make_labels

    store = SeriesStore(retention_seconds=600)
    for t in range(3):
        store.ingest(1000.0 + t, [(make_labels("x", [("gpu", str(i))]), 1.0) for i in range(600)])
    assert not issubclass(promql.EvaluationStopped, promql.PromQLError)
    # (query, its plan's nodes: one check each when it starts)
    for text, nodes in [
        ("x", 1),
        ('rate({__name__=~"x|y"}[5m])', 1),
        ("sum by (gpu) (x)", 2),
        ("x * on (gpu) x", 3),
        ("count(x > 0)", 4),
    ]:
        expr = promql.parse(text)
        counting = CountingDeadline()
        expected = promql.evaluate(expr, store, 1002.0)
        assert promql.evaluate(expr, store, 1002.0, deadline=counting) == expected
        # 600 series: every loop over them checks 3 times (every 256), besides each node.
        assert counting.checks >= nodes + 3, (text, counting.checks)
        for stop_at in range(1, counting.checks + 1):  # out of time at any check: stopped
            with pytest.raises(promql.EvaluationStopped):
                promql.evaluate(expr, store, 1002.0, deadline=CountingDeadline(stop_at))


# --- templates under the group time budget, and the tick kept from the rules ---------------------


def doubling(seed: str, depth: int = 6) -> str:
    """`seed` through `depth` nested reReplaceAll calls that each double their input."""
    for _ in range(depth):
        seed = f'(reReplaceAll "(.)" "$1$1" {seed})'
    return "{{ " + seed + " }}"


# Each annotation: six doublings of three UUIDs (120 characters), about 7,600 regex matches:
# within the 10,000 steps and 262,144 characters one expansion may spend, but over a node's
# alerts seconds of work, far more than half a 0.5 s interval.
SLOW_TEXT = doubling('(printf "%s%s%s" $labels.uuid $labels.uuid $labels.uuid)')
SLOW_TEMPLATE = f"""\
groups:
  - name: slow
    rules:
      - alert: GpuUpSlowText
        expr: gpu_up == 1
        annotations:
          summary: '{SLOW_TEXT}'
          description: '{SLOW_TEXT}'
"""


def test_a_template_past_the_group_budget_is_stopped_and_the_ticks_keep_their_interval(
    tmp_path: Path,
) -> None:
    interval = 0.5  # the group's budget: half of it
    path = write(tmp_path, SLOW_TEMPLATE)
    with serve(
        tmp_path, "--simulate", "--interval", str(interval), "--rules", str(path),
        "--metrics-profile", "full",  # the rule engine's own metrics
    ) as daemon:  # fmt: skip
        daemon.wait_ready()
        first = parse_samples(daemon.metrics_text())
        started = time.monotonic()
        time.sleep(6.0)
        last = parse_samples(daemon.metrics_text())
        elapsed = time.monotonic() - started
        ticks = last["gpu_exporter_ticks_total"] - first["gpu_exporter_ticks_total"]
        # The sampler's own counter against the ticks the interval asks for, as a ratio.
        assert ticks / (elapsed / interval) > 0.8, (ticks, elapsed)
        assert last['gpu_exporter_rule_group_budget_exceeded_total{group="slow"}'] > 0
        assert (
            last["gpu_exporter_rule_evaluations_total"]
            > first["gpu_exporter_rule_evaluations_total"]
        )
        up = [k for k, v in last.items() if k.startswith("gpu_up{") and v == 1]
        alerts = daemon.get("/api/v1/alerts").json()["data"]["alerts"]
        # The expression was evaluated: every GPU up has its alert, some annotations marked.
        assert len(alerts) == len(up) > 0
        texts = [text for alert in alerts for text in alert["annotations"].values()]
        assert TEMPLATE_STOPPED in texts
        assert daemon.get("/healthz").status_code == 200
        (rule,) = daemon.get("/api/v1/rules").json()["data"]["groups"][0]["rules"]
        assert rule["health"] == "err"
        assert "ran past its time budget of 0.25s" in rule["lastError"]
    assert "rule group slow stopped after" in daemon.output()


def rules_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command("rules", "check", *args), capture_output=True, text=True, check=False
    )


def test_rules_check_warns_about_a_costly_template_and_strict_refuses_it(tmp_path: Path) -> None:
    path = write(tmp_path, SLOW_TEMPLATE)
    checked = rules_check(str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    out = checked.stdout
    assert "WARNING: templates whose estimated expansion cost is high" in out
    for line, key in ((7, "summary"), (8, "description")):
        assert (
            f"{path}:{line}: groups[0].rules[0].annotations.{key}: alert GpuUpSlowText: one "
            "expansion may run about"
        ) in out
    assert "grows 64-fold through 6 nested calls that amplify it (reReplaceAll x2)" in out
    strict = rules_check("--strict", str(path))
    assert strict.returncode == 1
    assert "FAILED: --strict refuses templates whose estimated expansion cost is high" in (
        strict.stdout
    )
    # Five doublings of one label stay under the threshold: no warning.
    cheap = write(tmp_path, SLOW_TEMPLATE.replace(SLOW_TEXT, doubling("$labels.uuid", 5)), "ok")
    quiet = rules_check("--strict", str(cheap))
    assert quiet.returncode == 0 and "WARNING" not in quiet.stdout, quiet.stdout


def test_the_cost_estimate_follows_the_text_through_the_template() -> None:
    from gpu_exporter.alerting.pack import all_pack_files
    from gpu_exporter.alerting.rules.loader import costly_templates, load_rule_files
    from gpu_exporter.alerting.rules.template_cost import COSTLY_STEPS, estimate

    assert costly_templates(load_rule_files(all_pack_files())) == []  # the shipped rules
    cheap = estimate('{{ reReplaceAll "(.*):.*" "$1" $labels.instance }} {{ $value | humanize }}')
    assert cheap.growth == 1 and not cheap.costly
    six = estimate(doubling("$labels.uuid"))
    five = estimate(doubling("$labels.uuid", 5))
    assert (six.growth, five.growth) == (64, 32) and six.costly and not five.costly
    assert six.amplifiers == ("reReplaceAll x2",) * 6
    # A wide printf feeding two doublings: its 1000 characters, not a label's 64.
    wide = estimate(
        '{{ printf "%1000s" "" | reReplaceAll "(.)" "$1$1" | reReplaceAll "(.)" "$1$1" }}'
    )
    assert wide.steps >= 3000 and wide.costly
    # Ranges over the labels: each level multiplies its body.
    ranges = ["{{ range $labels }}" * depth + "{{ . }}" + "{{ end }}" * depth for depth in (2, 3)]
    assert estimate(ranges[0]).steps < COSTLY_STEPS <= estimate(ranges[1]).steps
    # A variable carries what was assigned to it.
    assigned = estimate('{{ $x := printf "%1000s" "" }}' + doubling("$x", 2))
    assert assigned.steps >= 3000


def test_template_expansion_checks_the_deadline_every_few_steps() -> None:
    text = doubling("$labels.uuid", 4)
    counting = CountingDeadline()
    labels = {"uuid": "GPU-" + "0" * 36}
    expected = template.expand(text, labels=labels, value=1.0)
    assert template.expand(text, labels=labels, value=1.0, check=counting.check) == expected
    # 40 characters doubled four times: 600 regex matches, a check every 32 steps at least.
    assert counting.checks >= 600 // template.CHECK_EVERY_STEPS, counting.checks
    for stop_at in (1, counting.checks // 2, counting.checks):
        with pytest.raises(promql.EvaluationStopped):
            template.expand(text, labels=labels, value=1.0, check=CountingDeadline(stop_at).check)


def slow_rules(tmp_path: Path, where: str = "annotations") -> Path:
    """Alert Hot over gpu_temperature_celsius with a slow template in its `where`, then Cold."""
    return write(
        tmp_path,
        f"""\
groups:
  - name: slow
    rules:
      - alert: Hot
        expr: gpu_temperature_celsius > 80
        {where}:
          text: '{doubling('(printf "%100s" $labels.uuid)')}'
      - alert: Cold
        expr: gpu_temperature_celsius < 0
""",
    )


class Sink:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, alerts: Any) -> None:
        self.sent += alerts


def test_an_annotation_past_the_budget_is_marked_and_the_alert_still_fires(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpu_exporter.alerting.rules.manager")
    # 64 alerts of about 6,300 regex matches each: seconds unstopped, against a 0.3 s budget.
    settings = RulesConfig(files=[str(slow_rules(tmp_path))], group_time_budget_seconds=0.3)
    sink = Sink()
    manager = RuleManager(settings, sink)
    manager.load()
    manager.on_series(node(1000.0, gpus=64))
    group = manager.evaluator.groups[0]
    assert group.last_duration < 2.0, group.last_duration  # stopped near its budget
    assert group.last_annotations_stopped > 0 and group.last_stopped == 1  # and Cold
    alerts = manager.alerts_json()
    assert len(alerts) == 64 and {a["state"] for a in alerts} == {"firing"}
    marked = [a for a in alerts if a["annotations"]["text"] == TEMPLATE_STOPPED]
    assert len(marked) == group.last_annotations_stopped
    assert len(sink.sent) == 64  # sent as evaluated, marked text and all
    assert metric(manager, "gpu_exporter_rule_group_budget_exceeded_total", group="slow") == 1
    rules = {r["name"]: r for r in manager.rules_json()[0]["rules"]}
    assert f"{len(marked)} annotations not rendered" in rules["Hot"]["lastError"]
    assert "evaluation stopped, state kept" in rules["Cold"]["lastError"]
    assert caplog.text.count("rule group slow stopped after") == 1
    # Within the budget again: rendered, the error gone, and said once.
    manager.settings = settings.model_copy(update={"group_time_budget_seconds": 60.0})
    manager.on_series(node(1001.0, gpus=64))
    assert TEMPLATE_STOPPED not in {a["annotations"]["text"] for a in manager.alerts_json()}
    assert all(r["health"] == "ok" for r in manager.rules_json()[0]["rules"])
    assert "rule group slow evaluated within its time budget of 60s again" in caplog.text


def test_a_label_past_the_budget_stops_the_rule_and_keeps_its_alerts(tmp_path: Path) -> None:
    settings = RulesConfig(files=[str(slow_rules(tmp_path, "labels"))])
    manager = RuleManager(settings.model_copy(update={"group_time_budget_seconds": 60.0}))
    manager.load()
    manager.on_series(node(1000.0, gpus=64))
    before = manager.alerts_json()
    assert len(before) == 64
    # A marked label would be another alert: the rule is stopped instead, its alerts kept.
    manager.settings = settings.model_copy(update={"group_time_budget_seconds": 0.3})
    manager.on_series(node(1001.0, gpus=64, value=95.0))  # would update their values
    assert manager.evaluator.groups[0].last_stopped == 2
    assert manager.alerts_json() == before


def test_a_slow_evaluation_never_holds_up_the_tick_and_the_next_is_skipped(
    tmp_path: Path,
) -> None:
    # Seconds of templates, a 60 s budget, a 20 ms sampling interval: a tick waits 5 ms.
    settings = RulesConfig(files=[str(slow_rules(tmp_path))], group_time_budget_seconds=60.0)
    manager = RuleManager(settings, interval_seconds=0.02)
    manager.load()
    manager.start()
    try:
        manager.on_series(node(1000.0, gpus=64))
        assert manager.evaluations_total == 0  # still running on the rule thread
        manager.on_series(node(1001.0, gpus=64, value=50.0))
        assert manager.evaluations_total == 0
        assert metric(manager, "gpu_exporter_rule_evaluations_skipped_total") == 1
        waited = 0.0
        while manager.evaluations_total == 0 and waited < 60.0:
            time.sleep(0.05)
            waited += 0.05
        assert manager.evaluations_total == 1
        # The skipped tick's series still reached the history, after the evaluation.
        time.sleep(0.2)
        latest = promql.evaluate(promql.parse("gpu_temperature_celsius"), manager.store, 1001.0)
        assert {e.value for e in latest} == {50.0}
        # The next tick evaluates again.
        manager.on_series(node(1002.0, gpus=64, value=20.0))
        assert metric(manager, "gpu_exporter_rule_evaluations_skipped_total") == 1
    finally:
        manager.stop()


def test_the_views_read_while_the_rule_thread_evaluates(tmp_path: Path) -> None:
    # Thousands of pending alerts appearing and vanishing at every tick while the API and the
    # self-metrics read them.
    path = write(
        tmp_path,
        "groups:\n  - name: g\n    rules:\n      - alert: Hot\n"
        "        expr: gpu_temperature_celsius > 80\n        for: 1h\n",
    )

    def churning(tick: int) -> SeriesSet:
        name = "gpu_temperature_celsius"
        rows = tuple(series(name, 90.0, (("gpu", f"{tick}-{g}"),)) for g in range(2000))
        return SeriesSet(1000.0 + tick, {name: rows})

    manager = RuleManager(RulesConfig(files=[str(path)]), interval_seconds=4.0)
    manager.load()
    manager.start()
    failures: list[BaseException] = []
    reads = 0
    done = threading.Event()

    def read() -> None:
        nonlocal reads
        while not done.is_set():
            try:
                manager.alerts_json()
                manager.rules_json()
                list(manager.series())
                reads += 1
            except BaseException as exc:
                failures.append(exc)
                return

    reader = threading.Thread(target=read)
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns inside each other's loops
    reader.start()
    try:
        for tick in range(25):
            manager.on_series(churning(tick))
            time.sleep(0.01)
    finally:
        done.set()
        reader.join(30)
        manager.stop()
        sys.setswitchinterval(switching)
    assert not failures, failures
    assert reads > 0 and manager.evaluations_total > 0
