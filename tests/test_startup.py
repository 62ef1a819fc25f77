"""Start-up that cannot hang: the real daemon on the fake NVML (pynvml over the fake C library),
with calls made to hang from the first second.

Each test checks that the port answers from the start (/healthz within 1 s, the liveness bound
the start-up promise makes), that /readyz says why it is not ready, what the node looks like
once it is, and that SIGTERM still ends the daemon with status 0.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon import Daemon, command, free_port, parse_samples, serve
from tests.support import wait_for

# The port opens before NVML's start, so it answers while a start-up call hangs for
# HANG_SECONDS. The bound only has to tell that from waiting for the hang: it leaves room for a
# CI machine running four test workers on two cores (seen: 1.14 s), not a speed promise.
HEALTHZ_WITHIN_SECONDS = 5.0
STOP_WITHIN_SECONDS = 5.0  # SIGTERM during a hung start-up: prompt, not after the hang
HANG_SECONDS = 600  # longer than any test: the call never answers while we look
GPUS = [{"label": "a"}, {"label": "b"}, {"label": "c"}]


def scenario_file(tmp_path: Path, **extra: Any) -> str:
    spec = {"name": "startup", "defaults": {"model": "NVIDIA H200", "nvlink_links": 18}}
    path = tmp_path / "scenario.yaml"
    path.write_text(json.dumps({**spec, "devices": GPUS, **extra}))  # JSON is YAML
    return str(path)


def hang(device: int, function: str) -> dict[str, Any]:
    return {
        "at": 0,
        "device": device,
        "kind": "hang",
        "function": function,
        "duration": HANG_SECONDS,
    }


@contextmanager
def started(tmp_path: Path, *args: str) -> Iterator[tuple[Daemon, httpx.Response, float]]:
    """The daemon, its first /healthz answer and how long after the daemon's start that came.

    The start is the daemon's first log line: its modules imported, its configuration and
    scenario read, NVML not yet asked anything. What comes before it is the same whatever NVML
    does, and on a busy two-core test machine the interpreter's imports alone vary by more
    than the bound."""
    with serve(tmp_path, *args) as daemon:
        deadline = time.monotonic() + 30
        while True:
            assert daemon.process.poll() is None, daemon.output()
            try:
                first = daemon.get("/healthz")
                answered = time.time()
                break
            except httpx.TransportError:
                time.sleep(0.01)
            assert time.monotonic() < deadline, f"port never opened:\n{daemon.output()}"
        yield daemon, first, answered - logged_start(daemon)


def logged_start(daemon: Daemon) -> float:
    """The wall-clock time of the daemon's first log line (logging's default asctime)."""
    line = daemon.output().splitlines()[0]
    stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def stop(daemon: Daemon) -> None:
    asked = time.monotonic()
    daemon.process.send_signal(signal.SIGTERM)
    status = daemon.process.wait(timeout=15)
    took = time.monotonic() - asked
    assert status == 0, daemon.output()
    assert took < STOP_WITHIN_SECONDS, f"SIGTERM took {took:.1f}s"


def up_by_gpu(samples: dict[str, float]) -> dict[str, tuple[float, str]]:
    out = {}
    for series, value in samples.items():
        if series.startswith("gpu_up{"):
            labels = dict(part.split("=", 1) for part in series[7:-1].split(","))
            out[labels["gpu"].strip('"')] = (value, labels.get("uuid", "").strip('"'))
    return out


def test_hung_nvml_init_keeps_the_port_open_and_unready_with_the_reason(tmp_path: Path) -> None:
    path = scenario_file(
        tmp_path, latency={"functions": {"nvmlInitWithFlags": HANG_SECONDS * 1000}}
    )
    with started(tmp_path, "--simulate", path) as (daemon, first, after):
        assert after < HEALTHZ_WITHIN_SECONDS, f"/healthz first answered {after:.2f}s after start"
        assert first.status_code == 200 and first.text.startswith("starting"), first.text
        ready = daemon.get("/readyz")
        assert ready.status_code == 503
        assert "NVML init not finished after" in ready.text, ready.text
        metrics = daemon.get("/metrics")
        assert metrics.status_code == 503 and "NVML init" in metrics.text, metrics.text
        time.sleep(1.5)  # still waiting, still alive: the start-up thread beats while it waits
        assert daemon.get("/healthz").status_code == 200
        assert daemon.get("/readyz").status_code == 503
        stop(daemon)


def test_slow_nvml_init_is_waited_for_then_ready(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, latency={"functions": {"nvmlInitWithFlags": 2500}})
    with started(tmp_path, "--simulate", path) as (daemon, first, after):
        assert after < HEALTHZ_WITHIN_SECONDS, f"/healthz first answered {after:.2f}s after start"
        assert first.status_code == 200, first.text
        ready = daemon.get("/readyz")
        assert ready.status_code == 503 and "NVML init not finished" in ready.text, ready.text
        daemon.wait_ready(timeout=20)
        ups = up_by_gpu(parse_samples(daemon.metrics_text()))
        assert {gpu: value for gpu, (value, _) in ups.items()} == {"0": 1, "1": 1, "2": 1}
        stop(daemon)


def test_a_gpu_whose_uuid_read_hangs_at_start_comes_up_down(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, faults=[hang(1, "nvmlDeviceGetUUID")])
    config = tmp_path / "config.yaml"
    # A long deadline keeps the enumeration visibly under way for a while.
    config.write_text("nvml:\n  device_deadline_seconds: 3\n")
    args = ("--simulate", path, "--config", str(config), "--interval", "5")
    with started(tmp_path, *args) as (daemon, first, after):
        assert after < HEALTHZ_WITHIN_SECONDS, f"/healthz first answered {after:.2f}s after start"
        assert first.status_code == 200, first.text
        ready = daemon.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert "GPU enumeration not finished after" in ready.text, ready.text
        daemon.wait_ready(timeout=20)
        samples = parse_samples(daemon.metrics_text())
        ups = up_by_gpu(samples)
        assert ups["0"][0] == 1 and ups["2"][0] == 1
        assert ups["1"] == (0, ""), "GPU 1 is down, its UUID unknown (no uuid label)"
        devices = daemon.get("/api/v1/devices").json()["data"]["devices"]
        hung = next(d for d in devices if d["index"] == 1)
        assert "nvmlDeviceGetUUID did not answer in time" in hung["down_reason"]
        assert any(
            k.startswith("gpu_exporter_errors_total{") and 'error="Timeout"' in k for k in samples
        )
        stop(daemon)


def test_a_hung_p2p_read_leaves_that_gpus_pairs_unknown_not_the_node_dark(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, faults=[hang(1, "nvmlDeviceGetP2PStatus")])
    with started(tmp_path, "--simulate", path, "--metrics-profile", "full") as (
        daemon,
        first,
        after,
    ):
        assert after < HEALTHZ_WITHIN_SECONDS, f"/healthz first answered {after:.2f}s after start"
        assert first.status_code == 200, first.text
        daemon.wait_ready(timeout=20)

        def topology_read() -> dict[str, float] | None:
            samples = parse_samples(daemon.metrics_text())
            has = any(k.startswith("gpu_p2p_usual_supported{") for k in samples)
            return samples if has else None

        samples = wait_for(topology_read, 20, "the topology families")
        ups = up_by_gpu(samples)
        assert {gpu: value for gpu, (value, _) in ups.items()} == {"0": 1, "1": 1, "2": 1}
        p2p_gpus = {
            series.split('gpu="')[1].split('"')[0]
            for series in samples
            if series.startswith("gpu_p2p_usual_supported{")
        }
        assert p2p_gpus == {"0", "2"}, "GPU 1's P2P is unknown (absent); the others' is read"
        link_gpus = {
            series.split('gpu="')[1].split('"')[0]
            for series in samples
            if series.startswith("gpu_topology_usual_link_info{")
        }
        assert link_gpus == {"0", "1", "2"}, "GPU 1's links are still read"
        timeouts = [
            k
            for k in samples
            if k.startswith("gpu_exporter_errors_total{")
            and 'source="topology"' in k
            and 'field="p2p_status"' in k
            and 'error="Timeout"' in k
        ]
        assert timeouts, "the hung call is counted"
        stop(daemon)


def test_more_gpus_than_max_devices_exits_2_naming_the_setting(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("nvml:\n  max_devices: 2\n")
    path = scenario_file(tmp_path)
    listen = f"127.0.0.1:{free_port()}"
    result = subprocess.run(
        command("serve", "--simulate", path, "--config", str(config), "--listen-address", listen),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "3 GPUs" in last and "nvml.max_devices (2)" in last, result.stderr
    assert "Traceback" not in result.stderr


def test_a_thousand_gpus_are_refused_without_a_thread_each(fake_nvml: Any) -> None:
    from gpu_exporter.collect.nvml.source import NvmlSource
    from gpu_exporter.collect.source import TooManyDevicesError

    fake_nvml.install({"name": "huge", "devices": [{"label": "x"}] * 1000})
    before = threading.active_count()
    source = NvmlSource()
    try:
        with pytest.raises(
            TooManyDevicesError, match=r"1000 GPUs, more than nvml.max_devices \(64\)"
        ):
            source.start()
        assert threading.active_count() - before < 10, "no thread per GPU"
    finally:
        source.close()
