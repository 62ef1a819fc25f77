"""`gpu-exporter rules test`: promtool's rule unit-test format, run on the daemon's evaluator.

Same file format and the same procedure as `promtool test rules` (Prometheus 2.42): load the
input series, evaluate every group in order at every `evaluation_interval` step from 0 to the
last eval time, compare the *firing* alerts at each `alert_rule_test.eval_time` and the query
results of each `promql_expr_test`. Output mimics promtool's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpu_exporter.rules import promql
from gpu_exporter.rules.alerts import State
from gpu_exporter.rules.engine import GroupEvaluator
from gpu_exporter.rules.loader import RuleFileError, load_rule_files, parse_duration
from gpu_exporter.rules.series_notation import load_input_series, parse_series
from gpu_exporter.store import Labels, SeriesStore
from gpu_exporter.yamlfile import YamlFileError, load_yaml_file

_TEST_FILE_KEYS = {"rule_files", "evaluation_interval", "group_eval_order", "tests"}
_TEST_KEYS = {
    "name", "interval", "input_series", "alert_rule_test", "promql_expr_test",
    "external_labels", "external_url",
}  # fmt: skip


class RuleTestFileError(ValueError):
    pass


@dataclass
class FileOutcome:
    file: str
    errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.errors


def run_test_files(paths: Iterable[str | Path], out: TextIO) -> bool:
    """Run every file; print promtool-style results; True when all passed."""
    all_passed = True
    for path in paths:
        out.write(f"Unit Testing:  {path}\n")
        outcome = run_test_file(Path(path))
        if outcome.passed:
            out.write("  SUCCESS\n\n")
        else:
            all_passed = False
            out.write("  FAILED:\n")
            for error in outcome.errors:
                out.write(f"{error}\n")
            out.write("\n")
    return all_passed


def run_test_file(path: Path) -> FileOutcome:
    outcome = FileOutcome(str(path))
    try:
        located = load_yaml_file(path)
        spec = located.data or {}
        if not isinstance(spec, dict):
            raise RuleTestFileError(f"{path}: a test file is a mapping")
        unknown = set(spec) - _TEST_FILE_KEYS
        if unknown:
            raise RuleTestFileError(f"{path}: unknown keys {sorted(unknown)}")
        interval = parse_duration(str(spec.get("evaluation_interval", "1m")))
        rule_files = [
            str(p if Path(p).is_absolute() else path.parent / p)
            for p in spec.get("rule_files") or []
        ]
        groups = load_rule_files(rule_files)
        order = spec.get("group_eval_order") or []
        if order:
            rank = {name: i for i, name in enumerate(order)}
            groups.sort(key=lambda g: rank.get(g.name, len(rank)))
        for index, test in enumerate(spec.get("tests") or []):
            outcome.errors += _run_test(test, index, groups, interval)
    except (YamlFileError, RuleFileError, RuleTestFileError, promql.PromQLError, ValueError) as exc:
        outcome.errors.append(f"    {exc}")
    return outcome


def _run_test(test: dict[str, Any], index: int, groups, default_interval: float) -> list[str]:
    errors = _run_test_case(test, index, groups, default_interval)
    if errors and test.get("name"):
        errors.insert(0, f"    name: {test['name']},")
    return errors


def _run_test_case(test: dict[str, Any], index: int, groups, default_interval: float) -> list[str]:
    if not isinstance(test, dict) or set(test) - _TEST_KEYS:
        raise RuleTestFileError(f"tests[{index}]: unknown keys {sorted(set(test) - _TEST_KEYS)}")
    interval = parse_duration(str(test.get("interval", f"{default_interval}s")))
    store = SeriesStore(retention_seconds=math.inf)
    alert_tests = test.get("alert_rule_test") or []
    expr_tests = test.get("promql_expr_test") or []
    eval_times = {parse_duration(str(t["eval_time"])) for t in alert_tests}
    max_time = max([*eval_times, *(parse_duration(str(t["eval_time"])) for t in expr_tests), 0.0])
    steps = int(max_time // default_interval) if default_interval else 0
    # promtool loads input one evaluation step at a time, up to the last step at or before the
    # largest eval_time: later samples are invisible to it, so they must be to us.
    load_input_series(
        store, test.get("input_series") or [], interval, until=steps * default_interval
    )
    evaluator = GroupEvaluator(
        groups,
        store,
        external_labels=test.get("external_labels") or {},
        external_url=test.get("external_url") or "",
    )
    alert_tests = test.get("alert_rule_test") or []
    expr_tests = test.get("promql_expr_test") or []
    eval_times = {parse_duration(str(t["eval_time"])) for t in alert_tests}
    max_time = max([*eval_times, *(parse_duration(str(t["eval_time"])) for t in expr_tests), 0.0])
    errors: list[str] = []
    got_at: dict[float, dict[str, list]] = {}
    steps = round(max_time / default_interval) if default_interval else 0
    for step in range(steps + 1):
        t = step * default_interval
        for problem in evaluator.evaluate_all(t):
            errors.append(f"    rule: {problem}, time: {_fmt_duration(t)}")
        if t in eval_times:
            got_at[t] = {
                rule.name: [_alert_key(a.labels, a.annotations) for a in rule.alerts(State.FIRING)]
                for rule in evaluator.alerting_rules()
            }
    for case in alert_tests:
        errors += _check_alerts(case, got_at)
    for case in expr_tests:
        errors += _check_expr(case, store)
    return errors


def _alert_key(labels: Labels | Mapping[str, str], annotations: Mapping[str, str]) -> tuple:
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    return (tuple(sorted(pairs)), tuple(sorted(annotations.items())))


def _check_alerts(case: dict[str, Any], got_at: dict[float, dict[str, list]]) -> list[str]:
    t = parse_duration(str(case["eval_time"]))
    name = case["alertname"]
    expected = sorted(
        _alert_key(
            {**{str(k): str(v) for k, v in (a.get("exp_labels") or {}).items()},
             "alertname": name},
            {str(k): str(v) for k, v in (a.get("exp_annotations") or {}).items()},
        )
        for a in case.get("exp_alerts") or []
    )  # fmt: skip
    got = sorted(got_at.get(t, {}).get(name, []))
    if expected == got:
        return []
    return [
        f"    alertname: {name}, time: {_fmt_duration(t)}, ",
        f"        exp:{_fmt_alerts(expected)}, ",
        f"        got:{_fmt_alerts(got)}",
    ]


def _check_expr(case: dict[str, Any], store: SeriesStore) -> list[str]:
    t = parse_duration(str(case["eval_time"]))
    expr_text = case["expr"]
    try:
        result = promql.evaluate(promql.parse(expr_text), store, t)
    except promql.PromQLError as exc:
        return [f"    expr: {expr_text!r}, time: {_fmt_duration(t)}, err: {exc}"]
    if isinstance(result, float):
        got = [((), result)]
    else:
        got = [(element.labels, element.value) for element in result]
    expected = [
        (parse_series(str(sample.get("labels", "{}"))), float(sample["value"]))
        for sample in case.get("exp_samples") or []
    ]
    if _same_samples(expected, got):
        return []
    return [
        f"    expr: {expr_text!r}, time: {_fmt_duration(t)},",
        f"        exp: {_fmt_samples(expected)}",
        f"        got: {_fmt_samples(got)}",
    ]


def _same_samples(expected: list[tuple[Labels, float]], got: list[tuple[Labels, float]]) -> bool:
    if len(expected) != len(got):
        return False
    for (el, ev), (gl, gv) in zip(sorted(expected), sorted(got), strict=True):
        if el != gl:
            return False
        if not (ev == gv or (math.isnan(ev) and math.isnan(gv))):
            return False
    return True


def _fmt_alerts(alerts: list[tuple]) -> str:
    parts = []
    for labels, notes in alerts:
        label_text = ", ".join(f'{k}="{v}"' for k, v in labels)
        annotation_text = ", ".join(f'{k}="{v}"' for k, v in notes)
        parts.append(
            f"\n        0:\n          Labels:{{{label_text}}}\n          "
            f"Annotations:{{{annotation_text}}}"
        )
    return "[" + "".join(parts) + "]" if parts else "(none)"


def _fmt_samples(samples: list[tuple[Labels, float]]) -> str:
    return "[" + ", ".join(
        "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + f"}} {value}"
        for labels, value in sorted(samples)
    ) + "]"  # fmt: skip


def _fmt_duration(seconds: float) -> str:
    """As Prometheus prints durations: 5m, 1h30m, 90s -> 1m30s, 0 -> 0s."""
    whole = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, whole = divmod(whole, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0s"
