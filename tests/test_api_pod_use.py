"""/api/v1/devices: each GPU's and MIG instance's per-pod use (pod_use), processes of no known
container (unattributed), whether it is shared, and which containers waste it; null where not
measured, and nothing at all without per-process attribution."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.model.series import SeriesSet
from gpu_exporter.model.snapshot import Snapshot
from gpu_exporter.pipeline.sampler import Sampler
from gpu_exporter.web.api import DevicesAnswer, PodUse, create_app, device_json
from gpu_exporter.web.pod_json import IdleAlerts
from tests.shared_node import GIB, shared_node


def answer(snapshot: Snapshot, series: SeriesSet, idle: IdleAlerts | None = None) -> dict[str, Any]:
    body = {
        "status": "success",
        "data": {
            "timestamp": snapshot.timestamp,
            "sequence": 0,
            "node": {},
            "devices": [
                device_json(v, snapshot.device(v.index), None, idle) for v in series.devices()
            ],
        },
    }
    # Every key and value survives the model, which forbids extra keys.
    assert DevicesAnswer.model_validate(body).model_dump(mode="json") == body
    return body


def by_pod(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{e['namespace']}/{e['pod']}/{e['container']}": e for e in entries}


@pytest.mark.parametrize("mode", ["labels", "info"])
def test_each_device_lists_who_uses_how_much_of_it(mode: str) -> None:
    snapshot, series = shared_node(mode)
    gpu0, gpu1, mig, gpu3 = answer(snapshot, series)["data"]["devices"]

    assert gpu0["shared"] is True
    pods = by_pod(gpu0["pod_use"])
    assert sorted(pods) == ["ml/train-0/main", "research/notebook-0/lab"]
    train, notebook = pods["ml/train-0/main"], pods["research/notebook-0/lab"]
    assert train["allocated"] and train["processes"] == 2
    assert train["memory_bytes"] == 30 * GIB
    assert train["utilization"] == pytest.approx(0.55)
    assert (train["encoder"], train["decoder"]) == (0.0, pytest.approx(0.1))
    # 700 J in the tick, charged by SM-time share: 0.55 of the 0.6 the processes used.
    assert train["energy_joules"] == pytest.approx(700 * 0.55 / 0.6)
    assert train["attribution"] == "apportioned" and train["waste"] is False
    # A share held and not used: measured zeros, and waste.
    assert (notebook["processes"], notebook["memory_bytes"], notebook["utilization"]) == (0, 0, 0)
    assert notebook["energy_joules"] is None and notebook["attribution"] is None  # none charged
    assert notebook["waste"] is True and notebook["waste_reason"] == "runs no process on it"
    assert gpu0["unattributed"] == [
        {"reason": "host", "processes": 1, "memory_bytes": 2 * GIB,
         "utilization": pytest.approx(0.05)},
    ]  # fmt: skip

    # One pod alone: not shared, its energy all of the GPU's (measured).
    assert gpu1["shared"] is False and gpu1["unattributed"] == []
    (infer,) = gpu1["pod_use"]
    assert (infer["energy_joules"], infer["attribution"]) == (700.0, "exclusive")

    # MIG: NVML has processes and memory only; the rest is null, never 0.
    assert mig["shared"] is False and mig["pod_use"] == []  # pods hold its instances
    embed_gi, chat_gi = mig["instances"]
    assert embed_gi["shared"] is False and chat_gi["shared"] is True
    chat = by_pod(chat_gi["pod_use"])
    assert chat["infer/chat-0/srv"]["processes"] == 1
    assert chat["infer/chat-0/srv"]["memory_bytes"] == 4 * GIB
    for entry in chat.values():
        assert [entry[k] for k in ("utilization", "encoder", "decoder", "energy_joules")] == [
            None, None, None, None,
        ]  # fmt: skip
    assert chat["infer/chat-1/srv"]["waste"] is True
    assert chat["infer/chat-0/srv"]["waste"] is False

    # Held, but its processes not read: nothing about its use, not zeros.
    assert gpu3["pod_use"] == [] and gpu3["unattributed"] == [] and gpu3["shared"] is False


def test_gpu_allocated_but_idle_marks_its_container_and_only_it() -> None:
    snapshot, series = shared_node()
    alerts = [
        {"labels": {"alertname": "GpuAllocatedButIdle", "gpu": "1", "uuid": "GPU-1",
                    "namespace": "serving", "pod": "infer-0", "container": "srv"},
         "state": "firing"},
        {"labels": {"alertname": "GpuAllocatedButIdle", "gpu": "2", "mig_uuid": "MIG-9",
                    "namespace": "infer", "pod": "chat-1", "container": "srv"},
         "state": "pending"},
        # Another alert on the same container, and this one on another GPU: not this one.
        {"labels": {"alertname": "GpuBusyButIdle", "gpu": "0", "namespace": "ml",
                    "pod": "train-0", "container": "main"}, "state": "firing"},
        {"labels": {"alertname": "GpuAllocatedButIdle", "gpu": "3", "namespace": "ml",
                    "pod": "train-0", "container": "main"}, "state": "firing"},
    ]  # fmt: skip
    gpu0, gpu1, mig, _ = answer(snapshot, series, IdleAlerts(alerts))["data"]["devices"]
    (infer,) = gpu1["pod_use"]
    assert infer["idle_alert"] == "firing" and infer["waste"] is True
    assert infer["waste_reason"] == "GpuAllocatedButIdle is firing for it"
    chat1 = by_pod(mig["instances"][1]["pod_use"])["infer/chat-1/srv"]
    assert chat1["idle_alert"] == "pending"
    assert chat1["waste_reason"] == "runs no process on it"  # pending alone is not the verdict
    train = by_pod(gpu0["pod_use"])["ml/train-0/main"]
    assert train["idle_alert"] is None and train["waste"] is False


@dataclass
class Published:
    snapshot: Snapshot
    series: SeriesSet


class Tick:
    """The sampler as the HTTP side reads it, holding one published tick."""

    interval = 1.0

    def __init__(self, snapshot: Snapshot, series: SeriesSet) -> None:
        self.published = Published(snapshot, series)
        self.latest, self.series, self.rendered = snapshot, series, None

    def seconds_since_start(self) -> float:
        return 1.0

    def seconds_since_last_tick(self) -> float:
        return 0.5


class Rules:
    """The rule manager's answers: no health group, GpuAllocatedButIdle firing on GPU 0."""

    def rules_json(self, group: str | None = None) -> list[dict[str, Any]]:
        return []

    def alerts_json(self) -> list[dict[str, Any]]:
        labels = {"alertname": "GpuAllocatedButIdle", "gpu": "0", "namespace": "research",
                  "pod": "notebook-0", "container": "lab"}  # fmt: skip
        return [{"labels": labels, "annotations": {}, "state": "firing",
                 "activeAt": "2026-01-01T00:00:00Z", "value": "1e+00"}]  # fmt: skip


def test_the_route_answers_its_model_with_the_rule_engines_idle_alerts() -> None:
    snapshot, series = shared_node()
    client = TestClient(create_app(Tick(snapshot, series), lambda: True, Rules()))
    body = client.get("/api/v1/devices").json()
    assert DevicesAnswer.model_validate(body).model_dump(mode="json") == body
    notebook = by_pod(body["data"]["devices"][0]["pod_use"])["research/notebook-0/lab"]
    assert notebook["idle_alert"] == "firing"
    assert notebook["waste_reason"] == (
        "GpuAllocatedButIdle is firing for it; runs no process on it"
    )


def test_the_schema_documents_every_per_pod_field() -> None:
    schema = create_app(Tick(*shared_node()), lambda: True).openapi()
    components = schema["components"]["schemas"]
    for name in ("PodUse", "Unattributed"):
        for field, spec in components[name]["properties"].items():
            if field not in ("namespace", "pod", "container"):
                assert spec.get("description"), f"{name}.{field} has no description"
    for owner in ("Device", "Instance"):
        props = components[owner]["properties"]
        assert {"shared", "pod_use", "unattributed"} <= set(props), owner
    assert set(PodUse.model_fields) >= {
        "namespace", "pod", "container", "processes", "memory_bytes", "utilization", "encoder",
        "decoder", "energy_joules", "attribution",
    }  # fmt: skip


def test_without_per_process_attribution_nothing_is_shown(fake_nvml) -> None:
    """The fake NVML's mixed node, as the daemon reads it today: no per-pod series, so empty
    lists (never zeros) on every GPU."""
    fake_nvml.install("mixed")
    errors = ErrorLog()
    source = NvmlSource(errors=errors)
    source.start()
    try:
        sampler = Sampler(source, errors, interval=1.0)
        sampler.tick()
        client = TestClient(create_app(sampler, lambda: source.started))
        devices = client.get("/api/v1/devices").json()["data"]["devices"]
        assert len(devices) == 8
        for device in devices:
            assert (device["shared"], device["pod_use"], device["unattributed"]) == (False, [], [])
    finally:
        source.close()
