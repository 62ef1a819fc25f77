"""Fleet emulation: what a fleet of nodes running the exporter costs a real Prometheus.

The daemon runs once as users deploy it (`serve --simulate mixed`: eight GPUs, pods attributed
through its built-in fake kubelet in `labels` mode, the shipped rules, `--dcgm-compat`), and
its /metrics and /metrics/dcgm are captured as Prometheus asks for them (OpenMetrics, gzip).
One HTTP server on 127.0.0.1 then serves that capture as `nodes` nodes (bench/fleet_nodes.py:
UUIDs and the node name rewritten per node, so every node has the same series under labels of
its own), and a real Prometheus scrapes them as the shipped ServiceMonitor does, for each
output in turn:

- `native`: /metrics with the shipped rules loaded (rules/gpu-exporter.recording.yaml, the
  fleet dashboard's recording rules, and rules/gpu-exporter.rules.yaml, the alerts);
- `native-no-rules`: the same without rules (what the series alone cost);
- `compat`: /metrics/dcgm alone (the shipped rules read the native names, so none are loaded).

After every target has been scraped, Prometheus keeps scraping for `history_seconds` (the
range selectors then read some history: at a 5 s interval, 90 s put as many samples in a
5-minute range as a steady 15 s scrape does), then until each rule group has been evaluated
`evaluations` times; then its head series, resident memory, CPU and the rule groups'
evaluation times are read from its API, its /metrics and /proc. Evaluation times are wall
times (Prometheus' `evaluationTime`): groups evaluate concurrently and share the machine, so
the median and the fastest evaluation are reported next to the slowest. Figures per 1,000
nodes are scaled linearly from the nodes run: series and evaluation times in proportion,
memory as the idle Prometheus' (measured first) plus the rest in proportion.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import loadgen, prometheus_api, promtext
from bench.fleet_nodes import (
    COMPAT,
    JOBS,
    NATIVE,
    OUTPUT_PATHS,
    TEMPLATE_NODE,
    ReplayServer,
    fleet_bodies,
    prometheus_config,
    scrape_job,
)
from bench.procfs import Probe
from bench.procs import OUR_TICK_FAMILY, OURS, ROOT, Running, free_port, our_command, running
from bench.prometheus_api import GroupEvaluation, Prometheus

SHIPPED_RULES = (
    ROOT / "rules" / "gpu-exporter.recording.yaml",
    ROOT / "rules" / "gpu-exporter.rules.yaml",
)
FLEET_GROUP = "gpu-exporter-fleet"  # the recording rules' group
# Series Prometheus writes itself: a target's report series (up, scrape_*; Prometheus docs
# "Jobs and instances") and the rules' outputs (recorded names carry a colon; alerts' ALERTS
# and ALERTS_FOR_STATE).
REPORT_SERIES = '{{__name__=~"up|scrape_.+", job="{job}"}}'
RULE_SERIES = '{__name__=~".+:.+|ALERTS|ALERTS_FOR_STATE"}'
SLOWEST_RULES = 5
# name -> (output, with the shipped rules)
RUNS: dict[str, tuple[str, bool]] = {
    "native": (NATIVE, True),
    "native-no-rules": (NATIVE, False),
    "compat": (COMPAT, False),
}


@dataclass(frozen=True)
class FleetSettings:
    nodes: int = 200
    per: int = 1000  # the figures' scale: per this many nodes
    scrape_interval: float = 5.0  # also the recording group's evaluation interval
    history_seconds: float = 90.0
    evaluations: int = 4  # of each rule group, once every node's series are there
    scenario: str = "mixed"
    capture_ticks: int = 10
    runs: tuple[str, ...] = tuple(RUNS)
    idle_seconds: float = 3.0
    timeout_seconds: float = 600.0  # per run

    @classmethod
    def quick(cls) -> FleetSettings:
        return cls(
            nodes=5,
            scrape_interval=1.0,
            history_seconds=0.0,
            evaluations=1,
            capture_ticks=3,
            idle_seconds=1.0,
            timeout_seconds=120.0,
        )


# -- the capture ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    text: str
    content_type: str
    series: int  # sample lines: each is one series


def exposition_series(text: str) -> int:
    """Series in an exposition (text or OpenMetrics): its distinct sample lines."""
    return len(promtext.samples(text))


def _fetch(url: str) -> Capture:
    response = loadgen.fetch(url, loadgen.PROMETHEUS_HEADERS)
    if response.status != 200:
        raise RuntimeError(f"{url} answered {response.status}")
    body = response.body
    if response.headers.get("content-encoding") == "gzip":
        body = gzip.decompress(body)
    text = body.decode()
    content_type = response.headers.get("content-type", "text/plain")
    return Capture(text, content_type, exposition_series(text))


def _wait_for_pods(daemon: Running, timeout: float = 60.0) -> None:
    """Until pod attribution has read the fake kubelet (gpu_pod_info has samples)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "gpu_pod_info" in promtext.families_with_samples(daemon.metrics_text()):
            return
        time.sleep(0.5)
    raise RuntimeError(f"no gpu_pod_info within {timeout:g}s:\n{daemon.output()[-4000:]}")


def capture(settings: FleetSettings, workdir: Path) -> dict[str, Capture]:
    """Each output of one daemon, as Prometheus receives it, once it has ticked
    `capture_ticks` times and attributed the pods."""
    port = free_port()
    argv = our_command(settings.scenario, port, 1.0, ["--dcgm-compat"])
    env = {"NODE_NAME": TEMPLATE_NODE}
    with running(OURS, argv, port, workdir, OUR_TICK_FAMILY, env) as daemon:
        daemon.wait_ready(ticks=settings.capture_ticks)
        _wait_for_pods(daemon)
        base = f"http://127.0.0.1:{port}"
        outputs = {RUNS[name][0] for name in settings.runs}
        return {output: _fetch(base + OUTPUT_PATHS[output]) for output in sorted(outputs)}


# -- arithmetic -----------------------------------------------------------------------------------


def scaled(value: float | None, nodes: int, per: int) -> float | None:
    """`value` measured at `nodes` nodes, at `per` nodes, in proportion."""
    return None if value is None else value * per / nodes


def scaled_above(value: float | None, base: float, nodes: int, per: int) -> float | None:
    """`value` at `per` nodes where `base` does not grow with nodes (an idle process)."""
    return None if value is None else base + (value - base) * per / nodes


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if not ordered:
        return None
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def group_summary(evaluations: Sequence[GroupEvaluation], nodes: int, per: int) -> dict[str, Any]:
    """One rule group's evaluations (the same group, in time order): their durations, the
    slowest rules of the last one, and rules that failed."""
    last = evaluations[-1]
    seconds = [e.seconds for e in evaluations]
    slowest = sorted(last.rules, key=lambda rule: rule.seconds, reverse=True)[:SLOWEST_RULES]
    return {
        "file": Path(last.file).name,
        "interval_seconds": last.interval,
        "rules": len(last.rules),
        "evaluation_seconds": seconds,
        "min_seconds": min(seconds),
        "median_seconds": median(seconds),
        "max_seconds": max(seconds),
        "median_seconds_per_1000": scaled(median(seconds), nodes, per),
        "min_seconds_per_1000": scaled(min(seconds), nodes, per),
        "slowest_rules": [[rule.name, rule.seconds] for rule in slowest],
        "errors": [[r.name, r.error] for r in last.rules if r.health == "err"],
    }


def new_evaluations(
    seen: dict[str, dict[float, GroupEvaluation]], groups: Iterable[GroupEvaluation], since: float
) -> None:
    """Add the groups' last evaluations that started at or after `since` (wall time)."""
    for group in groups:
        if group.last_evaluation is not None and group.last_evaluation >= since:
            seen.setdefault(group.name, {})[group.last_evaluation] = group


# -- one run --------------------------------------------------------------------------------------


def _deadline_left(deadline: float, what: str, prometheus: Prometheus) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(f"timed out {what}:\n{prometheus.output()[-4000:]}")


def _wait_all_scraped(prometheus: Prometheus, job: str, nodes: int, deadline: float) -> float:
    """Wall time at which every target's last scrape succeeded."""
    while True:
        up = prometheus.query(f'count(up{{job="{job}"}} == 1)')
        if up == nodes:
            return time.time()
        _deadline_left(deadline, f"waiting for {nodes} targets up (now {up})", prometheus)
        time.sleep(0.25)


def _sleep_until(moment: float) -> None:
    while (left := moment - time.time()) > 0:
        time.sleep(min(left, 1.0))


def _collect_evaluations(
    prometheus: Prometheus, since: float, count: int, deadline: float
) -> dict[str, list[GroupEvaluation]]:
    seen: dict[str, dict[float, GroupEvaluation]] = {}
    while True:
        groups = prometheus.rules()
        new_evaluations(seen, groups, since)
        if groups and all(len(seen.get(g.name, {})) >= count for g in groups):
            return {name: [by_time[t] for t in sorted(by_time)] for name, by_time in seen.items()}
        _deadline_left(deadline, f"waiting for {count} evaluations of every group", prometheus)
        time.sleep(0.25)


def _observe(
    prometheus: Prometheus,
    settings: FleetSettings,
    output: str,
    rules: bool,
) -> dict[str, Any]:
    job, nodes = JOBS[output], settings.nodes
    started = time.time()
    deadline = time.monotonic() + settings.timeout_seconds
    complete = _wait_all_scraped(prometheus, job, nodes, deadline)
    cpu_before, at_before = Probe(prometheus.pid).cpu(), time.monotonic()
    history_ends = complete + settings.history_seconds
    _sleep_until(history_ends + settings.evaluations * settings.scrape_interval)
    evaluations = (
        _collect_evaluations(prometheus, history_ends, settings.evaluations, deadline)
        if rules
        else {}
    )
    cpu_after, at_after = Probe(prometheus.pid).cpu(), time.monotonic()
    window = max(int(time.time() - complete), 1)
    own = prometheus.own_metrics()
    rss, peak = prometheus_api.memory_bytes(prometheus)
    return {
        "targets_up": prometheus.query(f'count(up{{job="{job}"}} == 1)'),
        "head_series": own.get("prometheus_tsdb_head_series"),
        "report_series": prometheus.series_count(REPORT_SERIES.format(job=job), started),
        "rule_series": prometheus.series_count(RULE_SERIES, started),
        "series_per_target_min": prometheus.query(
            f'min(scrape_samples_post_metric_relabeling{{job="{job}"}})'
        ),
        "series_per_target_max": prometheus.query(
            f'max(scrape_samples_post_metric_relabeling{{job="{job}"}})'
        ),
        "scrape_seconds_mean": prometheus.query(
            f'avg(avg_over_time(scrape_duration_seconds{{job="{job}"}}[{window}s]))'
        ),
        "scrape_seconds_max": prometheus.query(
            f'max(max_over_time(scrape_duration_seconds{{job="{job}"}}[{window}s]))'
        ),
        "rss_bytes": rss,
        "peak_rss_bytes": peak,
        "heap_inuse_bytes": own.get("go_memstats_heap_inuse_bytes"),
        "cpu_cores": (cpu_after.total - cpu_before.total) / (at_after - at_before),
        "observed_seconds": time.time() - complete,
        "rule_groups": {
            name: group_summary(found, nodes, settings.per) for name, found in evaluations.items()
        },
    }


def measure(
    name: str, capture: Capture, settings: FleetSettings, workdir: Path, idle_rss: float
) -> dict[str, Any]:
    """One run of RUNS: `capture` served as the fleet to a Prometheus of its own."""
    output, with_rules = RUNS[name]
    nodes, per = settings.nodes, settings.per
    bodies = fleet_bodies(capture.text, capture.content_type, output, nodes)
    rules = SHIPPED_RULES if with_rules else ()
    with ReplayServer(bodies) as server:
        job = scrape_job(output, f"127.0.0.1:{server.port}", nodes)
        config = prometheus_config([job], settings.scrape_interval, rules)
        with prometheus_api.running(workdir / name, config) as prometheus:
            found = _observe(prometheus, settings, output, bool(rules))
        scrapes = sum(server.requests.values())
    expected_scraped = nodes * capture.series
    found |= {
        "output": output,
        "nodes": nodes,
        "job": JOBS[output],
        "rule_files": [path.name for path in rules],
        "exposition_series": capture.series,
        "exposition_bytes": len(capture.text.encode()),
        "gzip_bytes_per_target": mean([len(b.gzipped) for b in bodies.values()]),
        "scrapes_per_target": scrapes / nodes,
        "scraped_series": expected_scraped,
        "head_series_accounted": found["head_series"]
        == expected_scraped + found["report_series"] + found["rule_series"],
    }
    found["per_1000"] = {
        "head_series": scaled(found["head_series"], nodes, per),
        "rss_bytes": scaled_above(found["rss_bytes"], idle_rss, nodes, per),
        "cpu_cores": scaled(found["cpu_cores"], nodes, per),
        "rule_groups_median_seconds": {
            group: info["median_seconds_per_1000"] for group, info in found["rule_groups"].items()
        },
    }
    return found


def idle_rss(settings: FleetSettings, workdir: Path) -> float:
    """Resident bytes of a Prometheus that scrapes nothing (the memory that does not grow
    with nodes)."""
    with prometheus_api.running(workdir, prometheus_config([], settings.scrape_interval)) as idle:
        time.sleep(settings.idle_seconds)
        return float(prometheus_api.memory_bytes(idle)[0])


def run(settings: FleetSettings, workdir: Path) -> dict[str, Any]:
    missing = prometheus_api.unavailable()
    if missing:
        return {"unavailable": missing}
    workdir.mkdir(parents=True, exist_ok=True)
    captures = capture(settings, workdir / "daemon")
    idle = idle_rss(settings, workdir / "idle")
    runs = {
        name: measure(name, captures[RUNS[name][0]], settings, workdir, idle)
        for name in settings.runs
    }
    return {
        "settings": asdict(settings),
        "prometheus": prometheus_api.version(),
        "scaling": f"per {settings.per:,} nodes: linear from {settings.nodes}; memory as the "
        "idle Prometheus' plus the rest in proportion",
        "idle_rss_bytes": idle,
        "runs": runs,
    }
