#!/usr/bin/env python3
"""Run nvitop-exporter's own CLI on gpu-exporter's fake NVML, in one process.

    python bench/run_nvitop_exporter.py --scenario mixed [--report FILE] -- \\
        --bind-address 127.0.0.1 --port 9500 --interval 1

`gpu_exporter.sim.install` points `pynvml.nvmlLib` at the fake before nvitop is imported, so
nvitop's `libnvml` (which calls pynvml's wrappers and initialises NVML itself, lazily) talks to
the same simulated driver as the daemon does; nothing of nvitop is changed. Two additions, for
the benchmark only:

- the exporter's collection loop is the original one (`update_host()`, `update_device()` per
  device, sleep to the next interval) with a timer around each pass, exported as the summaries
  `nvitop_bench_tick_duration_seconds` (whole pass) and `nvitop_bench_devices_duration_seconds`
  (device part only); the bench leaves `nvitop_bench_*` out of every family count;
- NVML symbols nvitop asks for that the fake does not implement are recorded (pynvml turns
  them into `NVMLError_FunctionNotFound`, as an old driver would; nvitop then reports less).

On SIGTERM or SIGINT the exporter stops as on Ctrl-C, and with `--report` the launcher writes
a JSON file: NVML calls per symbol, missing symbols, and nvitop's own FunctionNotFound log.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml

from gpu_exporter import sim
from gpu_exporter.sim.fake_nvml import FakeNvmlLib


class RecordingLib:
    """Forwards to the fake; remembers symbols the fake lacks (-> FunctionNotFound)."""

    def __init__(self, fake: FakeNvmlLib) -> None:
        self._fake = fake
        self.missing: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._fake, name)
        except AttributeError:
            self.missing[name] = self.missing.get(name, 0) + 1
            raise


def install(scenario: str) -> tuple[FakeNvmlLib, RecordingLib]:
    fake = sim.install(sim.load_scenario(scenario))
    recording = RecordingLib(fake)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = recording
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return fake, recording


def timed_exporter_class() -> type:
    """nvitop-exporter's PrometheusExporter with a timer around each collection pass."""
    from nvitop_exporter.exporter import PrometheusExporter
    from prometheus_client import Summary

    class TimedExporter(PrometheusExporter):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._tick_seconds = Summary(
                "nvitop_bench_tick_duration_seconds",
                "bench only: one pass of nvitop-exporter's collection loop",
                registry=self.registry,
            )
            self._device_seconds = Summary(
                "nvitop_bench_devices_duration_seconds",
                "bench only: the update_device part of one pass",
                registry=self.registry,
            )

        def collect(self) -> None:  # the original loop, timed
            while True:
                next_update_time = time.monotonic() + self.interval
                started = time.perf_counter()
                self.update_host()
                devices_started = time.perf_counter()
                for device in self.devices:
                    self.update_device(device)
                finished = time.perf_counter()
                self._device_seconds.observe(finished - devices_started)
                self._tick_seconds.observe(finished - started)
                time.sleep(max(0.0, next_update_time - time.monotonic()))

    return TimedExporter


def _stop_like_ctrl_c(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def function_not_found_log() -> list[str]:
    """nvitop's own record of FunctionNotFound errors (names of the pynvml wrappers)."""
    from nvitop.api import libnvml

    names = {m.group(0) for key in libnvml.UNKNOWN_FUNCTIONS for m in re.finditer(r"nvml\w+", key)}
    return sorted(names)


def write_report(path: Path, fake: FakeNvmlLib, recording: RecordingLib) -> None:
    report = {
        "scenario": fake.scenario.name,
        "devices": len(fake.scenario.devices),
        "calls": dict(sorted(fake.call_counts.items())),
        "missing_symbols": dict(sorted(recording.missing.items())),
        "nvitop_function_not_found": function_not_found_log(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="mixed", help="scenario name or file")
    parser.add_argument("--report", type=Path, help="write a JSON report here on exit")
    parser.add_argument("exporter_args", nargs="*", help="nvitop-exporter arguments (after --)")
    args = parser.parse_args(argv)
    return args, list(args.exporter_args)


def main(argv: Sequence[str] | None = None) -> int:
    args, exporter_args = parse_args(sys.argv[1:] if argv is None else argv)
    fake, recording = install(args.scenario)
    from nvitop_exporter import cli

    cli.PrometheusExporter = timed_exporter_class()
    signal.signal(signal.SIGTERM, _stop_like_ctrl_c)
    sys.argv = ["nvitop-exporter", *exporter_args]
    try:
        status = cli.main()
    except KeyboardInterrupt:  # a signal before the collection loop started
        status = 0
    if args.report is not None:
        write_report(args.report, fake, recording)
    return status


if __name__ == "__main__":
    sys.exit(main())
