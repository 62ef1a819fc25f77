"""MIG in the people-facing views: /api/v1/devices (and its OpenAPI schema) and the status page.

The daemon is assembled as `serve` assembles it (classifier, the shipped rule pack, pod
attribution in labels mode from a real gRPC fake kubelet) on the fake NVML's `mig` scenario,
driven by a manual clock past its reconfiguration at 90 s and the 10 min `for:` of the
busy-but-idle alert. The API answers before (60 s) and after (650 s) are kept; the status page
is rendered from them by headless Chromium (see tests/test_status_page.py).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpu_exporter import sim
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.config.load import load_config
from gpu_exporter.pipeline.assembly import Assembly, assemble
from gpu_exporter.sim.kubelet import FakeKubelet, pod
from gpu_exporter.web.api import DevicesAnswer, create_app
from tests.conftest import ManualClock
from tests.test_status_page import PROBE, Dom, chromium, page_routes, serve

INTERVAL = 5.0
BEFORE_SECONDS = 60.0  # GPU 1 still 3g + 2g + 1g + 1g
AFTER_SECONDS = 650.0  # the 2g split in two 1g (one reusing GI 5); GpuBusyButIdle firing


def answers(client: TestClient) -> dict[str, Any]:
    return {
        "devices": client.get("/api/v1/devices").json(),
        "alerts": client.get("/api/v1/alerts").json(),
    }


def pods_for(assembly: Assembly) -> list[Any]:
    """Pods on instances, by every id form the kubelet may give a MIG device, and one on the
    whole GPU; one held by the 2g.35gb that the reconfiguration removes."""
    devices = assembly.sampler.series.devices()
    seven, mixed, whole, a100 = devices

    def mig(device: Any, gi: str, ci: str | None = None) -> str:
        return next(
            i.mig_uuid
            for i in device.instances
            if i.identity["gpu_instance"] == gi and i.identity.get("compute_instance") == ci
        )

    return [
        pod("infer", "spin", {"srv": [("nvidia.com/mig-1g.18gb", [mig(seven, "9")])]}),
        pod("infer", "small", {"srv": [("nvidia.com/mig-2g.35gb", [mig(mixed, "5")])]}),
        pod("train", "big", {"main": [("nvidia.com/gpu", [f"MIG-{mixed.uuid}/1/0"])]}),
        pod("gke", "tiny", {"main": [("nvidia.com/gpu", ["nvidia1/gi13"])]}),
        pod("a", "ci1", {"main": [("nvidia.com/mig-1c.3g.40gb", [mig(a100, "1", "1")])]}),
        pod("whole", "job", {"main": [("nvidia.com/gpu", [whole.uuid])]}),
    ]


@pytest.fixture(scope="module")
def mig_api() -> Iterator[dict[str, Any]]:
    """{"before": ..., "after": ..., "openapi": ...}: the API's answers for `mig`."""
    clock = ManualClock()
    sim.install("mig", clock=clock)
    kubelet = FakeKubelet().start()
    try:
        flags = {
            "interval_seconds": INTERVAL,
            "nvml.xid_events": False,
            "kubernetes.enabled": True,
            "kubernetes.socket_path": kubelet.socket_path,
            "kubernetes.mode": "labels",
        }
        config = load_config(None, flags, environ={})
        errors = ErrorLog()
        source = NvmlSource(
            settings=config.nvml,
            interval_seconds=config.interval_seconds,
            errors=errors,
            clock=clock,
        )
        source.start()
        try:
            assembly = assemble(config, source, errors, wall_clock=lambda: 1.75e9 + clock())
            assembly.sampler.tick()  # the layout, for the kubelet's device ids
            kubelet.set_pods(pods_for(assembly))
            assert assembly.attribution is not None and assembly.attribution.refresh()
            client = TestClient(
                create_app(assembly.sampler, lambda: source.started, assembly.rules)
            )
            found: dict[str, Any] = {"openapi": client.get("/openapi.json").json()}
            while clock.now < AFTER_SECONDS:
                clock.advance(INTERVAL)
                assembly.sampler.tick()
                if clock.now == BEFORE_SECONDS:
                    found["before"] = answers(client)
            found["after"] = answers(client)
            yield found
        finally:
            source.close()
    finally:
        kubelet.close()
        sim.uninstall()


def devices(answer: dict[str, Any]) -> list[dict[str, Any]]:
    body = answer["devices"]
    assert body["status"] == "success"
    return body["data"]["devices"]


def by_gi(device: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Instances keyed "9" or "1/2" (GI / CI)."""
    out = {}
    for instance in device["instances"]:
        identity = instance["identity"]
        key = identity["gpu_instance"]
        if "compute_instance" in identity:
            key += "/" + identity["compute_instance"]
        out[key] = instance
    return out


# -- /api/v1/devices ---------------------------------------------------------------------------


def test_each_gpu_lists_its_mig_instances_with_identity_pods_class_memory_activity_size(
    mig_api: dict[str, Any],
) -> None:
    seven, mixed, whole, a100 = devices(mig_api["before"])
    assert [len(d["instances"]) for d in (seven, mixed, whole, a100)] == [7, 4, 0, 5]
    gis = by_gi(seven)
    assert list(gis) == ["7", "8", "9", "10", "11", "12", "13"]  # by GPU instance
    launch = gis["9"]
    assert launch["identity"] == {
        "gpu_instance": "9",
        "mig_uuid": launch["identity"]["mig_uuid"],
        "mig_profile": "1g.18gb",
    }
    assert re.fullmatch(
        r"MIG-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", launch["identity"]["mig_uuid"]
    )
    holder = {"namespace": "infer", "pod": "spin", "container": "srv"}
    assert launch["labels"] == holder and launch["pods"] == [holder]  # labels mode
    assert launch["bottleneck"] == "launch_bound"
    assert launch["memory"] == {"used_bytes": 4294967296.0, "total_bytes": 17999855616.0}
    activity = launch["activity"]
    assert activity["graphics_engine"] == pytest.approx(0.95)
    assert activity["sm"] < 0.2 and activity["tensor"] < 0.05 and activity["dram"] < 0.1
    assert activity["sm_occupancy"] == pytest.approx(0.04)
    assert launch["size"] == {
        "gpu_slices": 1,
        "compute_slices": 1,
        "multiprocessors": 16,
        "memory_bytes": 17999855616,
    }
    # `metrics` has every family of the instance, as a GPU's does; never the parent's.
    assert launch["metrics"]["gpu_mig_instance_slices"] == 1.0
    assert {s["labels"]["pipe"] for s in launch["metrics"]["gpu_pipe_active_ratio"]} >= {"fp16"}
    for family in ("gpu_power_watts", "gpu_utilization_ratio", "gpu_clock_hertz"):
        assert family not in launch["metrics"]
    assert gis["12"]["bottleneck"] == "idle" and gis["12"]["pods"] == []
    assert {gis[k]["bottleneck"] for k in ("7", "8", "10", "11", "13")} == {"tensor_bound"}

    # The parents: the GPU's own quantities, no class or utilization (the instances have them).
    for parent in (seven, mixed, a100):
        metrics = parent["metrics"]
        assert parent["up"] and metrics["gpu_power_watts"] > 0
        assert {s["labels"]["state"]: s["value"] for s in metrics["gpu_mig_mode"]} == {
            "current": 1.0,
            "pending": 1.0,
        }
        for family in ("gpu_bottleneck", "gpu_utilization_ratio", "gpu_sm_active_ratio"):
            assert family not in metrics
        assert parent["labels"] == {}  # held by no pod itself

    mixed_gis = by_gi(mixed)
    assert mixed_gis["1"]["pods"][0]["pod"] == "big"  # MIG-GPU-<parent>/<gi>/<ci>
    assert mixed_gis["13"]["pods"][0]["pod"] == "tiny"  # GKE's nvidia<n>/gi<gi>
    assert mixed_gis["5"]["identity"]["mig_profile"] == "2g.35gb"
    assert mixed_gis["5"]["size"]["gpu_slices"] == 2

    # A100: a GPU instance split in three compute instances, each with its compute_instance
    # label and no memory of its own; no GPM, so no activity anywhere (null, never 0).
    a100_gis = by_gi(a100)
    assert list(a100_gis) == ["1/0", "1/1", "1/2", "5", "14"]
    shared = a100_gis["1/1"]
    assert shared["identity"]["mig_profile"] == "1c.3g.40gb"
    assert shared["pods"] == [{"namespace": "a", "pod": "ci1", "container": "main"}]
    assert a100_gis["1/0"]["pods"] == [] and a100_gis["1/0"]["labels"] == {}
    assert shared["memory"] == {"used_bytes": None, "total_bytes": None}
    assert a100_gis["14"]["memory"]["used_bytes"] == 2147483648.0
    assert shared["size"]["compute_slices"] == 1 and shared["size"]["gpu_slices"] == 3
    for instance in a100_gis.values():
        assert set(instance["activity"].values()) == {None}
        assert instance["bottleneck"] == "unknown"

    # A whole GPU keeps its fields as before, with no instances.
    assert whole["instances"] == [] and whole["metrics"]["gpu_utilization_ratio"] > 0.9
    assert whole["labels"] == {"namespace": "whole", "pod": "job", "container": "main"}
    assert {s["labels"]["state"]: s["value"] for s in whole["metrics"]["gpu_mig_mode"]} == {
        "current": 0.0,
        "pending": 0.0,
    }
    assert set(whole) == {
        "index", "uuid", "up", "down_reason", "info", "labels", "bottleneck", "bottleneck_kind",
        "bottleneck_reason", "links", "health", "shared", "pod_use", "unattributed", "metrics",
        "instances",
    }  # fmt: skip
    # Each instance's class with its kind and the classifier's reason; the parent has none,
    # but its links (every instance reads the parent's) against their capacity.
    assert launch["bottleneck_kind"] == "waste"
    assert launch["bottleneck_reason"].startswith("SMs mostly empty"), launch
    assert gis["12"]["bottleneck_kind"] == "spare"  # idle, no pod holds it
    assert a100_gis["1/1"]["bottleneck_kind"] == "unknown"
    assert "Hopper" in a100_gis["1/1"]["bottleneck_reason"]
    assert seven["bottleneck"] is seven["bottleneck_kind"] is seven["bottleneck_reason"] is None
    pcie = seven["links"]["pcie"]
    assert pcie["capacity_bytes_per_second"] > 0 and 0 <= pcie["utilization"] < 1, pcie


def test_after_the_reconfiguration_the_new_instances_appear_and_the_old_one_is_gone(
    mig_api: dict[str, Any],
) -> None:
    before = by_gi(devices(mig_api["before"])[1])
    after = by_gi(devices(mig_api["after"])[1])
    assert list(before) == ["1", "5", "13", "14"]
    assert list(after) == ["1", "5", "6", "13", "14"]
    old, new = before["5"], after["5"]
    assert (old["identity"]["mig_profile"], new["identity"]["mig_profile"]) == (
        "2g.35gb",
        "1g.18gb",
    )
    assert new["identity"]["mig_uuid"] != old["identity"]["mig_uuid"]  # GI 5 reused, not it
    all_after = {
        i["identity"]["mig_uuid"] for d in devices(mig_api["after"]) for i in d["instances"]
    }
    assert old["identity"]["mig_uuid"] not in all_after
    # The pod held the old instance: the new one with its GI id is not its.
    assert old["pods"][0]["pod"] == "small" and new["pods"] == [] and new["labels"] == {}
    assert new["size"]["gpu_slices"] == 1 and new["memory"]["used_bytes"] == 8589934592.0
    assert new["bottleneck"] in ("compute_bound", "launch_bound", "memory_bound")  # measured
    for key in ("1", "13", "14"):  # the others are untouched
        assert after[key]["identity"] == before[key]["identity"]


def test_the_answer_is_exactly_its_model_and_the_schema_declares_instances(
    mig_api: dict[str, Any],
) -> None:
    for moment in ("before", "after"):
        body = mig_api[moment]["devices"]
        assert DevicesAnswer.model_validate(body).model_dump(mode="json") == body
    schemas = mig_api["openapi"]["components"]["schemas"]
    device, instance = schemas["Device"], schemas["Instance"]
    assert device["properties"]["instances"]["items"] == {"$ref": "#/components/schemas/Instance"}
    assert "instances" in device["required"]
    assert set(instance["properties"]) == {
        "identity", "labels", "pods", "bottleneck", "bottleneck_kind", "bottleneck_reason",
        "memory", "activity", "size", "shared", "pod_use", "unattributed", "metrics",
    }  # fmt: skip
    assert set(instance["required"]) == set(instance["properties"])
    assert set(schemas["InstanceActivity"]["properties"]) == {
        "graphics_engine", "sm", "sm_occupancy", "tensor", "dram",
    }  # fmt: skip
    assert set(schemas["InstanceSize"]["properties"]) == {
        "gpu_slices", "compute_slices", "multiprocessors", "memory_bytes",
    }  # fmt: skip
    assert schemas["Pod"]["required"] == ["namespace", "pod", "container"]


# -- the status page ---------------------------------------------------------------------------


def test_browser_shows_instances_under_their_gpu(mig_api: dict[str, Any], tmp_path: Path) -> None:
    after = mig_api["after"]
    with serve(page_routes("", after["devices"], after["alerts"])) as base:
        markup = chromium(tmp_path, f"{base}/", "--dump-dom")
        shot = tmp_path / "mig.png"
        chromium(tmp_path, f"{base}/", f"--screenshot={shot}", "--window-size=1400,1300")

    dom = Dom(markup)
    rows = dom.rows["gpus"]
    kinds = [
        ("instance" if "instance" in r["attrs"].get("class", "") else "gpu", r["attrs"]["data-gpu"])
        for r in rows
    ]
    # Each GPU's row, then its instances' rows, in order.
    assert kinds == [
        ("gpu", "0"), *[("instance", "0")] * 7,
        ("gpu", "1"), *[("instance", "1")] * 5,
        ("gpu", "2"),
        ("gpu", "3"), *[("instance", "3")] * 5,
    ]  # fmt: skip
    gpus = {r["gpu"]: r for r in rows if "instance" not in r["attrs"].get("class", "")}
    assert gpus["0"]["bottleneck"] == "MIG: 7 instances"
    assert gpus["1"]["bottleneck"] == "MIG: 5 instances"
    assert gpus["3"]["bottleneck"] == "MIG: 5 instances"
    assert gpus["2"]["bottleneck"] == "tensor_bound" and gpus["2"]["pod"] == "whole/job"
    for parent in ("0", "1", "3"):  # the GPU's own quantities stay on its row
        assert re.fullmatch(r"\d{3} / [47]00 W", gpus[parent]["power"]), gpus[parent]
        assert gpus[parent]["util"] == gpus[parent]["sm"] == "n/a"
        assert gpus[parent]["pod"] == "—"

    def instances(gpu: str) -> dict[str, dict[str, Any]]:
        return {
            r["gpu"]: r
            for r in rows
            if r["attrs"]["data-gpu"] == gpu and "instance" in r["attrs"].get("class", "")
        }

    seven = instances("0")
    assert list(seven) == [f"GI {gi}" for gi in range(7, 14)]
    launch = seven["GI 9"]
    assert launch["model"] == "1g.18gb" and launch["bottleneck"] == "launch_bound"
    assert launch["pod"] == "infer/spin"
    assert launch["util"] == "95%" and re.fullmatch(r"1[0-4]%", launch["sm"]), launch
    assert launch["memory"] == "4.0 / 16.8 GiB"
    assert launch["attrs"]["data-mig-uuid"].startswith("MIG-")
    for col in ("power", "clock", "temp", "throttle"):  # the GPU's, not repeated
        assert all(r[col] == "" for r in seven.values())
    assert seven["GI 12"]["bottleneck"] == "idle" and seven["GI 12"]["pod"] == "—"

    mixed = instances("1")
    assert list(mixed) == ["GI 1", "GI 5", "GI 6", "GI 13", "GI 14"]
    assert mixed["GI 5"]["model"] == "1g.18gb" and mixed["GI 5"]["pod"] == "—"
    assert mixed["GI 1"]["pod"] == "train/big" and mixed["GI 13"]["pod"] == "gke/tiny"

    a100 = instances("3")
    assert list(a100) == ["GI 1 · CI 0", "GI 1 · CI 1", "GI 1 · CI 2", "GI 5", "GI 14"]
    shared = a100["GI 1 · CI 1"]
    assert shared["model"] == "1c.3g.40gb" and shared["pod"] == "a/ci1"
    assert shared["bottleneck"] == "unknown"
    for row in a100.values():  # no GPM on A100: n/a, never 0%
        assert [row[c] for c in ("util", "sm", "tensor", "dram")] == ["n/a"] * 4
    assert shared["memory"] == "n/a" and a100["GI 14"]["memory"] == "2.0 / 9.3 GiB"

    firing = {(a["alertname"], a["gpu"]) for a in dom.rows["alerts"] if a["state"] == "firing"}
    assert ("GpuBusyButIdle", "0 GI 9") in firing, firing
    assert not [gpu for name, gpu in firing if name == "GpuBusyButIdle" and gpu != "0 GI 9"]
    assert dom.attrs("div", id="error").get("hidden") is not None
    assert re.search(r'<span id="node"[^>]*>4 of 4 GPUs up · 17 MIG instances ·', markup)
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000, len(png)


def test_browser_escapes_hostile_instance_values(mig_api: dict[str, Any], tmp_path: Path) -> None:
    body = copy.deepcopy(mig_api["after"]["devices"])
    instance = body["data"]["devices"][0]["instances"][0]
    instance["identity"].update(gpu_instance=PROBE, mig_profile=PROBE, compute_instance=PROBE)
    instance["pods"] = [{"namespace": PROBE, "pod": PROBE, "container": PROBE}]
    instance["bottleneck"] = PROBE
    instance["activity"]["sm"] = None  # NaN is sent as null
    body["data"]["devices"][3]["instances"] = "not a list"  # a broken answer: no rows, no crash
    alerts = {"status": "success", "data": {"alerts": []}}
    with serve(page_routes("", body, alerts, csp=False)) as base:
        markup = chromium(tmp_path, f"{base}/", "--dump-dom")
    dom = Dom(markup)
    assert "data-pwned" not in markup and not [t for t, _ in dom.tags if t == "img"]
    hostile = next(r for r in dom.rows["gpus"] if PROBE in r["gpu"])
    assert hostile["gpu"] == f"GI {PROBE} · CI {PROBE}"
    assert hostile["model"] == PROBE and hostile["bottleneck"] == PROBE
    assert hostile["pod"] == f"{PROBE}/{PROBE}" and hostile["sm"] == "n/a"
    assert not [r for r in dom.rows["gpus"] if r["attrs"]["data-gpu"] == "3" and r["gpu"] != "3"]
    assert dom.attrs("div", id="error").get("hidden") is not None
