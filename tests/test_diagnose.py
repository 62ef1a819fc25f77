"""`gpu-exporter diagnose` end to end on the fake NVML (real time, short profiles)."""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpu_exporter import diagnose
from gpu_exporter.sim.kubelet import FakeKubelet, pod
from tests.conftest import ManualClock

ANSI = re.compile(r"\x1b\[")
MIXED_INTENT = {
    0: "idle",
    1: "compute_bound",
    2: "tensor_bound",
    3: "memory_bound",
    4: "launch_bound",
    5: "throttled",
    6: "throttled",
    7: "link_bound",
}


def parse(*argv: str) -> argparse.Namespace:
    """Through add_parser, as cli.py wires it."""
    parser = argparse.ArgumentParser(prog="gpu-exporter")
    diagnose.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["diagnose", *argv])


def run_json(capsys, *argv: str) -> tuple[int, dict[str, Any]]:
    status = diagnose.run(parse(*argv, "--json"))
    return status, json.loads(capsys.readouterr().out)


def test_mixed_classifies_every_gpu_as_the_scenario_intends(capsys) -> None:
    status, report = run_json(capsys, "--simulate", "mixed", "--duration", "3", "--interval", "0.5")
    classes = {d["index"]: d["class"] for d in report["devices"]}
    assert classes == MIXED_INTENT
    assert status == report["exit_status"] == diagnose.EXIT_ATTENTION
    assert report["needs_attention"] is True
    attention = {d["index"] for d in report["devices"] if d["problems"]}
    assert attention == {4, 5, 6, 7}  # launch-, link-bound and throttled; the rest is fine

    assert report["schema_version"] == 4 and report["simulated"] == "mixed"
    assert report["versions"]["driver"] == "570.124.06"
    assert report["versions"]["cuda_driver"] == "12.8"
    assert report["versions"]["exporter"]
    assert report["profile"]["samples"] == 7
    assert "NV18" in report["topology"]["matrix"]
    assert len(report["topology"]["links"]) == 8 * 7

    launch = report["devices"][4]
    assert launch["model"] == "NVIDIA H200" and launch["up"] is True
    assert launch["profile"]["utilization"] > 0.9 > 0.2 > launch["profile"]["sm_active"]
    assert any("Nsight Systems" in step for step in launch["next_steps"])
    assert launch["problems"][0].startswith("launch_bound")
    assert launch["profile"]["class_seconds"]["launch_bound"] > 1.0
    throttled = report["devices"][5]
    assert "hw_thermal_slowdown" in throttled["state"]["clock_events_active"]
    assert throttled["state"]["sm_clock_hz"] < 0.6 * throttled["state"]["sm_clock_max_hz"]
    assert throttled["state"]["pcie"] == {
        "generation": 5,
        "max_generation": 5,
        "width": 16,
        "max_width": 16,
    }
    assert throttled["state"]["nvlink_links"] == 18
    assert throttled["state"]["health"]["xid_errors"] == {}
    assert report["devices"][7]["profile"]["link_utilization"] > 0.6
    assert report["devices"][0]["next_steps"] and not report["devices"][0]["problems"]


def test_pre_hopper_activity_is_unknown_not_guessed(capsys) -> None:
    status, report = run_json(
        capsys, "--simulate", "pre-hopper", "--duration", "1.5", "--interval", "0.5"
    )
    classes = {d["index"]: d["class"] for d in report["devices"]}
    # GPU 1 ran no kernel at all (utilization 0): idle is a fact, not an activity guess.
    assert classes == {0: "unknown", 1: "idle", 2: "unknown", 3: "unknown"}
    for device in report["devices"]:
        assert device["profile"]["sm_active"] is None
        assert device["profile"]["tensor_active"] is None
    assert any("--dcgm auto" in step for step in report["devices"][0]["next_steps"])
    assert status == diagnose.EXIT_OK and report["needs_attention"] is False
    assert report["versions"]["cuda_driver"] == "12.2"
    assert {d["activity_source"] for d in report["devices"]} == {None}


def test_pre_hopper_with_dcgm_gives_the_answers_hopper_gives(capsys) -> None:
    """The same node with a DCGM host engine: activity from DCGM's profiling fields, and the
    classes, problems and exit status `mixed` gives for the same kinds on Hopper with GPM."""
    status, report = run_json(
        capsys, "--simulate", "pre-hopper-dcgm", "--duration", "3", "--interval", "0.5"
    )
    devices = report["devices"]
    classes = {d["index"]: d["class"] for d in devices}
    # GPU 4 is in MIG mode: no class of its own, one per instance, from DCGM per GPU instance
    assert classes == {0: "compute_bound", 1: "idle", 2: "launch_bound", 3: "memory_bound", 4: None}
    instances = {i["gpu_instance"]: i["class"] for i in devices[4]["instances"]}
    assert instances == {1: "tensor_bound", 5: "launch_bound", 13: "memory_bound", 14: "idle"}
    assert {d["activity_source"] for d in devices} == {"dcgm"}
    launch = devices[2]
    assert launch["profile"]["utilization"] > 0.9 > 0.2 > launch["profile"]["sm_active"]
    assert launch["problems"][0].startswith("launch_bound")
    assert any("Nsight Systems" in step for step in launch["next_steps"])
    assert status == report["exit_status"] == diagnose.EXIT_ATTENTION


def test_dcgm_off_on_that_node_is_the_pre_hopper_answer(capsys) -> None:
    _, report = run_json(
        capsys, "--simulate", "pre-hopper-dcgm", "--dcgm", "off", "--duration", "1.5"
    )
    assert {d["index"]: d["class"] for d in report["devices"]}[2] == "unknown"
    assert {d["activity_source"] for d in report["devices"]} == {None}


def test_dcgm_asked_for_without_libdcgm_is_bad_input(capsys) -> None:
    status = diagnose.run(parse("--simulate", "pre-hopper", "--dcgm", "standalone"))
    assert status == 2
    assert "dcgm.mode is standalone" in capsys.readouterr().err


def test_the_text_report_says_where_activity_came_from(capsys) -> None:
    diagnose.run(parse("--simulate", "pre-hopper-dcgm", "--duration", "3", "--interval", "0.5"))
    assert "SM, tensor and DRAM of GPU 0, 1, 2, 3, 4: DCGM's profiling fields" in (
        capsys.readouterr().out
    )


def test_health_problems_need_attention(capsys, tmp_path: Path) -> None:
    """Health is the rule pack's: a pending remap, a down-trained busy link and uncorrectable
    ECC errors the volatile count still holds (counted before the run: only a GPU reset clears
    them) are its alerts (the link's pending, as its `for:` outlasts a profile)."""
    scenario = tmp_path / "sick.yaml"
    scenario.write_text(
        "name: sick\n"
        "defaults: {model: NVIDIA H200, values: {utilization: 0.98, sm_active: 0.9,"
        " tensor_active: 0.6, dram_active: 0.4}}\n"
        "devices:\n"
        "  - {}\n"
        "  - values: {row_remap_pending: 1, ecc_uncorrected_total: 2, pcie_generation: 3}\n"
    )
    status, report = run_json(capsys, "--simulate", str(scenario), "--duration", "1")
    healthy, sick = report["devices"]
    assert healthy["class"] == "tensor_bound" and healthy["problems"] == []
    assert healthy["health_findings"] == [] and healthy["next_steps_for"] == "tensor_bound"
    alerts = {f["alert"]: f["state"] for f in sick["health_findings"]}
    assert alerts == {
        "GpuRowRemapPending": "firing",
        "GpuPcieLinkGenerationDegraded": "pending",
        "GpuUncorrectableEccErrors": "firing",
    }
    assert len(sick["problems"]) == 3 and all(p.startswith("Gpu") for p in sick["problems"])
    # A finding, so not also a note.
    assert not any("uncorrectable ECC error(s)" in n for n in sick["notes"])
    assert sick["next_steps_for"] == "health" and sick["next_steps"][0].startswith("Drain")
    assert status == diagnose.EXIT_ATTENTION


def test_terminal_report_has_the_matrix_and_no_colour_off_a_tty() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter.diagnose", "--simulate", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = result.stdout
    assert result.returncode == diagnose.EXIT_ATTENTION, result.stderr
    assert not ANSI.search(out)
    for heading in ("Versions:", "Topology (as nvidia-smi topo -m):", "Activity profile ("):
        assert heading in out
    assert re.search(r"^  GPU0\s+X\s+NV18", out, re.MULTILINE)
    assert "CPU Affinity" in out and "Legend:" in out
    assert "4. Hot spots: what to look at next" in out and "Exit status 1" in out
    assert re.search(r"^  4\s.*launch_bound\s+ml/trainer-0$", out, re.MULTILINE)  # with its pod


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_tty_and_when_allowed(monkeypatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert diagnose.use_colour(parse(), _Tty())
    assert not diagnose.use_colour(parse(), io.StringIO())
    assert not diagnose.use_colour(parse("--no-color"), _Tty())
    assert not diagnose.use_colour(parse("--json"), _Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not diagnose.use_colour(parse(), _Tty())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--duration", "0"], "--duration"),
        (["--duration", "-3"], "--duration"),
        (["--interval", "0.05"], "--interval"),
        (["--duration", "1", "--interval", "2"], "must not exceed"),
        (["--simulate", "no-such-scenario"], "no such scenario"),
        (["--start-timeout", "0"], "--start-timeout must be > 0"),
        (["--start-timeout", "1e9"], "--start-timeout must be > 0 and at most 3600"),
    ],
)
def test_bad_input_exits_2(capsys, argv: list[str], message: str) -> None:
    assert diagnose.run(parse(*argv)) == diagnose.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_bad_flag_exits_2() -> None:
    with pytest.raises(SystemExit) as exit_info:
        diagnose.main(["--duration", "soon"])
    assert exit_info.value.code == 2


def test_no_driver_exits_3_with_a_hint(capsys, monkeypatch) -> None:
    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    assert diagnose.run(parse("--duration", "1")) == diagnose.EXIT_NO_DRIVER
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "libnvidia-ml.so.1 was not found" in captured.err
    assert "gpu-exporter diagnose --simulate" in captured.err


HANG_MS = 600_000  # longer than any test: the call never answers while diagnose waits
LIVENESS_SECONDS = 30  # diagnose gives up after --start-timeout 1 (and its close), never hangs


def diagnose_process(tmp_path: Path, spec: dict[str, Any], *argv: str) -> tuple[int, str, str]:
    """`gpu-exporter diagnose` in its own interpreter (its hung fake-NVML calls die with it)."""
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(json.dumps(spec))  # JSON is YAML
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter.diagnose", "--simulate", str(scenario), *argv],
        capture_output=True,
        text=True,
        timeout=LIVENESS_SECONDS,
        check=False,
    )
    return result.returncode, result.stdout, result.stderr


@pytest.mark.parametrize("hung", ["nvmlInitWithFlags", "nvmlDeviceGetCount_v2"])
def test_a_hung_nvml_start_exits_3_naming_the_step_and_how_long(tmp_path: Path, hung: str) -> None:
    spec = {
        "name": "hung-init",
        "devices": [{"label": "a"}],
        "latency": {"functions": {hung: HANG_MS}},
    }
    status, out, err = diagnose_process(tmp_path, spec, "--duration", "1", "--start-timeout", "1")
    assert status == diagnose.EXIT_NO_DRIVER, err
    assert out == ""
    assert re.search(r"NVML does not answer: NVML init not finished after 1\.\ds", err), err
    assert "(--start-timeout 1)" in err and "nvidia-smi" in err
    assert "Traceback" not in err


def test_gpus_whose_identity_reads_hang_at_start_are_down_with_their_reasons(
    tmp_path: Path,
) -> None:
    """Two GPUs unidentified at start (their UUID, their handle read hangs): each is its own
    entry, down, with the call that hung; the others are diagnosed as usual."""
    hang = {"at": 0, "kind": "hang", "duration": HANG_MS / 1000}
    spec = {
        "name": "hung-gpus",
        "defaults": {"model": "NVIDIA H200", "values": {"utilization": 0.9, "sm_active": 0.8}},
        "devices": [{"label": "a"}, {"label": "no uuid"}, {"label": "no handle"}, {"label": "d"}],
        "faults": [
            {**hang, "device": 1, "function": "nvmlDeviceGetUUID"},
            {**hang, "device": 2, "function": "nvmlDeviceGetHandleByIndex_v2"},
        ],
    }
    status, out, err = diagnose_process(
        tmp_path, spec, "--json", "--duration", "1", "--interval", "0.5"
    )
    assert status == diagnose.EXIT_ATTENTION, err
    devices = json.loads(out)["devices"]
    assert [(d["index"], d["up"]) for d in devices] == [
        (0, True),
        (1, False),
        (2, False),
        (3, True),
    ]
    assert devices[1]["down_reason"] == "NVML call nvmlDeviceGetUUID did not answer in time"
    assert devices[2]["down_reason"] == (
        "NVML call nvmlDeviceGetHandleByIndex did not answer in time"
    )
    for down in devices[1:3]:
        assert down["uuid"] == "" and down["class"] is None and down["problems"]
    assert devices[0]["uuid"] and devices[0]["class"] is not None


# -- MIG -----------------------------------------------------------------------------------------


def mig_layout() -> list[Any]:
    """The `mig` scenario's GPUs as the production source enumerates them (UUIDs and MIG UUIDs
    are derived from the scenario, so diagnose's own run sees the same)."""
    from gpu_exporter import sim
    from gpu_exporter.collect.nvml.source import NvmlConfig, NvmlSource
    from gpu_exporter.collect.source import ErrorLog

    clock = ManualClock()
    sim.install("mig", clock=clock)
    source = NvmlSource(settings=NvmlConfig(xid_events=False), errors=ErrorLog(), clock=clock)
    try:
        source.start()
        clock.advance(1.0)
        return source.sample()
    finally:
        source.close()
        sim.uninstall()


def by_gi(device: dict[str, Any]) -> dict[tuple[int, int | None], dict[str, Any]]:
    return {(i["gpu_instance"], i["compute_instance"]): i for i in device["instances"]}


@pytest.fixture(scope="module")
def mig_kubelet() -> Iterator[FakeKubelet]:
    """A kubelet with pods on MIG instances (by MIG UUID, the pre-R470 id and GKE's id) and
    on the whole GPU."""
    seven, mixed, whole, a100 = mig_layout()
    launch = next(i for i in seven.instances if i.gpu_instance == 9)
    shared = [i for i in a100.instances if i.gpu_instance == 1]
    kubelet = FakeKubelet().start()
    kubelet.set_pods(
        [
            pod("infer", "spin", {"srv": [("nvidia.com/mig-1g.18gb", [launch.mig_uuid])]}),
            pod("train", "big", {"main": [("nvidia.com/gpu", [f"MIG-{mixed.uuid}/1/0"])]}),
            pod("gke", "small", {"main": [("nvidia.com/gpu", ["nvidia1/gi13"])]}),
            pod("a", "ci1", {"main": [("nvidia.com/mig-1c.3g.40gb", [shared[1].mig_uuid])]}),
            pod("whole", "job", {"main": [("nvidia.com/gpu", [whole.uuid])]}),
        ]
    )
    try:
        yield kubelet
    finally:
        kubelet.close()


def test_mig_lists_instances_under_their_parents_with_class_and_pod(
    capsys, mig_kubelet: FakeKubelet
) -> None:
    status, report = run_json(
        capsys, "--simulate", "mig", "--duration", "2", "--interval", "0.5",
        "--kubelet-socket", mig_kubelet.socket_path,
    )  # fmt: skip
    assert report["pods"] == {
        "kubelet_socket": mig_kubelet.socket_path,
        "read": True,
        "devices_held": 5,
        "runtime_socket": None,  # processes are not mapped without --processes
        "runtime_read": False,
    }
    seven, mixed, whole, a100 = report["devices"]
    # MIG parents: no class of their own (not "unknown", not down), their instances listed.
    for parent, count in ((seven, 7), (mixed, 4), (a100, 5)):
        assert parent["up"] is True and parent["mig"] == {"current": True, "pending": True}
        assert parent["class"] is None and parent["next_steps"] == []
        assert "MIG is on" in parent["class_reason"]
        assert len(parent["instances"]) == count
        assert parent["profile"]["utilization"] is None
        assert parent["profile"]["link_utilization"] is not None  # the GPU's links
    assert whole["mig"] == {"current": False, "pending": False} and whole["instances"] == []
    assert whole["class"] == "tensor_bound"
    assert whole["pods"] == [{"namespace": "whole", "pod": "job", "container": "main"}]

    gis = by_gi(seven)
    assert sorted(gis) == [(gi, None) for gi in range(7, 14)]  # by GPU instance
    launch = gis[9, None]
    assert launch["mig_profile"] == "1g.18gb" and launch["mig_uuid"].startswith("MIG-")
    assert launch["class"] == "launch_bound"
    assert launch["pods"] == [{"namespace": "infer", "pod": "spin", "container": "srv"}]
    assert launch["problems"] and launch["problems"][0].startswith("launch_bound")
    assert launch["next_steps"] == list(diagnose.NEXT_STEPS["launch_bound"])  # as a whole GPU's
    assert launch["profile"]["utilization"] > 0.9 > 0.2 > launch["profile"]["sm_active"]
    assert launch["size"] == {
        "gpu_slices": 1,
        "compute_slices": 1,
        "multiprocessors": 16,
        "memory_bytes": 17999855616,
    }
    assert launch["memory_used_bytes"] == 4294967296
    assert gis[12, None]["class"] == "idle" and gis[12, None]["problems"] == []
    others = [i for key, i in gis.items() if key[0] not in (9, 12)]
    assert {i["class"] for i in others} == {"tensor_bound"}
    assert all(i["pods"] == [] and i["problems"] == [] for i in others)
    # The parent's own problems stay its own; its health counts the instance's.
    assert seven["problems"] == []

    mixed_gis = by_gi(mixed)
    assert sorted(mixed_gis) == [(1, None), (5, None), (13, None), (14, None)]
    assert mixed_gis[1, None]["pods"][0]["pod"] == "big"  # the pre-R470 id
    assert mixed_gis[13, None]["pods"][0]["pod"] == "small"  # GKE's id
    assert mixed_gis[5, None]["mig_profile"] == "2g.35gb"  # before the reconfiguration at 90 s

    # A100: no GPM, so no activity: said so, not a generic unknown, and no problem.
    a100_gis = by_gi(a100)
    assert sorted(a100_gis) == [(1, 0), (1, 1), (1, 2), (5, None), (14, None)]
    for instance in a100_gis.values():
        assert instance["class"] == "unknown" and instance["problems"] == []
        assert instance["activity_unavailable"].startswith("activity unavailable: no GPM")
        assert "Hopper" in instance["class_reason"]
        assert instance["next_steps"] == list(diagnose.MIG_NO_GPM_STEPS)
        assert instance["profile"]["sm_active"] is None
    assert a100_gis[1, 1]["pods"][0]["pod"] == "ci1" and a100_gis[1, 0]["pods"] == []
    assert a100_gis[1, 0]["mig_profile"] == "1c.3g.40gb"
    assert a100_gis[1, 0]["memory_used_bytes"] is None  # the GPU instance's, not a CI's
    assert a100_gis[14, None]["memory_used_bytes"] == 2147483648
    # No instances on the H200s say that: theirs is measured.
    assert all(i["activity_unavailable"] is None for i in [*gis.values(), *mixed_gis.values()])

    assert report["needs_attention"] is True and status == diagnose.EXIT_ATTENTION


def test_mig_terminal_report_puts_instances_under_their_gpu(mig_kubelet: FakeKubelet) -> None:
    result = subprocess.run(
        [
            sys.executable, "-m", "gpu_exporter.diagnose", "--simulate", "mig",
            "--duration", "1", "--interval", "0.5", "--kubelet-socket", mig_kubelet.socket_path,
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == diagnose.EXIT_ATTENTION, result.stderr
    assert f"Pods: from the kubelet at {mig_kubelet.socket_path} (5 device(s) held" in out
    profile = out.split("Activity profile (")[1].split("Time by category")[0]
    lines = profile.splitlines()
    assert re.search(r"^  GPU\s+util .* class\s+pod$", lines[1])
    parent = next(n for n, line in enumerate(lines) if re.match(r"^  0\s", line))
    assert lines[parent].split()[-2:] == ["instances", "-"]
    assert "MIG: 7 instances" in lines[parent]
    # Its seven instances follow it, indented, each with its class and pod.
    under = lines[parent + 1 : parent + 8]
    assert all(line.startswith("    GI ") for line in under), under
    assert re.search(r"^    GI 9 1g\.18gb\s+0\.9\d\s+0\.1\d.*launch_bound\s+infer/spin$", under[2])
    assert re.search(r"^    GI 12 1g\.18gb .*idle\s+-$", under[5])
    assert re.search(r"^  2\s.*tensor_bound\s+whole/job$", profile, re.MULTILINE)
    assert re.search(r"^    GI 1 CI 1 1c\.3g\.40gb\s+n/a.*unknown\s+a/ci1$", profile, re.MULTILINE)
    assert "n/a (down)" not in out  # a MIG parent is not a GPU that is down
    next_steps = out.split("4. Hot spots")[1].split("Needs attention")[0]
    assert "launch_bound (GPU 0 GI 9)" in next_steps and "Nsight Systems" in next_steps
    assert "activity unavailable: no GPM before Hopper" in next_steps
    assert re.search(r"unknown \(GPU 3 GI 1 CI 0, GPU 3 GI 1 CI 1, GPU 3 GI 1 CI 2, ", next_steps)
    attention = out.split("Needs attention")[1]
    assert re.search(r"^  GPU 0 GI 9: launch_bound: ", attention, re.MULTILINE)
    assert "GPU 3" not in attention  # activity unavailable is not a problem
    # The GPU is healthy: a launch-bound instance is the job's problem, not the hardware's.
    assert re.search(r"^  0\s+NVIDIA H200 .*\sok$", out, re.MULTILINE)
    assert "problem(s)" not in out


def test_mig_lists_instances_with_class_and_the_scenarios_pods(capsys) -> None:
    """The built-in `mig` scenario has pods: diagnose reads them from the fake kubelet it
    runs, through the production attribution path, and names them per instance."""
    status = diagnose.run(parse("--simulate", "mig", "--duration", "0.5", "--interval", "0.5"))
    out = capsys.readouterr().out
    assert status == diagnose.EXIT_ATTENTION
    assert "Pods: from the kubelet at" in out
    time_sliced = r"infer/chat-small-0, infer/chat-small-1"
    assert re.search(rf"^    GI 9 1g\.18gb .*launch_bound\s+{time_sliced}$", out, re.M)
    assert re.search(r"^    GI 1 CI 0 1c\.3g\.40gb .*unknown\s+batch/ocr-0$", out, re.M)


def test_mig_without_a_kubelet_has_no_pod_column(capsys, tmp_path: Path) -> None:
    import yaml

    from gpu_exporter.sim.scenario import builtin_path

    data = yaml.safe_load(builtin_path("mig").read_text())
    del data["pods"]
    scenario = tmp_path / "mig-no-pods.yaml"
    scenario.write_text(yaml.safe_dump(data))
    status = diagnose.run(
        parse("--simulate", str(scenario), "--duration", "0.5", "--interval", "0.5")
    )
    out = capsys.readouterr().out
    assert status == diagnose.EXIT_ATTENTION
    assert "Pods:" not in out and not re.search(r"class\s+pod$", out, re.MULTILINE)
    assert re.search(r"^    GI 9 1g\.18gb .*launch_bound$", out, re.MULTILINE)


def test_an_unanswering_kubelet_is_said_and_changes_nothing_else(capsys, tmp_path: Path) -> None:
    missing = str(tmp_path / "kubelet.sock")
    status, report = run_json(
        capsys, "--simulate", "mig", "--duration", "0.5", "--interval", "0.5",
        "--kubelet-socket", missing,
    )  # fmt: skip
    assert report["pods"] == {
        "kubelet_socket": missing,
        "read": False,
        "devices_held": 0,
        "runtime_socket": None,
        "runtime_read": False,
    }
    assert all(not i["pods"] for d in report["devices"] for i in d["instances"])
    assert status == diagnose.EXIT_ATTENTION  # GI 9 is launch-bound, as with pods
