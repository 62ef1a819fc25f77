"""Soak: many ticks with the shipped rules and the notifier on; is resident memory flat?

Two modes, both on the 8-GPU `mixed` scenario, alerts POSTed to a local sink that answers 200:

- accelerated (`bench.inproc` in a fresh child process, `python -m bench.soak`, so that no
  other benchmark's memory is in its RSS): the production tick pipeline on a manual clock,
  1 s of scenario time per tick, ticks back to back. Hours of daemon time fit in minutes, so
  the rule engine's history (up to 16 minutes per series) fills and the steady state is
  reached; the CPU per tick at the end is the steady-state cost. No HTTP server.
- realtime (`gpu-exporter serve --interval 0.2` as a process, scraped every 5 s): the whole
  daemon with its HTTP server, for as long as the budget allows.

Reported: RSS at start, peak (sampled, and VmHWM), end, and the least-squares slope over the
second half of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from bench import loadgen, scenarios
from bench.inproc import build
from bench.procfs import Probe
from bench.procs import OUR_TICK_FAMILY, OURS, ROOT, free_port, our_command, running
from bench.stats import slope
from tests.localserver import LocalServer


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
    ticks: int = 100_000  # accelerated mode: stop at this many ticks ...
    seconds: float = 420.0  # ... or after this long, whichever comes first
    sample_every_ticks: int = 100
    realtime_seconds: float = 90.0  # 0: skip the realtime mode
    realtime_interval: float = 0.2
    realtime_sample_seconds: float = 2.0

    @classmethod
    def quick(cls) -> SoakSettings:
        return cls(ticks=60, seconds=10.0, sample_every_ticks=10, realtime_seconds=4.0)


def memory_summary(points: list[dict[str, float]], x: str) -> dict[str, float]:
    """start/peak/end RSS (MiB) and the RSS slope over the second half, per unit of `x`."""
    if not points:
        return {}
    rss = [p["rss_mib"] for p in points]
    half = points[len(points) // 2 :]
    return {
        "rss_start_mib": rss[0],
        "rss_peak_mib": max(rss),
        "rss_end_mib": rss[-1],
        "hwm_end_mib": points[-1].get("hwm_mib", float("nan")),
        "slope_second_half_mib_per_unit": slope([p[x] for p in half], [p["rss_mib"] for p in half]),
        "slope_unit": x,
    }


def _thin(points: list[dict[str, Any]], keep: int = 240) -> list[dict[str, Any]]:
    if len(points) <= keep:
        return points
    step = len(points) / keep
    return [points[int(i * step)] for i in range(keep)] + [points[-1]]


def accelerated(settings: SoakSettings) -> dict[str, Any]:
    probe = Probe("self")
    scenario = scenarios.generate(8, name="bench-soak")
    with CountingSink() as sink:
        pipeline = build(scenario, rules=None, alertmanager_url=sink.url)
        points: list[dict[str, Any]] = []
        rss_before = probe.memory().rss_mib
        started = time.monotonic()
        cpu_mark, ticks = time.process_time(), 0
        try:
            while ticks < settings.ticks and time.monotonic() - started < settings.seconds:
                pipeline.tick()
                ticks += 1
                if ticks % settings.sample_every_ticks == 0:
                    cpu_now = time.process_time()
                    memory = probe.memory()
                    store = pipeline.manager.store
                    points.append(
                        {
                            "tick": ticks,
                            "elapsed_seconds": time.monotonic() - started,
                            "rss_mib": memory.rss_mib,
                            "hwm_mib": memory.hwm_mib,
                            "cpu_seconds_per_tick": (cpu_now - cpu_mark)
                            / settings.sample_every_ticks,
                            "store_series": store.series_count(),
                            "store_samples": store.sample_count(),
                            "alerts_sent": sink.alerts,
                        }
                    )
                    cpu_mark = cpu_now
        finally:
            pipeline.close()
        posts, alerts = sink.posts, sink.alerts
    tail = points[-max(1, len(points) // 5) :]
    return {
        "ticks": ticks,
        "scenario_hours": ticks * pipeline.interval / 3600,
        "wall_seconds": time.monotonic() - started,
        "rss_before_first_tick_mib": rss_before,
        "memory": memory_summary(points, "tick"),
        "steady_cpu_seconds_per_tick": sum(p["cpu_seconds_per_tick"] for p in tail) / len(tail)
        if tail
        else None,
        "alert_posts": posts,
        "alerts_sent": alerts,
        "points": _thin(points),
    }


def realtime(settings: SoakSettings, workdir: Path) -> dict[str, Any]:
    scenario = scenarios.write_yaml(
        scenarios.generate(8, name="bench-soak"), workdir / "soak-scenario.yaml"
    )
    points: list[dict[str, Any]] = []
    with CountingSink() as sink:
        port = free_port()
        extra = ["--alertmanager-url", sink.url]
        argv = our_command(scenario, port, settings.realtime_interval, extra)
        with running(OURS, argv, port, workdir, OUR_TICK_FAMILY) as target:
            target.wait_ready()
            first = target.counters()
            started = time.monotonic()
            next_scrape = started
            while time.monotonic() - started < settings.realtime_seconds:
                now = time.monotonic()
                if now >= next_scrape:
                    loadgen.fetch(target.url)
                    next_scrape = now + 5.0
                memory = target.memory()
                points.append(
                    {
                        "elapsed_seconds": now - started,
                        "rss_mib": memory.rss_mib,
                        "hwm_mib": memory.hwm_mib,
                    }
                )
                time.sleep(settings.realtime_sample_seconds)
            last = target.closing_counters()
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
        "memory": memory_summary(points, "elapsed_seconds"),
        "alert_posts": posts,
        "alerts_sent": alerts,
        "points": _thin(points),
    }


def accelerated_in_child(settings: SoakSettings, workdir: Path) -> dict[str, Any]:
    """`accelerated` in a fresh interpreter: its RSS is the pipeline's alone."""
    out = workdir / "accelerated.json"
    argv = [sys.executable, "-m", "bench.soak", "--out", str(out)]
    argv += ["--ticks", str(settings.ticks), "--seconds", f"{settings.seconds:g}"]
    argv += ["--sample-every", str(settings.sample_every_ticks)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(argv, check=True, env=env, timeout=settings.seconds + 300)
    return json.loads(out.read_text())


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
    parser.add_argument("--ticks", type=int, default=SoakSettings.ticks)
    parser.add_argument("--seconds", type=float, default=SoakSettings.seconds)
    parser.add_argument("--sample-every", type=int, default=SoakSettings.sample_every_ticks)
    args = parser.parse_args(argv)
    settings = SoakSettings(
        ticks=args.ticks, seconds=args.seconds, sample_every_ticks=args.sample_every
    )
    args.out.write_text(json.dumps(accelerated(settings)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
