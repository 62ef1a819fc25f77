"""Peer comparison: gpu-exporter vs nvitop-exporter on the same fake NVML and scenario.

Three exporters run alternately (A/B/C/A/B/C), never at the same time, each as a fresh
process: gpu-exporter young (`bench/run_daemon.py`: `serve` on the fake exactly as
`--simulate` runs it, plus a timer around whole ticks), the same with its rule history
prefilled at the second tick (`--prefill-history`: range rules then cost what they cost after
16 minutes of running, which a one-minute phase cannot otherwise show), and nvitop-exporter
(`bench/run_nvitop_exporter.py`). Ratios are ours / peer for the steady daemon (`ratios`)
and for the young one (`ratios_young`). Each phase: wait for three ticks, warm up, then

1. a CPU window scraped as Prometheus scrapes (one scrape every 15 s with Prometheus'
   headers: OpenMetrics, gzip), so that rendering is counted the way production pays for it:
   CPU per tick, wall time per tick (both from the launchers' timers around whole ticks /
   collection passes) and the part of it that reads the GPUs (ours:
   `gpu_exporter_tick_duration_seconds`; theirs: `update_device`), CPU % of one core,
   resident memory (the JSON keeps this window under the key `idle`);
2. `/metrics` latency with 1 scraper and with 32 concurrent scrapers (bounded request counts,
   plain text, no gzip), and once with 1 scraper sending Prometheus' own headers;
3. families declared and families with samples in one scrape, and which quantities they cover.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import loadgen, promtext, scenarios, soak
from bench.procs import (
    BENCH_ONLY_PREFIXES,
    OUR_FULL_TICK_FAMILY,
    OUR_TICK_FAMILY,
    OURS,
    OURS_SHIPPED,
    OURS_STEADY,
    PEER,
    PEER_DEVICES_FAMILY,
    PEER_TICK_FAMILY,
    ROOT,
    Running,
    free_port,
    our_timed_command,
    peer_command,
    running,
    running_node,
    window,
)
from bench.stats import mean, ratio, summarize

# Ratio rows: (key, lower is better). Families: higher is better.
RATIO_KEYS = (
    "cpu_seconds_per_tick",
    "wall_seconds_per_tick",
    "scrape_1_p50",
    "scrape_1_p99",
    "scrape_32_p50",
    "scrape_32_p99",
    "rss_mib",
    "gpu_families",
)


@dataclass(frozen=True)
class PeerSettings:
    rounds: int = 2
    interval: float = 1.0
    warmup_seconds: float = 5.0
    idle_seconds: float = 30.0  # the CPU window
    window_scrape_every_seconds: float = 15.0  # Prometheus' default scrape interval is 15-60 s
    single_requests: int = 300
    concurrent_scrapers: int = 32
    concurrent_requests_each: int = 15
    prometheus_header_requests: int = 100
    targets: tuple[str, ...] = (OURS, OURS_STEADY, OURS_SHIPPED, PEER)
    history_seconds: float = 960.0  # OURS_STEADY: the shipped rules' longest window + lookback

    @classmethod
    def quick(
        cls, targets: tuple[str, ...] = (OURS, OURS_STEADY, OURS_SHIPPED, PEER)
    ) -> PeerSettings:
        return cls(
            rounds=1,
            warmup_seconds=1.0,
            idle_seconds=3.0,
            window_scrape_every_seconds=1.5,
            single_requests=20,
            concurrent_scrapers=32,
            concurrent_requests_each=2,
            prometheus_header_requests=10,
            targets=targets,
        )


# The import floor of the stack the daemon is built on (FastAPI, uvicorn, prometheus-client,
# APScheduler): what any exporter on that stack pays before its first line of code.
STACK_FLOOR_IMPORTS = (
    "import fastapi, uvicorn, prometheus_client, apscheduler.schedulers.background"
)
_PRINT_RSS = "import re; print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1])"


def import_rss_mib(statement: str) -> float:
    """Resident memory of a fresh interpreter after `statement`."""
    out = subprocess.run(
        [sys.executable, "-c", f"{statement}\n{_PRINT_RSS}"],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT)},  # the project's own modules, for the profiles
    )
    return int(out.stdout.strip()) / 1024


def memory_floor() -> dict[str, float]:
    return {
        "python_alone_mib": import_rss_mib("pass"),
        "stack_floor_mib": import_rss_mib(STACK_FLOOR_IMPORTS),
    }


def peer_available() -> str:
    """ "" when nvitop-exporter is importable, else why not."""
    if importlib.util.find_spec("nvitop_exporter") is None:
        return "nvitop-exporter is not installed (pip install nvitop-exporter==1.7.2)"
    return ""


def peer_scenario() -> dict[str, Any]:
    """8 GPUs of the built-in `mixed` with pods and 10 running processes on every GPU
    (`scenarios.generate_processes`), so that both exporters' per-process loops have work,
    plus one XID 31 on GPU 3 at t = 3 s, so that XID coverage is observed rather than assumed
    (XID 31 is an application's page fault: no shipped rule fires on it)."""
    scenario = scenarios.generate_processes(8, name="bench-peer-mixed")
    scenario["faults"] = [*scenario.get("faults", []), XID_31_ON_GPU_3]
    return scenario


XID_31_ON_GPU_3 = {"at": 3, "device": 3, "kind": "xid", "xid": 31}


def gpu_families(families: set[str]) -> set[str]:
    """GPU telemetry families: `gpu_*` without the exporter's self-metrics."""
    return {f for f in families if f.startswith("gpu_") and not f.startswith("gpu_exporter_")}


def families_report(text: str) -> dict[str, Any]:
    declared = {
        f for f in promtext.declared_families(text) if not f.startswith(BENCH_ONLY_PREFIXES)
    }
    with_samples = {
        f for f in promtext.families_with_samples(text) if not f.startswith(BENCH_ONLY_PREFIXES)
    }
    gpu = gpu_families(with_samples)
    return {
        "declared": len(declared),
        "with_samples": len(with_samples),
        "gpu_families": len(gpu),
        "gpu_family_names": sorted(gpu),
        "coverage": promtext.coverage(with_samples),
    }


def _scrape(url: str, scrapers: int, each: int, headers: dict[str, str]) -> dict[str, Any]:
    result = loadgen.run_scrape_load(url, scrapers, each, headers)
    stats = summarize(result.latencies)
    return {
        "scrapers": scrapers,
        "requests": scrapers * each,
        "errors": result.errors,
        "p50": stats["p50"],
        "p99": stats["p99"],
        "mean": stats["mean"],
        "max": stats["max"],
        "bytes_per_response": result.bytes_received / max(len(result.latencies), 1),
    }


def measure(target: Running, settings: PeerSettings) -> dict[str, Any]:
    """One phase on an already started exporter."""
    target.wait_ready(ticks=3)  # OURS_STEADY has its full history from the third tick
    time.sleep(settings.warmup_seconds)
    start = target.counters()
    scraped_at = scrape_window(
        target.url, settings.idle_seconds, settings.window_scrape_every_seconds
    )
    end = target.closing_counters()
    idle = window(start, end)
    memory_idle = target.memory()
    single = _scrape(target.url, 1, settings.single_requests, loadgen.PLAIN_HEADERS)
    many = _scrape(
        target.url,
        settings.concurrent_scrapers,
        settings.concurrent_requests_each,
        loadgen.PLAIN_HEADERS,
    )
    prom = _scrape(target.url, 1, settings.prometheus_header_requests, loadgen.PROMETHEUS_HEADERS)
    memory_end = target.memory()
    text = target.metrics_text()
    phase: dict[str, Any] = {
        "idle": idle | {"scrapes": len(scraped_at)},
        "rss_mib_idle": memory_idle.rss_mib,
        "rss_mib_after_load": memory_end.rss_mib,
        "hwm_mib": memory_end.hwm_mib,
        "scrape_1": single,
        "scrape_32": many,
        "scrape_1_prometheus_headers": prom,
        "families": families_report(text),
    }
    # The part of a tick that reads the GPUs: ours' own histogram, theirs' update_device.
    part = PEER_DEVICES_FAMILY if target.tick_family == PEER_TICK_FAMILY else OUR_TICK_FAMILY
    phase["reads_seconds_per_tick"] = per_tick(start.text, end.text, part, idle["ticks"])
    return phase


def scrape_window(url: str, seconds: float, every: float) -> list[float]:
    """Scrape `url` once every `every` seconds for `seconds` (the last scrape at the end), as
    Prometheus would; returns the offsets of the scrapes."""
    began = time.monotonic()
    offsets = []
    offset = every
    while offset <= seconds + 1e-9:
        time.sleep(max(0.0, began + offset - time.monotonic()))
        response = loadgen.fetch(url, loadgen.PROMETHEUS_HEADERS)
        if response.status != 200:
            raise RuntimeError(f"{url}: answered {response.status} in the CPU window")
        offsets.append(time.monotonic() - began)
        offset += every
    remaining = began + seconds - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
    return offsets


def per_tick(start: str, end: str, family: str, ticks: float) -> float | None:
    """Growth of a summary's or histogram's sum between two expositions, per tick."""
    first, last = promtext.sum_and_count(start, family), promtext.sum_and_count(end, family)
    if first is None or last is None or ticks <= 0:
        return None
    return (last[0] - first[0]) / ticks


def _phase(name: str, scenario: Path, settings: PeerSettings, workdir: Path) -> dict[str, Any]:
    port = free_port()
    report = workdir / f"nvitop-report-{port}.json"
    if name == PEER:
        argv, family = peer_command(scenario, port, settings.interval, report), PEER_TICK_FAMILY
    elif name == OURS_SHIPPED:
        return shipped_phase(scenario, settings, workdir)
    else:
        history = settings.history_seconds if name == OURS_STEADY else 0.0
        argv = our_timed_command(scenario, port, settings.interval, history)
        family = OUR_FULL_TICK_FAMILY
    with running(name, argv, port, workdir, family) as target:
        result = measure(target, settings)
        result["pid"] = target.process.pid
        if name != PEER:
            result["grpcio_loaded"] = grpcio_loaded(target.process.pid)
    if name == PEER:
        result["exit_status"] = target.process.returncode
        if report.exists():
            result["nvml_report"] = json.loads(report.read_text())
    return result


def shipped_config(
    node: Mapping[str, str],
    *,
    processes: bool = False,
    alertmanager_url: str | None = None,
) -> dict[str, Any]:
    """The daemon configuration the chart renders from its default values (the whole rule
    pack, pod attribution on, per-process attribution off, no Alertmanager, log level info),
    pointed at the kubelet of bench/run_node.py as the chart points it at the node's.
    `processes` and `alertmanager_url`: as `processAttribution.enabled=true` and
    `alerting.alertmanagers[0].url` turn them on (bench/profile.py: what they add).
    tests/test_bench.py compares it with the chart's rendered config.yaml."""
    config = soak.config_file(soak.shipped_settings(alertmanager_url))
    config["kubernetes"] = {"enabled": True, "socket_path": node["kubelet_socket"]}
    if processes:
        config["kubernetes"]["processes"] = {
            "enabled": True,
            "proc_root": node["proc_root"],
            "runtime_socket": node["runtime_socket"],
        }
        config["nvml"] = {"processes": True}
    return config


def shipped_phase(
    scenario: Path,
    settings: PeerSettings,
    workdir: Path,
    *,
    processes: bool = False,
    alertmanager: bool = False,
    change: Callable[[dict[str, Any]], object] | None = None,
    history_seconds: float | None = None,
) -> dict[str, Any]:
    """OURS_SHIPPED: the steady daemon with the chart's default configuration, its kubelet (and
    with `processes` its runtime and /proc) served by another process on the same clock; with
    `alertmanager` its alerts go to a local sink. `change` edits the configuration first and
    `history_seconds` replaces the prefilled history (bench/profile.py: what each part costs)."""
    port = free_port()
    epoch = time.time()
    with soak.CountingSink() as sink, running_node(scenario, epoch, workdir) as node:
        url = sink.url if alertmanager else None
        config = shipped_config(node, processes=processes, alertmanager_url=url)
        if change is not None:
            change(config)
        path = workdir / f"shipped-config-{port}.yaml"
        path.write_text(yaml.safe_dump(config))
        argv = our_timed_command(
            scenario,
            port,
            settings.interval,
            settings.history_seconds if history_seconds is None else history_seconds,
            epoch=epoch,
            extra=["--config", str(path)],
            log_level="info",
        )
        env = {"NODE_NAME": soak.NODE_NAME}
        with running(OURS_SHIPPED, argv, port, workdir, OUR_FULL_TICK_FAMILY, env) as target:
            result = measure(target, settings)
            result["pid"] = target.process.pid
            result["attributed_pods"] = attributed_pods(target.metrics_text())
            result["grpcio_loaded"] = grpcio_loaded(target.process.pid)
        result["alerts_received"] = sink.alerts
    return result


def grpcio_loaded(pid: int) -> bool:
    """Whether grpcio's extension is mapped into `pid`: the daemon's own client is h2, so only
    an in-process fake kubelet or runtime would bring it (and its 26 MiB)."""
    with open(f"/proc/{pid}/maps") as maps:
        return any("cygrpc" in line for line in maps)


def attributed_pods(text: str) -> int:
    """Distinct pods named on `gpu_pod_info` in an exposition: pod attribution worked."""
    pods = set()
    for family in text_string_to_metric_families(text):
        if family.name == "gpu_pod_info":
            pods |= {(s.labels.get("namespace"), s.labels.get("pod")) for s in family.samples}
    return len(pods)


def flatten(phase: dict[str, Any]) -> dict[str, float]:
    """The figures that get ratios, from one phase."""
    return {
        "cpu_seconds_per_tick": phase["idle"]["cpu_seconds_per_tick"],
        "cpu_percent_of_core": phase["idle"]["cpu_percent_of_core"],
        "wall_seconds_per_tick": phase["idle"]["wall_seconds_per_tick"],
        "reads_seconds_per_tick": phase.get("reads_seconds_per_tick"),
        "scrape_1_p50": phase["scrape_1"]["p50"],
        "scrape_1_p99": phase["scrape_1"]["p99"],
        "scrape_32_p50": phase["scrape_32"]["p50"],
        "scrape_32_p99": phase["scrape_32"]["p99"],
        "scrape_prometheus_headers_p50": phase["scrape_1_prometheus_headers"]["p50"],
        "scrape_prometheus_headers_p99": phase["scrape_1_prometheus_headers"]["p99"],
        "rss_mib": phase["rss_mib_after_load"],
        "rss_mib_idle": phase["rss_mib_idle"],
        "hwm_mib": phase["hwm_mib"],
        "bytes_per_scrape": phase["scrape_1"]["bytes_per_response"],
        "families_declared": phase["families"]["declared"],
        "families_with_samples": phase["families"]["with_samples"],
        "gpu_families": phase["families"]["gpu_families"],
    }


def aggregate(phases: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean of each figure over the rounds of one exporter."""
    flat = [flatten(p) for p in phases]
    if not flat:
        return {}
    return {key: mean([f[key] for f in flat if f[key] is not None]) for key in flat[0]}


def ratios(ours: dict[str, float], theirs: dict[str, float]) -> dict[str, float | None]:
    return {key: ratio(ours.get(key), theirs.get(key)) for key in RATIO_KEYS}


def run(settings: PeerSettings, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    scenario = scenarios.write_yaml(peer_scenario(), workdir / "peer-scenario.yaml")
    targets = list(settings.targets)
    unavailable = peer_available()
    if PEER in targets and unavailable:
        targets.remove(PEER)
    phases: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    order = []
    for round_index in range(settings.rounds):
        for name in targets:  # A/B/A/B: alternate within each round
            order.append(f"{round_index}:{name}")
            phases[name].append(_phase(name, scenario, settings, workdir))
    summary = {name: aggregate(results) for name, results in phases.items()}
    result: dict[str, Any] = {
        "settings": settings.__dict__ | {"targets": list(settings.targets)},
        "scenario": str(scenario.name),
        "order": order,
        "phases": phases,
        "summary": summary,
        "peer_unavailable": unavailable or None,
        "memory_floor": memory_floor(),
    }
    if PEER in summary:
        for name, key in (
            (OURS, "ratios_young"),
            (OURS_STEADY, "ratios"),
            (OURS_SHIPPED, "ratios_shipped"),
        ):
            if name in summary:
                result[key] = ratios(summary[name], summary[PEER])
    if OURS in summary and PEER in summary:
        result["coverage"] = {
            OURS: phases[OURS][-1]["families"]["coverage"],
            PEER: phases[PEER][-1]["families"]["coverage"],
        }
    return result
