"""The status page's per-pod table, rendered by headless Chromium from /api/v1/devices as the
daemon answers it for a node with shared GPUs (tests/shared_node.py: the production per-pod
code and series model) and with hostile values; see tests/test_status_page.py for the browser
and DOM helpers, and the same page with no per-process data (no table, no heading)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from gpu_exporter.web.api import device_json
from gpu_exporter.web.pod_json import IdleAlerts
from gpu_exporter.web.status_page import render_status_page
from tests.shared_node import shared_node
from tests.test_status_page import PROBE, Dom, chromium, page_routes, serve

POD_HEADERS = (
    "GPU", "Pod", "Container", "Processes", "Utilization share", "Encoder / decoder", "Memory",
    "Energy", "Use",
)  # fmt: skip
NO_ALERTS = {"status": "success", "data": {"alerts": []}}


def devices_json(idle: IdleAlerts | None = None) -> dict[str, Any]:
    snapshot, series = shared_node()
    devices = [device_json(v, snapshot.device(v.index), None, idle) for v in series.devices()]
    data = {"timestamp": snapshot.timestamp, "sequence": 1, "node": {}, "devices": devices}
    return {"status": "success", "data": data}


def rendered(tmp_path: Path, devices: dict[str, Any], *args: str) -> str:
    with serve(page_routes("", devices, NO_ALERTS)) as base:
        return chromium(tmp_path, f"{base}/", *args)


def test_the_per_pod_table_is_part_of_the_page() -> None:
    page = render_status_page()
    for header in POD_HEADERS:
        assert f'<th scope="col">{header}</th>' in page
    assert '<section id="pods-section" hidden>' in page  # until the data says otherwise


def test_shared_gpus_and_instances_list_each_pods_share_and_paint_idle_ones_as_waste(
    tmp_path: Path,
) -> None:
    idle = IdleAlerts(
        [{"labels": {"alertname": "GpuAllocatedButIdle", "gpu": "0", "namespace": "research",
                     "pod": "notebook-0", "container": "lab"}, "state": "firing"}]
    )  # fmt: skip
    dom = Dom(rendered(tmp_path, devices_json(idle), "--dump-dom"))
    shot = tmp_path / "pods.png"
    rendered(tmp_path, devices_json(idle), f"--screenshot={shot}", "--window-size=1280,1200")

    assert dom.attrs("section", id="pods-section").get("hidden") is None
    rows = {(row["gpu"], row["pod"]): row for row in dom.rows["pods"]}
    # Shared: GPU 0 (two pods and a host process) and GPU 2's GI 9 (two pods). Not listed: the
    # exclusive GPU 1, GI 7 with one pod, and GPU 3 whose processes were not read.
    assert list(rows) == [
        ("0", "ml/train-0"),
        ("0", "research/notebook-0"),
        ("0", "host processes"),
        ("2 GI 9", "infer/chat-0"),
        ("2 GI 9", "infer/chat-1"),
    ]
    train = rows["0", "ml/train-0"]
    assert (train["container"], train["processes"], train["util"]) == ("main", "2", "55%")
    assert train["codec"] == "enc 0% · dec 10%"
    assert train["memory"] == "30.0 / 141 GiB"
    assert train["energy"] == "0.6 kJapportioned"  # 700 J x 0.55 / 0.6, and how it was charged
    assert train["use"] == "in use" and "waste" not in train["attrs"].get("class", "")
    notebook = rows["0", "research/notebook-0"]
    assert notebook["attrs"]["class"] == "waste" and notebook["kind"] == "waste"
    reason = "GpuAllocatedButIdle is firing for it; runs no process on it"
    assert notebook["use"] == "idle" + reason and notebook["titles"]["use"] == reason
    assert (notebook["processes"], notebook["util"], notebook["memory"]) == (
        "0", "0%", "0.0 / 141 GiB",
    )  # fmt: skip
    assert notebook["energy"] == "n/a"  # nothing charged: not 0
    host = rows["0", "host processes"]
    assert "unattributed" in host["attrs"]["class"] and host["use"] == "no known container"
    assert (host["processes"], host["util"], host["memory"]) == ("1", "5%", "2.0 / 141 GiB")
    # MIG: counts and memory are measured; utilization and energy are not, and say why.
    chat0, chat1 = rows["2 GI 9", "infer/chat-0"], rows["2 GI 9", "infer/chat-1"]
    assert chat0["attrs"]["data-mig-uuid"] == "MIG-9"
    assert (chat0["processes"], chat0["memory"]) == ("1", "4.0 / 17.0 GiB")
    assert chat0["util"] == chat0["energy"] == chat0["codec"] == "n/a"
    assert chat0["titles"]["util"] == "NVML has no per-process utilization under MIG"
    assert chat1["kind"] == "waste" and chat1["use"] == "idleruns no process on it"

    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000, len(png)


def test_hostile_per_pod_values_stay_text_and_missing_ones_stay_n_a(tmp_path: Path) -> None:
    devices = copy.deepcopy(devices_json())
    gpu0 = devices["data"]["devices"][0]
    first, second = gpu0["pod_use"]
    first.update(namespace=PROBE, pod=PROBE, container=PROBE, attribution=PROBE)
    second.update(waste_reason=PROBE, processes=None, memory_bytes=None, utilization=None)
    second.update(encoder=None, decoder=None)
    gpu0["unattributed"][0]["reason"] = PROBE
    markup = rendered(tmp_path, devices, "--dump-dom")
    dom = Dom(markup)

    assert "data-pwned" not in markup and not [t for t, _ in dom.tags if t == "img"]
    rows = dom.rows["pods"]
    assert rows[0]["pod"] == f"{PROBE}/{PROBE}" and rows[0]["container"] == PROBE
    assert rows[0]["energy"].endswith(PROBE)
    assert rows[1]["use"] == "idle" + PROBE
    assert [rows[1][c] for c in ("processes", "util", "codec", "memory")] == ["n/a"] * 4
    assert rows[2]["pod"] == f"{PROBE} processes"


def test_an_unshared_node_shows_no_per_pod_table(tmp_path: Path) -> None:
    devices = copy.deepcopy(devices_json())
    for device in devices["data"]["devices"]:
        device["shared"] = False
        for instance in device["instances"]:
            instance["shared"] = False
    markup = rendered(tmp_path, devices, "--dump-dom")
    dom = Dom(markup)
    assert dom.attrs("section", id="pods-section").get("hidden") is not None
    assert dom.rows["pods"] == [] and len(dom.rows["gpus"]) == 4 + 2  # and the GPU table is
    assert not re.search(r'<tr class="waste"', markup)
