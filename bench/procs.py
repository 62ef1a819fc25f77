"""Start the exporters under test as real processes on 127.0.0.1, read their counters, stop
them by PID."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
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
# The same, steady, with the chart's configuration and the node in another process
OURS_SHIPPED = "gpu-exporter-shipped"
PEER = "nvitop-exporter"
OUR_TICK_FAMILY = "gpu_exporter_tick_duration_seconds"  # the daemon's own: NVML reads only
OUR_FULL_TICK_FAMILY = "gpu_exporter_full_tick_duration_seconds"  # whole ticks
PEER_TICK_FAMILY = "nvitop_bench_tick_duration_seconds"
PEER_DEVICES_FAMILY = "nvitop_bench_devices_duration_seconds"
BENCH_ONLY_PREFIXES = ("nvitop_bench_", "bench_")


DEPLOY_VENV = BENCH / ".deploy-venv"
_deploy_venv = False  # run_all turns it on for full runs


def use_deploy_venv(on: bool) -> None:
    global _deploy_venv
    _deploy_venv = on
    _deploy_python.cache_clear()


def our_python() -> str:
    """The interpreter our daemon runs on: this one, or after `use_deploy_venv(True)` (full
    runs of run_all) `_deploy_python()`."""
    return _deploy_python() if _deploy_venv else sys.executable


@functools.cache
def _deploy_python() -> str:
    """A venv beside the benchmarks holding only the package's runtime dependencies,
    installed as the image installs them (`pip install .`), made on first use. A development
    venv also holds the test and lint tools, and some of them change what the daemon imports
    (httpx loads its command-line client, with rich and pygments, whenever they are
    installed: about 3 MiB of RSS the image does not have). PYTHONPATH still puts this
    checkout's code first. Falls back to this interpreter, with a warning, when the venv
    cannot be made (no package index)."""
    python = DEPLOY_VENV / "bin" / "python"
    if not python.exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(DEPLOY_VENV)], check=True)
            pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run([*pip, str(ROOT)], check=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            shutil.rmtree(DEPLOY_VENV, ignore_errors=True)
            print(f"warning: no runtime-only venv ({exc}); our daemon runs on {sys.executable}")
            return sys.executable
    return str(python)


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
    return [our_python(), "-m", "gpu_exporter", "serve", "--simulate", str(scenario), *flags]


def our_timed_command(
    scenario: Path | str,
    port: int,
    interval: float,
    history_seconds: float = 0.0,
    *,
    epoch: float | None = None,
    extra: Sequence[str] = (),
    log_level: str = "warning",
) -> list[str]:
    """The same daemon through bench/run_daemon.py: whole ticks timed, and with
    `history_seconds` the rule engine gets that much history at its second tick, so that it
    runs at steady-state cost from the start. With `epoch`, the scenario's clock is the one of
    bench/run_node.py started with it, which then serves the node's /proc and runtime."""
    launcher = [our_python(), str(BENCH / "run_daemon.py"), "--scenario", str(scenario)]
    history = ["--prefill-history", f"{history_seconds:g}"] if history_seconds else []
    node = ["--epoch", repr(epoch)] if epoch is not None else []
    return [*launcher, *history, *node, "--", *serve_flags(port, interval, extra, log_level)]


def node_command(scenario: Path | str, epoch: float, ready: Path) -> list[str]:
    """bench/run_node.py: the scenario's kubelet, runtime and /proc in a process of their own."""
    node = [sys.executable, str(BENCH / "run_node.py"), "--scenario", str(scenario)]
    return [*node, "--epoch", repr(epoch), "--ready", str(ready)]


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


@contextlib.contextmanager
def running_node(scenario: Path | str, epoch: float, workdir: Path) -> Iterator[dict[str, str]]:
    """bench/run_node.py for `scenario` on `epoch`'s clock; yields its endpoints
    (`kubelet_socket`, `runtime_socket`, `proc_root`) once they listen."""
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / f"node-{os.getpid()}-{time.monotonic_ns()}.json"
    log = ready.with_suffix(".log")
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            node_command(scenario, epoch, ready), stdout=sink, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bench/run_node.py did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield json.loads(ready.read_text())
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
