"""The benchmark harness (bench/) computes what it claims to: statistics, /proc parsing,
exposition parsing, generated scenarios and rules, Markdown, target verdicts, the bare-NVML
loop, and one short end-to-end run. No timing is asserted anywhere."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from bench import loadgen, overhead, peer, promtext, report, run_all, scenarios
from bench.procfs import Probe, parse_stat, parse_status
from bench.stats import percentile, ratio, slope, summarize
from gpu_exporter import sim
from gpu_exporter.alerting.pack import all_pack_files
from gpu_exporter.alerting.rules.loader import load_rule_files
from gpu_exporter.config.load import load_config
from tests.localserver import LocalServer

# -- statistics ------------------------------------------------------------------------------


def test_percentile_interpolates_linearly_between_ranks() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([float(v) for v in range(1, 101)], 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summary_ratio_and_slope() -> None:
    stats = summarize([1.0, 2.0, 3.0])
    assert stats["count"] == 3 and stats["mean"] == 2.0 and stats["max"] == 3.0
    assert math.isnan(summarize([])["p99"])
    assert ratio(1.0, 4.0) == 0.25
    assert ratio(1.0, 0.0) is None and ratio(None, 1.0) is None and ratio(math.nan, 1.0) is None
    assert slope([0.0, 1.0, 2.0], [1.0, 3.0, 5.0]) == pytest.approx(2.0)
    assert slope([1.0], [1.0]) == 0.0 and slope([2.0, 2.0], [1.0, 5.0]) == 0.0


# -- /proc -----------------------------------------------------------------------------------

STAT = (
    "4242 (python3 (bench) x) S 1 4242 4242 0 -1 4194560 12345 0 0 0 "
    "250 50 0 0 20 0 7 0 123456 987654321 17000 18446744073709551615 1 1 0 0 0 0 0 "
    "16781312 16386 0 0 0 17 1 0 0 0 0 0\n"
)
STATUS = """\
Name:\tpython3
State:\tS (sleeping)
VmPeak:\t  300000 kB
VmHWM:\t   81920 kB
VmRSS:\t   65536 kB
Threads:\t7
"""


def test_stat_fields_are_counted_from_the_last_parenthesis() -> None:
    times = parse_stat(STAT, clock_ticks=100)
    assert (times.user_seconds, times.system_seconds, times.total) == (2.5, 0.5, 3.0)
    with pytest.raises(ValueError):
        parse_stat("4242 python3 S 1", clock_ticks=100)


def test_status_gives_rss_and_peak_in_bytes() -> None:
    memory = parse_status(STATUS)
    assert memory.rss_bytes == 65536 * 1024 and memory.rss_mib == 64.0
    assert memory.hwm_mib == 80.0
    with pytest.raises(ValueError):
        parse_status("Name:\tx\nVmRSS:\t1 kB\n")


def test_probe_reads_this_process() -> None:
    probe = Probe("self")
    assert probe.memory().rss_bytes > 0
    assert probe.cpu().total >= 0


# -- exposition ------------------------------------------------------------------------------

EXPOSITION = """\
# HELP gpu_energy_joules_total Energy.
# TYPE gpu_energy_joules_total counter
gpu_energy_joules_total{gpu="0"} 12.5
# HELP gpu_fan_speed_Percentage Fan.
# TYPE gpu_fan_speed_Percentage gauge
gpu_fan_speed_Percentage{gpu="0"} NaN
# HELP gpu_exporter_tick_duration_seconds Tick.
# TYPE gpu_exporter_tick_duration_seconds histogram
gpu_exporter_tick_duration_seconds_bucket{le="0.1"} 3.0
gpu_exporter_tick_duration_seconds_bucket{le="+Inf"} 4.0
gpu_exporter_tick_duration_seconds_sum 0.5
gpu_exporter_tick_duration_seconds_count 4.0
# HELP gpu_sm_active_ratio SM.
# TYPE gpu_sm_active_ratio gauge
"""


def test_families_count_only_those_with_numeric_samples() -> None:
    declared = promtext.declared_families(EXPOSITION)
    assert declared["gpu_energy_joules_total"] == "counter"
    assert len(declared) == 4
    assert promtext.families_with_samples(EXPOSITION) == {
        "gpu_energy_joules_total",
        "gpu_exporter_tick_duration_seconds",
    }
    assert promtext.sum_and_count(EXPOSITION, "gpu_exporter_tick_duration_seconds") == (0.5, 4.0)
    assert promtext.sum_and_count(EXPOSITION, "absent") is None


def test_coverage_maps_quantities_to_families() -> None:
    found = promtext.coverage(["gpu_power_usage_W", "gpu_xid_errors_total", "gpu_clock_sm_MHz"])
    assert found["power"] == ["gpu_power_usage_W"]
    assert found["xid"] == ["gpu_xid_errors_total"]
    assert found["clocks"] == ["gpu_clock_sm_MHz"]
    assert found["tensor"] == []
    assert set(found) == set(promtext.QUANTITIES)


def test_gpu_families_leave_out_self_metrics() -> None:
    names = {"gpu_power_watts", "gpu_exporter_devices", "host_uptime_Second"}
    assert peer.gpu_families(names) == {"gpu_power_watts"}


# -- generated scenarios and rules ------------------------------------------------------------


@pytest.mark.parametrize("devices", [1, 8, 64])
def test_generated_scenarios_load(devices: int) -> None:
    scenario = sim.load_scenario(scenarios.generate(devices))
    assert len(scenario.devices) == devices
    assert len({d.pci_bus_id for d in scenario.devices}) == devices
    assert len({d.uuid for d in scenario.devices}) == devices


def test_generated_scenario_options() -> None:
    data = scenarios.generate(
        8,
        latency=scenarios.NVML_LIKE_LATENCY,
        pcie_byte_fields=False,
        faults=[{"at": 3, "device": 3, "kind": "xid", "xid": 31}],
    )
    scenario = sim.load_scenario(data)
    assert {197, 198} <= scenario.driver.unsupported_fields
    assert scenario.latency.seconds("nvmlDeviceGetPowerUsage") == pytest.approx(0.00036)
    assert scenario.latency.seconds("nvmlDeviceGetPcieThroughput") == pytest.approx(0.020)
    assert [f.kind for f in scenario.faults] == ["xid"]
    with pytest.raises(ValueError):
        scenarios.generate(0)


def test_thermal_faults_step_on_at_the_given_time() -> None:
    scenario = sim.load_scenario(scenarios.thermal_faults(8, [(2, 20.0)]))
    reasons = scenario.devices[2].values["clock_event_reasons"]
    assert reasons.value_at(19.9) == 0
    assert int(reasons.value_at(20.0)) & 0x40  # hw_thermal_slowdown
    assert sim.load_scenario(peer.peer_scenario()).faults[0].at == 3


def test_generated_mig_scenario_has_8_h200s_of_7_1g_instances() -> None:
    from bench import scaling

    config = next(c for c in scaling.CONFIGS if c.name == scaling.MIG_CONFIG)
    assert (config.devices, config.mig_instances, config.series_devices) == (8, 7, 64)
    data = config.scenario()
    scenario = sim.load_scenario(data)
    assert len(scenario.devices) == 8
    assert (
        len({d.uuid for d in scenario.devices})
        == len({d.pci_bus_id for d in scenario.devices})
        == 8
    )
    uuids = set()
    for gpu, device in enumerate(scenario.devices):
        assert device.model == "NVIDIA H200" and device.mig_enabled
        assert device.mig is not None
        live = device.mig.live(0.0)
        assert len(live) == 7
        assert {i.profile.name for i in live} == {"1g.18gb"}
        assert sorted(i.gpu_instance for i in live) == list(range(7, 14))
        assert sorted(s for i in live for s in i.slots) == list(range(7))
        uuids |= {u for i in live for u in i.mig_uuids}
        # every instance busy; exactly one launch-bound (engine busy, SMs mostly idle)
        sm = [i.values["sm_active"].value_at(10.0) for i in live]
        engine = [i.values["graphics_active"].value_at(10.0) for i in live]
        assert min(engine) > 0.8
        assert sum(v < 0.2 for v in sm) == 1, f"GPU {gpu}: {sm}"
        # the parent reports no activity of its own under MIG
        assert not {"utilization", "sm_active"} & set(data["devices"][gpu]["values"])
    assert len(uuids) == 56
    assert scaling.MIG_CONFIG == report.MIG_CONFIG
    assert scaling.MIG_CONFIG in scaling.ScalingSettings.quick().configs
    small = sim.load_scenario(scenarios.generate_mig(2, 3)).devices[1].mig
    assert small is not None and len(small.live(0.0)) == 3
    with pytest.raises(ValueError):
        scenarios.generate_mig(8, 8)


def test_mig_config_ticks_with_series_per_instance() -> None:
    """The pipeline the scaling benchmark measures exports the 56 instances' series."""
    from bench import scaling
    from bench.inproc import build

    config = next(c for c in scaling.CONFIGS if c.name == scaling.MIG_CONFIG)
    pipeline = build(config.scenario(), rules=[])
    try:
        pipeline.tick()
        pipeline.tick()
        rendered = pipeline.sampler.rendered
        assert rendered is not None
        text = rendered.text.decode()
    finally:
        pipeline.close()
    used = [line for line in text.splitlines() if line.startswith("gpu_memory_used_bytes{")]
    engine = [
        line for line in text.splitlines() if line.startswith("gpu_graphics_engine_active_ratio{")
    ]
    assert sum('mig_uuid="' in line for line in used) == 56
    assert sum('mig_uuid="' in line for line in engine) == 56
    assert not any(line.startswith("gpu_utilization_ratio{") for line in text.splitlines())


@pytest.mark.parametrize("series", [1, 100, 1000])
def test_generated_rule_files_load_with_one_rule_per_series(series: int, tmp_path: Path) -> None:
    path = scenarios.write_yaml(scenarios.rule_file(series), tmp_path / "rules.yaml")
    groups = load_rule_files([str(path)])
    rules = [rule for group in groups for rule in group.rules]
    assert len(rules) == series
    assert len({rule.name for rule in rules}) == series


def test_subquery_rules_load_and_evaluate_over_the_daemons_families(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The scaling benchmark's subquery-heavy set: 100 rules at 8 GPUs, none skipped, valid
    in both PromQL dialects, reading only catalog families the default metrics profile
    exports (a rule reading nothing costs nothing), and none failing on a tick."""
    from bench import scaling
    from bench.inproc import build
    from gpu_exporter.alerting.rules import promql
    from gpu_exporter.model import catalog

    expressions = scenarios.subquery_rule_expressions(8)
    assert len(expressions) == len(set(expressions)) == 100
    for text in expressions:
        promql.parse(text, promql.PROMETHEUS_3)
        names = promql.referenced_metrics(promql.parse(text))
        assert names and names <= catalog.BY_NAME.keys(), text
    config = next(c for c in scaling.CONFIGS if c.rules == "subquery")
    files = config.rule_files(tmp_path)
    assert files is not None
    groups = load_rule_files(files)
    assert sum(len(group.rules) for group in groups) == 100
    assert not any(group.skipped for group in groups)
    pipeline = build(config.scenario(), rules=files)
    try:
        for _ in range(3):
            pipeline.tick()
        manager = pipeline.manager
        assert manager is not None
        rules = [rule for group in manager.rules_json() for rule in group["rules"]]
    finally:
        pipeline.close()
    assert len(rules) == 100
    assert {rule["health"] for rule in rules} == {"ok"}, [r["lastError"] for r in rules]
    assert "does not export" not in caplog.text


def test_detection_rules_load(tmp_path: Path) -> None:
    shipped = scenarios.shipped_rule("GpuThermalSlowdown")
    path = tmp_path / "detection.yaml"
    scenarios.write_yaml(scenarios.detection_rule_file(shipped), path)
    names = [rule.name for group in load_rule_files([str(path)]) for rule in group.rules]
    assert names == ["BenchHwThermalSlowdown", "GpuThermalSlowdown"]
    with pytest.raises(KeyError):
        scenarios.shipped_rule("NoSuchAlert")


def test_the_detection_rule_fires_on_the_default_profile_the_tick_after_the_fault(
    tmp_path: Path,
) -> None:
    from bench.inproc import build

    path = tmp_path / "detection.yaml"
    scenarios.write_yaml(scenarios.detection_rule_file(), path)
    pipeline = build(scenarios.thermal_faults(4, [(2, 5.0)]), rules=[str(path)])
    try:
        firing_at = []
        for _ in range(8):  # ticks at t = 0..7 s, the fault from 5 s
            pipeline.tick()
            manager = pipeline.manager
            assert manager is not None
            alerts = [a for a in manager.alerts_json() if a["state"] == "firing"]
            if alerts:
                firing_at.append(pipeline.clock())
                assert {a["labels"]["gpu"] for a in alerts} == {"2"}
    finally:
        pipeline.close()
    assert firing_at and firing_at[0] <= 6.0  # one tick after the fault at most


# -- Markdown and verdicts --------------------------------------------------------------------


def test_table_renders_padded_github_markdown() -> None:
    text = report.table(["name", "value"], [["a|b", 1], ["longer", "2.50 ms"]])
    assert text.splitlines() == [
        "| name   | value   |",
        "| ------ | ------- |",
        "| a\\|b   | 1       |",
        "| longer | 2.50 ms |",
    ]
    with pytest.raises(ValueError):
        report.table(["a"], [["1", "2"]])


def test_fmt_units() -> None:
    assert report.fmt(0.00125, "ms") == "1.25 ms"
    assert report.fmt(1.5, "x") == "1.50x"
    assert report.fmt(42.0, "count") == "42"
    assert report.fmt(None, "ms") == "n/a" and report.fmt(math.nan) == "n/a"
    assert report.fmt(True) == "yes"


FAULT = {"gpu": "2", "fault_at_scenario_seconds": 20.0}


def test_targets_get_verdicts_from_the_results() -> None:
    results = {
        "peer": {
            "summary": {
                "gpu-exporter-steady": {
                    "scrape_1_p99": 0.002,
                    "scrape_32_p99": 0.080,
                    "rss_mib": 55.0,
                    "cpu_seconds_per_tick": 0.011,
                },
                "gpu-exporter-shipped": {"rss_mib": 63.0, "cpu_seconds_per_tick": 0.0095},
                "nvitop-exporter": {"rss_mib": 36.0, "cpu_seconds_per_tick": 0.010},
            },
            "ratios": {"cpu_seconds_per_tick": 1.1},
            "ratios_young": {"cpu_seconds_per_tick": 0.9},
            "ratios_shipped": {"cpu_seconds_per_tick": 0.95},
            "memory_floor": {"python_alone_mib": 10.0, "stack_floor_mib": 45.0},
        },
        "scaling": {
            "configs": {
                "8gpu": {
                    "tick": {"steady": {"cpu_seconds_per_tick": 0.008}},
                    "scrape": {"scrape_32_p99": 0.008},
                },
                "64gpu": {
                    "tick": {"steady": {"cpu_seconds_per_tick": 0.090}},
                    "scrape": {"scrape_1_p99": 0.004, "scrape_32_p99": 0.060},
                },
            },
            "bytes_per_device": {"8": 10_000.0, "64": 10_500.0},
        },
        "detection": {
            "rows": [
                {
                    "rule": "BenchHwThermalSlowdown",
                    "path": "daemon",
                    "latency_seconds": 0.6,
                    **FAULT,
                },
                {
                    "rule": "BenchHwThermalSlowdown",
                    "path": "prometheus",
                    "latency_seconds": 9,
                    **FAULT,
                },
            ]
        },
        "fleet": {
            "runs": {"native": {"exposition_series": 470}, "compat": {"exposition_series": 488}}
        },
    }
    verdicts = {name: ok for name, _, _, ok in report.evaluate_targets(results)}
    assert verdicts["/metrics p99 <= 5 ms, 1 scraper"] is True
    assert verdicts["/metrics p99 <= 50 ms, 32 scrapers"] is False
    assert verdicts["CPU per tick <= 0.9x nvitop-exporter (steady, shipped configuration)"] is False
    assert verdicts["CPU per tick <= 0.9x nvitop-exporter (steady, trimmed configuration)"] is False
    assert verdicts["CPU per tick <= 1.0x nvitop-exporter (young, trimmed)"] is True
    assert verdicts["RSS <= 64 MiB (steady, shipped configuration)"] is True
    # Shipped: 63 - 45 = 18 MiB beyond the floor vs 36 - 10 = 26 MiB: 0.69x.
    name = "RSS beyond the stack's import floor <= 1.0x nvitop-exporter's beyond Python"
    assert verdicts[name] is True
    assert verdicts["64 devices: tick CPU per device <= 1.25x the 8-device figure"] is False
    assert verdicts["64 devices: exposition bytes per device <= 1.1x the 8-device figure"] is True
    assert verdicts["64 devices: /metrics p99 <= 5 ms, 1 scraper"] is True
    assert verdicts["64 devices: /metrics p99 <= 50 ms, 32 scrapers"] is False
    # 60 ms / 64 devices = 0.94 ms against 8 ms / 8 = 1 ms: 0.94x.
    name = "64 devices: /metrics p99 per device, 32 scrapers, <= 1.25x the 8-device figure"
    assert verdicts[name] is True
    name = "series per node (/metrics, default profile) <= the compat endpoint's"
    assert verdicts[name] is True
    assert verdicts["detection <= one tick after the condition (daemon, for: 0)"] is True
    assert verdicts["read path over bare NVML <= 1.25x (NVML source only, CPU)"] is None
    markdown = report.render(results, {"cpu": "test"})
    assert "## Targets" in markdown and "**missed**" in markdown


def test_cpu_and_series_targets_flip_at_their_limits() -> None:
    def verdicts(shipped_cpu: float, native: int | None, compat: int | None) -> dict[str, Any]:
        runs = {k: {"exposition_series": v} for k, v in (("native", native), ("compat", compat))}
        results = {
            "peer": {"ratios_shipped": {"cpu_seconds_per_tick": shipped_cpu}},
            "fleet": {"runs": runs},
        }
        return {name: ok for name, _, _, ok in report.evaluate_targets(results)}

    cpu = "CPU per tick <= 0.9x nvitop-exporter (steady, shipped configuration)"
    series = "series per node (/metrics, default profile) <= the compat endpoint's"
    assert verdicts(0.9, 488, 488)[cpu] is True and verdicts(0.9, 488, 488)[series] is True
    assert verdicts(0.91, 489, 488)[cpu] is False and verdicts(0.91, 489, 488)[series] is False
    assert verdicts(0.5, 489, None)[series] is None  # no compat count: nothing to compare


def _mig_results(whole: float, mig: float | None, p99: float | None) -> dict[str, object]:
    configs: dict[str, object] = {"8gpu": {"tick": {"steady": {"cpu_seconds_per_tick": whole}}}}
    if mig is not None:
        configs["8gpu-mig-7x1g"] = {
            "config": {"name": "8gpu-mig-7x1g", "devices": 8, "mig_instances": 7},
            "tick": {"steady": {"cpu_seconds_per_tick": mig}},
            "scrape": {"scrape_1_p99": p99},
        }
    return {"scaling": {"configs": configs}}


MIG_CPU = "8 GPUs x 7 MIG instances: tick CPU per device <= 1.25x the 8-GPU figure"
MIG_P99 = "8 x 7 MIG: /metrics p99 <= 5 ms, 1 scraper"


@pytest.mark.parametrize(
    ("mig_cpu", "p99", "cpu_ok", "p99_ok"),
    [
        # 8 GPUs 8 ms: 1 ms per device. 64 devices at 0.080 s: 1.25 ms per device, 1.25x.
        (0.080, 0.005, True, True),
        (0.0801, 0.0051, False, False),
        # 0.040 s is 0.625 ms per device (met) but 5 ms per GPU: per GPU is not the target.
        (0.040, 0.001, True, True),
    ],
)
def test_mig_targets_count_parents_and_instances_as_devices(
    mig_cpu: float, p99: float, cpu_ok: bool, p99_ok: bool
) -> None:
    results = _mig_results(0.008, mig_cpu, p99)
    rows = {name: (value, note, ok) for name, value, note, ok in report.evaluate_targets(results)}
    value, note, ok = rows[MIG_CPU]
    assert ok is cpu_ok
    assert value == report.fmt(mig_cpu / 64 / 0.001, "x")
    assert "8 parents + 56 instances = 64 devices" in note
    assert f"per GPU {report.fmt(mig_cpu / 8, 'ms')}" in note
    assert rows[MIG_P99][2] is p99_ok
    cost = report.mig_cost(results["scaling"])  # type: ignore[arg-type]
    assert cost["devices"] == 64
    assert cost["per_device"] == pytest.approx(mig_cpu / 64)
    assert cost["per_gpu"] == pytest.approx(mig_cpu / 8)
    section = report.scaling_section(results["scaling"])  # type: ignore[arg-type]
    assert "8 GPUs x 7 MIG instances = 64 devices" in section


def test_mig_targets_are_na_without_the_mig_run() -> None:
    rows = {name: ok for name, _, _, ok in report.evaluate_targets(_mig_results(0.008, None, None))}
    assert rows[MIG_CPU] is None and rows[MIG_P99] is None
    from bench import scaling

    assert scaling.mig_per_device({}) == {}
    measured = {"8gpu-mig-7x1g": {"tick": {"steady": {"cpu_seconds_per_tick": 0.064}}}}
    assert scaling.mig_per_device(measured) == pytest.approx(
        {"devices": 64.0, "cpu_seconds_per_device": 0.001, "cpu_seconds_per_gpu": 0.008}
    )


def test_per_device_cost() -> None:
    costs = {"1gpu": 0.008, "8gpu": 0.064, "64gpu": 1.28}
    configs = {name: {"tick": {"steady": {"cpu_seconds_per_tick": c}}} for name, c in costs.items()}
    per_device = report.per_device_cost({"configs": configs})
    assert per_device == pytest.approx({1: 0.008, 8: 0.008, 64: 0.02})


def test_cpu_model_from_cpuinfo() -> None:
    assert run_all.cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 9454\n") == "AMD EPYC 9454"
    assert run_all.cpu_model("") == "unknown"


# -- load generator ---------------------------------------------------------------------------


def test_response_head_parsing() -> None:
    version, status, headers = loadgen.parse_head(b"HTTP/1.0 200 OK\r\nContent-Length: 3")
    assert (version, status, headers) == ("HTTP/1.0", 200, {"content-length": "3"})
    assert loadgen.keeps_alive("HTTP/1.1", {}) is True
    assert loadgen.keeps_alive("HTTP/1.1", {"connection": "close"}) is False
    assert loadgen.keeps_alive("HTTP/1.0", {}) is False
    with pytest.raises(loadgen.HttpError):
        loadgen.parse_head(b"garbage")
    with pytest.raises(ValueError):
        loadgen.Client("http://example.com/metrics")


@pytest.fixture
def tiny_server() -> Iterator[str]:
    """HTTP/1.0 (closes after each response, like wsgiref) and HTTP/1.1 chunked paths."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/chunked":
                self.protocol_version = "HTTP/1.1"
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
                return
            self.send_response(200)
            self.send_header("Content-Length", "5")
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args: object) -> None:
            pass

    with LocalServer(Handler) as server:
        yield server.url


def test_scrape_load_counts_every_request(tiny_server: str) -> None:
    result = loadgen.run_scrape_load(f"{tiny_server}/metrics", concurrency=4, requests_each=3)
    assert result.errors == 0
    assert len(result.latencies) == 12
    assert result.bytes_received == 12 * 5
    assert loadgen.fetch(f"{tiny_server}/chunked").body == b"abcde"


# -- bare NVML loop and short runs -------------------------------------------------------------


def test_bare_loop_makes_the_daemons_nvml_calls(fake_nvml: object) -> None:
    settings = overhead.OverheadSettings(ticks=3, warmup_ticks=2, latency_models=("mixed",))
    scenario = overhead.scenario_for("mixed", 2)
    bare = overhead.measure_variant("bare_sequential", scenario, settings)
    daemon = overhead.measure_variant("source_only", scenario, settings)
    assert bare["calls"], "the bare loop made no NVML calls"
    assert overhead.same_calls(bare["calls"], daemon["calls"]) == {"same": True, "differences": {}}


def test_paired_read_path_measures_both_loops_pair_by_pair(fake_nvml: object) -> None:
    settings = overhead.OverheadSettings(warmup_ticks=1, pairs=3, ticks_per_pair=2)
    paired = overhead.paired_read_path(overhead.scenario_for("mixed", 2), settings)
    cpu = paired["cpu_seconds_per_tick"]
    assert len(cpu["bare_sequential"]) == len(cpu["source_only"]) == 3
    pairs = zip(cpu["source_only"], cpu["bare_sequential"], strict=True)
    assert paired["ratios"] == [source / bare for source, bare in pairs]
    assert paired["median"] == sorted(paired["ratios"])[1]


def test_the_read_path_verdict_is_the_median_pair_not_one_block() -> None:
    mixed = {
        "ratios": {"source_only_cpu_vs_bare": 1.4},
        "read_path_paired": {"ratios": [1.1, 1.2, 1.9], "median": 1.2},
    }
    results = {"overhead": {"models": {"mixed": mixed}}}
    rows = {name: (value, note, ok) for name, value, note, ok in report.evaluate_targets(results)}
    value, note, ok = rows["read path over bare NVML <= 1.25x (NVML source only, CPU)"]
    assert ok is True and value == "1.20x" and "3 back-to-back pairs" in note and "1.40x" in note


def test_quick_peer_run_writes_json_and_summary(tmp_path: Path) -> None:
    argv = ["--quick", "--only", "peer", "--targets", "gpu-exporter", "--results", str(tmp_path)]
    assert run_all.main(argv) == 0
    result = json.loads((tmp_path / "peer.json").read_text())
    assert set(result) >= {"settings", "order", "phases", "summary", "duration_seconds"}
    phase = result["phases"]["gpu-exporter"][0]
    assert set(phase) >= {"idle", "scrape_1", "scrape_32", "rss_mib_idle", "families"}
    assert set(phase["idle"]) >= {"ticks", "cpu_seconds_per_tick", "wall_seconds_per_tick"}
    assert phase["scrape_1"]["errors"] == 0 and phase["scrape_32"]["errors"] == 0
    assert phase["families"]["coverage"]["xid"]  # the scenario's XID was exported
    assert phase["grpcio_loaded"] is False  # the scenario's node is not served in our process
    assert set(result["summary"]["gpu-exporter"]) >= {"cpu_seconds_per_tick", "rss_mib"}
    assert json.loads((tmp_path / "machine.json").read_text())["quick"] is True
    assert "# Benchmark summary" in (tmp_path / "summary.md").read_text()


def test_shipped_phase_attributes_pods_with_the_node_in_another_process(tmp_path: Path) -> None:
    settings = peer.PeerSettings.quick(targets=("gpu-exporter-shipped",))
    result = peer.run(settings, tmp_path)
    phase = result["phases"]["gpu-exporter-shipped"][0]
    pods = {(p["namespace"], p["pod"]) for p in peer.peer_scenario()["pods"]}
    assert phase["attributed_pods"] == len(pods) > 0  # the kubelet of bench/run_node.py
    assert phase["grpcio_loaded"] is False  # its gRPC servers are not in our process
    assert phase["idle"]["ticks"] > 0 and phase["scrape_1"]["errors"] == 0


NODE = {"kubelet_socket": "/run/k.sock", "runtime_socket": "/run/r.sock", "proc_root": "/p"}
AM_URL = "http://127.0.0.1:9093"


@pytest.mark.parametrize(
    ("values", "options", "locations"),
    [
        ([], {}, set()),
        (
            ["--set", "processAttribution.enabled=true"],
            {"processes": True},
            {"kubernetes.processes.proc_root", "kubernetes.processes.runtime_socket"},
        ),
        (["--set", f"alerting.alertmanagers[0].url={AM_URL}"], {"alertmanager_url": AM_URL}, set()),
    ],
)
def test_the_shipped_row_runs_the_charts_configuration(
    tmp_path: Path, values: list[str], options: dict[str, Any], locations: set[str]
) -> None:
    """The chart's config.yaml, loaded by the daemon, equals the shipped row's but for where
    the rules, the kubelet's socket (and the runtime's socket and /proc) are here."""
    from tests.test_bench_soak import flat
    from tests.test_values_schema import rendered_config

    (tmp_path / "chart.yaml").write_text(yaml.safe_dump(rendered_config(*values)))
    (tmp_path / "ours.yaml").write_text(yaml.safe_dump(peer.shipped_config(NODE, **options)))
    chart, ours = (
        flat(load_config(tmp_path / name, {}, environ={}).model_dump())
        for name in ("chart.yaml", "ours.yaml")
    )
    differing = {key for key in chart.keys() | ours.keys() if chart.get(key) != ours.get(key)}
    assert differing == {"rules.files", "kubernetes.socket_path"} | locations
    assert ours["rules.files"] == all_pack_files() and ours["log_level"] == "info"


def test_nvitop_exporter_runs_on_the_fake(tmp_path: Path) -> None:
    pytest.importorskip("nvitop_exporter")
    settings = peer.PeerSettings.quick(targets=("nvitop-exporter",))
    result = peer.run(settings, tmp_path)
    phase = result["phases"]["nvitop-exporter"][0]
    assert phase["idle"]["ticks"] > 0
    assert phase["families"]["coverage"]["power"] == ["gpu_power_usage_W"]
    report_data = phase["nvml_report"]
    assert report_data["calls"]["nvmlDeviceGetPowerUsage"] > 0
    assert "nvmlDeviceGetFanSpeed" in report_data["missing_symbols"]


def test_the_cpu_window_is_scraped_as_prometheus_scrapes() -> None:
    """One scrape per `every` seconds, the last at the window's end, with Prometheus' headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    with LocalServer(Handler) as server:
        offsets = peer.scrape_window(server.url + "/metrics", 0.6, 0.2)
    assert len(offsets) == len(seen) == 3
    assert offsets == sorted(offsets) and offsets[-1] >= 0.6 - 0.05
    assert all(h.get("Accept") == loadgen.PROMETHEUS_HEADERS["Accept"] for h in seen)
    assert all(h.get("Accept-Encoding") == "gzip" for h in seen)


def test_exposition_cost_and_bytes_per_device() -> None:
    from bench import scaling
    from bench.inproc import build

    pipeline = build(scenarios.generate(2, name="bench-test"), rules=[])
    try:
        pipeline.tick()
        cost = scaling.exposition_cost(pipeline)
    finally:
        pipeline.close()
    text = pipeline.sampler.rendered.text
    assert cost["text_bytes"] == len(text) > 0
    assert cost["text_cpu_seconds"] >= 0 and cost["openmetrics_gzip_cpu_seconds"] >= 0
    results = {
        name: {"tick": {"exposition": {"text_bytes": size}}}
        for name, size in (("8gpu", 80_000.0), ("64gpu", 640_000.0))
    }
    assert scaling.bytes_per_device(results) == {"8": 10_000.0, "64": 10_000.0}


# -- the dcgm-exporter compat benchmark ---------------------------------------------------------


def test_compat_benchmark_measures_both_pipelines_and_a_scrape() -> None:
    from bench import compat

    settings = compat.CompatSettings(rounds=1, ticks_per_round=1, renders=1, configs=("8gpu",))
    data = compat.run(settings, Path("/nonexistent"))["configs"]["8gpu"]
    assert len(data["tick_cpu_off"]) == len(data["tick_cpu_on"]) == 1
    assert data["on_vs_off"] == data["tick_cpu_on_mean"] / data["tick_cpu_off_mean"]
    assert data["compat_bytes"] > 50_000 and data["native_bytes"] > 30_000  # default profile
    assert data["compat_render"]["count"] == data["native_render"]["count"] == 1
    section = report.compat_section({"configs": {"8gpu": data}})
    assert section.splitlines()[2].startswith("| 8gpu ")


def test_compat_target_verdicts() -> None:
    def verdict(on_vs_off: float) -> str:
        results = {"compat": {"configs": {"8gpu": {"on_vs_off": on_vs_off}}}}
        (target,) = [t for t in report.evaluate_targets(results) if "dcgm compat" in t[0]]
        return report._verdict(target[3])

    assert verdict(1.01) == "met" and verdict(1.2) == "**missed**"


# -- the DCGM source benchmark ------------------------------------------------------------------


def test_dcgm_benchmark_measures_both_modes_with_activity_from_dcgm() -> None:
    from bench import dcgm_activity

    data = dcgm_activity.run(dcgm_activity.DcgmSettings(rounds=1, ticks_per_round=1), Path("/x"))
    assert len(data["tick_cpu_off"]) == len(data["tick_cpu_on"]) == 1
    assert data["on_vs_off"] == data["tick_cpu_on_mean"] / data["tick_cpu_off_mean"]
    assert data["activity_from_dcgm"] is True
    assert report.dcgm_section(data).splitlines()[2].startswith("| pre-hopper-dcgm ")


def test_dcgm_target_needs_activity_from_dcgm() -> None:
    def verdict(on_vs_off: float, measured: bool = True) -> str:
        results = {"dcgm": {"on_vs_off": on_vs_off, "activity_from_dcgm": measured}}
        (target,) = [t for t in report.evaluate_targets(results) if "DCGM source" in t[0]]
        return report._verdict(target[3])

    assert verdict(1.2) == "met" and verdict(1.7) == "**missed**"
    assert verdict(1.0, measured=False) != "met"


# -- the per-process attribution benchmark ------------------------------------------------------


@pytest.mark.parametrize("devices", [8, 64])
def test_generated_process_scenarios_put_ten_processes_of_pods_on_every_gpu(devices: int) -> None:
    scenario = sim.load_scenario(scenarios.generate_processes(devices))
    processes = scenario.processes
    assert len(processes) == 10 * devices
    assert len({p.pid for p in processes}) == len(processes)
    per_gpu: dict[int, list[Any]] = {}
    for p in processes:
        per_gpu.setdefault(p.gpu, []).append(p)
    assert {gpu: len(procs) for gpu, procs in per_gpu.items()} == dict.fromkeys(range(devices), 10)
    board = [per_gpu[gpu] for gpu in range(8)]
    mps = board[1]
    assert sorted(p.kind for p in mps) == ["mps"] * 9 + ["mps_server"]
    assert len({p.pod.pod for p in mps if p.kind == "mps"}) == 3
    assert [p.name for p in processes if p.pod is None] == ["ollama"] * (devices // 8)
    shares = {(pod.gpu, pod.replica) for pod in scenario.pods if pod.replica is not None}
    assert {replica for gpu, replica in shares if gpu == 5} == set(range(5))  # five pods share
    # Every container the kubelet reports holding a GPU or a share runs processes on it (some
    # idle); on GPU 2 a container that holds nothing runs some too.
    held = {(p.namespace, p.pod, p.container) for p in scenario.pods}
    running = {(p.pod.namespace, p.pod.pod, p.pod.container) for p in processes if p.pod}
    assert held <= running
    assert ("train", "pretrain-2", "profiler") in running - held
    assert all(pod.gpu < devices for pod in scenario.pods)


def test_process_benchmark_measures_both_sides_with_every_process_attributed() -> None:
    from bench import process_attribution as pa

    settings = pa.ProcessSettings(
        rounds=1,
        ticks_per_round=1,
        history_seconds=10.0,
        breakdown_ticks=1,
        refreshes=1,
        rss_ticks=0,
        configs=("8gpu",),
    )
    data = pa.run(settings, Path("/nonexistent"))["configs"]["8gpu"]
    assert len(data["tick_cpu_off"]) == len(data["tick_cpu_on"]) == 1
    assert data["on_vs_off"] == data["tick_cpu_on_mean"] / data["tick_cpu_off_mean"]
    assert data["added_cpu_per_gpu"] == pytest.approx(data["added_cpu_per_tick"] / 8)
    on, off = data["breakdown_on"], data["breakdown_off"]
    # Both sides read the same node: 80 processes, one a host process, on the "on" side only.
    assert (on["processes_listed"], on["processes_in_pods"]) == (80, 79)
    assert on["processes_unattributed"] == {"host": 1.0}
    assert off["processes_listed"] == 0 and off["processes_in_pods"] == 0
    assert data["attribution_complete"] is True
    assert on["series"] > off["series"] and on["text_bytes"] > off["text_bytes"]
    assert set(on["parts_cpu_per_tick"]) >= {
        "NVML reads",
        "processes collector",
        "per-pod processor",
        "process owners",
        "/proc reads",
        "inside the fake NVML",
        "inside its per-process calls",
        "simulated node's thread",
    }
    assert "processes collector" not in off["parts_cpu_per_tick"]
    refresh = on["runtime_refresh"]
    assert refresh["answered"] == refresh["refreshes"] == 1
    assert refresh["refresh_seconds"] == 10.0  # the default the cadence is charged at
    assert "runtime_refresh" not in off
    section = report.processes_section({"configs": {"8gpu": data}})
    assert section.splitlines()[2].startswith("| 8gpu (80 processes) ")
    assert "Where a tick's CPU goes, 8gpu:" in section


def test_attribution_is_complete_only_when_no_process_is_unknown() -> None:
    from bench.process_attribution import attribution_complete

    def data(listed: int, in_pods: float, **unattributed: float) -> dict[str, Any]:
        return {
            "processes_listed": listed,
            "processes_in_pods": in_pods,
            "processes_unattributed": unattributed,
        }

    assert attribution_complete(data(80, 79.0, host=1.0))
    assert not attribution_complete(data(80, 78.0, host=1.0, unknown=1.0))
    assert not attribution_complete(data(80, 78.0, host=1.0))
    assert not attribution_complete(data(0, 0.0))


def test_gpus_up_are_counted_from_the_exposition() -> None:
    from bench.process_attribution import gpu_up

    assert gpu_up('gpu_up{gpu="0",holders="a/b/c,d/e/f",uuid="GPU-1"} 1.0')
    assert not gpu_up('gpu_up{gpu="1",uuid="GPU-2"} 0.0')
    assert not gpu_up("gpu_up_total 1.0") and not gpu_up("# TYPE gpu_up gauge")


def test_the_daemon_side_off_is_a_given_setting_serve_simulate_keeps() -> None:
    # serve --simulate turns per-process attribution on for a node with processes unless the
    # user set it; the benchmark's "off" daemon sets it through the environment.
    from bench.process_attribution import OFF_ENV
    from gpu_exporter.cli import _simulated_processes
    from gpu_exporter.config.load import load_config

    node = SimpleNamespace(proc_root="/tmp/proc", cri_socket_path="/tmp/cri.sock")
    off = _simulated_processes(node, load_config(None, {}, environ=OFF_ENV))
    on = _simulated_processes(node, load_config(None, {}, environ={}))
    assert (off.kubernetes.processes.enabled, off.nvml.processes) == (False, False)
    assert (on.kubernetes.processes.enabled, on.nvml.processes) == (True, True)
    assert on.kubernetes.processes.proc_root == "/tmp/proc"
