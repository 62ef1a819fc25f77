"""The start-up check that the daemon's alerts can be merged with Prometheus' copies: each
mismatch it finds is one WARNING naming the setting to change; through `serve` once."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from gpu_exporter.config.dedup import (
    SERIES_LABELS,
    SETTING_NAMES,
    label_mismatches,
    warn_label_mismatches,
)
from tests.daemon import serve
from tests.servers import Recorder
from tests.support import wait_for

GOLDEN = Path(__file__).resolve().parent / "golden"


def test_node_from_node_name_or_the_external_label_matches() -> None:
    assert label_mismatches({}, "node-7") == []
    assert label_mismatches({"node": "node-7"}, "") == []
    assert label_mismatches({"node": "node-7", "cluster": "eu-1"}, "node-7") == []


def test_no_node_at_all_is_named_with_both_ways_to_set_it() -> None:
    [problem] = label_mismatches({"cluster": "eu-1"}, "")
    assert "no node label" in problem
    assert "$NODE_NAME" in problem and SETTING_NAMES in problem


def test_a_node_label_other_than_node_name_is_named_with_both_values() -> None:
    [problem] = label_mismatches({"node": "gpu-a"}, "gpu-b")
    assert "node='gpu-a'" in problem and "'gpu-b'" in problem
    assert SETTING_NAMES in problem


@pytest.mark.parametrize(
    "name", ["gpu", "uuid", "mig_uuid", "namespace", "pod", "container", "xid", "alertname"]
)
def test_a_label_the_series_carry_is_named(name: str) -> None:
    [problem] = label_mismatches({name: "x", "node": "n"}, "")
    assert f"{name!r} is a label of the exporter's own series" in problem
    assert SETTING_NAMES in problem


def test_a_reserved_name_is_named() -> None:
    [problem] = label_mismatches({"__cluster": "eu-1"}, "n")
    assert "'__cluster' is reserved" in problem and SETTING_NAMES in problem


def test_every_problem_is_reported() -> None:
    problems = label_mismatches({"pod": "a", "gpu": "0", "__x": "1", "cluster": "eu"}, "")
    assert len(problems) == 4, problems
    assert not [p for p in problems if "cluster'" in p]


def test_series_labels_cover_every_label_on_the_golden_expositions() -> None:
    # A new label on /metrics that the check does not know would slip through it.
    seen = set()
    for path in GOLDEN.glob("mixed-*.metrics.txt"):
        for line in path.read_text().splitlines():
            if not line.startswith("#") and "{" in line:
                seen |= set(re.findall(r'(\w+)="', line[line.index("{") : line.rindex("}")]))
    assert {"gpu", "uuid", "namespace", "pod"} <= seen
    assert seen <= SERIES_LABELS, seen - SERIES_LABELS


def test_each_problem_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gpu_exporter"):
        warn_label_mismatches({"pod": "a"}, environ={})
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.WARNING]
    assert [r.getMessage() for r in caplog.records] == label_mismatches({"pod": "a"}, "")


def test_serve_warns_at_start_when_alerts_are_sent(tmp_path: Path) -> None:
    with (
        Recorder() as alertmanager,  # answers the notifier's POSTs with 200
        serve(
            tmp_path,
            "--simulate",
            "mixed",
            "--alertmanager-url",
            alertmanager.url,
            "--external-label",
            "cluster=eu-1",
            "--external-label",
            "pod=exporter",
            env={"NODE_NAME": ""},
        ) as daemon,
    ):
        daemon.wait_ready()
        expected = label_mismatches({"cluster": "eu-1", "pod": "exporter"}, "")
        assert len(expected) == 2

        def warned() -> list[str]:
            lines = daemon.output().splitlines()
            return [line for line in lines if " WARNING gpu_exporter.config.dedup: " in line]

        lines = wait_for(lambda: len(warned()) >= 2 and warned(), 15, "the two warnings")
        assert len(lines) == 2, lines  # nothing about cluster
        for problem in expected:
            assert sum(line.endswith(problem) for line in lines) == 1, (problem, lines)
