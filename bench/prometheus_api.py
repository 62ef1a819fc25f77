"""A real Prometheus (Debian's `prometheus`) on 127.0.0.1, stopped by PID, and what the
benchmarks read from it: its HTTP API (query, series, rules; Prometheus docs "HTTP API") and
its own /metrics."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import yaml

from bench import promtext
from bench.procfs import Probe
from bench.procs import free_port

BINARY = "prometheus"


class PrometheusError(RuntimeError):
    pass


def unavailable() -> str:
    return "" if shutil.which(BINARY) else f"not installed: {BINARY}"


def version() -> str:
    """`prometheus --version`'s first line, e.g. "prometheus, version 2.42.0+ds (...)"."""
    binary = shutil.which(BINARY)
    if binary is None:
        return "not installed"
    result = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    lines = (result.stdout or result.stderr).splitlines()
    return lines[0].strip() if result.returncode == 0 and lines else ""


# -- answers --------------------------------------------------------------------------------------


def api_data(payload: Mapping[str, Any]) -> Any:
    """The `data` of an API answer; its error type and message when it failed."""
    if payload.get("status") != "success":
        raise PrometheusError(f"{payload.get('errorType', '?')}: {payload.get('error', payload)}")
    return payload.get("data")


def single_value(data: Mapping[str, Any]) -> float | None:
    """The value of an instant query that gives a scalar or at most one sample; None for an
    empty vector (nothing matched)."""
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return float(result[1])  # type: ignore[index]
    if kind != "vector" or not isinstance(result, list):
        raise PrometheusError(f"expected a scalar or an instant vector, got {kind}")
    if not result:
        return None
    if len(result) > 1:
        raise PrometheusError(f"expected at most one sample, got {len(result)}")
    return float(result[0]["value"][1])


def parse_time(text: str) -> float | None:
    """An RFC 3339 time of the API as Unix seconds; None for Go's zero time (never)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return None if moment.year <= 1 else moment.timestamp()


@dataclass(frozen=True)
class RuleEvaluation:
    name: str
    kind: str  # "recording" or "alerting"
    seconds: float
    health: str
    error: str


@dataclass(frozen=True)
class GroupEvaluation:
    """One rule group as /api/v1/rules reports it: its last evaluation's start and duration."""

    name: str
    file: str
    interval: float
    last_evaluation: float | None
    seconds: float
    rules: tuple[RuleEvaluation, ...]


def rule_groups(data: Mapping[str, Any]) -> list[GroupEvaluation]:
    groups = []
    for group in data.get("groups", []):
        rules = tuple(
            RuleEvaluation(
                name=rule["name"],
                kind=rule.get("type", "?"),
                seconds=float(rule.get("evaluationTime", 0.0)),
                health=rule.get("health", "unknown"),
                error=rule.get("lastError", ""),
            )
            for rule in group.get("rules", [])
        )
        groups.append(
            GroupEvaluation(
                name=group["name"],
                file=group.get("file", ""),
                interval=float(group.get("interval", 0.0)),
                last_evaluation=parse_time(group.get("lastEvaluation", "0001-01-01T00:00:00Z")),
                seconds=float(group.get("evaluationTime", 0.0)),
                rules=rules,
            )
        )
    return groups


# -- the process ----------------------------------------------------------------------------------


@dataclass
class Prometheus:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> bytes:
        query = f"?{urlencode(params, doseq=True)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=60) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as error:  # the API explains a bad query in its body
            return error.read()

    def api(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return api_data(json.loads(self.get(path, params)))

    def query(self, expr: str) -> float | None:
        return single_value(self.api("/api/v1/query", {"query": expr}))

    def series_count(self, match: str, start: float) -> int:
        """Series matching `match` with samples since `start`: the head keeps a series gone
        stale, which an instant query no longer counts."""
        found = self.api("/api/v1/series", {"match[]": match, "start": f"{start:.3f}"})
        return len(found)

    def rules(self) -> list[GroupEvaluation]:
        return rule_groups(self.api("/api/v1/rules"))

    def own_metrics(self) -> dict[str, float]:
        return promtext.samples(self.get("/metrics").decode())

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _wait_ready(prometheus: Prometheus, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if prometheus.process.poll() is not None:
            raise PrometheusError(f"prometheus exited:\n{prometheus.output()[-4000:]}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=2) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.1)
    raise PrometheusError(f"prometheus not ready in {timeout:g}s:\n{prometheus.output()[-4000:]}")


@contextlib.contextmanager
def running(
    workdir: Path, config: Mapping[str, Any], extra: Sequence[str] = (), timeout: float = 60.0
) -> Iterator[Prometheus]:
    """Prometheus with this configuration, its TSDB in `workdir`; stopped by PID."""
    binary = shutil.which(BINARY)
    if binary is None:
        raise PrometheusError(unavailable())
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    port = free_port()
    argv = [
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--web.external-url=http://127.0.0.1:{port}",
        *extra,
    ]
    log = workdir / "prometheus.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    prometheus = Prometheus(process, f"http://127.0.0.1:{port}", log)
    try:
        _wait_ready(prometheus, timeout)
        yield prometheus
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def memory_bytes(prometheus: Prometheus) -> tuple[int, int]:
    """Resident and peak resident bytes (/proc/<pid>/status VmRSS, VmHWM)."""
    memory = Probe(prometheus.pid).memory()
    return memory.rss_bytes, memory.hwm_bytes
