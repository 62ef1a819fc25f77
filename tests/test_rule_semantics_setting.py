"""`rules.semantics` from the configuration, the chart and the CLI to the evaluator: each
place picks the Prometheus whose PromQL the rules follow, and a wrong name is refused naming
the setting. (What each semantics computes: tests/test_promql_semantics.py.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.loader import LoadLimits, RuleFileError, load_rule_files
from gpu_exporter.alerting.rules.manager import RuleManager
from gpu_exporter.alerting.settings import RulesConfig
from gpu_exporter.alerting.store import SeriesStore
from gpu_exporter.config.load import ConfigError, load_config, rule_manager
from tests.support import gpu_exporter
from tests.test_values_schema import rendered_config

ROOT = Path(__file__).resolve().parent.parent
HOLT_WINTERS = """
groups:
  - name: smoothing
    rules:
      - record: smoothed
        expr: holt_winters(x[5m], 0.5, 0.5)
"""
# Samples every minute from 0: at 5m, [5m] holds six in 2.42 and five in 3.x.
COUNTING = """
groups:
  - name: counting
    rules:
      - record: samples_in_5m
        expr: count_over_time(x[5m])
"""


def test_the_default_is_prometheus_2_42_everywhere(tmp_path: Path) -> None:
    config = load_config(None, environ={})
    assert config.rules.semantics == promql.DEFAULT_SEMANTICS.name == "prometheus2"
    assert rule_manager(config).semantics is promql.PROMETHEUS_2
    assert RuleManager(RulesConfig()).semantics is promql.PROMETHEUS_2


def test_the_setting_reaches_the_rule_manager(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("rules:\n  semantics: prometheus3\n")
    assert rule_manager(load_config(path, environ={})).semantics is promql.PROMETHEUS_3
    environ = {"GPU_EXPORTER_RULES__SEMANTICS": "prometheus3"}
    assert load_config(None, environ=environ).rules.semantics == "prometheus3"


def test_an_unknown_semantics_is_refused_naming_the_setting(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("rules:\n  semantics: prometheus4\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert "rules.semantics" in str(info.value)
    assert "prometheus2" in str(info.value) and "prometheus3" in str(info.value)


def test_loading_follows_the_semantics(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(HOLT_WINTERS)
    assert load_rule_files([path], LoadLimits(semantics=promql.PROMETHEUS_2))
    with pytest.raises(RuleFileError) as info:  # 3.x knows no holt_winters
        load_rule_files([path], LoadLimits(semantics=promql.PROMETHEUS_3))
    assert 'unknown function with name "holt_winters"' in str(info.value)


@pytest.mark.parametrize(("semantics", "expected"), [("prometheus2", 6.0), ("prometheus3", 5.0)])
def test_the_manager_evaluates_with_the_semantics(
    tmp_path: Path, semantics: str, expected: float
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(COUNTING)
    settings = RulesConfig(files=[str(path)], semantics=semantics)
    manager = RuleManager(settings, SeriesStore(retention_seconds=math.inf))
    manager.load()
    labels = (("__name__", "x"),)
    for minute in range(6):
        manager.store.append(labels, minute * 60.0, float(minute))
    evaluator = manager.evaluator
    assert not evaluator.evaluate_all(300.0)
    result = promql.evaluate(promql.parse("samples_in_5m"), manager.store, 300.0)
    assert [e.value for e in result] == [expected]


def test_rules_check_and_test_take_the_semantics(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(HOLT_WINTERS)
    assert gpu_exporter("rules", "check", str(path)).returncode == 0
    refused = gpu_exporter("rules", "check", "--semantics", "prometheus3", str(path))
    assert refused.returncode == 1 and "holt_winters" in refused.stdout
    # The promtool-checked expectations are 2.42's: 3.x's windows give other numbers.
    functions = str(ROOT / "tests/promql/functions.test.yaml")
    assert gpu_exporter("rules", "test", functions).returncode == 0
    assert gpu_exporter("rules", "test", "--semantics", "prometheus3", functions).returncode == 1
    wrong = gpu_exporter("rules", "test", "--semantics", "prometheus4", functions)
    assert wrong.returncode == 2 and "prometheus3" in wrong.stderr


def test_the_chart_passes_the_semantics_to_the_daemon() -> None:
    assert rendered_config()["rules"]["semantics"] == "prometheus2"
    config = rendered_config("--set", "rules.semantics=prometheus3")
    assert config["rules"]["semantics"] == "prometheus3"
