"""The settings `gpu-exporter diagnose` checks: the fake NVML's calls as nvml.h documents them,
the scenario keys behind them, and the checks end to end through the production reader."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpu_exporter import diagnose, sim
from gpu_exporter.sim.scenario import ScenarioError, load_scenario

SETTINGS_CALLS = (
    ("nvmlDeviceGetPowerManagementDefaultLimit", ()),
    ("nvmlDeviceGetPowerManagementLimitConstraints", ()),
    ("nvmlDeviceGetApplicationsClock", (pynvml.NVML_CLOCK_SM,)),
    ("nvmlDeviceGetDefaultApplicationsClock", (pynvml.NVML_CLOCK_MEM,)),
)


@pytest.fixture
def faults_nvml() -> Iterator[None]:
    sim.install("faults")
    pynvml.nvmlInit()
    try:
        yield
    finally:
        pynvml.nvmlShutdown()
        sim.uninstall()


def test_fake_answers_the_settings_calls_in_nvml_units(faults_nvml) -> None:
    h100 = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h100) == 700_000  # mW
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h100) == 650_000
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h100) == [350_000, 700_000]
    assert pynvml.nvmlDeviceGetPersistenceMode(h100) == pynvml.NVML_FEATURE_DISABLED
    assert pynvml.nvmlDeviceGetApplicationsClock(h100, pynvml.NVML_CLOCK_SM) == 1410
    assert pynvml.nvmlDeviceGetApplicationsClock(h100, pynvml.NVML_CLOCK_GRAPHICS) == 1410
    assert pynvml.nvmlDeviceGetDefaultApplicationsClock(h100, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetComputeMode(h100) == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert pynvml.nvmlDeviceGetEccMode(h100) == [1, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no video application clock
        pynvml.nvmlDeviceGetApplicationsClock(h100, pynvml.NVML_CLOCK_VIDEO)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetApplicationsClock(h100, 42)


@pytest.mark.parametrize(("call", "args"), SETTINGS_CALLS)
def test_a_consumer_board_answers_not_supported(faults_nvml, call: str, args: tuple) -> None:
    consumer = pynvml.nvmlDeviceGetHandleByIndex(3)  # power_limit, applications_clocks off
    with pytest.raises(pynvml.NVMLError_NotSupported):
        getattr(pynvml, call)(consumer, *args)
    assert pynvml.nvmlDeviceGetComputeMode(consumer) == pynvml.NVML_COMPUTEMODE_DEFAULT


def test_a_management_limit_outside_its_range_names_file_field_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\ndevices:\n  - power_limit_watts: 650\n    power_limit_range_watts: [700, 900]\n"
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    message = str(err.value)
    assert message.startswith(f"{path}:4: devices[0].power_limit_range_watts: "), message
    assert "650 W lies outside power_limit_range_watts [700, 900]" in message
    path.write_text("name: bad\ndevices:\n  - compute_mode: shared\n")
    with pytest.raises(ScenarioError, match=r":3: devices\[0\]\.compute_mode: "):
        load_scenario(path)


MISCONFIGURED = """\
name: misconfigured
defaults: {model: NVIDIA H200, values: {utilization: 0.98, sm_active: 0.9, tensor_active: 0.7,
           dram_active: 0.4}}
devices:
  - {ecc_pending: false, compute_mode: prohibited}
  - {compute_mode: exclusive_process, power_limit_watts: 750, power_default_limit_watts: 700,
     power_limit_range_watts: [350, 800]}
  - {}
"""


def test_settings_warnings_need_attention_and_notes_do_not(capsys, tmp_path: Path) -> None:
    scenario = tmp_path / "misconfigured.yaml"
    scenario.write_text(MISCONFIGURED)
    status = diagnose.main(
        ["--simulate", str(scenario), "--duration", "1", "--interval", "0.5", "--json"]
    )
    report = json.loads(capsys.readouterr().out)
    first, second, third = report["devices"]
    levels = {f["setting"]: f["level"] for f in first["config"]["findings"]}
    assert levels == {"ecc_mode": "warning", "compute_mode": "warning"}
    assert first["config"]["settings"]["ecc_pending"] is False
    assert any("ECC is on but set to off at the next reboot" in p for p in first["problems"])
    assert any("compute mode is Prohibited" in p for p in first["problems"])
    # Raised limit and exclusive-process mode are choices, not faults: notes only.
    assert {f["setting"]: f["level"] for f in second["config"]["findings"]} == {
        "power_limit": "note",
        "compute_mode": "note",
    }
    assert second["problems"] == [] and len(second["notes"]) == 2
    assert third["config"]["findings"] == [] and third["problems"] == []
    assert third["config"]["settings"]["compute_mode"] == "default"
    assert status == diagnose.EXIT_ATTENTION


def test_healthy_defaults_need_no_attention(capsys, tmp_path: Path) -> None:
    scenario = tmp_path / "fine.yaml"
    scenario.write_text(MISCONFIGURED.split("devices:")[0] + "devices:\n  - {}\n")
    status = diagnose.main(
        ["--simulate", str(scenario), "--duration", "1", "--interval", "0.5", "--json"]
    )
    report = json.loads(capsys.readouterr().out)
    (device,) = report["devices"]
    assert device["config"]["findings"] == [] and device["problems"] == []
    assert status == diagnose.EXIT_OK


def test_a_hung_settings_read_costs_that_gpu_its_settings_not_the_report(tmp_path: Path) -> None:
    """The settings are read once after the profile; a call that never answers leaves that
    GPU's settings unavailable (why is said) and the report still comes, in bounded time."""
    import subprocess
    import sys

    scenario = tmp_path / "hung-settings.yaml"
    scenario.write_text(
        MISCONFIGURED.split("devices:")[0]
        + "devices:\n  - {}\n  - {}\n"
        # Persistence mode: read by the settings read alone, never by a tick (a hung tick call
        # would make the GPU stop answering during the profile, another story).
        + "faults:\n  - {at: 0, device: 1, kind: hang, duration: 600,"
        + " function: nvmlDeviceGetPersistenceMode}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter.diagnose", "--simulate", str(scenario), "--json",
         "--duration", "1", "--interval", "0.5"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    report = json.loads(result.stdout)
    answered, hung = report["devices"]
    assert answered["config"]["settings"]["power_default_limit_watts"] is not None
    assert hung["config"]["settings"] is None
    assert hung["config"]["unavailable"].startswith("no answer within")
    assert hung["up"] is True and hung["class"] == "tensor_bound"  # the profile was unaffected
    assert result.returncode == diagnose.EXIT_OK, result.stderr
