"""Soak: the shipped configuration ticking for hours past its longest rule range; do resident
memory, threads and open file descriptors settle?

The configuration is the chart's (`helm/gpu-exporter`'s default values with
`processAttribution.enabled=true` and one Alertmanager; `shipped_settings`): the whole rule pack
as the chart mounts it (recording and alerting files), pod attribution from the kubelet's
PodResources API, per-process attribution from /proc and the container runtime's CRI API, the
notifier, the XID event thread, log level info, a 1 s interval. The node is
`scenarios.generate_processes(8)`: 8 GPUs with 10 processes of pods each (time-slicing, MPS,
exclusive pods, a host process), plus batch jobs coming and going on one time-slicing share
every `churn_seconds` (`scenarios.add_job_churn`: new pods, new per-pod series, PIDs reused by
later pods). The fake kubelet and container runtime answer over their real gRPC wire (unix
sockets); alerts go to `CountingSink`, a local stand-in for Alertmanager that answers 200, in
the harness' process.

Two modes:

- accelerated (`python -m bench.soak`, a fresh child process whose /proc/self is sampled): the
  production tick pipeline (`bench.inproc.build`) on a manual clock, 1 s of scenario time per
  tick, ticks back to back, so hours of daemon time fit in minutes and the rule history (each
  metric kept as far back as the pack reads it, at most `rules.max_range_seconds`, 1 h) fills
  early in the run. The fake NVML, kubelet, /proc and container runtime run in that process
  too: their threads and sockets are in the counts. Their refresh threads (the kubelet's and the
  runtime's) and the XID thread wait in real time, which runs 20-30 times slower than the
  scenario here: `ACCELERATED_SETTINGS` refreshes both every second (the settings' minimum)
  instead of the chart's 10 s, so they refresh a third to half as often per hour of scenario
  time as a node would, rather than 20-30 times less. No HTTP server.
- realtime (`gpu-exporter serve --simulate --config` as a process, scraped every 5 s): the
  whole daemon with its HTTP server, for as long as the budget allows; it ends long before the
  history fills, so it shows the levels of the whole process, not whether they settle.

Sampled at fixed tick intervals (accelerated) or every `realtime_sample_seconds`: VmRSS and
VmHWM, the thread count (/proc/<pid>/status) and the open file descriptors (/proc/<pid>/fd).
Reported for each of RSS, threads and descriptors: start, peak, end, and the least-squares slope
per hour of scenario time over the settled part of the run (`settle`: from the longest history
the loaded rules keep, plus `SETTLE_MARGIN_SECONDS` for ended series to age out), against
`GROWTH_LIMITS_PER_HOUR`; the verdict is "growing" when a slope is above its limit, "flat" when
none is, "unsettled" when less than `MIN_SETTLED_SECONDS` of the run came after the fill. The
accelerated mode also samples what the resident set is made of (`EXPLAINING`: Python's live
blocks and malloc's bytes in use, `bench.heap`, and the rule history's samples), whose slopes
tell objects kept from memory the allocators hold free.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import yaml

from bench import loadgen, scenarios
from bench.heap import live_heap
from bench.inproc import Pipeline, build
from bench.procfs import Probe
from bench.procs import OUR_TICK_FAMILY, OURS, ROOT, free_port, our_command, running
from bench.stats import slope
from gpu_exporter.alerting.pack import all_pack_files
from gpu_exporter.alerting.settings import DEFAULT_MAX_RANGE_SECONDS
from tests.localserver import LocalServer

DEVICES = 8
NODE_NAME = "soak-node"  # $NODE_NAME, which the chart's DaemonSet sets: the alerts' node label
CHURN_GPU = 7  # time-sliced by two pods (`scenarios.PROCESS_LAYOUTS`); the jobs take a third share
# A leak shows as a slope over the settled part; these are the largest slopes called flat. RSS:
# the suite's "flat" target (5 MiB a day). Threads and descriptors: one an hour, so that one
# more thread started once in a settled part of 1.5 h or more reads flat (a step of one in the
# middle of T hours has a slope of 1.5 / T) and one more per job, refresh or alert does not.
GROWTH_LIMITS_PER_HOUR: Mapping[str, float] = {"rss_mib": 5.0 / 24, "threads": 1.0, "fds": 1.0}
QUANTITIES: Mapping[str, str] = {"rss_mib": "RSS (MiB)", "threads": "threads", "fds": "open fds"}
# Sampled beside RSS in the accelerated mode, to tell objects kept (live Python blocks, malloc's
# bytes in use: `bench.heap`) from memory the allocators keep, and a full history (its samples).
EXPLAINING = ("python_blocks", "malloc_in_use_mib", "store_samples")
# Series of a pod that ended keep their samples until the longest window has passed them; a
# job's series end when the job does, so the settled part starts a margin after the fill.
SETTLE_MARGIN_SECONDS = 600.0
MIN_SETTLED_SECONDS = 3600.0  # a slope over less is the noise of a few samples
# The chart's refresh threads wait in real time (see the module docstring).
ACCELERATED_SETTINGS: Mapping[str, Any] = {
    "kubernetes.refresh_seconds": 1.0,
    "kubernetes.processes.refresh_seconds": 1.0,
}


def shipped_settings(alertmanager_url: str | None) -> dict[str, Any]:
    """The chart's daemon configuration (helm/gpu-exporter, default values with
    `processAttribution.enabled=true` and `alerting.alertmanagers[0].url`), as configuration
    flags, where it differs from the daemon's defaults or a simulated node: every file of the
    pack (the chart mounts recording and alerting rules; the daemon alone loads only the
    alerting file), the Alertmanager, and the log level and interval it writes. Pod and
    per-process attribution are turned on and pointed at the simulated node's sockets and /proc
    by `serve --simulate`'s own helpers (`cli._simulated_kubelet`, `cli._simulated_processes`),
    as the chart turns them on and points them at the node's. tests/test_bench_soak.py compares
    the result with the chart's rendered config.yaml."""
    settings: dict[str, Any] = {
        "interval_seconds": 1.0,
        "log_level": "info",
        "rules.files": all_pack_files(),
    }
    if alertmanager_url is not None:
        settings["alerting.alertmanagers"] = [alertmanager_url]
    return settings


def soak_scenario(hours: float, churn_seconds: float) -> dict[str, Any]:
    """The node: 8 GPUs of pods' processes, and jobs coming and going for `hours`."""
    scenario = scenarios.generate_processes(DEVICES, name="bench-soak")
    return scenarios.add_job_churn(
        scenario, until=hours * 3600 + churn_seconds, every=churn_seconds, gpu=CHURN_GPU
    )


class CountingSink:
    """An Alertmanager stand-in on 127.0.0.1: answers 200 to every POST, counts alerts."""

    def __init__(self) -> None:
        self.posts = 0
        self.alerts = 0
        self._lock = threading.Lock()
        self._server = LocalServer(self._handler())
        self.url = self._server.url

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    count = len(json.loads(body))
                except ValueError:
                    count = 0
                with sink._lock:
                    sink.posts += 1
                    sink.alerts += count
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def __enter__(self) -> CountingSink:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)


@dataclass(frozen=True)
class SoakSettings:
    ticks: int = 21_600  # accelerated mode: stop at this many ticks (6 h of scenario time) ...
    seconds: float = 1_200.0  # ... or after this long, whichever comes first
    sample_every_ticks: int = 60
    churn_seconds: float = 300.0  # a new batch job this often (scenario time)
    realtime_seconds: float = 90.0  # 0: skip the realtime mode
    realtime_interval: float = 0.2
    realtime_sample_seconds: float = 2.0

    @classmethod
    def quick(cls) -> SoakSettings:
        return cls(
            ticks=60,
            seconds=20.0,
            sample_every_ticks=10,
            churn_seconds=20.0,
            realtime_seconds=4.0,
        )


def sample(probe: Probe) -> dict[str, float]:
    """One reading of the process under test."""
    memory = probe.memory()
    return {
        "rss_mib": memory.rss_mib,
        "hwm_mib": memory.hwm_mib,
        "threads": probe.threads(),
        "fds": probe.open_fds(),
    }


def settle(
    points: Sequence[Mapping[str, Any]], settled_from: float, x: str = "scenario_seconds"
) -> dict[str, Any]:
    """Start, peak and end of RSS, threads and open fds, and each one's least-squares slope
    per hour of `x` (seconds) over the points at or after `settled_from`, with its verdict."""
    settled = [p for p in points if p[x] >= settled_from]
    span = settled[-1][x] - settled[0][x] if len(settled) > 1 else 0.0
    resources: dict[str, dict[str, Any]] = {}
    for key, limit in GROWTH_LIMITS_PER_HOUR.items():
        values = [float(p[key]) for p in points]
        entry: dict[str, Any] = {
            "start": values[0] if values else None,
            "peak": max(values) if values else None,
            "end": values[-1] if values else None,
            "limit_per_hour": limit,
            "settled_start": float(settled[0][key]) if settled else None,
            "slope_per_hour": None,
            "verdict": "unsettled",
        }
        if span >= MIN_SETTLED_SECONDS:
            rate = slope([p[x] / 3600 for p in settled], [float(p[key]) for p in settled])
            entry["slope_per_hour"] = rate
            entry["verdict"] = "growing" if rate > limit else "flat"
        resources[key] = entry
    verdicts = {entry["verdict"] for entry in resources.values()}
    verdict = (
        "growing" if "growing" in verdicts else "unsettled" if "unsettled" in verdicts else "flat"
    )
    # What the resident set is made of, where sampled: no verdict, the reading of one.
    explaining: dict[str, dict[str, float | None]] = {}
    for key in EXPLAINING:
        values = [p.get(key) for p in settled]
        if span >= MIN_SETTLED_SECONDS and None not in values:
            explaining[key] = {
                "settled_start": float(values[0]),
                "end": float(values[-1]),
                "slope_per_hour": slope([p[x] / 3600 for p in settled], values),
            }
    result = {
        "settled_from_seconds": settled_from,
        "settled_seconds": span,
        "settled_points": len(settled),
        "resources": resources,
        "explaining": explaining,
        "verdict": verdict,
    }
    result["verdict_line"] = verdict_line(result)
    return result


def verdict_line(settled: Mapping[str, Any]) -> str:
    """One sentence: the verdict, each slope, the limits."""
    limits = ", ".join(
        f"{_per_hour(GROWTH_LIMITS_PER_HOUR[k], k)} {QUANTITIES[k].split(' (')[0]}"
        for k in GROWTH_LIMITS_PER_HOUR
    )
    rule = f"growing = a least-squares slope above {limits} per hour of scenario time"
    if settled["verdict"] == "unsettled":
        hours = settled["settled_seconds"] / 3600
        return (
            f"unsettled: {hours:.2f} h of the run came after the history filled (at "
            f"{settled['settled_from_seconds'] / 3600:.2f} h), {MIN_SETTLED_SECONDS / 3600:g} h "
            f"needed; {rule}"
        )
    slopes = ", ".join(
        f"{QUANTITIES[k].split(' (')[0]} {_per_hour(e['slope_per_hour'], k, sign=True)}/h"
        for k, e in settled["resources"].items()
    )
    start = settled["settled_from_seconds"] / 3600
    end = start + settled["settled_seconds"] / 3600
    return f"{settled['verdict']}: {slopes} over scenario hours {start:.2f}-{end:.2f}; {rule}"


def _per_hour(value: float, key: str, sign: bool = False) -> str:
    text = f"{value:+.3f}" if sign else f"{value:.3f}"
    return f"{text} MiB" if key == "rss_mib" else text


def longest_history_seconds(pipeline: Pipeline) -> float:
    """How far back the loaded rules keep any metric (`RuleManager`'s retention: windows and
    expiry of ended series), the time the history needs to fill."""
    manager = pipeline.manager
    evaluator = manager.evaluator if manager is not None else None
    if evaluator is None:
        return 0.0
    default, by_metric = evaluator.retention()
    kept = [default, *by_metric.values()]
    return max(max(r.window, r.expire) for r in kept)


def _job_pods(pipeline: Pipeline) -> set[str]:
    """The churned jobs' pods in the last tick's series (attributed, so seen)."""
    series = pipeline.sampler.series
    if series is None:
        return set()
    return {v for row in series for k, v in row.labels if k == "pod" and v.startswith("job-")}


class _CountingHandler(logging.Handler):
    """Counts the daemon's log records by level, and those after a mark."""

    def __init__(self) -> None:
        super().__init__()
        self.by_level: Counter[str] = Counter()
        self.settled = 0
        self.settling = True

    def emit(self, record: logging.LogRecord) -> None:
        self.by_level[record.levelname] += 1
        if not self.settling:
            self.settled += 1


def configure_logging() -> None:
    """As `serve` configures it, at the chart's level (info)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def start(
    settings: SoakSettings, alertmanager_url: str
) -> tuple[dict[str, Any], dict[str, Any], Pipeline]:
    """The accelerated soak's node and pipeline: its scenario, its configuration flags and
    the started pipeline (close it)."""
    scenario = soak_scenario(settings.ticks / 3600, settings.churn_seconds)
    flags = {**shipped_settings(alertmanager_url), **ACCELERATED_SETTINGS}
    return scenario, flags, build(scenario, node=True, xid_events=True, settings=flags)


def accelerated(settings: SoakSettings, alertmanager_url: str) -> dict[str, Any]:
    """The shipped configuration on a manual clock in this process, sampled from /proc/self."""
    log_counter = _CountingHandler()
    logging.getLogger().addHandler(log_counter)
    probe = Probe("self")
    before = sample(probe)
    scenario, flags, pipeline = start(settings, alertmanager_url)
    points: list[dict[str, Any]] = []
    jobs_seen: set[str] = set()
    started = time.monotonic()
    cpu_mark, ticks = time.process_time(), 0
    try:
        assembly = pipeline.assembly
        if assembly is None or assembly.attribution is None or assembly.processes is None:
            raise RuntimeError("the soak needs pod and per-process attribution on")
        settled_from = longest_history_seconds(pipeline) + SETTLE_MARGIN_SECONDS
        while ticks < settings.ticks and time.monotonic() - started < settings.seconds:
            pipeline.tick()
            ticks += 1
            if ticks % settings.sample_every_ticks:
                continue
            cpu_now = time.process_time()
            store = pipeline.manager.store if pipeline.manager is not None else None
            stats = pipeline.notifier.stats() if pipeline.notifier is not None else None
            jobs_seen |= _job_pods(pipeline)
            log_counter.settling = pipeline.clock() < settled_from
            points.append(
                {
                    "tick": ticks,
                    "scenario_seconds": pipeline.clock(),
                    "elapsed_seconds": time.monotonic() - started,
                    **sample(probe),
                    **live_heap(),
                    "cpu_seconds_per_tick": (cpu_now - cpu_mark) / settings.sample_every_ticks,
                    "store_series": store.series_count() if store else None,
                    "store_samples": store.sample_count() if store else None,
                    "alerts_sent": stats.sent_total if stats else None,
                    "alert_queue": stats.queue_length if stats else None,
                }
            )
            cpu_mark = cpu_now
        kubelet_lists = getattr(pipeline.kubelet, "list_calls", None)
    finally:
        pipeline.close()
        logging.getLogger().removeHandler(log_counter)
    tail = points[-max(1, len(points) // 5) :]
    stats = pipeline.notifier.stats() if pipeline.notifier is not None else None
    return {
        "configuration": {
            "chart_values": ["processAttribution.enabled=true", "alerting.alertmanagers[0].url"],
            "settings": flags,
            "scenario": scenario["name"],
            "devices": DEVICES,
            "processes": len(scenario["processes"]),
            "pods": len(scenario["pods"]),
            "churn_seconds": settings.churn_seconds,
            "jobs_scheduled": sum(1 for p in scenario["pods"] if p["pod"].startswith("job-")),
        },
        "ticks": ticks,
        "scenario_hours": ticks * pipeline.interval / 3600,
        "wall_seconds": time.monotonic() - started,
        "before_first_tick": before,
        "settle": settle(points, settled_from),
        "steady_cpu_seconds_per_tick": sum(p["cpu_seconds_per_tick"] for p in tail) / len(tail)
        if tail
        else None,
        "jobs_seen_in_series": len(jobs_seen),
        "kubelet_list_calls": kubelet_lists,
        "alerts_sent": stats.sent_total if stats else None,
        "alerts_failed": stats.failed_total if stats else None,
        "log_records": dict(log_counter.by_level),
        "log_records_settled": log_counter.settled,
        "points": _thin(points),
    }


def _thin(points: list[dict[str, Any]], keep: int = 240) -> list[dict[str, Any]]:
    if len(points) <= keep:
        return points
    step = len(points) / keep
    return [points[int(i * step)] for i in range(keep)] + [points[-1]]


def realtime(settings: SoakSettings, workdir: Path) -> dict[str, Any]:
    """The whole daemon (`serve --simulate`, its HTTP server too) on the same node and
    configuration, in real time, sampled from /proc/<pid>."""
    hours = max(settings.realtime_seconds, 1.0) / 3600
    scenario = scenarios.write_yaml(
        soak_scenario(hours, settings.churn_seconds), workdir / "soak-scenario.yaml"
    )
    points: list[dict[str, Any]] = []
    with CountingSink() as sink:
        config = workdir / "soak-config.yaml"
        config.write_text(yaml.safe_dump(config_file(shipped_settings(sink.url))))
        port = free_port()
        argv = our_command(
            scenario, port, settings.realtime_interval, ["--config", str(config)], log_level="info"
        )
        env = {"NODE_NAME": NODE_NAME}
        with running(OURS, argv, port, workdir, OUR_TICK_FAMILY, env) as target:
            target.wait_ready()
            first = target.counters()
            started = time.monotonic()
            next_scrape = started
            while time.monotonic() - started < settings.realtime_seconds:
                now = time.monotonic()
                if now >= next_scrape:
                    loadgen.fetch(target.url)
                    next_scrape = now + 5.0
                points.append({"scenario_seconds": now - started, **sample(target.probe)})
                time.sleep(settings.realtime_sample_seconds)
            last = target.closing_counters()
            log_lines = len(target.output().splitlines())
        posts, alerts = sink.posts, sink.alerts
    ticks = last.tick_count - first.tick_count
    seconds = last.at - first.at
    return {
        "interval": settings.realtime_interval,
        "ticks": ticks,
        "seconds": seconds,
        "cpu_percent_of_core": 100 * (last.cpu.total - first.cpu.total) / seconds
        if seconds
        else None,
        # Scenario time is real time here: the history fills after the longest range allowed.
        "settle": settle(points, DEFAULT_MAX_RANGE_SECONDS + SETTLE_MARGIN_SECONDS),
        "alert_posts": posts,
        "alerts_sent": alerts,
        "log_lines": log_lines,
        "points": _thin(points),
    }


def config_file(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted configuration flags as the nested mapping of a configuration file."""
    data: dict[str, Any] = {}
    for key, value in flags.items():
        *parents, leaf = key.split(".")
        node = data
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    if "alertmanagers" in data.get("alerting", {}):
        data["alerting"]["alertmanagers"] = [{"url": u} for u in data["alerting"]["alertmanagers"]]
    return data


def accelerated_in_child(settings: SoakSettings, workdir: Path) -> dict[str, Any]:
    """`accelerated` in a fresh interpreter: its /proc/self is the pipeline's and the node's
    alone. The sink stays here, so that its threads and connections are not counted."""
    out = workdir / "accelerated.json"
    log = workdir / "accelerated.log"
    with CountingSink() as sink:
        argv = [sys.executable, "-m", "bench.soak", "--out", str(out), "--am", sink.url]
        argv += ["--ticks", str(settings.ticks), "--seconds", f"{settings.seconds:g}"]
        argv += ["--sample-every", str(settings.sample_every_ticks)]
        argv += ["--churn-seconds", f"{settings.churn_seconds:g}"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NODE_NAME": NODE_NAME}
        with log.open("wb") as stderr:
            subprocess.run(argv, check=True, env=env, stderr=stderr, timeout=settings.seconds + 300)
        posts, alerts = sink.posts, sink.alerts
    result: dict[str, Any] = json.loads(out.read_text())
    result["alert_posts"], result["alerts_received"] = posts, alerts
    result["log_lines"] = len(log.read_text(errors="replace").splitlines())
    return result


def run(settings: SoakSettings, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "settings": settings.__dict__,
        "accelerated": accelerated_in_child(settings, workdir),
    }
    if settings.realtime_seconds > 0:
        result["realtime"] = realtime(settings, workdir)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Child-process entry of the accelerated soak: run it, write its result as JSON."""
    parser = argparse.ArgumentParser(description="accelerated soak (see bench/soak.py)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--am", required=True, help="the Alertmanager stand-in's URL")
    parser.add_argument("--ticks", type=int, default=SoakSettings.ticks)
    parser.add_argument("--seconds", type=float, default=SoakSettings.seconds)
    parser.add_argument("--sample-every", type=int, default=SoakSettings.sample_every_ticks)
    parser.add_argument("--churn-seconds", type=float, default=SoakSettings.churn_seconds)
    args = parser.parse_args(argv)
    settings = SoakSettings(
        ticks=args.ticks,
        seconds=args.seconds,
        sample_every_ticks=args.sample_every,
        churn_seconds=args.churn_seconds,
    )
    configure_logging()
    args.out.write_text(json.dumps(accelerated(settings, args.am)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
