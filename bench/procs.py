"""Start the exporters under test as real processes on 127.0.0.1, read their counters, stop
them by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import loadgen, promtext
from bench.procfs import CpuTimes, Memory, Probe

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
OURS = "gpu-exporter"
OURS_STEADY = "gpu-exporter-steady"  # rule history prefilled: steady-state rule costs
PEER = "nvitop-exporter"
OUR_TICK_FAMILY = "gpu_exporter_tick_duration_seconds"  # the daemon's own: NVML reads only
OUR_FULL_TICK_FAMILY = "gpu_exporter_full_tick_duration_seconds"  # whole ticks
PEER_TICK_FAMILY = "nvitop_bench_tick_duration_seconds"
PEER_DEVICES_FAMILY = "nvitop_bench_devices_duration_seconds"
BENCH_ONLY_PREFIXES = ("nvitop_bench_", "bench_")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_flags(
    port: int, interval: float, extra: Sequence[str] = (), log_level: str = "warning"
) -> list[str]:
    return [
        "--listen-address",
        f"127.0.0.1:{port}",
        "--interval",
        f"{interval:g}",
        "--log-level",
        log_level,
        *extra,
    ]


def our_command(
    scenario: Path | str,
    port: int,
    interval: float,
    extra: Sequence[str] = (),
    log_level: str = "warning",
) -> list[str]:
    """`gpu-exporter serve` exactly as a user runs it on the simulator."""
    flags = serve_flags(port, interval, extra, log_level)
    return [sys.executable, "-m", "gpu_exporter", "serve", "--simulate", str(scenario), *flags]


def our_timed_command(
    scenario: Path | str, port: int, interval: float, history_seconds: float = 0.0
) -> list[str]:
    """The same daemon through bench/run_daemon.py: whole ticks timed, and with
    `history_seconds` the rule engine gets that much history at its second tick, so that it
    runs at steady-state cost from the start."""
    launcher = [sys.executable, str(BENCH / "run_daemon.py"), "--scenario", str(scenario)]
    history = ["--prefill-history", f"{history_seconds:g}"] if history_seconds else []
    return [*launcher, *history, "--", *serve_flags(port, interval)]


def peer_command(scenario: Path | str, port: int, interval: float, report: Path) -> list[str]:
    """nvitop-exporter's CLI on the same fake NVML (bench/run_nvitop_exporter.py)."""
    return [
        sys.executable,
        str(BENCH / "run_nvitop_exporter.py"),
        "--scenario",
        str(scenario),
        "--report",
        str(report),
        "--",
        "--hostname",
        "bench",
        "--bind-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--interval",
        f"{interval:g}",
    ]


@dataclass(frozen=True)
class Counters:
    """What one read of a running exporter gives: its tick counters and its CPU time."""

    at: float  # monotonic
    cpu: CpuTimes
    tick_sum: float
    tick_count: float
    text: str = field(repr=False)


@dataclass
class Running:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    tick_family: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def probe(self) -> Probe:
        return Probe(self.process.pid)

    def metrics_text(self) -> str:
        response = loadgen.fetch(self.url)
        if response.status != 200:
            raise RuntimeError(f"{self.name}: /metrics answered {response.status}")
        return response.body.decode()

    def counters(self) -> Counters:
        """Scrape first, then read CPU: the scrape's own cost stays out of a window that
        starts here (and a window ending here reads CPU before its closing scrape)."""
        text = self.metrics_text()
        cpu = self.probe.cpu()
        found = promtext.sum_and_count(text, self.tick_family) or (0.0, 0.0)
        return Counters(time.monotonic(), cpu, found[0], found[1], text)

    def closing_counters(self) -> Counters:
        cpu = self.probe.cpu()
        at = time.monotonic()
        text = self.metrics_text()
        found = promtext.sum_and_count(text, self.tick_family) or (0.0, 0.0)
        return Counters(at, cpu, found[0], found[1], text)

    def memory(self) -> Memory:
        return self.probe.memory()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float = 60.0, ticks: int = 1) -> None:
        """Until /metrics answers 200 and reports at least `ticks` finished ticks."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.output()[-4000:]}")
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                text = self.metrics_text()
                found = promtext.sum_and_count(text, self.tick_family)
                if found is not None and found[1] >= ticks:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready within {timeout}s:\n{self.output()[-4000:]}")

    def stop(self, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return self.process.returncode


@contextlib.contextmanager
def running(
    name: str,
    argv: Sequence[str],
    port: int,
    workdir: Path,
    tick_family: str,
    env: Mapping[str, str] | None = None,
) -> Iterator[Running]:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}-{port}.log"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": _pythonpath(),
        # Whole ticks are timed by this family, which the default metrics profile leaves out.
        "GPU_EXPORTER_METRICS__INCLUDE": OUR_FULL_TICK_FAMILY,
        **(env or {}),
    }
    with log.open("wb") as sink:
        process = subprocess.Popen(list(argv), stdout=sink, stderr=subprocess.STDOUT, env=env)
    target = Running(name, process, port, log, tick_family)
    try:
        yield target
    finally:
        target.stop()


def _pythonpath() -> str:
    existing = os.environ.get("PYTHONPATH", "")
    return f"{ROOT}{os.pathsep}{existing}" if existing else str(ROOT)


def window(start: Counters, end: Counters) -> dict[str, float]:
    """CPU and tick figures between two reads of the same process."""
    ticks = end.tick_count - start.tick_count
    seconds = end.at - start.at
    cpu = end.cpu.total - start.cpu.total
    return {
        "seconds": seconds,
        "ticks": ticks,
        "cpu_seconds": cpu,
        "cpu_percent_of_core": 100.0 * cpu / seconds if seconds > 0 else float("nan"),
        "cpu_seconds_per_tick": cpu / ticks if ticks > 0 else float("nan"),
        "wall_seconds_per_tick": (end.tick_sum - start.tick_sum) / ticks
        if ticks > 0
        else float("nan"),
    }
