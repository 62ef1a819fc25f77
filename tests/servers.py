"""Real servers for tests, on 127.0.0.1 only and stopped by PID: Alertmanager, Prometheus
(Debian packages), and a recording HTTP(S) receiver for webhooks."""

from __future__ import annotations

import contextlib
import json
import ssl
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx

from tests.daemon import free_port
from tests.localserver import LocalServer
from tests.support import require_tool


@dataclass(frozen=True)
class Received:
    path: str
    headers: Message
    body: Any


class Recorder:
    """HTTP(S) server on 127.0.0.1 that records each POST and answers with scripted codes."""

    def __init__(
        self, port: int = 0, statuses: Sequence[int] = (), tls: ssl.SSLContext | None = None
    ) -> None:
        self.requests: list[Received] = []
        self._statuses = deque(statuses)
        self._cond = threading.Condition()
        self._server = LocalServer(self._handler_class(), port, tls)
        self.port, self.url = self._server.port, self._server.url

    def __enter__(self) -> Recorder:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Received]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"got {len(self.requests)} requests, expected {count}")
            return list(self.requests)

    def _record(self, path: str, headers: Message, body: bytes) -> int:
        with self._cond:
            self.requests.append(Received(path, headers, json.loads(body)))
            self._cond.notify_all()
            return self._statuses.popleft() if self._statuses else 200

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = recorder._record(self.path, self.headers, body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        return Handler


# --- the real Alertmanager -----------------------------------------------------------------

AM_CONFIG = """\
route:
  receiver: hook
  group_by: ['...']
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
- name: hook
  webhook_configs:
  - url: {webhook}
    send_resolved: true
"""


@contextlib.contextmanager
def alertmanager(
    workdir: Path, webhook: str, port: int | None = None, config: str | None = None
) -> Iterator[str]:
    """A real Alertmanager on 127.0.0.1 (no cluster port), stopped by PID; yields its url.

    `config`: a configuration of its own instead of AM_CONFIG (`webhook` is then unused)."""
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "am.yml").write_text(AM_CONFIG.format(webhook=webhook) if config is None else config)
    args = [
        f"--config.file={workdir / 'am.yml'}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    with _running("prometheus-alertmanager", args, workdir / "am.log", port) as url:
        yield url


@contextlib.contextmanager
def _running(tool: str, args: list[str], log_path: Path, port: int) -> Iterator[str]:
    """Start `tool` with `args`, wait for /-/ready on 127.0.0.1:`port`, stop it by PID."""
    binary = require_tool(tool)
    with log_path.open("wb") as log:
        process = subprocess.Popen([binary, *args], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, url, log_path, tool)
        yield url
    finally:
        stop_process(process)


def wait_ready(process: subprocess.Popen[bytes], url: str, log_path: Path, what: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what} exited:\n{log_path.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"{what} not ready:\n{log_path.read_text()}")


def am_alerts(url: str, alertname: str | None = None) -> list[dict[str, Any]]:
    params = {"filter": f'alertname="{alertname}"'} if alertname else {}
    response = httpx.get(f"{url}/api/v2/alerts", params=params, timeout=5)
    response.raise_for_status()
    return response.json()


def webhook_messages(hook: Recorder, status: str, timeout: float = 6.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [r.body for r in hook.requests if r.body.get("status") == status]
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {status} webhook; got {[r.body for r in hook.requests]}")


PROMETHEUS_CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: [{rules}]
alerting:
  alertmanagers:
  - static_configs:
    - targets: ['{alertmanager}']
scrape_configs:
- job_name: gpu-exporter
  static_configs:
  - targets: ['{target}']
  relabel_configs:
  - target_label: node
    replacement: {node}
  metric_relabel_configs:
  - action: labeldrop
    regex: instance|job
"""


@contextlib.contextmanager
def prometheus(
    workdir: Path, target: str, rules: Path, alertmanager_url: str, node: str
) -> Iterator[str]:
    """A real Prometheus scraping `target` every second and evaluating `rules`; yields its url.

    Series get `node` from relabeling (as the ServiceMonitor does) and lose job/instance, so
    its alerts carry the same labels as the daemon's (which add `node` as an external label).
    """
    config = PROMETHEUS_CONFIG.format(
        rules=rules,
        alertmanager=alertmanager_url.removeprefix("http://"),
        target=target,
        node=node,
    )
    with prometheus_with_config(workdir, config) as url:
        yield url


@contextlib.contextmanager
def prometheus_with_config(workdir: Path, config: str) -> Iterator[str]:
    """A real Prometheus on 127.0.0.1 with this configuration, stopped by PID; yields its url."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(config)
    args = [
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--web.external-url=http://127.0.0.1:{port}",
    ]
    with _running("prometheus", args, workdir / "prometheus.log", port) as url:
        yield url


def stop_process(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
