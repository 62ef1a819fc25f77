"""HTTP endpoints against a real sampler on the fake NVML (ticks driven by the test)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gpu_exporter.collect.nvml.source import NvmlConfig, NvmlSource
from gpu_exporter.collect.source import ErrorLog, TooManyDevicesError
from gpu_exporter.collect.startup import StartupProgress
from gpu_exporter.pipeline.sampler import Sampler
from gpu_exporter.web.api import DevicesAnswer, create_app
from tests.daemon import serve
from tests.support import wait_for


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


class StepClock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def starting_app(fake_nvml) -> tuple[StartupProgress, StepClock, TestClient]:
    fake_nvml.install("mixed")
    errors = ErrorLog()
    source = NvmlSource(errors=errors)  # never started: the progress below stands for it
    clock = StepClock()
    progress = StartupProgress(clock)
    app = create_app(Sampler(source, errors), lambda: progress.ready, startup=progress)
    return progress, clock, TestClient(app)


def test_while_starting_alive_and_unready_with_the_step_and_its_time(fake_nvml) -> None:
    progress, clock, client = starting_app(fake_nvml)
    clock.now += 3.2
    progress.beat()  # the start-up thread waits, beating
    health = client.get("/healthz")
    assert health.status_code == 200
    assert health.text == "starting: NVML init not finished after 3.2s\n"
    ready = client.get("/readyz")
    assert (ready.status_code, ready.text) == (
        503,
        "not ready: NVML init not finished after 3.2s\n",
    )
    progress.step("GPU enumeration")
    clock.now += 0.5
    metrics = client.get("/metrics")
    assert (metrics.status_code, metrics.text) == (503, "GPU enumeration not finished after 0.5s\n")
    progress.mark_ready()
    assert client.get("/readyz").text == "not ready: no snapshot yet\n"
    assert client.get("/healthz").text == "starting\n"


def test_liveness_fails_when_start_up_itself_stops_moving_or_gives_up(fake_nvml) -> None:
    progress, clock, client = starting_app(fake_nvml)
    clock.now += 9.0
    assert client.get("/healthz").status_code == 200  # within the stale bound (10 s)
    clock.now += 2.0  # no beat for 11 s: our own start-up thread is stuck
    health = client.get("/healthz")
    assert (health.status_code, health.text) == (503, "start-up stuck for 11.0s\n")
    progress.beat()
    assert client.get("/healthz").status_code == 200
    progress.fail(TooManyDevicesError("NVML lists 70 GPUs, more than nvml.max_devices (64)"))
    for path in ("/healthz", "/readyz"):
        response = client.get(path)
        assert response.status_code == 503 and "more than nvml.max_devices" in response.text


def test_head_is_answered_on_every_get_endpoint(fake_nvml) -> None:
    source, sampler, client = make(fake_nvml)
    try:
        sampler.tick()
        methods: dict[str, set[str]] = {}
        for route in client.app.routes:  # type: ignore[attr-defined]
            methods.setdefault(route.path, set()).update(getattr(route, "methods", None) or ())
        gets = [path for path, verbs in methods.items() if "GET" in verbs and "{" not in path]
        assert "/metrics" in gets
        for path in gets:
            if path.startswith("/openapi") or path.startswith("/docs"):
                continue  # FastAPI's own
            assert "HEAD" in methods[path], path
            head, get = client.head(path), client.get(path)
            assert head.status_code == get.status_code, path
            assert head.headers["content-type"] == get.headers["content-type"], path
    finally:
        source.close()


def test_two_gpus_unidentified_at_start_are_two_devices(fake_nvml) -> None:
    """Identity reads that hang at start (the UUID on one GPU, the handle on another) leave two
    GPUs down without a UUID: /api/v1/devices lists each on its own, with its own reason."""
    hang = {"at": 0, "kind": "hang", "duration": 30}
    spec = {
        "name": "unidentified",
        "defaults": {"model": "NVIDIA H200", "values": {"power_watts": 400}},
        "devices": [{"label": "a"}, {"label": "no uuid"}, {"label": "no handle"}, {"label": "d"}],
        "faults": [
            {**hang, "device": 1, "function": "nvmlDeviceGetUUID"},
            {**hang, "device": 2, "function": "nvmlDeviceGetHandleByIndex_v2"},
        ],
    }
    fake_nvml.install(spec)
    errors = ErrorLog()
    source = NvmlSource(settings=NvmlConfig(device_deadline_seconds=1.0), errors=errors)
    source.start()
    sampler = Sampler(source, errors, interval=1.0)
    client = TestClient(create_app(sampler, lambda: source.started))
    try:
        sampler.tick()
        devices = client.get("/api/v1/devices").json()["data"]["devices"]
        assert [(d["index"], d["up"]) for d in devices] == [
            (0, True),
            (1, False),
            (2, False),
            (3, True),
        ]
        no_uuid, no_handle = devices[1], devices[2]
        assert no_uuid["down_reason"] == "NVML call nvmlDeviceGetUUID did not answer in time"
        assert no_handle["down_reason"] == (
            "NVML call nvmlDeviceGetHandleByIndex did not answer in time"
        )
        for down in (no_uuid, no_handle):
            assert down["uuid"] == "" and down["info"] == {}
            assert "gpu_power_watts" not in down["metrics"]
        uuids = [d["uuid"] for d in (devices[0], devices[3])]
        assert all(uuids) and len(set(uuids)) == 2
        assert devices[0]["metrics"]["gpu_power_watts"] > 0
        assert client.get("/").status_code == 200  # the status page reads this same list
    finally:
        source.close()


def test_serve_simulate_mig_answers_each_instance_under_its_gpu(tmp_path: Path) -> None:
    """The daemon's own process on `--simulate mig`: every MIG instance is listed under its GPU
    with its identity, class, memory, activity and size, and the answer is its model."""
    with serve(tmp_path, "--simulate", "mig", "--interval", "0.5") as daemon:
        daemon.wait_ready()

        def classified() -> dict[str, Any] | None:
            body = daemon.get("/api/v1/devices").json()
            gpu0 = body["data"]["devices"][0]["instances"]
            launch = next(i for i in gpu0 if i["identity"]["gpu_instance"] == "9")
            return body if launch["bottleneck"] == "launch_bound" else None

        body = wait_for(classified, 15, "GPU 0 GI 9 classified launch-bound")
        assert DevicesAnswer.model_validate(body).model_dump(mode="json") == body
        seven, mixed, whole, a100 = body["data"]["devices"]
        assert [len(d["instances"]) for d in body["data"]["devices"]] == [7, 4, 0, 5]
        assert [i["identity"]["gpu_instance"] for i in mixed["instances"]] == ["1", "5", "13", "14"]
        assert [i["identity"].get("compute_instance") for i in a100["instances"]] == [
            "0", "1", "2", None, None,
        ]  # fmt: skip
        for device in (seven, mixed, a100):
            for instance in device["instances"]:
                assert instance["identity"]["mig_uuid"].startswith("MIG-")
                assert instance["size"]["gpu_slices"] >= 1
                assert "gpu_power_watts" not in instance["metrics"]  # the parent's, once
            assert "gpu_bottleneck" not in device["metrics"]
        measured = [i for i in seven["instances"] if i["activity"]["sm"] is not None]
        assert len(measured) == 7 and seven["instances"][0]["memory"]["total_bytes"] > 0
        assert all(i["activity"]["sm"] is None for i in a100["instances"])  # no GPM on A100
        assert whole["instances"] == [] and whole["metrics"]["gpu_utilization_ratio"] > 0.9
        assert daemon.get("/").status_code == 200
