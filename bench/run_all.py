#!/usr/bin/env python3
"""Run the whole benchmark suite: one command, JSON per benchmark, Markdown tables.

    python bench/run_all.py            # full run (about 40 minutes on 2 cores)
    python bench/run_all.py --quick    # every benchmark, briefly (about 1 minute)

Writes `bench/results/<benchmark>.json`, `bench/results/machine.json` and
`bench/results/summary.md` (`bench/results/quick/` with `--quick`), and prints the summary.
Benchmarks: peer (vs nvitop-exporter), scaling, overhead (vs bare NVML), soak, detection,
compat (the dcgm-exporter compatible output), dcgm (the DCGM source), processes (per-process
attribution on vs off), fleet (one node's output as 200 nodes to a real Prometheus).
Needs: this repository installed (`pip install -e .`), nvitop-exporter 1.7.2 for the peer
(without it the peer columns stay empty), Debian's prometheus and prometheus-alertmanager for
the detection benchmark (prometheus for the fleet one). Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import (  # noqa: E402
    compat,
    dcgm_activity,
    detection,
    fleet,
    overhead,
    peer,
    process_attribution,
    procs,
    report,
    scaling,
    soak,
)
from bench.procs import OURS, PEER  # noqa: E402

BENCHMARKS = (
    "peer",
    "scaling",
    "overhead",
    "soak",
    "detection",
    "compat",
    "dcgm",
    "processes",
    "fleet",
)
RESULTS = ROOT / "bench" / "results"


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return "unknown"


def _package(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def source_revision() -> str:
    """The commit benchmarked, with "+changes" when the daemon's files differ from it."""

    def git(*args: str) -> str:
        result = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        )
        return result.stdout.strip() if result.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "gpu_exporter", "rules")
    return f"{commit}+changes" if dirty else commit


def machine() -> dict[str, Any]:
    try:
        model = cpu_model(Path("/proc/cpuinfo").read_text())
    except OSError:
        model = platform.processor() or "unknown"
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "nvidia-ml-py": _package("nvidia-ml-py"),
        "nvitop-exporter": _package("nvitop-exporter"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "revision": source_revision(),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs of everything")
    parser.add_argument(
        "--only", help=f"comma-separated benchmarks to run (default all: {','.join(BENCHMARKS)})"
    )
    parser.add_argument("--results", type=Path, help="output folder (default bench/results)")
    parser.add_argument("--targets", help=f"peer: which exporters (default {OURS},{PEER})")
    parser.add_argument("--peer-rounds", type=int, help="peer: A/B rounds")
    parser.add_argument("--soak-ticks", type=int, help="soak (accelerated): most ticks to run")
    parser.add_argument("--soak-seconds", type=float, help="soak (accelerated): time budget")
    parser.add_argument(
        "--soak-realtime-seconds", type=float, help="soak (realtime daemon): duration, 0 = skip"
    )
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs and configs")
    parser.add_argument(
        "--our-python",
        choices=("deploy", "this"),
        help="our daemon on a runtime-only venv as the image installs it (bench/.deploy-venv, "
        "default of full runs) or on this interpreter (default of --quick)",
    )
    parser.add_argument(
        "--summary-only",
        action="store_true",
        help="run nothing: render summary.md from the JSON files already in the results folder",
    )
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else list(BENCHMARKS)
    unknown = set(chosen) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    args.chosen = chosen
    return args


def _replace(settings: Any, **changes: Any) -> Any:
    given = {k: v for k, v in changes.items() if v is not None}
    return type(settings)(**(settings.__dict__ | given))


def runners(args: argparse.Namespace, workdir: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    quick = args.quick
    targets = tuple(args.targets.split(",")) if args.targets else None
    peer_settings = _replace(
        peer.PeerSettings.quick() if quick else peer.PeerSettings(),
        rounds=args.peer_rounds,
        targets=targets,
    )
    soak_settings = _replace(
        soak.SoakSettings.quick() if quick else soak.SoakSettings(),
        ticks=args.soak_ticks,
        seconds=args.soak_seconds,
        realtime_seconds=args.soak_realtime_seconds,
    )
    scaling_settings = scaling.ScalingSettings.quick() if quick else scaling.ScalingSettings()
    overhead_settings = overhead.OverheadSettings.quick() if quick else overhead.OverheadSettings()
    detection_settings = (
        detection.DetectionSettings.quick() if quick else detection.DetectionSettings()
    )
    compat_settings = compat.CompatSettings.quick() if quick else compat.CompatSettings()
    dcgm_settings = dcgm_activity.DcgmSettings.quick() if quick else dcgm_activity.DcgmSettings()
    processes_settings = (
        process_attribution.ProcessSettings.quick()
        if quick
        else process_attribution.ProcessSettings()
    )
    fleet_settings = fleet.FleetSettings.quick() if quick else fleet.FleetSettings()
    return {
        "peer": lambda: peer.run(peer_settings, workdir / "peer"),
        "scaling": lambda: scaling.run(scaling_settings, workdir / "scaling"),
        "overhead": lambda: overhead.run(overhead_settings),
        "soak": lambda: soak.run(soak_settings, workdir / "soak"),
        "detection": lambda: detection.run(detection_settings, workdir / "detection"),
        "compat": lambda: compat.run(compat_settings, workdir / "compat"),
        "dcgm": lambda: dcgm_activity.run(dcgm_settings, workdir / "dcgm"),
        "processes": lambda: process_attribution.run(processes_settings, workdir / "processes"),
        "fleet": lambda: fleet.run(fleet_settings, workdir / "fleet"),
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=False, default=str) + "\n")


def render_existing(out: Path) -> int:
    results = {}
    for name in BENCHMARKS:
        path = out / f"{name}.json"
        if path.exists():
            data = json.loads(path.read_text())
            if "error" not in data:
                results[name] = data
    machine_path = out / "machine.json"
    info = json.loads(machine_path.read_text()) if machine_path.exists() else machine()
    summary = report.render(results, info)
    (out / "summary.md").write_text(summary)
    print(summary)
    return 0


def compile_bytecode() -> None:
    """Byte-compile the project as an installed package is (pip, and the image, compile it):
    with PYTHONDONTWRITEBYTECODE set, every benchmarked process would otherwise compile the
    project's modules from source at start, and keep the compiler's memory as RSS."""
    for folder in ("gpu_exporter", "bench"):
        compileall.compile_dir(ROOT / folder, quiet=1)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.results or (RESULTS / "quick" if args.quick else RESULTS)
    if args.summary_only:
        return render_existing(out)
    workdir = Path(tempfile.mkdtemp(prefix="gpu-exporter-bench-"))
    compile_bytecode()
    procs.use_deploy_venv((args.our_python or ("this" if args.quick else "deploy")) == "deploy")
    info = machine() | {"quick": args.quick, "our_python": procs.our_python()}
    write_json(out / "machine.json", info)
    results: dict[str, Any] = {}
    failed = []
    try:
        for name, run in runners(args, workdir).items():
            if name not in args.chosen:
                continue
            print(f"== {name}", file=sys.stderr, flush=True)
            started = time.monotonic()
            try:
                results[name] = run()
            except Exception:
                failed.append(name)
                results[name] = {"error": traceback.format_exc()}
                print(results[name]["error"], file=sys.stderr)
            results[name]["duration_seconds"] = time.monotonic() - started
            results[name]["revision"] = info["revision"]  # JSONs of several runs get committed
            write_json(out / f"{name}.json", results[name])
    finally:
        if args.keep_workdir:
            print(f"work files kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    ok = {k: v for k, v in results.items() if "error" not in v}
    summary = report.render(ok, info)
    (out / "summary.md").write_text(summary)
    print(summary)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
