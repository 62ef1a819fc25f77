"""`gpu-exporter diagnose` in a diagnosis' order: health, then steady and comparable (versions,
clocks, settings drift), then where the time goes (per-class seconds as shares), then the hot
spots' advice; in the text and in the JSON alike. End to end on the fake NVML (real time,
short profiles), plus the settings watch on hand-made views for what a scenario cannot change
mid-profile (a driver per GPU, a power limit moved while measuring)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter import diagnose
from gpu_exporter.collect.classify import nvlink_capacity, pcie_capacity
from gpu_exporter.diagnose.comparable import SettingsWatch, comparable_report
from gpu_exporter.diagnose.report import SECTIONS
from gpu_exporter.diagnose.text import SECTION_TITLES
from gpu_exporter.diagnose.time_shares import CATEGORIES, CATEGORY_KEYS
from gpu_exporter.model.series import DeviceView
from gpu_exporter.model.snapshot import Reading
from tests.test_diagnose import MIXED_INTENT

SHORT = ("--duration", "2", "--interval", "0.5")


def diagnose_out(*argv: str) -> tuple[int, str]:
    """One in-process run; its exit status and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = diagnose.main([*argv, "--no-color"])
    return status, out.getvalue()


@pytest.fixture(scope="module")
def mixed() -> tuple[int, dict[str, Any]]:
    status, out = diagnose_out("--simulate", "mixed", *SHORT, "--json")
    return status, json.loads(out)


@pytest.fixture(scope="module")
def mixed_text() -> str:
    return diagnose_out("--simulate", "mixed", *SHORT)[1]


def test_json_sections_come_in_the_diagnosis_order(mixed) -> None:
    _, report = mixed
    names = [s["section"] for s in report["sections"]]
    assert names == ["health", "steady_and_comparable", "where_the_time_goes", "hot_spots"]
    assert [s["keys"] for s in report["sections"]] == [list(keys) for _, keys in SECTIONS]
    keys = list(report)
    flat = [key for section in report["sections"] for key in section["keys"]]
    assert [keys.index(k) for k in flat] == sorted(keys.index(k) for k in flat)
    # Health first among them, then the run's outcome after them all.
    assert keys.index("health") < keys.index("comparable") < keys.index("time")
    assert keys.index("time") < keys.index("hot_spots") < keys.index("devices")
    assert keys[-2:] == ["needs_attention", "exit_status"]
    assert report["schema_version"] == diagnose.SCHEMA_VERSION == 4


def test_text_sections_come_in_the_diagnosis_order(mixed_text) -> None:
    out = mixed_text
    headings = [SECTION_TITLES[name] for name, _ in SECTIONS]
    marks = [
        *headings[:2],
        "Versions:",
        "Clocks and settings over the profile",
        "State at the end of the profile:",
        headings[2],
        "Topology (as nvidia-smi topo -m):",
        "Activity profile (",
        "Time by category",
        "Not measured:",
        headings[3],
        "Needs attention",
        "Exit status 1",
    ]
    at = [out.find(mark) for mark in marks]
    assert -1 not in at, [m for m, i in zip(marks, at, strict=True) if i < 0]
    assert at == sorted(at), marks
    assert headings[0].startswith("1. Health") and headings[3].startswith("4. Hot spots")


def _category_of(device: Mapping[str, Any]) -> str:
    """The category a GPU of `mixed` falls in by its intended class; a link-bound one by the
    link nearer its capacity, from the profile's own rates and the links' capacities."""
    cls = MIXED_INTENT[device["index"]]
    if cls != "link_bound":
        return next(c.key for c in CATEGORIES if cls in c.classes)
    p, s = device["profile"], device["state"]
    pcie = p["pcie_bytes_per_second"] / pcie_capacity(s["pcie"]["generation"], s["pcie"]["width"])
    nvlink = p["nvlink_bytes_per_second"] / nvlink_capacity(
        device["architecture"], s["nvlink_links_active"]
    )
    return "collective" if nvlink > pcie else "copy"


def test_shares_are_each_gpus_class_seconds_over_its_profiled_time(mixed) -> None:
    _, report = mixed
    time = report["time"]
    devices = {d["index"]: d for d in report["devices"]}
    node = dict.fromkeys(CATEGORY_KEYS, 0.0)
    for gpu in time["gpus"]:
        device = devices[gpu["gpu"]]
        seconds = device["profile"]["class_seconds"]
        whole = sum(seconds.values())
        assert whole > 0 and gpu["seconds"] == pytest.approx(whole, abs=1e-3)
        assert gpu["kernel_time_share"] == device["profile"]["utilization"]
        assert gpu["counted"] is True  # mixed's hardware is healthy
        # Each class's seconds in its category (link-bound in one of copy and collective).
        link = gpu["shares"]["copy"] + gpu["shares"]["collective"]
        assert link == pytest.approx(seconds["link_bound"] / whole, abs=1e-3)
        compute = (seconds["tensor_bound"] + seconds["compute_bound"]) / whole
        assert gpu["shares"]["compute_bound"] == pytest.approx(compute, abs=1e-3)
        for key, cls in (("idle_gaps", "idle"), ("launch_bound", "launch_bound"),
                         ("memory_bound", "memory_bound"), ("throttled", "throttled"),
                         ("unknown", "unknown")):  # fmt: skip
            assert gpu["shares"][key] == pytest.approx(seconds[cls] / whole, abs=1e-3), key
        assert sum(gpu["shares"].values()) == pytest.approx(1.0, abs=1e-3)
        # The scenario's intent holds most of each GPU's time.
        top = max(gpu["shares"], key=lambda key: gpu["shares"][key])
        assert top == _category_of(device), (gpu["where"], gpu["shares"])
        for key, share in gpu["shares"].items():
            node[key] += share * whole
    total = sum(node.values())
    assert time["total_seconds"] == pytest.approx(total, abs=1e-2)
    by_key = {c["category"]: c for c in time["categories"]}
    assert list(by_key) == list(CATEGORY_KEYS)
    for key, seconds in node.items():
        assert by_key[key]["share"] == pytest.approx(seconds / total, abs=1e-3), key
    # Who holds the link-bound GPU's time is derived above; each category lists its GPUs.
    collective = [f"GPU {i}" for i in devices if _category_of(devices[i]) == "collective"]
    assert by_key["collective"]["held_by"] == collective


def test_hot_spots_follow_the_categories_order_and_keep_each_gpus_advice(mixed) -> None:
    _, report = mixed
    advice = report["hot_spots"]["advice"]
    order = [CATEGORY_KEYS.index(a["category"]) for a in advice]
    assert order == sorted(order)
    devices = {d["index"]: d for d in report["devices"]}
    assert {a["gpu"] for a in advice} == set(devices)
    for a in advice:
        assert a["class"] == devices[a["gpu"]]["class"]
        assert a["next_steps"] == devices[a["gpu"]]["next_steps"]
    assert report["hot_spots"]["health_first"] == []


def test_what_the_gpu_cannot_measure_is_said_not_measured(mixed, mixed_text) -> None:
    _, report = mixed
    not_measured = {item["what"]: item["why"] for item in report["time"]["not_measured"]}
    nic = next(why for what, why in not_measured.items() if what.startswith("NIC traffic"))
    assert "not a NIC's" in nic
    copy = next(c for c in report["time"]["categories"] if c["category"] == "copy")
    assert "GPUDirect RDMA" in copy["cannot_tell_apart"]
    idle = next(c for c in report["time"]["categories"] if c["category"] == "idle_gaps")
    assert "look the same" in idle["cannot_tell_apart"]
    assert any(item.startswith("locked clocks") for item in report["comparable"]["not_read"])
    said = " ".join(mixed_text.split("Not measured:")[1].split())
    assert "NIC traffic (InfiniBand, RoCE, Ethernet): NVML counts the GPU's PCIe and NVLink" in said


DRIFT = """\
name: drift
defaults: {model: NVIDIA H200, values: {utilization: 0.98, sm_active: 0.9, tensor_active: 0.7,
           dram_active: 0.4}}
devices:
  - {}
  - power_limit_watts: 750
    power_default_limit_watts: 700
    power_limit_range_watts: [350, 800]
    values: {sm_clock_mhz: {sine: {mean: 1700, amplitude: 280, period: 2}}}
  - {unsupported: [power_limit]}
"""


def test_settings_drift_between_gpus_needs_attention_and_unread_settings_are_said(
    tmp_path: Path,
) -> None:
    """Three H200s: GPU 1's power limit raised (a note on its own, no fault of the GPU) and its
    SM clock swinging while busy; GPU 2 cannot report its limit. The drift is GPU 1's alone and
    is why the node needs attention; GPU 2 is said not read, not counted as different."""
    scenario = tmp_path / "drift.yaml"
    scenario.write_text(DRIFT)
    status, out = diagnose_out("--simulate", str(scenario), *SHORT, "--json")
    report = json.loads(out)
    comparable = report["comparable"]
    drift = [f for f in comparable["findings"] if f["check"] == "drift_between_gpus"]
    assert [(f["setting"], f["level"], f["gpus"]) for f in drift] == [
        ("power_management_limit_watts", "warning", [1])
    ]
    assert "GPU 0 700 W" in drift[0]["text"] and "GPU 1 750 W" in drift[0]["text"]
    assert "GPU 2" not in drift[0]["text"]
    gpus = {g["index"]: g for g in comparable["gpus"]}
    assert gpus[2]["settings"]["power_management_limit_watts"] is None
    assert any(
        item.startswith("nvmlDeviceGetPowerManagementLimit: NVML answered not supported")
        for item in gpus[2]["not_read"]
    )
    # The swinging clock: a note, from the clock's own range against its maximum.
    clock = gpus[1]["sm_clock"]
    assert clock["spread"] == pytest.approx(
        (clock["max_hz"] - clock["min_hz"]) / clock["max_clock_hz"]
    )
    assert clock["steady"] is False and gpus[0]["sm_clock"]["steady"] is True
    unsteady = [f for f in comparable["findings"] if f["check"] == "clock_not_steady"]
    assert [(f["gpus"], f["level"]) for f in unsteady] == [([1], "note")]
    # Nothing else needs attention: the drift is the reason.
    assert all(d["problems"] == [] for d in report["devices"])
    assert report["health"]["node_findings"] == []
    assert report["needs_attention"] is True and status == diagnose.EXIT_ATTENTION

    _, text = diagnose_out("--simulate", str(scenario), *SHORT)
    steady = text.split(SECTION_TITLES["steady_and_comparable"])[1]
    steady = " ".join(steady.split(SECTION_TITLES["where_the_time_goes"])[0].split())
    assert "warning: power limit differs between the NVIDIA H200 GPUs" in steady
    assert "GPU 2 not read: nvmlDeviceGetPowerManagementLimit" in steady
    attention = " ".join(text.split("Needs attention")[1].split())
    assert "node: power limit differs between the NVIDIA H200 GPUs" in attention


SICK = """\
name: sick
defaults: {model: NVIDIA H200, values: {utilization: 0.98, sm_active: 0.9, tensor_active: 0.6,
           dram_active: 0.4}}
devices:
  - {}
  - values: {row_remap_pending: 1}
"""


def test_a_gpu_with_a_health_finding_is_not_counted_in_where_the_time_goes(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "sick.yaml"
    scenario.write_text(SICK)
    _, out = diagnose_out("--simulate", str(scenario), *SHORT, "--json")
    report = json.loads(out)
    healthy, sick = report["time"]["gpus"]
    assert healthy["counted"] is True and sick["counted"] is False
    assert sick["not_counted"].startswith("health first")
    assert report["time"]["total_seconds"] == pytest.approx(healthy["seconds"], abs=1e-2)
    assert report["hot_spots"]["health_first"] == ["GPU 1"]
    assert [a["where"] for a in report["hot_spots"]["advice"]] == ["GPU 0"]


def view(
    index: int,
    *,
    driver: str = "570.124.06",
    enforced: float = 700.0,
    sm_mhz: float = 1980.0,
    model: str = "NVIDIA H200",
) -> DeviceView:
    """One GPU as one tick's series show it: its driver, enforced power limit and SM clock."""
    readings = (
        Reading("gpu_power_limit_watts", enforced),
        Reading("gpu_clock_hertz", sm_mhz * 1e6, (("clock", "sm"),)),
        Reading("gpu_clock_max_hertz", 1980e6, (("clock", "sm"),)),
    )
    info = {"model": model, "driver_version": driver}
    return DeviceView(index, f"GPU-{index}", True, info, {}, readings)


def test_a_driver_differing_between_gpus_and_a_limit_moved_mid_profile_are_drift() -> None:
    watch = SettingsWatch()
    ticks = [
        [view(0), view(1, driver="550.54.15"), view(2, model="NVIDIA H100 80GB HBM3")],
        [view(0, enforced=600.0), view(1, driver="550.54.15"),
         view(2, model="NVIDIA H100 80GB HBM3")],
    ]  # fmt: skip
    for tick in ticks:
        for v in tick:
            watch.observe(v)
    report = comparable_report(watch, ticks[-1], {})
    found = {(f["check"], f["setting"]): f for f in report["findings"]}
    driver = found[("drift_between_gpus", "driver_version")]
    # The driver is compared across models; the odd one out is the GPU on the other driver.
    assert driver["level"] == "warning" and driver["gpus"] == [1]
    moved = found[("changed_during_profile", "enforced_power_limit_watts")]
    assert moved["gpus"] == [0] and "700 W -> 600 W" in moved["text"]
    assert found[("mixed_models", "model")]["level"] == "note"
    # The settings after the profile were not read: said, per GPU, never assumed equal.
    assert all(g["not_read"] == ["settings after the profile: not read"] for g in report["gpus"])
    assert ("drift_between_gpus", "power_management_limit_watts") not in found


def test_steady_identical_gpus_have_no_findings() -> None:
    watch = SettingsWatch()
    views = [view(0), view(1)]
    for _ in range(3):
        for v in views:
            watch.observe(v)
    report = comparable_report(watch, views, {})
    assert report["findings"] == []
    assert [g["sm_clock"]["steady"] for g in report["gpus"]] == [True, True]
