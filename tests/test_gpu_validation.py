"""bench/gpu_validation.py without a GPU: argument handling, the report and its summary."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_script():
    spec = importlib.util.spec_from_file_location(
        "gpu_validation", ROOT / "bench/gpu_validation.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_validation"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gv():
    return load_script()


def test_runs_on_the_fake_and_writes_json_and_summary(gv, tmp_path: Path, fake_nvml) -> None:
    output = tmp_path / "out" / "validation.json"
    # Phases long enough that a loaded machine (CI runs several tests per core) still fits
    # several ticks and 1 s sampling periods in each: the energy rate (over tick times, taken
    # before the reads) and the per-process shares asserted below wobble in a short phase.
    argv = ["--simulate", "mixed", "--seconds", "4", "--warmup", "0.1", "--interval", "0.3"]
    argv += ["--calls", "10", "--workloads", "idle", "matmul_bf16", "tiny_kernels"]
    assert gv.main([*argv, "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    assert report["simulated"] is True
    assert set(report["workloads"]) == {"idle", "matmul_bf16", "tiny_kernels"}
    phase = report["workloads"]["idle"]
    assert phase["samples"] >= 3
    gpu4 = phase["devices"]["4"]  # the launch-bound GPU of the mixed scenario
    assert gpu4["gpu_utilization_ratio"]["mean"] >= 0.9
    assert gpu4["gpu_sm_active_ratio"]["mean"] < 0.2
    assert gpu4["gpu_energy_joules_total"]["rate_per_second"] == pytest.approx(190, rel=0.15)
    assert phase["series_gpu0"][0]["up"] is True
    # The daemon's classifier runs on the samples: the fake's launch-bound GPU 4 is named so.
    assert phase["class"]["4"] == "launch_bound"
    assert phase["class"]["0"] == "idle"
    assert report["fields"]["hw_thermal_ns"]["return"] == 0
    assert report["gpm_short_windows"]["supported"] is True
    assert report["memory_info"]["v2"]["reserved"] > 0
    # What the compat issue reads: answered by the fake as nvml.h says a Hopper GPU would.
    assert report["fields"]["board_limit_violation_ns"]["return"] == 0
    assert report["fields"]["nvlink_crc_flit_errors"]["return"] == 0
    assert (
        report["calls"]["power_management_limit_mw"] >= report["calls"]["enforced_power_limit_mw"]
    )
    assert len(report["calls"]["encoder_utilization"]) == 2  # [percent, sampling period us]
    compat = report["dcgm_compat"]
    assert "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE" in compat["families"]
    assert compat["gpu0_lines"]["DCGM_FI_DEV_GPU_TEMP"].startswith(
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID='
    )
    # Field 230 and the fabric info, on every GPU: the mixed scenario's H200s have no fabric.
    health = report["health"]
    assert set(health) == {str(i) for i in range(len(report["devices"]))}
    assert health["0"]["recovery_action"] == {
        "return": 0,
        "value": 0.0,
        "value_type": 1,
        "action": "none",
    }
    assert health["0"]["fabric"] == {
        "v3": {"error": "NVMLError_NotSupported"},
        "v2": {"error": "NVMLError_NotSupported"},
    }
    assert "GPU 0: recovery action none (field 230 = 0); fabric v3 NVMLError_NotSupported" in (
        output.with_suffix(".md").read_text()
    )
    assert report["call_latency"]["power_usage"]["calls"] >= 3
    assert report["microbench"]["nvmlDeviceGetPcieThroughput"]["p50_ms"] >= 19  # fake's model
    summary = output.with_suffix(".md").read_text()
    assert "| idle |" in summary and "| tiny_kernels |" in summary
    assert "power_usage" in summary
    # Per process: the fake lists the workload child under its real PID on GPU 0, busy in
    # matmul and idle in idle (SIMULATED_CHILD_SM), sampled once a second.
    found = report["processes"]
    child = found["child_pid"]
    assert found["euid"] == os.geteuid()
    compute = found["calls"]["nvmlDeviceGetComputeRunningProcesses"]
    assert compute["outcome"] == "ok" and compute["child_listed"] is True
    assert compute["child_memory_bytes"] == gv.SIMULATED_CHILD_MEMORY
    assert found["calls"]["nvmlDeviceGetProcessesUtilizationInfo"]["outcome"] in (
        "ok",
        "NVMLError_NotFound",
    )
    assert found["utilization_call"] == "nvmlDeviceGetProcessesUtilizationInfo"
    assert found["sample_period_ms"] == 1000.0  # the fake's period: its stamps' spacing
    assert found["device_sample_period_ms"] == 1000.0  # nvmlDeviceGetSamples': the same
    short = found["short_reads"]
    assert short["poll_seconds"] == 0.1 and short["busy_polls"] > short["busy_not_found"] > 0
    assert short["not_found_when_sooner_than_the_period"] is True
    assert found["no_permission"] is False
    assert found["mps_client_pids"].startswith("not verified")
    assert str(child) in found["simulated_child"]
    for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetProcessesUtilizationInfo"):
        assert found["latency"][call]["calls"] > 10
    matmul = report["workloads"]["matmul_bf16"]["processes"]
    assert matmul["collector"]["listed"] == matmul["collector"]["ticks"] >= 3
    assert matmul["collector"]["gpus"] == [0]
    # (a tick with no period ended since the last repeats the last shares read: not asserted)
    assert matmul["collector"]["sm_share_max"] == pytest.approx(0.95)
    assert matmul["collector"]["sm_share_mean"] > 0
    assert matmul["probe"]["pids_sampled"] == [child]
    assert matmul["probe"]["child_sm_mean_of_samples"] == pytest.approx(0.95)
    assert matmul["probe"]["process_stamps_on_device_stamps"] == 1.0  # one sampler, assumed
    idle = report["workloads"]["idle"]["processes"]
    assert idle["collector"]["sm_share_mean"] == 0.0 and idle["probe"]["child_samples"] == 0
    assert report["call_latency"]["compute_processes"]["calls"] >= 3  # the collector's own
    checks = report["checks"]
    assert [checks[name]["passed"] for name in checks if name.startswith("processes")] == [
        True,
        True,
        True,
    ]
    assert f"workload child PID {child}" in summary and "| matmul_bf16 | " in summary


def test_rejects_a_run_over_the_time_budget(gv) -> None:
    with pytest.raises(SystemExit) as exit_info:
        gv.parse_args(["--seconds", "100"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("argv", [["--seconds", "0"], ["--interval", "-1"], ["--workloads", "x"]])
def test_rejects_bad_arguments(gv, argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        gv.parse_args(argv)


def test_percentile(gv) -> None:
    values = [float(v) for v in range(1, 101)]
    assert gv.percentile(values, 0.5) == 50
    assert gv.percentile(values, 0.99) == 99
    assert gv.percentile([3.0], 0.99) == 3


def test_acceptance_checks_judge_measured_values(gv) -> None:
    def phase(**means: float) -> dict:
        return {"devices": {"0": {k: {"mean": v} for k, v in means.items()}}}

    report = {
        "workloads": {
            "idle": phase(gpu_sm_active_ratio=0.01),
            "matmul_bf16": phase(gpu_tensor_active_ratio=0.1, gpu_utilization_ratio=0.99),
        }
    }
    report["workloads"]["matmul_bf16"]["devices"]["0"]["gpu_energy_joules_total"] = {
        "mean": 0.0,
        "rate_per_second": 690.0,
    }
    report["workloads"]["matmul_bf16"]["devices"]["0"]["gpu_power_watts"] = {"mean": 700.0}
    report["workloads"]["matmul_bf16"]["processes"] = {
        "collector": {"listed_with_memory_ratio": 0.5, "sm_share_mean": 0.9}
    }
    report["workloads"]["idle"]["processes"] = {"collector": {"sm_share_mean": 0.2}}
    checks = gv.acceptance_checks(report)
    assert (
        checks["processes, matmul: the workload's PID listed with memory, every tick"]["passed"]
        is False
    )
    assert checks["processes, matmul: the workload's SM share above 0"]["passed"] is True
    assert checks["processes, idle: the workload's SM share below 0.05"]["passed"] is False
    assert checks["idle: SM activity below 0.05"]["passed"] is True
    assert checks["matmul: Tensor activity above 0.3"]["passed"] is False
    assert checks["matmul: energy rate close to power"]["passed"] is True
    assert checks["h2d copy: PCIe rx above 5 GB/s"]["passed"] is None  # not measured


def test_a_broken_run_still_writes_what_it_has(gv, tmp_path, monkeypatch, fake_nvml) -> None:
    def explode(*args, **kwargs):
        raise RuntimeError("the GPU caught fire")

    monkeypatch.setattr(gv, "microbench", explode)
    output = tmp_path / "v.json"
    argv = ["--simulate", "mixed", "--seconds", "0.5", "--warmup", "0", "--workloads", "idle"]
    assert gv.main([*argv, "--output", str(output)]) == 1
    report = json.loads(output.read_text())
    assert "RuntimeError: the GPU caught fire" in report["failure"]
    assert report["workloads"]["idle"]["samples"] >= 1
    assert "Run failed part-way" in output.with_suffix(".md").read_text()


def test_mig_is_reported_where_it_is_enabled_and_compared_with_the_daemon(
    gv, tmp_path: Path, fake_nvml
) -> None:
    output = tmp_path / "mig.json"
    argv = ["--simulate", "mig", "--seconds", "0.5", "--warmup", "0", "--interval", "0.3"]
    argv += ["--calls", "5", "--workloads", "idle", "--output", str(output)]
    assert gv.main(argv) == 0
    mig = json.loads(output.read_text())["mig"]
    assert [mig[str(i)]["mode"] for i in range(4)] == [[1, 1], [1, 1], [0, 0], [1, 1]]
    assert "nvml" not in mig["2"]  # MIG off: nothing to list
    assert len(mig["0"]["nvml"]) == 7 and mig["0"]["agree"] is True
    assert len(mig["3"]["nvml"]) == 5 and mig["3"]["agree"] is True  # 3 CIs + 2g + 1g
    listed = {i["mig_uuid"] for i in mig["1"]["nvml"]}
    assert listed == {i["mig_uuid"] for i in mig["1"]["daemon"]}
    summary = output.with_suffix(".md").read_text()
    assert "MIG on GPU 0: mode [1, 1]; 7 MIG devices, daemon agrees: True" in summary
    # GPU 0 has MIG on: the fake cannot list the child there, and nothing is claimed of it.
    report = json.loads(output.read_text())
    assert report["processes"]["simulated_child"] == "not registered: GPU 0 has MIG on"
    assert report["checks"]["processes, idle: the workload's SM share below 0.05"]["passed"] is None


def test_health_reads_record_what_the_driver_answered(gv, tmp_path: Path, fake_nvml) -> None:
    """The faults scenario: a fabric on the H100s (GPU 0 degraded from 20 s; read at the
    start, healthy), none on the consumer card, which has field 230 too (Ada)."""
    output = tmp_path / "faults.json"
    argv = ["--simulate", "faults", "--seconds", "0.5", "--warmup", "0", "--interval", "0.3"]
    argv += ["--calls", "5", "--workloads", "idle", "--output", str(output)]
    gv.main(argv)  # the scenario's hang and lost GPU may fail checks; the reads are recorded
    health = json.loads(output.read_text())["health"]
    fabric = health["0"]["fabric"]
    assert fabric["v3"]["state"] == 3 and fabric["v3"]["status"] == 0
    assert fabric["v3"]["health_summary"] == 1 and fabric["v2"]["health_summary"] is None
    assert fabric["v3"]["health_mask"] == fabric["v2"]["health_mask"] == "0x1aa"
    assert fabric["exported"]["gpu_fabric_state{state='completed'}"] == 1.0
    assert fabric["exported"]["gpu_fabric_health_issue{issue='degraded_bandwidth'}"] == 0.0
    assert health["3"]["fabric"]["v3"] == {"error": "NVMLError_NotSupported"}
    assert health["3"]["recovery_action"]["action"] == "none"
    summary = output.with_suffix(".md").read_text()
    assert "GPU 0: recovery action none (field 230 = 0); fabric v3 state 3, status 0" in summary
