"""What the rule store keeps per metric: exactly what the loaded rules' selectors can read.

Each behaviour is checked against a store that keeps everything, fed the same writes and
evaluated at each ingest's time as the daemon evaluates: a policy keeping too little changes a
result, one keeping too much fails a count."""

from __future__ import annotations

import math
import struct
from pathlib import Path

from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.engine import RETENTION_MARGIN_SECONDS as MARGIN
from gpu_exporter.alerting.rules.engine import GroupEvaluator
from gpu_exporter.alerting.rules.manager import RuleManager
from gpu_exporter.alerting.settings import RulesConfig
from gpu_exporter.alerting.store import (
    Labels,
    Matcher,
    Retention,
    SeriesStore,
    is_stale,
    make_labels,
)

RULES = """\
groups:
  - name: g
    interval: 5s
    rules:
      - alert: Ranged
        expr: rate(c_total[10m]) > 0
      - alert: Instant
        expr: g == 1
      - alert: Shifted
        expr: s offset 1m > 0
      - record: rec
        expr: sum(g)
"""
EXPRS = ["rate(c_total[10m])", "g", "s offset 1m", "rec", "absent(g)"]
C = make_labels("c_total", [("gpu", "0")])
G0 = make_labels("g", [("gpu", "0")])
G1 = make_labels("g", [("gpu", "1")])
S = make_labels("s", [("gpu", "0")])


def manager_for(tmp_path: Path, text: str = RULES) -> RuleManager:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    manager = RuleManager(RulesConfig(files=[str(path)]))
    manager.load()
    return manager


class Twin:
    """The manager's store and one keeping everything, fed alike; each ingest is followed by
    an evaluation at its time, and every expression must read the same from both."""

    def __init__(self, manager: RuleManager) -> None:
        self.store = manager.store
        self.full = SeriesStore(retention_seconds=math.inf)
        self.evaluators = [
            manager.evaluator,
            GroupEvaluator([g.group for g in manager.evaluator.groups], self.full),
        ]

    def tick(self, t: float, samples: list[tuple[Labels, float]]) -> None:
        for store, evaluator in zip((self.store, self.full), self.evaluators, strict=True):
            store.ingest(t, samples, group="tick")
            assert evaluator.evaluate_all(t) == []
        for text in EXPRS:
            expr = promql.parse(text)
            got = bits(promql.evaluate(expr, self.store, t))
            assert got == bits(promql.evaluate(expr, self.full, t)), (text, t)


def bits(result: list[promql.Element] | float) -> list[tuple[Labels, bytes]]:
    if isinstance(result, float):
        return [((), struct.pack("<d", result))]
    return [(e.labels, struct.pack("<d", e.value)) for e in result]


def times_of(store: SeriesStore, labels: Labels) -> list[int]:
    matchers = [Matcher(name, "=", value) for name, value in labels]
    rows = [row for row in store.range_ms(matchers, 0, 10**15) if row[0] == labels]
    latest = [ms for found, ms, _ in store.latest_ms(matchers, 10**15) if found == labels]
    return list(rows[0][1]) if rows else latest  # range_ms leaves a lone marker out


def test_each_metric_keeps_what_its_selectors_read(tmp_path: Path) -> None:
    evaluator = manager_for(tmp_path).evaluator
    default, by_metric = evaluator.retention()
    assert by_metric == {
        "c_total": Retention(600 + MARGIN, 600 + MARGIN),  # range + margin
        "g": Retention(0.0, 300 + MARGIN),  # the newest sample, while the lookback sees it
        "s": Retention(60 + 300 + MARGIN, 60 + 300 + MARGIN),  # offset + lookback
        "rec": Retention(0.0, 300 + MARGIN),  # a recording rule's output, read by none
    }
    assert default == Retention(0.0, MARGIN)  # every metric has its own: never used


def test_a_selector_without_a_fixed_name_adds_its_needs_to_every_metric(tmp_path: Path) -> None:
    rules = RULES + "      - alert: Any\n        expr: count_over_time({gpu='0'}[15m]) > 0\n"
    default, by_metric = manager_for(tmp_path, rules).evaluator.retention()
    assert default == Retention(900 + MARGIN, 900 + MARGIN)
    assert by_metric["g"] == Retention(900 + MARGIN, 900 + MARGIN)
    assert by_metric["s"] == Retention(900 + MARGIN, 900 + MARGIN)


def test_a_range_only_metric_is_trimmed_at_its_range_plus_the_margin(tmp_path: Path) -> None:
    manager = manager_for(tmp_path)
    twin = Twin(manager)
    t, counter = 1_700_000_000.0, 0.0
    for step in range(700):
        t += 1.0
        counter += step * 7919 % 13  # uneven: the rate depends on where the window starts
        twin.tick(t, [(C, counter), (G0, 1.0), (S, float(step % 7))])
    t_ms = round(t * 1000)
    window_ms = round((600 + MARGIN) * 1000)
    assert times_of(manager.store, C) == list(range(t_ms - window_ms, t_ms + 1, 1000))
    # The offset selector's metric keeps offset + lookback (+ margin), no more.
    window_ms = round((360 + MARGIN) * 1000)
    assert times_of(manager.store, S) == list(range(t_ms - window_ms, t_ms + 1, 1000))


def test_an_instant_only_metric_keeps_exactly_its_newest_sample(tmp_path: Path) -> None:
    manager = manager_for(tmp_path)
    twin = Twin(manager)
    t = 500.0
    for step in range(400):
        t += 1.0
        twin.tick(t, [(G0, float(step % 3)), (G1, 1.0)])
        assert times_of(manager.store, G0) == [round(t * 1000)]
    series = manager.store._by_name["g"][G0]
    assert len(series.values) == 1  # no expired samples linger
    assert manager.store.sample_count() == 3  # g twice and rec: their newest samples


def test_a_vanished_series_keeps_only_its_marker_and_stops_matching_at_once(
    tmp_path: Path,
) -> None:
    manager = manager_for(tmp_path)
    twin = Twin(manager)
    for t in range(1, 11):
        twin.tick(float(t), [(G0, 1.0), (G1, 1.0)])
    twin.tick(11.0, [(G0, 1.0)])  # gpu 1 vanishes: a marker, and `g` has gpu 0 alone
    assert [e.labels for e in promql.evaluate(promql.parse("g"), manager.store, 11.0)] == [G0]
    ((_, ms, value),) = manager.store.latest_ms([Matcher("gpu", "=", "1")], 10**9)
    assert ms == 11_000 and is_stale(value)
    assert times_of(manager.store, G1) == [11_000]  # the marker alone
    # It stays while the lookback could see it, then the series goes.
    for t in range(12, 11 + 300 + int(MARGIN) + 1):
        twin.tick(float(t), [(G0, 1.0)])
    assert manager.store.series_count() == 3  # g{gpu="0"}, g{gpu="1"} (marker), rec
    twin.tick(11.0 + 300 + MARGIN + 1, [(G0, 1.0)])
    assert manager.store.series_count() == 2
    twin.tick(11.0 + 300 + MARGIN + 2, [(G0, 1.0), (G1, 1.0)])  # back: it matches again
    assert len(promql.evaluate(promql.parse("g"), manager.store, 11.0 + 300 + MARGIN + 2)) == 2


def test_an_offset_selector_reads_a_sample_offset_plus_lookback_old(tmp_path: Path) -> None:
    manager = manager_for(tmp_path)
    twin = Twin(manager)
    manager.store.append(S, 1000.0, 3.0)  # written once, never again (no marker either)
    twin.full.append(S, 1000.0, 3.0)
    for t in range(1001, 1000 + 60 + 300 + 1):
        twin.tick(float(t), [(G0, 1.0)])
    # Exactly the lookback before t - 1m: still seen, so still kept.
    result = promql.evaluate(promql.parse("s offset 1m"), manager.store, 1360.0)
    assert result == [promql.Element(S, 3.0)]
    for t in range(1361, 1000 + 60 + 300 + int(MARGIN) + 2):
        twin.tick(float(t), [(G0, 1.0)])
    assert not manager.store.latest_ms([Matcher("__name__", "=", "s")], 10**9)  # expired
