#!/usr/bin/env python3
"""Profiles behind the missed targets, written as text next to the results.

    python bench/profile.py [--out bench/results/profiles] [--only tick,scrape,imports]

- `tick`, `tick64`: pyinstrument over steady-state ticks (8 or 64 GPUs of `mixed`, shipped
  rules, 16 minutes of rule history prefilled) in this process: where a tick's CPU goes.
- `scrape`: py-spy samples the real daemon while 32 scrapers load `/metrics`: which frames
  the event loop thread spends its time in (needs py-spy and permission to ptrace).
- `imports`: resident memory of a fresh interpreter after importing each dependency (and
  the daemon's own modules): where the RSS comes from before the first tick.
- `shipped-memory`: the real daemon with the chart's configuration (the peer benchmark's
  shipped row), then with one part of it turned off at a time: what each part costs in RSS.
- `memory`: in a fresh interpreter, RSS after each stage of a steady 8-GPU daemon (the
  stack's imports, ours, the pipeline with the shipped rules, ticks, 16 minutes of rule
  history), tracemalloc's breakdown of the Python heap by file at the end, and the slowest
  imports by `python -X importtime`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import loadgen, peer, procs, scenarios  # noqa: E402
from bench.inproc import build  # noqa: E402
from bench.procs import OUR_TICK_FAMILY, OURS, free_port, our_command, running  # noqa: E402
from bench.run_all import compile_bytecode  # noqa: E402

PROFILES = ROOT / "bench" / "results" / "profiles"
IMPORTS = (
    ("python alone", "pass"),
    ("pynvml", "import pynvml"),
    ("yaml", "import yaml"),
    ("prometheus_client", "import prometheus_client"),
    ("promql_parser", "import promql_parser"),
    ("pydantic", "import pydantic"),
    ("httpx", "import httpx"),
    ("apscheduler", "import apscheduler.schedulers.background"),
    ("uvicorn", "import uvicorn"),
    ("starlette", "import starlette.applications"),
    ("fastapi", "import fastapi"),
    ("gpu_exporter.config.load", "import gpu_exporter.config.load"),
    ("gpu_exporter.alerting.rules.manager", "import gpu_exporter.alerting.rules.manager"),
    ("gpu_exporter.web.api", "import gpu_exporter.web.api"),
    (
        "everything serve imports",
        "import uvicorn, gpu_exporter.web.api, gpu_exporter.config.load, "
        "gpu_exporter.pipeline.sampler, gpu_exporter.collect.nvml.source, "
        "gpu_exporter.alerting.rules.manager, gpu_exporter.alerting.notify, "
        "gpu_exporter.sim, gpu_exporter.collect.nvml.topology, gpu_exporter.collect.classify",
    ),
)


def profile_tick(ticks: int = 30, devices: int = 8) -> str:
    from pyinstrument import Profiler

    pipeline = build(scenarios.generate(devices, name="bench-profile"))
    try:
        pipeline.tick()
        pipeline.tick()
        pipeline.prefill(960)
        pipeline.tick()
        profiler = Profiler(interval=0.0005)
        profiler.start()
        for _ in range(ticks):
            pipeline.tick()
        profiler.stop()
    finally:
        pipeline.close()
    return profiler.output_text(unicode=False, color=False, show_all=False)


def import_rss() -> str:
    lines = ["| imports | VmRSS (MiB) |", "| --- | --- |"]
    for label, statement in IMPORTS:
        lines.append(f"| {label} | {peer.import_rss_mib(statement):.1f} |")
    return "\n".join(lines) + "\n"


# Leaf frames of a thread that waits rather than works.
IDLE_LEAVES = ("Condition.wait", "Event.wait", "Queue.get", "EpollSelector.select", "select")


def summarize_collapsed(text: str, thread_marker: str, top: int = 40) -> str:
    """Inclusive share of each frame among the busy samples of stacks containing
    `thread_marker` (py-spy's raw format: `frame;frame;... count` per line)."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or thread_marker not in stack:
            continue
        if stack.rsplit(";", 1)[-1].split(" (")[0] in IDLE_LEAVES:
            continue
        n = int(count)
        total += n
        for frame in dict.fromkeys(f.split(" (")[0] for f in stack.split(";")):
            inclusive[frame] += n
    rows = [f"{n / total * 100:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    return f"samples: {total}\n" + "\n".join(rows) + "\n"


def profile_scrape(workdir: Path, seconds: float = 8.0) -> str:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        return "py-spy not installed\n"
    scenario = scenarios.write_yaml(scenarios.generate(8), workdir / "scenario.yaml")
    port = free_port()
    raw = workdir / "scrape.txt"
    with running(OURS, our_command(scenario, port, 1.0), port, workdir, OUR_TICK_FAMILY) as d:
        d.wait_ready(ticks=3)
        record = [py_spy, "record", "--pid", str(d.process.pid), "--rate", "250"]
        record += ["--format", "raw", "--output", str(raw), "--duration", f"{seconds:g}"]
        spy = subprocess.Popen(record, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        time.sleep(1.0)
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                loadgen.run_scrape_load(d.url, 32, 10)

        loader = threading.Thread(target=load)
        loader.start()
        spy.wait(timeout=seconds + 30)
        stop.set()
        loader.join()
    if not raw.exists():
        return "py-spy produced no output (ptrace not permitted?)\n"
    return summarize_collapsed(raw.read_text(), "asyncio")


_MEMORY_STAGES = r"""
import gc, re, sys, tracemalloc
sys.path.insert(0, {root!r})
def rss():
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read())[1]) / 1024
rows = [("python alone", rss())]
{stack_floor}
rows.append(("+ FastAPI, uvicorn, prometheus-client, APScheduler", rss()))
import pynvml, yaml, promql_parser
rows.append(("+ pynvml, PyYAML, promql-parser", rss()))
import gpu_exporter.cli, gpu_exporter.web.api, gpu_exporter.pipeline.assembly
import gpu_exporter.collect.nvml.source
rows.append(("+ the daemon's own modules", rss()))
from bench import scenarios
from bench.inproc import build
if {trace}:  # tracing costs memory itself: a separate run gives the heap breakdown
    tracemalloc.start(1)
pipeline = build(scenarios.generate(8, name="bench-memory"))
rows.append(("+ the fake NVML and the pipeline with the shipped rules", rss()))
for _ in range(5):
    pipeline.tick()
rows.append(("+ 5 ticks", rss()))
pipeline.prefill(960)
for _ in range(3):
    pipeline.tick()
gc.collect()
rows.append(("+ 16 minutes of rule history", rss()))
if {trace}:
    print("Python heap after the last stage (tracemalloc, by file):\n")
    for stat in tracemalloc.take_snapshot().statistics("filename")[:12]:
        print(f"    {{stat.size / 1024:8.0f}} KiB  {{stat.traceback[0].filename}}")
    sys.exit(0)
print("| stage | VmRSS (MiB) | added |")
print("| --- | --- | --- |")
last = 0.0
for name, value in rows:
    print(f"| {{name}} | {{value:.1f}} | {{value - last:+.1f}} |")
    last = value
store = pipeline.manager.store
print(f"\nrule history: {{store.series_count()}} series, {{store.sample_count()}} samples\n")
"""


def profile_memory() -> str:
    stages, heap = (
        subprocess.run(
            [
                sys.executable,
                "-c",
                _MEMORY_STAGES.format(
                    root=str(ROOT), trace=trace, stack_floor=peer.STACK_FLOOR_IMPORTS
                ),
            ],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": str(ROOT)},
        ).stdout
        for trace in (False, True)
    )
    imports = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-c",
            "import gpu_exporter.cli, gpu_exporter.web.api, "
            "gpu_exporter.pipeline.assembly, gpu_exporter.collect.nvml.source",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT)},
    ).stderr
    timed = []
    for line in imports.splitlines()[1:]:
        _, _, rest = line.partition(":")
        fields = rest.split("|")
        if len(fields) == 3:
            timed.append((int(fields[1]), fields[2].rstrip()))
    slowest = "\n".join(
        f"    {us / 1000:7.1f} ms  {name}" for us, name in sorted(timed)[-15:][::-1]
    )
    return f"{stages}{heap}\nSlowest imports (cumulative, python -X importtime):\n\n{slowest}\n"


# The chart's default configuration, then one part changed at a time: (name, shipped_phase's
# keyword arguments).
SHIPPED_PARTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("the chart's default configuration, steady", {}),
    ("  without its 16 minutes of rule history (young)", {"history_seconds": 0.0}),
    ("  without any rules", {"change": lambda c: c.update(rules={"enabled": False})}),
    ("  with the alerting rules only (no recording file)", {"change": lambda c: c.pop("rules")}),
    ("  without pod attribution", {"change": lambda c: c.pop("kubernetes")}),
    ("  with per-process attribution (processAttribution.enabled)", {"processes": True}),
    ("  with an Alertmanager", {"alertmanager": True}),
)


def shipped_memory(workdir: Path) -> str:
    """RSS of the real daemon, the chart's default configuration, one part changed at a time."""
    settings = peer.PeerSettings.quick(targets=(peer.OURS_SHIPPED,))
    scenario = scenarios.write_yaml(peer.peer_scenario(), workdir / "shipped-scenario.yaml")
    rows = ["| configuration | RSS (MiB) | difference |", "| --- | --- | --- |"]
    whole = None
    for name, change in SHIPPED_PARTS:
        rss = peer.shipped_phase(scenario, settings, workdir, **change)["rss_mib_idle"]
        whole = rss if whole is None else whole
        rows.append(f"| {name} | {rss:.1f} | {'' if rss is whole else f'{rss - whole:+.1f}'} |")
    return (
        f"Our daemon on {procs.our_python()}; RSS after the peer benchmark's quick CPU window.\n\n"
        + "\n".join(rows)
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=PROFILES)
    parser.add_argument("--only", default="tick,tick64,scrape,imports,memory,shipped-memory")
    parser.add_argument(
        "--our-python", choices=("deploy", "this"), default="deploy", help="as run_all's"
    )
    args = parser.parse_args(argv)
    procs.use_deploy_venv(args.our_python == "deploy")
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = args.only.split(",")
    compile_bytecode()
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-profile-") as tmp:
        jobs = {
            "tick": lambda: profile_tick(),
            "tick64": lambda: profile_tick(ticks=4, devices=64),
            "scrape": lambda: profile_scrape(Path(tmp)),
            "imports": import_rss,
            "memory": profile_memory,
            "shipped-memory": lambda: shipped_memory(Path(tmp)),
        }
        for name, job in jobs.items():
            if name in chosen:
                print(f"== {name}", file=sys.stderr, flush=True)
                (args.out / f"{name}.txt").write_text(job())
    return 0


if __name__ == "__main__":
    sys.exit(main())
