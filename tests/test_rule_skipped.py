"""A rule using PromQL the daemon does not evaluate (native-histogram functions: it has no native
histograms) is valid for Prometheus: its file loads, the rule is listed with the reason, counted
and logged, and never evaluated; invalid PromQL still refuses the file, as Prometheus refuses
it; `rules check` warns (fails with --strict); `rules export` keeps the rule for Prometheus."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
import yaml

from gpu_exporter.alerting.rules.loader import RuleFileError, load_rule_files, skipped_rules
from gpu_exporter.alerting.rules.manager import NEVER_EVALUATED, RuleManager
from gpu_exporter.alerting.rules.runbook import with_runbook_base
from gpu_exporter.alerting.settings import RulesConfig
from tests.daemon import parse_samples, serve_with_live_rules
from tests.support import gpu_exporter, promtool, wait_for
from tests.test_rule_manager import Sink, series_of, snapshot

NATIVE = "histogram_count(rate(gpu_x[5m])) > 0"
REASON = "not evaluated in the daemon: unsupported PromQL construct: function histogram_count"
MIXED = f"""\
groups:
  - name: mixed
    rules:
      - alert: Hot
        expr: gpu_temperature_celsius > 80
      - alert: Native
        expr: {NATIVE}
        for: 1m
        labels: {{severity: warning}}
        annotations: {{summary: native}}
      - record: gpu:temperature:max
        expr: max(gpu_temperature_celsius)
"""
WITHOUT_NATIVE = """\
groups:
  - name: mixed
    rules:
      - alert: Hot
        expr: gpu_temperature_celsius > 80
      - record: gpu:temperature:max
        expr: max(gpu_temperature_celsius)
"""


def write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_rule(expr: str, kind: str = "alert", name: str = "Bad") -> str:
    return f"groups:\n- name: g\n  rules:\n  - {kind}: {name}\n    expr: '{expr}'\n"


def rules_check(*args: str) -> subprocess.CompletedProcess[str]:
    return gpu_exporter("rules", "check", *args, timeout=60)


# -- the loader --------------------------------------------------------------------------------


def test_the_other_rules_load_and_the_skipped_one_is_kept_with_its_reason(tmp_path: Path) -> None:
    path = write(tmp_path, MIXED)
    [group] = load_rule_files([path])
    assert [rule.name for rule in group.rules] == ["Hot", "gpu:temperature:max"]
    assert all(rule.expr is not None for rule in group.rules)
    [skipped] = group.skipped
    assert (skipped.rule.name, skipped.rule.kind, skipped.position) == ("Native", "alert", 1)
    assert skipped.rule.expr_text == NATIVE
    assert skipped.rule.for_seconds == 60
    assert dict(skipped.rule.labels) == {"severity": "warning"}
    assert skipped.construct == "function histogram_count"
    assert skipped.reason == REASON
    assert skipped.message == (
        f"{path}:7: groups[0].rules[1].expr: alert Native in group 'mixed': {REASON}"
    )


@pytest.mark.parametrize(
    ("expr", "kind", "construct"),
    [
        ("histogram_sum(rate(gpu_x[5m]))", "record", "function histogram_sum"),
        (
            "histogram_fraction(0, 0.5, rate(gpu_x[5m])) > 0.9",
            "alert",
            "function histogram_fraction",
        ),
        ("sum by (gpu) (histogram_count(rate(gpu_x[5m])))", "alert", "function histogram_count"),
        ("histogram_sum(gpu_x) / histogram_count(gpu_x)", "alert", "function histogram_sum"),
    ],
)
def test_every_native_histogram_function_is_skipped_with_its_name(
    tmp_path: Path, expr: str, kind: str, construct: str
) -> None:
    name = "rec:x" if kind == "record" else "Native"
    [group] = load_rule_files([write(tmp_path, one_rule(expr, kind, name))])
    assert group.rules == ()
    [skipped] = group.skipped
    assert (skipped.rule.kind, skipped.rule.name, skipped.construct) == (kind, name, construct)
    checked = promtool("check", "rules", str(tmp_path / "rules.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr  # Prometheus loads it


@pytest.mark.parametrize(
    ("expr", "wanted"),
    [
        ("histogram_count(rate(gpu_x[5m])", "invalid PromQL"),  # syntax
        ('histogram_count("a")', "invalid PromQL: expected type vector"),  # type
        ("histogram_count(gpu_x[5m])", "invalid PromQL"),  # a range where a vector goes
        ('histogram_count(rate(gpu_x{a=~"("}[5m]))', "invalid PromQL"),  # regex syntax
        # Regexes Go refuses though promql_parser takes them, and PromQL newer than 2.42,
        # inside the skipped call: promql.parse stops at the call, the loader looks further.
        ('histogram_count(rate(gpu_x{a=~"a{1001}"}[5m]))', "invalid repeat count"),
        ('histogram_fraction(scalar(gpu_x{a=~"a{1001}"}), 1, gpu_x)', "invalid repeat count"),
        ("histogram_count(limitk(1, gpu_x))", "limitk"),
        ('histogram_sum(gpu_x{a="b" or c="d"})', ""),  # refused, however it is worded
    ],
)
def test_invalid_promql_inside_a_native_histogram_call_still_refuses_the_file(
    tmp_path: Path, expr: str, wanted: str
) -> None:
    path = write(tmp_path, one_rule(expr))
    with pytest.raises(RuleFileError) as err:
        load_rule_files([path])
    [problem] = err.value.problems
    assert problem.startswith(f"{path}:5: groups[0].rules[0].expr: alert Bad: "), problem
    assert wanted in problem
    assert promtool("check", "rules", str(path)).returncode != 0  # Prometheus refuses it too


@pytest.mark.parametrize(
    ("expr", "construct"),
    [
        ("limitk(1, gpu_x)", "limitk"),  # newer than Prometheus 2.42
        ("mad_over_time(gpu_x[5m])", "mad_over_time"),
        ('gpu_x{a="b" or c="d"}', ""),  # promql_parser's own extension
    ],
)
def test_promql_prometheus_2_42_refuses_is_refused_with_file_rule_and_construct(
    tmp_path: Path, expr: str, construct: str
) -> None:
    path = write(tmp_path, one_rule(expr))
    with pytest.raises(RuleFileError) as err:
        load_rule_files([path])
    [problem] = err.value.problems
    assert problem.startswith(f"{path}:5: groups[0].rules[0].expr: alert Bad: "), problem
    assert construct in problem
    assert promtool("check", "rules", str(path)).returncode != 0


def test_a_skipped_rule_is_still_checked_like_any_other(tmp_path: Path) -> None:
    text = one_rule(NATIVE) + "    for: soon\n    annotations: {x: '{{ .Nope }'}\n"
    with pytest.raises(RuleFileError) as err:
        load_rule_files([write(tmp_path, text)])
    problems = err.value.problems
    assert len(problems) == 2, problems
    assert any("not a duration" in p for p in problems)
    assert any("template" in p for p in problems)


# -- the rule manager, in-process --------------------------------------------------------------


def test_the_manager_lists_counts_and_logs_the_skipped_rule_and_never_evaluates_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gpu_exporter.alerting.rules.manager")
    path = write(tmp_path, MIXED)
    sink = Sink()
    manager = RuleManager(RulesConfig(files=[str(path)], evaluation_interval_seconds=1.0), sink)
    manager.load()
    for t in range(3):
        manager.on_series(series_of(snapshot(1000.0 + t, 90)))
    [group] = manager.rules_json()
    rules = {rule["name"]: rule for rule in group["rules"]}
    assert list(rules) == ["Hot", "Native", "gpu:temperature:max"]  # as written
    assert rules["Hot"]["health"] == "ok" and rules["Hot"]["state"] == "firing"
    assert rules["gpu:temperature:max"]["health"] == "ok"
    native = rules["Native"]
    assert native == {
        "name": "Native",
        "query": NATIVE,
        "labels": {"severity": "warning"},
        "health": "err",
        "lastError": REASON,
        "evaluationTime": 0.0,
        "lastEvaluation": NEVER_EVALUATED,
        "type": "alerting",
        "state": "inactive",
        "duration": 60.0,
        "keepFiringFor": 0.0,
        "annotations": {"summary": "native"},
        "alerts": [],
    }
    assert {a.labels["alertname"] for a in sink.sent} == {"Hot"}
    assert manager.evaluation_failures_total == 0  # skipped, not failing
    assert skipped_metric(manager) == {"mixed": 1.0}
    logged = [r.getMessage() for r in caplog.records if "Native" in r.getMessage()]
    assert logged == [
        f"rule loaded but skipped: {path}:7: groups[0].rules[1].expr: alert Native in group "
        f"'mixed': {REASON}"
    ]


def test_a_reload_adding_or_removing_the_skipped_rule_updates_the_count(tmp_path: Path) -> None:
    path = write(tmp_path, WITHOUT_NATIVE)
    manager = RuleManager(RulesConfig(files=[str(path)], reload_check_seconds=3600))
    manager.load()
    assert skipped_metric(manager) == {"mixed": 0.0}
    path.write_text(MIXED)
    assert manager.reload()
    assert skipped_metric(manager) == {"mixed": 1.0}
    path.write_text(WITHOUT_NATIVE)
    assert manager.reload()
    assert skipped_metric(manager) == {"mixed": 0.0}
    assert [r["health"] for r in manager.rules_json()[0]["rules"]] == ["unknown", "unknown"]


def skipped_metric(manager: RuleManager) -> dict[str, float]:
    return {
        dict(row.labels)["group"]: row.value
        for row in manager.series()
        if row.name == "gpu_exporter_rule_group_skipped_rules"
    }


# -- serve --------------------------------------------------------------------------------------


def test_serve_evaluates_the_rest_and_reports_the_skipped_rule(tmp_path: Path) -> None:
    text = MIXED.replace("gpu_temperature_celsius > 80", "gpu_up == 1")
    with serve_with_live_rules(tmp_path, text) as (daemon, path):

        def rules() -> dict[str, dict]:
            [group] = daemon.get("/api/v1/rules").json()["data"]["groups"]
            return {rule["name"]: rule for rule in group["rules"]}

        wait_for(lambda: rules()["Hot"]["state"] == "firing", 15, "the supported alert firing")
        listed = rules()
        assert list(listed) == ["Hot", "Native", "gpu:temperature:max"]
        assert listed["gpu:temperature:max"]["health"] == "ok"
        native = listed["Native"]
        assert (native["health"], native["lastError"]) == ("err", REASON)
        assert (native["lastEvaluation"], native["alerts"]) == (NEVER_EVALUATED, [])
        alerts = daemon.get("/api/v1/alerts").json()["data"]["alerts"]
        assert {a["labels"]["alertname"] for a in alerts} == {"Hot"}
        assert skipped_series(daemon) == 1.0
        message = f"{path}:7: groups[0].rules[1].expr: alert Native in group 'mixed': {REASON}"
        assert daemon.output().count(message) == 1, daemon.output()

        path.write_text(WITHOUT_NATIVE)
        daemon.reload_rules()
        wait_for(lambda: skipped_series(daemon) == 0.0, 10, "the count after the rule went")
        assert daemon.rule_names() == ["Hot", "gpu:temperature:max"]
        path.write_text(MIXED)
        daemon.reload_rules()
        wait_for(lambda: skipped_series(daemon) == 1.0, 10, "the count after it came back")
        assert daemon.output().count(message) == 2  # once per load that has it
        assert daemon.process.poll() is None


def skipped_series(daemon) -> float:
    samples = parse_samples(daemon.metrics_text())
    return samples['gpu_exporter_rule_group_skipped_rules{group="mixed"}']


# -- rules check and export ---------------------------------------------------------------------


def test_rules_check_warns_and_exits_0(tmp_path: Path) -> None:
    path = write(tmp_path, MIXED)
    result = rules_check(str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    message = f"{path}:7: groups[0].rules[1].expr: alert Native in group 'mixed': {REASON}"
    assert (
        f"Checking {path}\n"
        "  WARNING: rules the daemon loads but does not evaluate (Prometheus does; --strict "
        f"refuses them):\n    {message}\n  SUCCESS: 3 rules found\n"
    ) in result.stdout


def test_rules_check_strict_refuses_the_skipped_rule(tmp_path: Path) -> None:
    skipping, clean = write(tmp_path, MIXED), write(tmp_path, WITHOUT_NATIVE, "clean.yaml")
    result = rules_check("--strict", str(clean), str(skipping))
    assert result.returncode == 1, result.stdout + result.stderr
    message = f"{skipping}:7: groups[0].rules[1].expr: alert Native in group 'mixed': {REASON}"
    assert (
        f"Checking {skipping}\n"
        "  FAILED: --strict refuses rules the daemon loads but does not evaluate:\n"
        f"    {message}\n"
    ) in result.stdout
    assert f"Checking {clean}\n  SUCCESS: 2 rules found\n" in result.stdout
    assert rules_check("--strict", str(clean)).returncode == 0


def test_export_keeps_the_skipped_rule_for_prometheus(tmp_path: Path) -> None:
    path = write(tmp_path, MIXED)
    result = gpu_exporter("rules", "export", str(path), timeout=60)
    assert result.returncode == 0, result.stderr
    spec = yaml.safe_load(result.stdout)["spec"]
    assert spec == yaml.safe_load(MIXED)  # unchanged, the skipped rule in its place
    exported = write(tmp_path, yaml.safe_dump(spec), "spec.yaml")
    checked = promtool("check", "rules", str(exported))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 3 rules found" in checked.stdout
    assert len(skipped_rules(load_rule_files([exported]))) == 1


def test_a_skipped_rules_runbook_link_is_made_absolute_as_the_others(tmp_path: Path) -> None:
    # /api/v1/rules lists a skipped rule's annotations: its relative link must resolve too.
    text = one_rule(NATIVE) + "    annotations: {runbook_url: docs/runbook.md#Bad}\n"
    base = "http://node:9449/runbook"
    groups = with_runbook_base(load_rule_files([write(tmp_path, text)]), base)
    (skipped,) = skipped_rules(groups)
    assert skipped.rule.annotations["runbook_url"] == f"{base}#Bad"
