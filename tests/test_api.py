"""HTTP endpoints against a real sampler on the fake NVML (ticks driven by the test)."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from gpu_exporter.api import create_app
from gpu_exporter.sampler import Sampler
from gpu_exporter.sources.base import ErrorLog
from gpu_exporter.sources.nvml import NvmlSource


def make(fake_nvml, interval: float = 1.0):
    fake_nvml.install("mixed")
    errors = ErrorLog()
    source = NvmlSource(errors=errors)
    source.start()
    sampler = Sampler(source, errors, interval=interval)
    return source, sampler, TestClient(create_app(sampler, lambda: source.started))


def test_ready_only_after_the_first_snapshot(fake_nvml) -> None:
    source, sampler, client = make(fake_nvml)
    try:
        response = client.get("/readyz")
        assert response.status_code == 503 and "no snapshot" in response.text
        assert client.get("/metrics").status_code == 503
        assert client.get("/api/v1/devices").status_code == 503
        sampler.tick()
        assert client.get("/readyz").status_code == 200
        assert client.get("/healthz").status_code == 200
        devices = client.get("/api/v1/devices").json()["data"]["devices"]
        assert [d["index"] for d in devices] == list(range(8))
        assert devices[5]["up"] is True
    finally:
        source.close()


def test_liveness_fails_when_ticks_stop(fake_nvml) -> None:
    source, sampler, client = make(fake_nvml)
    try:
        sampler.tick()
        sampler.last_tick_monotonic = time.monotonic() - 3600  # the scheduler died an hour ago
        response = client.get("/healthz")
        assert response.status_code == 503 and "stalled" in response.text
        assert client.get("/readyz").status_code == 503
    finally:
        source.close()


def test_liveness_fails_when_the_first_tick_never_finishes(fake_nvml) -> None:
    source, sampler, client = make(fake_nvml)
    try:
        assert client.get("/healthz").text == "starting\n"
        sampler.started_monotonic = time.monotonic() - 3600
        assert client.get("/healthz").status_code == 503
    finally:
        source.close()


def test_not_ready_before_nvml_started(fake_nvml) -> None:
    fake_nvml.install("mixed")
    errors = ErrorLog()
    source = NvmlSource(errors=errors)  # never started
    client = TestClient(create_app(Sampler(source, errors), lambda: source.started))
    response = client.get("/readyz")
    assert response.status_code == 503 and "NVML" in response.text
