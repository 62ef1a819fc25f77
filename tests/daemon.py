"""Run `gpu-exporter serve` as a real process on 127.0.0.1 for end-to-end tests."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

# Ports for the processes tests start are picked below the kernel's ephemeral range, which
# Linux hands out to every bind to port 0 and every outgoing connection: a port picked free
# there can be handed to someone else (once on CI, the daemon's own simulated API server)
# before the process it was picked for listens on it. Each xdist worker has its own block, which
# it goes round, so tests running side by side do not pick alike.
_BLOCK = 1000


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: no knowing, so no range to keep off
        return 0


def _unshared_ports() -> Iterator[int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    blocks = (_ephemeral_floor() - 1024) // _BLOCK
    if blocks < 1:
        return
    first = 1024 + (int(worker) % blocks if worker.isdigit() else 0) * _BLOCK
    offset = os.getpid() % _BLOCK  # another test run beside this one starts elsewhere in it
    for step in itertools.count():
        yield first + (offset + step) % _BLOCK


_PORTS = _unshared_ports()
_PORTS_LOCK = threading.Lock()  # a generator is not to be run by two threads at once


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on, for a process a test starts."""
    with _PORTS_LOCK:
        for port in itertools.islice(_PORTS, _BLOCK):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:  # taken: by another program, or a test run beside this one
                    continue
                return port
    with socket.socket() as sock:  # no block, or all of it taken: let the kernel pick
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Daemon:
    def __init__(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        log: Path,
        tls: ssl.SSLContext | None = None,
        auth: tuple[str, str] | None = None,
    ) -> None:
        self.process, self.port, self.log = process, port, log
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.client = httpx.Client(base_url=self.url, timeout=5.0, verify=tls or True, auth=auth)

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        return self.client.get(path, **kwargs)

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited early:\n{self.output()}")
            try:
                if self.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"daemon not ready within {timeout}s:\n{self.output()}")

    def metrics_text(self) -> str:
        response = self.get("/metrics")
        assert response.status_code == 200, response.text
        return response.text

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def sample(self, series: str) -> float:
        """The value of one series (`name` or `name{labels}`) in a scrape of /metrics."""
        return parse_samples(self.metrics_text())[series]

    def rule_names(self) -> list[str]:
        groups = self.get("/api/v1/rules").json()["data"]["groups"]
        return [rule["name"] for group in groups for rule in group["rules"]]

    def reload_rules(self) -> None:
        self.process.send_signal(signal.SIGHUP)


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_exporter.cli", *args]


@contextmanager
def serve(
    tmp_path: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    tls: ssl.SSLContext | None = None,
    auth: tuple[str, str] | None = None,
) -> Iterator[Daemon]:
    """`env`: extra environment; `preexec_fn`: run in the child before exec (e.g. to lower
    RLIMIT_NOFILE); `tls`: the client context for a daemon serving https; `auth`: basic auth
    for the daemon's client."""
    port = free_port()
    log = tmp_path / f"daemon-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command("serve", "--listen-address", f"127.0.0.1:{port}", *args),
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=preexec_fn,
        )
    daemon = Daemon(process, port, log, tls, auth)
    try:
        yield daemon
    finally:
        daemon.client.close()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


@contextmanager
def serve_with_live_rules(tmp_path: Path, rules_text: str) -> Iterator[tuple[Daemon, Path]]:
    """A ready simulated daemon evaluating one rule file (yielded with it), which it reloads on
    `Daemon.reload_rules` (SIGHUP) only: the periodic check is an hour away. Every family is
    exported (metrics.profile full): the rule engine's own metrics with the rest."""
    rules = tmp_path / "live.rules.yaml"
    rules.write_text(rules_text)
    config = tmp_path / "daemon.yaml"
    config.write_text("rules:\n  reload_check_seconds: 3600\nmetrics:\n  profile: full\n")
    with serve(
        tmp_path, "--simulate", "mixed", "--rules", str(rules), "--config", str(config)
    ) as daemon:
        daemon.wait_ready()
        yield daemon, rules


def parse_samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value for every sample line of a text exposition."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            samples[series] = float(value)
    return samples
