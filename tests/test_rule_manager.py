"""The daemon's rule engine: loading, refusing what it cannot evaluate, reloading safely,
evaluating snapshots, and handing alerts to the notifier as Prometheus would (rules it loads
but does not evaluate: tests/test_rule_skipped.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest

from gpu_exporter.alerting.rules.loader import RuleFileError, load_rule_files, parse_duration
from gpu_exporter.alerting.rules.manager import RuleManager
from gpu_exporter.alerting.settings import RulesConfig
from gpu_exporter.model.series import SeriesBuilder, SeriesSet
from gpu_exporter.model.snapshot import DeviceSample, Reading, Snapshot, TickStats

GOOD = """\
groups:
  - name: g
    rules:
      - alert: Hot
        expr: gpu_temperature_celsius > 80
        for: 2s
        labels: {severity: warning}
        annotations: {summary: "GPU {{ $labels.gpu }} at {{ $value }}C"}
"""


def write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def snapshot(t: float, temperature: float, gpus: int = 1) -> Snapshot:
    devices = tuple(
        DeviceSample(
            i,
            f"GPU-{i}",
            {"model": "H200"},
            True,
            (Reading("gpu_temperature_celsius", temperature, (("sensor", "gpu"),)),),
        )
        for i in range(gpus)
    )
    return Snapshot(t, devices, stats=TickStats(last_tick_timestamp=t, ticks=1))


def series_of(snap: Snapshot) -> SeriesSet:
    return SeriesBuilder().build(snap)


class Sink:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, alerts) -> None:
        self.sent.extend(alerts)


def test_duration_parsing() -> None:
    assert parse_duration("1h30m") == 5400
    assert parse_duration("0s") == 0
    assert parse_duration("250ms") == 0.25
    with pytest.raises(ValueError):
        parse_duration("5 minutes")


def test_rule_file_problems_are_all_reported(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "groups:\n- name: g\n  rules:\n"
        "  - alert: A\n    expr: 'up >'\n"
        "  - record: 'bad name'\n    expr: up\n"
        "  - alert: C\n    expr: up\n    for: soon\n"
        "  - alert: D\n    expr: up\n    annotations: {x: '{{ .Nope }'}\n",
    )
    with pytest.raises(RuleFileError) as err:
        load_rule_files([path])
    problems = err.value.problems
    assert len(problems) == 4, problems
    assert any("invalid PromQL" in p for p in problems)
    assert any("not a valid metric name" in p for p in problems)
    assert any("not a duration" in p for p in problems)
    assert any("template" in p for p in problems)


def test_a_glob_matching_nothing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError, match="no rule file matches"):
        load_rule_files([str(tmp_path / "*.yaml")])


def test_alert_goes_pending_then_firing_and_is_sent_then_resolved(tmp_path: Path) -> None:
    sink = Sink()
    manager = RuleManager(
        RulesConfig(files=[str(write(tmp_path, GOOD))], evaluation_interval_seconds=1.0), sink
    )
    manager.load()
    manager.on_series(series_of(snapshot(1000.0, 90)))
    assert [a["state"] for a in manager.alerts_json()] == ["pending"]
    assert sink.sent == []  # pending alerts are not sent
    manager.on_series(series_of(snapshot(1001.0, 91)))
    manager.on_series(series_of(snapshot(1002.0, 92)))
    assert [a["state"] for a in manager.alerts_json()] == ["firing"]
    assert len(sink.sent) == 1
    sent = sink.sent[0]
    assert sent.labels == {
        "alertname": "Hot",
        "gpu": "0",
        "uuid": "GPU-0",
        "sensor": "gpu",
        "severity": "warning",
    }
    assert sent.annotations == {"summary": "GPU 0 at 92C"}
    assert sent.ends_at > 1002.0  # in the future while firing
    manager.on_series(series_of(snapshot(1003.0, 50)))
    assert manager.alerts_json() == []
    resolved = sink.sent[-1]
    assert resolved.ends_at == 1003.0


@pytest.mark.parametrize(
    ("tick", "evaluation_interval", "expected"),
    [
        # Seconds between evaluations of a group without `interval` and of one with 15s: the
        # evaluation interval and the group's own, each at the tick nearest to it.
        (1.0, None, {"plain": 1, "slow": 15}),
        (1.0, 5.0, {"plain": 5, "slow": 15}),
        (2.0, 6.0, {"plain": 6, "slow": 14}),
    ],
)
def test_groups_run_at_their_interval_on_the_sampling_ticks(
    tmp_path: Path, tick: float, evaluation_interval: float | None, expected: dict[str, int]
) -> None:
    text = (
        "groups:\n"
        "  - name: plain\n    rules: [{record: 'a:b', expr: vector(1)}]\n"
        "  - name: slow\n    interval: 15s\n    rules: [{record: 'a:c', expr: vector(1)}]\n"
    )
    manager = RuleManager(
        RulesConfig(
            files=[str(write(tmp_path, text))], evaluation_interval_seconds=evaluation_interval
        ),
        interval_seconds=tick,
    )
    manager.load()
    evaluated: dict[str, list[float]] = {}
    for step in range(int(60 / tick) + 1):
        now = 1000.0 + step * tick
        manager.on_series(series_of(snapshot(now, 50)))
        for group in manager.evaluator.groups:
            if group.last_evaluation == now:
                evaluated.setdefault(group.group.name, []).append(now)
    gaps = {name: {b - a for a, b in pairwise(times)} for name, times in evaluated.items()}
    assert gaps == {name: {seconds} for name, seconds in expected.items()}


def test_a_broken_reload_keeps_the_last_good_rules(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    manager = RuleManager(RulesConfig(files=[str(path)], reload_check_seconds=0.01))
    manager.load()
    manager.on_series(series_of(snapshot(1000.0, 90)))
    path.write_text(GOOD.replace("gpu_temperature_celsius > 80", "gpu_temperature_celsius >"))
    os.utime(path, (time.time() + 5, time.time() + 5))
    time.sleep(0.02)
    manager.on_series(series_of(snapshot(1001.0, 91)))
    assert manager.last_reload_success is False
    assert f"{path}:5: groups[0].rules[0].expr: alert Hot: invalid PromQL" in (
        manager.last_reload_error
    )
    assert [a["state"] for a in manager.alerts_json()] == ["pending"]  # still evaluated
    rules = manager.rules_json()[0]["rules"]
    assert rules[0]["query"] == "gpu_temperature_celsius > 80"


def test_reload_on_request_keeps_state_of_unchanged_rules(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    manager = RuleManager(RulesConfig(files=[str(path)], reload_check_seconds=3600))
    manager.load()
    manager.on_series(series_of(snapshot(1000.0, 90)))
    path.write_text(GOOD + "      - alert: Cold\n        expr: gpu_temperature_celsius < 10\n")
    manager.request_reload()  # what SIGHUP does
    manager.on_series(series_of(snapshot(1001.0, 90)))
    names = [r["name"] for r in manager.rules_json()[0]["rules"]]
    assert names == ["Hot", "Cold"]
    alert = manager.alerts_json()[0]
    assert alert["activeAt"].startswith("1970-01-01T00:16:40")  # from before the reload


def test_rules_check_command(tmp_path: Path) -> None:
    good, bad = write(tmp_path, GOOD, "good.yaml"), write(tmp_path, "groups: 3\n", "bad.yaml")
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "rules", "check", str(good), str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert f"Checking {good}\n  SUCCESS: 1 rules found" in result.stdout
    assert f"Checking {bad}\n  FAILED:" in result.stdout


def test_export_is_a_prometheusrule_promtool_accepts(tmp_path: Path) -> None:
    import yaml

    from tests.support import require_tool

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_exporter",
            "rules",
            "export",
            "--namespace",
            "monitoring",
            "--runbook-base-url",
            "https://wiki.example/gpu-runbook",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    manifest = yaml.safe_load(result.stdout)
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    assert manifest["metadata"]["namespace"] == "monitoring"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(manifest["spec"]))
    checked = subprocess.run(
        [require_tool("promtool"), "check", "rules", str(spec)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    from gpu_exporter.alerting.pack import all_pack_files

    shipped = sum(len(group.rules) for group in load_rule_files(all_pack_files()))
    assert f"SUCCESS: {shipped} rules found" in checked.stdout


def test_the_store_is_fed_the_label_sets_store_samples_builds() -> None:
    # The manager reuses label sets from the previous feed of the same group; what it feeds
    # must stay exactly what store_samples gives, with new, changed and vanished series.
    from gpu_exporter.alerting.rules.manager import _StoreLabels, store_samples
    from gpu_exporter.model.series import series

    feeds = [
        [series("a", 1.0, (("gpu", "0"), ("b", "x"))), series("c", 2.0, (("gpu", "0"),))],
        [series("a", 3.0, (("gpu", "0"), ("b", "x"))), series("a", 4.0, (("b", ""), ("gpu", "1")))],
        [series("a", 5.0, (("gpu", "0"), ("b", "y"))), series("c", 6.0, (("gpu", "0"),))],
    ]
    labels = _StoreLabels()
    for t, rows in enumerate(feeds):
        series_set = SeriesSet(float(t), {"a": tuple(rows)})
        for names in (None, frozenset({"a"})):
            group = f"g{names is None}"
            assert labels.samples(series_set, names, group) == list(
                store_samples(series_set, names)
            )
    # Only the last feed's label sets are kept.
    assert {key[1] for key in labels._by_group["gTrue"]} == {r.labels for r in feeds[-1]}


# Label and annotation checks: (labels/annotations YAML, our problem, whether promtool 2.42
# refuses it too). Where it does not, Prometheus would pass a reserved label on or replace
# `alertname` silently (rules/alerting.go); we refuse both.
LABEL_CASES = [
    ("labels: {__name__: x}", "groups[0].rules[0].labels.__name__: alert A: '__name__' is", True),
    ("labels: {0a: x}", "groups[0].rules[0].labels.0a: alert A: '0a' is not a valid label", True),
    ('labels: {"a-b": x}', "groups[0].rules[0].labels.a-b: alert A: 'a-b' is not a valid", True),
    ('annotations: {"a b": x}', "groups[0].rules[0].annotations.a b: alert A: 'a b' is not", True),
    ("labels: {__x: y}", "groups[0].rules[0].labels.__x: alert A: '__x' is reserved", False),
    ("labels: {alertname: y}", "groups[0].rules[0].labels.alertname: alert A: 'alertname'", False),
    ("labels: {ok: [1]}", "groups[0].rules[0].labels.ok: alert A: label value must be a", True),
    # A value that is not UTF-8 cannot get past the YAML reader (a lone surrogate escape).
    ('labels: {ok: "\\ud800"}', "invalid YAML: found invalid Unicode character escape", True),
]


@pytest.mark.parametrize(("mapping", "problem", "promtool_refuses"), LABEL_CASES)
def test_labels_and_annotations_alertmanager_would_refuse_are_refused_at_load(
    tmp_path: Path, mapping: str, problem: str, promtool_refuses: bool
) -> None:
    from tests.support import require_tool

    text = (
        f"groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        {mapping}\n"
    )
    path = write(tmp_path, text)
    with pytest.raises(RuleFileError) as caught:
        load_rule_files([path])
    (found,) = caught.value.problems
    assert found.startswith(f"{path}:6: {problem}"), found
    checked = subprocess.run(
        [require_tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True
    )
    assert (checked.returncode != 0) == promtool_refuses, checked.stdout + checked.stderr


def test_valid_labels_and_annotations_load() -> None:
    text = GOOD.replace("labels: {severity: warning}", 'labels: {severity: warning, _x: "1", n: 3}')
    text = text.replace("annotations: {", 'annotations: {__doc: "y", ')
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (group,) = load_rule_files([write(Path(tmp), text)])
    rule = group.rules[0]
    assert dict(rule.labels) == {"severity": "warning", "_x": "1", "n": "3"}
    assert set(rule.annotations) == {"__doc", "summary"}
