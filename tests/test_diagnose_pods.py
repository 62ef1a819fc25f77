"""`gpu-exporter diagnose` and per-pod use: each container's share over the profile in the JSON
and the text report, and idle allocations (GpuAllocatedButIdle's condition over the profile)
needing attention. The shared node comes from tests/shared_node.py (the production per-pod code
and series model); the mixed scenario shows the held-and-idle case without per-process data."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter import diagnose
from gpu_exporter.collect.classify import Classifier
from gpu_exporter.collect.nvml.topology import Topology
from gpu_exporter.diagnose.pod_profile import PodProfile, PodProfiles, idle_allocations
from gpu_exporter.diagnose.report import Profile, Run, build_report
from gpu_exporter.diagnose.text import Text
from tests.shared_node import GIB, JOULES_PER_TICK, ticks
from tests.test_diagnose import parse, run_json

TICKS = 4


def shared_report() -> dict[str, Any]:
    profile = Profile(Classifier(), diagnose.HealthRules())
    for _, series in ticks(TICKS):
        profile.health.observe(series)
        for view in series.devices():
            profile.last[view.index] = view
            profile.pods.observe(view)
        profile.pods.tick()
        profile.ticks += 1
    run = Run("shared-node", float(TICKS), 1.0)
    return build_report(run, {}, Topology((), (), ()), profile)


def by_pod(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{e['namespace']}/{e['pod']}": e for e in entries}


def test_each_pods_share_over_the_profile_and_its_idle_allocations() -> None:
    report = shared_report()
    gpu0, gpu1, mig, gpu3 = report["devices"]

    train = by_pod(gpu0["pod_use"])["ml/train-0"]
    assert train["processes"] == 2 and isinstance(train["processes"], int)
    assert train["memory_bytes"] == 30 * GIB
    assert train["utilization"] == pytest.approx(0.55) and train["decoder"] == pytest.approx(0.1)
    # Charged from the second tick on (the first has no energy before it): 3 x 700 J x 0.55/0.6.
    assert train["energy_joules"] == pytest.approx((TICKS - 1) * JOULES_PER_TICK * 0.55 / 0.6)
    assert train["attribution"] == "apportioned" and train["idle"] is False
    notebook = by_pod(gpu0["pod_use"])["research/notebook-0"]
    assert notebook["idle"] is True and notebook["utilization"] == 0.0
    assert gpu0["unattributed"] == [
        {"reason": "host", "processes": 1, "memory_bytes": 2 * GIB,
         "utilization": pytest.approx(0.05)},
    ]  # fmt: skip
    assert gpu0["idle_allocations"] == [
        {"namespace": "research", "pod": "notebook-0", "container": "lab",
         "why": "ran no process on it during the profile"},
    ]  # fmt: skip
    (infer,) = gpu1["pod_use"]
    assert infer["energy_joules"] == pytest.approx((TICKS - 1) * JOULES_PER_TICK)
    assert infer["attribution"] == "exclusive" and gpu1["idle_allocations"] == []

    embed_gi, chat_gi = mig["instances"]
    chat = by_pod(chat_gi["pod_use"])
    assert chat["infer/chat-0"]["utilization"] is None  # NVML has none under MIG: not 0
    assert chat["infer/chat-0"]["energy_joules"] is None
    assert [i["pod"] for i in chat_gi["idle_allocations"]] == ["chat-1"]
    assert embed_gi["idle_allocations"] == [] and mig["pod_use"] == []

    # Its processes were not read: nothing about its use, and nothing invented.
    assert gpu3["pod_use"] == gpu3["unattributed"] == gpu3["idle_allocations"] == []

    # Idle allocations need attention; they are no fault of the GPU (no problem of its own).
    assert all(d["problems"] == [] for d in report["devices"])
    assert report["health"]["node_findings"] == []
    assert report["needs_attention"] is True
    assert report["exit_status"] == diagnose.EXIT_ATTENTION
    json.dumps(report)  # --json prints it as it is


def test_the_text_report_lists_each_pods_share_and_the_idle_allocations() -> None:
    out = io.StringIO()
    Text(out, colour=False).body(shared_report())
    text = out.getvalue()
    profile = text.split("Activity profile (")[1].split("Time by category")[0]
    per_pod = profile.split("Per pod, from the processes NVML lists")[1]
    rows = [line.split() for line in per_pod.splitlines() if line.startswith("  GPU ")]
    assert rows[0] == [
        "GPU", "pod", "container", "procs", "util", "enc", "dec", "memory", "energy", "charged",
    ]  # fmt: skip
    assert ["GPU", "0", "ml/train-0", "main", "2", "0.55", "0.00", "0.10", "30.0", "GiB",
            "1.9", "kJ", "apportioned"] in rows  # fmt: skip
    assert ["GPU", "0", "(host", "processes)", "-", "1", "0.05", "n/a", "n/a", "2.0", "GiB",
            "-", "-"] in rows  # fmt: skip
    assert ["GPU", "2", "GI", "9", "infer/chat-1", "srv", "0", "n/a", "n/a", "n/a", "0.0", "GiB",
            "n/a", "-"] in rows  # fmt: skip
    attention = " ".join(text.split("Needs attention")[1].split())  # lines wrap at 100
    assert (
        "GPU 0: idle allocation: research/notebook-0 (container lab) ran no process on it "
        "during the profile" in attention
    )
    assert "GPU 2 GI 9: idle allocation: infer/chat-1 (container srv) ran no process" in attention
    assert "node:" not in attention
    assert "Exit status 1: something needs attention." in text


def test_a_container_that_did_something_once_is_not_idle() -> None:
    busy_once = PodProfile(most_processes=1.0, utilization=[0.0, 0.2, 0.0])
    assert busy_once.idle() is None
    assert PodProfile(most_processes=1.0, utilization=[0.0, 0.0]).idle() == (
        "its processes ran no kernel on it during the profile"
    )
    assert PodProfile(most_processes=1.0).idle() is None  # nothing measured says it idled
    assert PodProfile(most_processes=0.0).idle() == "ran no process on it during the profile"


def test_the_holders_of_a_device_idle_over_the_profile_are_idle_allocations() -> None:
    """No per-process data needed: the kubelet's allocation and the class say it."""
    *_, (_, series) = ticks(1)
    gpu3 = series.devices()[3]  # held by batch/solo-0, its processes not read
    assert idle_allocations(PodProfiles(), (3, ""), gpu3, "compute_bound") == []
    assert idle_allocations(PodProfiles(), (3, ""), gpu3, "idle") == [
        {"namespace": "batch", "pod": "solo-0", "container": "work",
         "why": "held it while it ran no kernel (class idle)"},
    ]  # fmt: skip


def test_mixed_names_the_notebook_holding_its_idle_gpu(capsys) -> None:
    """The mixed scenario's pods, without per-process data: GPU 0 idles in research's
    notebook. It needs attention as an idle allocation, not as a problem of the GPU, and there
    is no per-pod use to show. 1 s ticks: at 0.5 s the per-GPU deadline (a share of the
    interval) was short enough for a loaded machine to miss it, and call GPU 0 lost."""
    status = diagnose.run(parse("--simulate", "mixed", "--duration", "4", "--interval", "1"))
    out = capsys.readouterr().out
    attention = " ".join(out.split("Needs attention")[1].split())
    assert (
        "GPU 0: idle allocation: research/notebook-alice-0 (container jupyter) held it while "
        "it ran no kernel (class idle)" in attention
    )
    assert "Per pod, from the processes NVML lists" not in out
    assert status == diagnose.EXIT_ATTENTION

    status = diagnose.run(
        parse("--simulate", "mixed", "--duration", "4", "--interval", "1", "--json")
    )
    report = json.loads(capsys.readouterr().out)
    gpu0 = report["devices"][0]
    assert gpu0["class"] == "idle" and gpu0["problems"] == []
    assert [i["pod"] for i in gpu0["idle_allocations"]] == ["notebook-alice-0"]
    others = [d for d in report["devices"] if d["index"] != 0]
    assert all(d["idle_allocations"] == [] for d in others)
    assert all(d["pod_use"] == [] and d["unattributed"] == [] for d in report["devices"])


def test_diagnose_simulate_shared_maps_processes_through_proc_and_the_runtime(capsys) -> None:
    # The whole path: the fake NVML's process lists, the simulated node's /proc and CRI runtime.
    status, report = run_json(capsys, "--simulate", "shared", "--duration", "2.5")
    assert status == diagnose.EXIT_ATTENTION
    assert report["pods"]["runtime_read"] is True
    gpu0, mps, exclusive, batch, _ = report["devices"]
    share = {p: e["utilization"] for p, e in by_pod(gpu0["pod_use"]).items()}
    assert share["research/llm-finetune-0"] > share["research/embed-batch-0"] > 0
    assert share["research/notebook-ana"] == share["research/notebook-ben"] == 0
    assert {"infer/asr-0", "infer/tts-0"} <= set(by_pod(mps["pod_use"]))
    assert [e["attribution"] for e in exclusive["pod_use"]] == ["exclusive"]
    assert [u["reason"] for u in batch["unattributed"]] == ["host"]
    # The idle allocations are GpuAllocatedButIdle's: holders only (not the MPS daemon's pod).
    idle = {
        f"{a['namespace']}/{a['pod']}"
        for d in report["devices"]
        for a in [
            *d["idle_allocations"],
            *(a for i in d["instances"] for a in i["idle_allocations"]),
        ]
    }
    assert idle == {"research/notebook-ana", "research/notebook-ben", "infer/chat-small-1"}


def test_a_runtime_that_does_not_answer_leaves_processes_unattributed(
    capsys, tmp_path: Path
) -> None:
    missing = str(tmp_path / "nothing.sock")
    status, report = run_json(
        capsys, "--simulate", "shared", "--duration", "1", "--runtime-socket", missing
    )
    assert status == diagnose.EXIT_ATTENTION
    assert report["pods"]["runtime_socket"] == missing and report["pods"]["runtime_read"] is False
    gpu0 = report["devices"][0]
    assert not gpu0["pod_use"] or all(e["utilization"] is None for e in gpu0["pod_use"])
    assert [u["reason"] for u in gpu0["unattributed"]] == ["unknown"]


@pytest.mark.parametrize("flag", ["--proc-root", "--runtime-socket"])
def test_an_empty_path_is_refused_naming_its_flag(capsys, flag: str) -> None:
    assert diagnose.run(parse("--processes", flag, "")) == diagnose.EXIT_USAGE
    assert capsys.readouterr().err.startswith(f"gpu-exporter diagnose: {flag}: ")
