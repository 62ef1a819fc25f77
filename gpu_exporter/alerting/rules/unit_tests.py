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

from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.alerts import State
from gpu_exporter.alerting.rules.engine import GroupEvaluator
from gpu_exporter.alerting.rules.loader import (
    LoadLimits,
    RuleFileError,
    load_rule_files,
    parse_duration,
)
from gpu_exporter.alerting.rules.series_notation import load_input_series, parse_series
from gpu_exporter.alerting.store import Labels, SeriesStore
from gpu_exporter.support.yamlfile import YamlFileError, load_yaml_file

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


def run_test_files(
    paths: Iterable[str | Path], out: TextIO, semantics: promql.Semantics = promql.DEFAULT_SEMANTICS
) -> bool:
    """Run every file; print promtool-style results; True when all passed."""
    all_passed = True
    for path in paths:
        out.write(f"Unit Testing:  {path}\n")
        outcome = run_test_file(Path(path), semantics)
        if outcome.passed:
            out.write("  SUCCESS\n\n")
        else:
            all_passed = False
            out.write("  FAILED:\n")
            for error in outcome.errors:
                out.write(f"{error}\n")
            out.write("\n")
    return all_passed


def run_test_file(
    path: Path, semantics: promql.Semantics = promql.DEFAULT_SEMANTICS
) -> FileOutcome:
    outcome = FileOutcome(str(path))
    try:
        located = load_yaml_file(path)
        spec = located.data or {}
        if not isinstance(spec, dict):
            raise RuleTestFileError(f"{path}: a test file is a mapping")
        unknown = set(spec) - _TEST_FILE_KEYS
        if unknown:
            raise RuleTestFileError(f"{path}: unknown keys {sorted(unknown, key=str)}")
        interval = parse_duration(str(spec.get("evaluation_interval", "1m")))
        rule_files = [
            str(p if Path(p).is_absolute() else path.parent / p)
            for p in spec.get("rule_files") or []
        ]
        groups = load_rule_files(rule_files, LoadLimits(semantics=semantics))
        order = spec.get("group_eval_order") or []
        if order:
            rank = {name: i for i, name in enumerate(order)}
            groups.sort(key=lambda g: rank.get(g.name, len(rank)))
        for index, test in enumerate(spec.get("tests") or []):
            outcome.errors += _run_test(test, index, groups, interval, semantics)
    except (YamlFileError, RuleFileError, RuleTestFileError, promql.PromQLError, ValueError) as exc:
        outcome.errors.append(f"    {exc}")
    return outcome


def _run_test(
    test: dict[str, Any],
    index: int,
    groups,
    default_interval: float,
    semantics: promql.Semantics,
) -> list[str]:
    errors = _run_test_case(test, index, groups, default_interval, semantics)
    if errors and test.get("name"):
        errors.insert(0, f"    name: {test['name']},")
    return errors


def _run_test_case(
    test: dict[str, Any],
    index: int,
    groups,
    default_interval: float,
    semantics: promql.Semantics,
) -> list[str]:
    if not isinstance(test, dict) or set(test) - _TEST_KEYS:
        unknown = sorted(set(test) - _TEST_KEYS) if isinstance(test, dict) else test
        raise RuleTestFileError(f"tests[{index}]: unknown keys {unknown}")
    # Without `interval`, promtool loads every input value at time 0 (and the first one wins):
    # checked against promtool 2.42; it is not the evaluation interval.
    interval = parse_duration(str(test["interval"])) if "interval" in test else 0.0
    alert_tests = test.get("alert_rule_test") or []
    expr_tests = test.get("promql_expr_test") or []
    for kind, cases, keys in (
        ("alert_rule_test", alert_tests, ("eval_time", "alertname")),
        ("promql_expr_test", expr_tests, ("eval_time", "expr")),
    ):
        for i, case in enumerate(cases):
            missing = [key for key in keys if not isinstance(case, dict) or key not in case]
            if missing:
                raise RuleTestFileError(f"tests[{index}].{kind}[{i}]: missing {missing}")
    # Integer milliseconds: 3 x 0.1 s must land exactly on 0.3 s.
    step_ms = round(default_interval * 1000)
    alert_times = {_ms(case["eval_time"]) for case in alert_tests}
    max_ms = max([*alert_times, *(_ms(case["eval_time"]) for case in expr_tests), 0])
    steps = max_ms // step_ms if step_ms else 0
    store = SeriesStore(retention_seconds=math.inf)
    # promtool loads input one evaluation step at a time, up to the last step at or before the
    # largest eval_time: later samples are invisible to it, so they must be to us.
    load_input_series(store, test.get("input_series") or [], interval, until=steps * step_ms / 1000)
    evaluator = GroupEvaluator(
        groups,
        store,
        external_labels=test.get("external_labels") or {},
        external_url=test.get("external_url") or "",
        write_alert_series=True,
        semantics=semantics,
        # promtool gives subqueries without a step the file's evaluation_interval.
        subquery_step=default_interval,
    )
    errors: list[str] = []
    got_at: dict[int, dict[str, list]] = {}
    for step in range(steps + 1):
        t_ms = step * step_ms
        for problem in evaluator.evaluate_all(t_ms / 1000):
            errors.append(f"    rule: {problem}, time: {_fmt_duration(t_ms / 1000)}")
        # As promtool: an eval_time between two steps sees the alerts of the step before it.
        for wanted in alert_times:
            if t_ms <= wanted < t_ms + step_ms:
                got: dict[str, list] = {}
                for rule in evaluator.alerting_rules():
                    alerts = [
                        _alert_key(a.labels, a.annotations) for a in rule.alerts(State.FIRING)
                    ]
                    got.setdefault(rule.name, []).extend(alerts)  # same-name rules add up
                got_at[wanted] = got
    for case in alert_tests:
        errors += _check_alerts(case, got_at)
    for case in expr_tests:
        errors += _check_expr(case, store, semantics, default_interval)
    return errors


def _ms(duration: Any) -> int:
    return round(parse_duration(str(duration)) * 1000)


def _alert_key(labels: Labels | Mapping[str, str], annotations: Mapping[str, str]) -> tuple:
    pairs = labels.items() if isinstance(labels, Mapping) else labels
    return (tuple(sorted(pairs)), tuple(sorted(annotations.items())))


def _check_alerts(case: dict[str, Any], got_at: dict[int, dict[str, list]]) -> list[str]:
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
    got = sorted(got_at.get(round(t * 1000), {}).get(name, []))
    if expected == got:
        return []
    return [
        f"    alertname: {name}, time: {_fmt_duration(t)}, ",
        f"        exp:{_fmt_alerts(expected)}, ",
        f"        got:{_fmt_alerts(got)}",
    ]


def _check_expr(
    case: dict[str, Any], store: SeriesStore, semantics: promql.Semantics, step: float
) -> list[str]:
    t = parse_duration(str(case["eval_time"]))
    expr_text = case["expr"]
    try:
        expr = promql.parse(expr_text, semantics)
        result = promql.evaluate(expr, store, t, semantics=semantics, subquery_step=step)
    except promql.PromQLError as exc:
        return [f"    expr: {expr_text!r}, time: {_fmt_duration(t)}, err: {exc}"]
    got: list[tuple[Labels, float]]
    if isinstance(result, float):
        got = [((), result)]
    else:
        got = [(element.labels, element.value) for element in result]
    expected = [
        (_expected_labels(sample.get("labels")), float(sample["value"]))
        for sample in case.get("exp_samples") or []
    ]
    if _same_samples(expected, got):
        return []
    return [
        f"    expr: {expr_text!r}, time: {_fmt_duration(t)},",
        f"        exp: {_fmt_samples(expected)}",
        f"        got: {_fmt_samples(got)}",
    ]


def _expected_labels(text: Any) -> Labels:
    """`exp_samples.labels`: a series like `m{a="b"}`, or nothing / `{}` for no labels."""
    if text is None or not str(text).strip() or str(text).strip() == "{}":
        return ()
    return parse_series(str(text))


def _same_samples(expected: list[tuple[Labels, float]], got: list[tuple[Labels, float]]) -> bool:
    if len(expected) != len(got):
        return False
    for (el, ev), (gl, gv) in zip(sorted(expected), sorted(got), strict=True):
        if el != gl:
            return False
        if ev != gv:  # promtool 2.42 compares with reflect.DeepEqual: NaN never equals NaN
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
