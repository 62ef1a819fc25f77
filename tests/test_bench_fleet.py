"""The fleet emulation benchmark (bench/fleet.py, fleet_nodes.py, prometheus_api.py): the fake
fleet it builds, the scrape configuration it gives Prometheus, its arithmetic, its reading of
Prometheus' answers, and one short run against a real Prometheus. No timing is asserted."""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import fleet, loadgen, report, run_all
from bench.fleet_nodes import (
    COMPAT,
    JOBS,
    NATIVE,
    NODE_NAME_META,
    TEMPLATE_NODE,
    ReplayServer,
    fleet_bodies,
    node_body,
    node_name,
    node_uuid,
    prometheus_config,
    scrape_job,
    uuids,
)
from bench.prometheus_api import (
    GroupEvaluation,
    PrometheusError,
    RuleEvaluation,
    api_data,
    parse_time,
    rule_groups,
    single_value,
)
from tests.support import promtool

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def _golden(name: str, hostname: str | None = None) -> str:
    """A golden exposition with its masked durations as numbers (Prometheus needs numbers)
    and, for the compat one, the template node as its hostname."""
    text = (GOLDEN / name).read_text().replace("<measured>", "0.001")
    return text.replace(f'="{hostname}"', f'="{TEMPLATE_NODE}"') if hostname else text


NATIVE_TEXT = _golden("mixed-labels.metrics.openmetrics.txt")
COMPAT_TEXT = _golden("mixed-labels.dcgm.txt", hostname="node-a")


def _series(text: str) -> set[str]:
    return {line.rpartition(" ")[0] for line in text.splitlines() if line and line[0] != "#"}


# -- the fake fleet ------------------------------------------------------------------------------


@pytest.mark.parametrize("template", [NATIVE_TEXT, COMPAT_TEXT], ids=[NATIVE, COMPAT])
def test_every_node_has_the_captured_series_under_labels_of_its_own(template: str) -> None:
    captured = uuids(template)
    assert captured, "the template has device UUIDs to rewrite"
    bodies = [node_body(template, node_name(i)) for i in range(3)]
    node_uuids = [uuids(body) for body in bodies]
    for index, (body, found) in enumerate(zip(bodies, node_uuids, strict=True)):
        assert fleet.exposition_series(body) == fleet.exposition_series(template)
        assert len(found) == len(captured) and not found & captured
        assert all(re.fullmatch(r"(GPU|MIG)-\w{8}-\w{4}-\w{4}-\w{4}-\w{12}", u) for u in found)
        assert TEMPLATE_NODE not in body
        # Exactly the captured exposition once the node's own names are mapped back.
        back = body.replace(f'="{node_name(index)}"', f'="{TEMPLATE_NODE}"')
        for uuid in captured:
            back = back.replace(node_uuid(node_name(index), uuid), uuid)
        assert back == template
    assert not node_uuids[0] & node_uuids[1] and not node_uuids[1] & node_uuids[2]
    # Series naming a device differ between nodes; the rest (the daemon's own) differ only by
    # the `node` label Prometheus gives each target.
    all_series = set().union(*(_series(body) for body in bodies))
    with_device = {series for series in _series(template) if uuids(series)}
    assert with_device
    assert len(all_series) == 3 * len(with_device) + len(_series(template) - with_device)


def test_the_template_node_becomes_each_nodes_name() -> None:
    body = node_body(COMPAT_TEXT, "gpu-node-0042")
    assert f'hostname="{TEMPLATE_NODE}"' in COMPAT_TEXT
    assert body.count('hostname="gpu-node-0042"') == COMPAT_TEXT.count(
        f'hostname="{TEMPLATE_NODE}"'
    )


def test_a_node_is_rewritten_the_same_each_time() -> None:
    assert node_body(NATIVE_TEXT, "gpu-node-0001") == node_body(NATIVE_TEXT, "gpu-node-0001")


def test_fleet_bodies_multiply_the_capture_by_the_nodes() -> None:
    bodies = fleet_bodies(COMPAT_TEXT, "text/plain", COMPAT, 4)
    assert sorted(bodies) == [f"/gpu-node-000{i}/metrics/dcgm" for i in range(4)]
    for path, body in bodies.items():
        assert gzip.decompress(body.gzipped) == body.plain
        assert path.split("/")[1] in body.plain.decode()
    series = [_series(body.plain.decode()) for body in bodies.values()]
    assert sum(len(s) for s in series) == len(set().union(*series)) == 4 * len(_series(COMPAT_TEXT))


def test_the_replay_server_answers_each_path_gzip_when_accepted() -> None:
    bodies = fleet_bodies(NATIVE_TEXT, OPENMETRICS, NATIVE, 2)
    with ReplayServer(bodies) as server:
        path = "/gpu-node-0001/metrics"
        zipped = loadgen.fetch(server.url + path, loadgen.PROMETHEUS_HEADERS)
        plain = loadgen.fetch(server.url + path, {"Accept": "text/plain"})
        missing = loadgen.fetch(server.url + "/gpu-node-0002/metrics", {})
    assert zipped.status == plain.status == 200 and missing.status == 404
    assert zipped.headers["content-encoding"] == "gzip"
    assert gzip.decompress(zipped.body) == plain.body == bodies[path].plain
    assert plain.headers["content-type"] == OPENMETRICS
    assert server.requests == {path: 2}


# -- the scrape configuration --------------------------------------------------------------------


def _operator_relabelings(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ServiceMonitor's relabelings in Prometheus' spelling (the Operator's translation)."""
    spelling = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{spelling.get(k, k): v for k, v in rule.items()} for rule in rules]


def test_the_native_job_relabels_as_the_shipped_service_monitor() -> None:
    monitor = yaml.safe_load((ROOT / "deploy" / "servicemonitor.yaml").read_text())
    (endpoint,) = monitor["spec"]["endpoints"]
    job = scrape_job(NATIVE, "127.0.0.1:1", 3)
    assert job["job_name"] == JOBS[NATIVE]
    assert job["relabel_configs"] == _operator_relabelings(endpoint["relabelings"])
    assert job["metric_relabel_configs"] == _operator_relabelings(endpoint["metricRelabelings"])
    assert endpoint["relabelings"][0]["sourceLabels"] == [NODE_NAME_META]


def test_the_compat_job_keeps_instance_under_its_own_job() -> None:
    job = scrape_job(COMPAT, "127.0.0.1:1", 2)
    assert job["job_name"] == JOBS[COMPAT] != JOBS[NATIVE]
    assert "metric_relabel_configs" not in job
    assert job["relabel_configs"] == scrape_job(NATIVE, "127.0.0.1:1", 2)["relabel_configs"]


@pytest.mark.parametrize("output", [NATIVE, COMPAT])
def test_each_target_has_its_own_path_node_and_instance(output: str) -> None:
    groups = scrape_job(output, "127.0.0.1:9", 300)["static_configs"]
    assert len(groups) == 300
    assert all(group["targets"] == ["127.0.0.1:9"] for group in groups)
    for label in ("__metrics_path__", NODE_NAME_META, "instance"):
        assert len({group["labels"][label] for group in groups}) == 300
    paths = {group["labels"]["__metrics_path__"] for group in groups}
    assert paths == set(
        fleet_bodies(COMPAT_TEXT if output == COMPAT else NATIVE_TEXT, "", output, 300)
    )


def test_promtool_accepts_the_configuration_with_the_shipped_rules(tmp_path: Path) -> None:
    jobs = [scrape_job(NATIVE, "127.0.0.1:9", 3), scrape_job(COMPAT, "127.0.0.1:9", 3)]
    config = prometheus_config(jobs, 5.0, fleet.SHIPPED_RULES)
    assert config["global"]["scrape_interval"] == config["global"]["evaluation_interval"] == "5s"
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result = promtool("check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(fleet.SHIPPED_RULES)} rule files found" in result.stdout
    assert all(f"Checking {rules}" in result.stdout for rules in fleet.SHIPPED_RULES)


# -- arithmetic ----------------------------------------------------------------------------------


def test_figures_scale_linearly_to_the_per_nodes() -> None:
    assert fleet.scaled(1377 * 200, 200, 1000) == 1377 * 1000
    assert fleet.scaled(0.25, 200, 1000) == pytest.approx(1.25)
    assert fleet.scaled(None, 200, 1000) is None
    # Memory: the idle part stays, the rest grows in proportion.
    assert fleet.scaled_above(100.0 + 200 * 3.0, 100.0, 200, 1000) == pytest.approx(3100.0)
    assert fleet.scaled_above(None, 100.0, 200, 1000) is None
    assert fleet.mean([1.0, 2.0, 6.0]) == 3.0 and fleet.mean([]) is None
    assert fleet.median([6.0, 1.0, 2.0]) == 2.0 and fleet.median([4.0, 1.0]) == 2.5
    assert fleet.median([]) is None


def test_exposition_series_are_its_sample_lines() -> None:
    text = '# TYPE a gauge\na{x="1"} 1\na{x="2"} NaN\n# TYPE b counter\nb_total 3\n# EOF\n'
    assert fleet.exposition_series(text) == 3
    assert fleet.exposition_series(COMPAT_TEXT) == len(_series(COMPAT_TEXT))


# -- Prometheus' answers -------------------------------------------------------------------------


def test_api_answers_give_their_data_or_their_error() -> None:
    assert api_data({"status": "success", "data": [1]}) == [1]
    with pytest.raises(PrometheusError, match="bad_data: parse error"):
        api_data({"status": "error", "errorType": "bad_data", "error": "parse error"})


def test_single_values_of_instant_queries() -> None:
    sample = {"metric": {}, "value": [1700000000.5, "1377"]}
    assert single_value({"resultType": "vector", "result": [sample]}) == 1377.0
    assert single_value({"resultType": "vector", "result": []}) is None
    assert single_value({"resultType": "scalar", "result": [1700000000.5, "2.5"]}) == 2.5
    with pytest.raises(PrometheusError, match="at most one sample, got 2"):
        single_value({"resultType": "vector", "result": [sample, sample]})
    with pytest.raises(PrometheusError, match="got matrix"):
        single_value({"resultType": "matrix", "result": []})


def test_api_times_with_nanoseconds_and_the_zero_time() -> None:
    assert parse_time("2026-12-06T08:49:06.123456789Z") == pytest.approx(1796546946.123456)
    assert parse_time("2026-12-06T09:49:06+01:00") == parse_time("2026-12-06T08:49:06Z")
    assert parse_time("0001-01-01T00:00:00Z") is None


RULES_ANSWER = {
    "groups": [
        {
            "name": "gpu-exporter-fleet",
            "file": "/x/rules/gpu-exporter.recording.yaml",
            "interval": 5,
            "evaluationTime": 0.0125,
            "lastEvaluation": "2026-12-06T08:49:06.5Z",
            "rules": [
                {
                    "name": "gpu:size:ratio",
                    "type": "recording",
                    "health": "ok",
                    "evaluationTime": 0.002,
                    "lastError": "",
                },
                {
                    "name": "gpu:owner:info",
                    "type": "recording",
                    "health": "err",
                    "evaluationTime": 0.009,
                    "lastError": "many-to-many matching not allowed",
                },
            ],
        },
        {
            "name": "gpu-health",
            "file": "/x/rules/gpu-exporter.rules.yaml",
            "interval": 15,
            "evaluationTime": 0,
            "lastEvaluation": "0001-01-01T00:00:00Z",
            "rules": [],
        },
    ]
}


def test_rule_groups_from_the_rules_api() -> None:
    fleet_group, health = rule_groups(RULES_ANSWER)
    assert (fleet_group.name, fleet_group.interval, fleet_group.seconds) == (
        "gpu-exporter-fleet",
        5.0,
        0.0125,
    )
    assert fleet_group.last_evaluation == parse_time("2026-12-06T08:49:06.5Z")
    assert fleet_group.rules[1] == RuleEvaluation(
        "gpu:owner:info", "recording", 0.009, "err", "many-to-many matching not allowed"
    )
    assert health.last_evaluation is None and health.rules == ()


def _evaluation(at: float | None, seconds: float, name: str = "g") -> GroupEvaluation:
    rules = (
        RuleEvaluation("a", "recording", seconds / 4, "ok", ""),
        RuleEvaluation("b", "alerting", seconds / 2, "ok", ""),
    )
    return GroupEvaluation(name, "/r/x.yaml", 5.0, at, seconds, rules)


def test_evaluations_are_kept_once_each_and_only_after_the_data_is_complete() -> None:
    seen: dict[str, dict[float, GroupEvaluation]] = {}
    fleet.new_evaluations(seen, [_evaluation(90.0, 1.0), _evaluation(None, 0.0, "h")], 100.0)
    assert seen == {}
    fleet.new_evaluations(seen, [_evaluation(100.0, 2.0)], 100.0)
    fleet.new_evaluations(seen, [_evaluation(100.0, 2.0), _evaluation(105.0, 4.0)], 100.0)
    assert sorted(seen["g"]) == [100.0, 105.0]


def test_a_groups_summary_scales_its_mean_and_names_its_slowest_and_failing_rules() -> None:
    failing = GroupEvaluation(
        "g",
        "/r/x.yaml",
        5.0,
        110.0,
        6.0,
        (
            RuleEvaluation("a", "recording", 1.0, "ok", ""),
            RuleEvaluation("c", "recording", 5.0, "err", "boom"),
        ),
    )
    summary = fleet.group_summary(
        [_evaluation(100.0, 2.0), _evaluation(105.0, 4.0), failing], nodes=200, per=1000
    )
    assert summary["evaluation_seconds"] == [2.0, 4.0, 6.0]
    assert (summary["min_seconds"], summary["median_seconds"], summary["max_seconds"]) == (2, 4, 6)
    assert summary["median_seconds_per_1000"] == pytest.approx(20.0)
    assert summary["min_seconds_per_1000"] == pytest.approx(10.0)
    assert summary["slowest_rules"] == [["c", 5.0], ["a", 1.0]]
    assert summary["errors"] == [["c", "boom"]] and summary["file"] == "x.yaml"


# -- the harness ---------------------------------------------------------------------------------


def test_run_all_knows_the_fleet_benchmark() -> None:
    assert run_all.parse_args(["--only", "fleet"]).chosen == ["fleet"]
    assert "fleet" in run_all.BENCHMARKS


def test_quick_run_against_a_real_prometheus(tmp_path: Path) -> None:
    """Prometheus' head holds each node's series once per node, plus its own report series
    and the rules' outputs; the series per node come from the captured exposition."""
    settings = fleet.FleetSettings.quick()
    result = fleet.run(settings, tmp_path)
    assert "unavailable" not in result, result
    assert result["prometheus"].startswith("prometheus, version 2.")
    runs = result["runs"]
    assert set(runs) == set(fleet.RUNS) == {"native", "native-no-rules", "compat"}
    shipped_groups = {
        group["name"]
        for path in fleet.SHIPPED_RULES
        for group in yaml.safe_load(path.read_text())["groups"]
    }
    for name, data in runs.items():
        nodes, per_node = data["nodes"], data["exposition_series"]
        assert nodes == settings.nodes and data["targets_up"] == nodes
        assert per_node > 100  # a whole node's exposition was captured
        assert data["series_per_target_min"] == data["series_per_target_max"] == per_node
        assert data["report_series"] > 0 and data["report_series"] % nodes == 0
        assert data["head_series"] == (
            nodes * per_node + data["report_series"] + data["rule_series"]
        ), name
        assert data["head_series_accounted"]
        assert data["scrapes_per_target"] >= 1
        assert data["per_1000"]["head_series"] == pytest.approx(data["head_series"] * 1000 / nodes)
        assert data["rss_bytes"] > result["idle_rss_bytes"] > 0
    native, bare, compat = runs["native"], runs["native-no-rules"], runs["compat"]
    assert set(native["rule_groups"]) == shipped_groups
    assert fleet.FLEET_GROUP in shipped_groups
    for group in native["rule_groups"].values():
        assert group["errors"] == [] and len(group["evaluation_seconds"]) >= settings.evaluations
    assert native["rule_series"] > 0
    for without_rules in (bare, compat):
        assert without_rules["rule_series"] == 0 and without_rules["rule_groups"] == {}
    assert native["exposition_series"] == bare["exposition_series"]
    assert native["exposition_series"] != compat["exposition_series"]
    assert (native["output"], bare["output"], compat["output"]) == (NATIVE, NATIVE, COMPAT)
    section = report.render({"fleet": result})
    assert "Fleet emulation" in section and "gpu-exporter-fleet" in section
