"""Scenario loading, validation errors and value specs (gpu_exporter/sim/scenario.py)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from gpu_exporter import sim
from gpu_exporter.sim.fake_nvml import implemented_functions
from gpu_exporter.sim.scenario import (
    CLOCK_EVENT_REASONS,
    FEATURES,
    MAX_DEVICES,
    QUANTITIES,
    TOPOLOGY_LEVELS,
    ScenarioError,
    ValueSpec,
    load_scenario,
)
from gpu_exporter.support.validation import InputError


def _one_device(**values: object) -> dict:
    return {"name": "t", "devices": [{"values": values}]}


def _spec(quantity: str, spec: object) -> ValueSpec:
    return load_scenario(_one_device(**{quantity: spec})).devices[0].values[quantity]


# -- built-ins ------------------------------------------------------------------------------


def test_builtin_names() -> None:
    assert sim.builtin_scenarios() == [
        "dra",
        "faults",
        "mig",
        "mixed",
        "pre-hopper",
        "pre-hopper-dcgm",
        "shared",
    ]


@pytest.mark.parametrize("name", sim.builtin_scenarios())
def test_every_builtin_loads(name: str) -> None:
    scenario = load_scenario(name)
    assert scenario.name == name
    assert scenario.devices
    assert len({d.uuid for d in scenario.devices}) == len(scenario.devices)
    assert len({d.pci_bus_id for d in scenario.devices}) == len(scenario.devices)


def test_mixed_builtin_shape() -> None:
    s = load_scenario("mixed")
    assert [d.model for d in s.devices] == ["NVIDIA H200"] * 8
    assert {d.architecture for d in s.devices} == {"hopper"}
    assert [d.numa_node for d in s.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(d.nvlink_links == 18 and d.power_limit_watts == 700 for d in s.devices)
    idle, compute, _, _, launch, thermal, power, link = s.devices
    assert idle.value("clock_event_reasons", 5) == CLOCK_EVENT_REASONS["gpu_idle"]
    assert compute.value("sm_active", 5) > 0.85
    assert launch.value("utilization", 5) > 0.9 > 0.2 > launch.value("sm_active", 5)
    assert int(thermal.value("clock_event_reasons", 5)) == 0x8 | 0x40
    assert int(power.value("clock_event_reasons", 5)) == 0x4 | 0x8 | 0x80
    assert link.value("nvlink_tx_bytes_per_second", 5) > 3e11


def test_pre_hopper_builtin_driver() -> None:
    s = load_scenario("pre-hopper")
    assert s.driver.version == "535.183.01"
    assert "nvmlDeviceGetCurrentClocksEventReasons" in s.driver.missing_functions
    assert s.driver.unsupported_fields == {269, 270, 271, 197, 198}
    assert not any(d.supports("gpm") for d in s.devices)


def test_faults_builtin_faults() -> None:
    s = load_scenario("faults")
    kinds = sorted((f.kind, f.device) for f in s.faults)
    assert kinds == [
        ("gpm_nan", 0),
        ("gpu_lost", 1),
        ("gpu_reset", 2),
        ("hang", 2),
        ("xid", 1),
        ("xid", 2),
    ]
    consumer = s.devices[3]
    assert consumer.architecture == "ada" and not consumer.supports("power_limit")


def test_load_from_path_and_unknown_name(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: mine\ndevices: [{}]\n")
    assert load_scenario(path).name == "mine"
    assert load_scenario(str(path)).source == str(path)
    builtins = r"\(built-ins: dra, faults, mig, mixed, pre-hopper, pre-hopper-dcgm, shared\)$"
    with pytest.raises(ScenarioError, match=builtins):
        load_scenario("no-such-scenario")


# -- defaults -------------------------------------------------------------------------------


def test_defaults_merge_under_devices() -> None:
    s = load_scenario(
        {
            "name": "t",
            "defaults": {
                "model": "NVIDIA A100-SXM4-80GB",
                "values": {"utilization": 0.5, "power_watts": 100},
                "max_clocks_mhz": {"sm": 1000},
            },
            "devices": [{}, {"values": {"power_watts": 200}, "max_clocks_mhz": {"memory": 900}}],
        }
    )
    first, second = s.devices
    assert first.architecture == "ampere"  # from the model table
    assert second.value("utilization", 0) == 0.5  # merged key by key
    assert (first.value("power_watts", 0), second.value("power_watts", 0)) == (100, 200)
    assert second.max_clocks_mhz["sm"] == 1000 and second.max_clocks_mhz["memory"] == 900
    assert first.value("sm_clock_mhz", 0) == 1000  # clocks default to the maximum


def test_unset_quantities_have_defaults_and_fallbacks() -> None:
    d = load_scenario(_one_device(dram_active=0.4, utilization=0.7)).devices[0]
    assert set(d.values) >= {"ecc_corrected_total", "pcie_width", "row_remap_failure"}
    assert d.value("memory_utilization", 3) == 0.4  # falls back to dram_active
    assert d.value("graphics_active", 3) == 0.7  # falls back to utilization
    assert d.value("pcie_generation", 3) == d.pcie_max_generation


def test_topology_levels() -> None:
    s = load_scenario(
        {
            "name": "t",
            "devices": [{}] * 6,
            "topology": [{"gpus": [0, 1], "level": "single"}],
        }
    )
    assert s.topology_level(0, 1) == TOPOLOGY_LEVELS["single"]
    assert s.topology_level(0, 2) == TOPOLOGY_LEVELS["node"]  # same default NUMA node
    assert s.topology_level(0, 5) == TOPOLOGY_LEVELS["system"]
    assert s.topology_level(3, 3) == TOPOLOGY_LEVELS["internal"]


# -- value specs ----------------------------------------------------------------------------


def test_constant_steps_ramp_pattern_sine() -> None:
    steps = _spec("power_watts", {"steps": [[10, 1], [20, 2]]})
    assert [steps.value_at(t) for t in (0, 10, 19.9, 20, 99)] == [1, 1, 1, 2, 2]
    ramp = _spec("power_watts", {"ramp": [[10, 0], [20, 100]]})
    assert [ramp.value_at(t) for t in (0, 10, 15, 20, 30)] == [0, 0, 50, 100, 100]
    pattern = _spec("power_watts", {"pattern": [[2, 5], [1, 7]]})
    assert [pattern.value_at(t) for t in (0, 1.9, 2, 2.9, 3, 5.5)] == [5, 5, 7, 7, 5, 7]
    sine = _spec("power_watts", {"sine": {"mean": 10, "amplitude": 4, "period": 8}})
    assert sine.value_at(2) == pytest.approx(14)
    assert sine.value_at(6) == pytest.approx(6)
    assert _spec("power_watts", 42).is_constant


def test_noise_is_deterministic_bounded_and_per_series() -> None:
    spec = _spec("power_watts", {"steps": [[0, 100]], "noise": 5})
    samples = [spec.value_at(t / 10) for t in range(200)]
    assert all(95 <= v <= 105 for v in samples)
    assert len(set(samples)) > 50  # it does vary
    assert samples == [spec.value_at(t / 10) for t in range(200)]
    other = _spec("temperature_celsius", {"steps": [[0, 100]], "noise": 5})
    assert [other.value_at(t / 10) for t in range(20)] != samples[:20]
    assert spec.value_at(1.01) == spec.value_at(1.09)  # constant within a 100 ms slot


def test_min_max_and_quantity_bounds_clamp() -> None:
    assert _spec("power_watts", {"ramp": [[0, 0], [10, 100]], "max": 30}).value_at(9) == 30
    ratio = _spec("utilization", {"steps": [[0, 0.99]], "noise": 0.5})
    assert all(0 <= ratio.value_at(t / 10) <= 1 for t in range(100))


def test_clock_event_reasons_forms() -> None:
    assert _spec("clock_event_reasons", ["sw_power_cap", "hw_slowdown"]).value_at(0) == 0xC
    steps = _spec("clock_event_reasons", {"steps": [[0, []], [5, ["hw_thermal_slowdown"]]]})
    assert (steps.value_at(4), steps.value_at(5)) == (0, 0x40)


def test_yaml12_exponents_are_numbers(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: t\ndevices:\n  - values: {pcie_tx_bytes_per_second: 1.5e9}\n")
    assert load_scenario(path).devices[0].value("pcie_tx_bytes_per_second", 0) == 1.5e9


# -- errors: file, field path, line ---------------------------------------------------------

BAD_FILES = {
    "unknown top-level key": (
        """
        name: t
        colour: blue  # <-
        devices: [{}]
        """,
        "colour: unknown key 'colour'",
    ),
    "mig instance ends before it starts": (
        """
        name: t
        devices:
          - model: NVIDIA H200
            architecture: hopper
            mig:
              instances:
                - {profile: 1g.18gb, from: 30, until: 30}  # <-
        """,
        "devices[0].mig.instances[0].until: `until` must be after `from`",
    ),
    "pod ends before it starts": (
        """
        name: t
        devices: [{}]
        pods:
          - {namespace: a, pod: b, gpu: 0, from: 20, until: 10}  # <-
        """,
        "pods[0].until: `until` must be after `from`",
    ),
    "bad steps pair": (
        """
        name: t
        devices:
          - {}
          - values:
              sm_active:
                steps:
                  - [0, 0.5]
                  - [10]  # <-
        """,
        "devices[1].values.sm_active.steps[1]: expected a [time, value] pair",
    ),
    "ratio out of range": (
        """
        name: t
        devices:
          - values:
              utilization: 1.5  # <-
        """,
        "devices[0].values.utilization: must be <= 1, got 1.5",
    ),
    "unknown reason": (
        """
        name: t
        devices:
          - values:
              clock_event_reasons:
                steps:
                  - [0, []]
                  - [5, [too_hot]]  # <-
        """,
        "devices[0].values.clock_event_reasons.steps[1][1][0]: unknown value 'too_hot'",
    ),
    "fault device out of range": (
        """
        name: t
        devices: [{}]
        faults:
          - {at: 3, device: 4, kind: xid, xid: 79}  # <-
        """,
        "faults[0].device: must be <= 0, got 4",
    ),
    "hang without duration": (
        """
        name: t
        devices: [{}]
        faults:
          - {at: 3, device: 0, kind: hang, function: nvmlDeviceGetPowerUsage}  # <-
        """,
        "faults[0]: missing required key 'duration'",
    ),
    "unknown symbol": (
        """
        name: t
        driver:
          missing_functions: [nvmlDeviceGetPowerUsage, nvmlDeviceGetWarpDrive]  # <-
        devices: [{}]
        """,
        "driver.missing_functions[1]: unknown value 'nvmlDeviceGetWarpDrive'",
    ),
    "times not increasing": (
        """
        name: t
        devices:
          - values:
              power_watts:
                ramp:
                  - [10, 100]
                  - [5, 200]  # <-
        """,
        "devices[0].values.power_watts.ramp[1]: times must increase",
    ),
    "bad value in defaults": (
        """
        name: t
        defaults:
          values:
            power_watts: {sine: {mean: 10, period: 5}}  # <-
        devices: [{}]
        """,
        "defaults.values.power_watts.sine: missing required key 'amplitude'",
    ),
    "unknown model": (
        """
        name: t
        devices:
          - model: NVIDIA Z9000  # <-
        """,
        "devices[0].model: unknown model 'NVIDIA Z9000': give `architecture` explicitly",
    ),
    "unknown feature": (
        """
        name: t
        devices:
          - unsupported: [power, warp_drive]  # <-
        """,
        "devices[0].unsupported[1]: unknown value 'warp_drive'",
    ),
    "invalid yaml": (
        """
        name: t
        devices: [{}
        faults: []  # <-
        """,
        "invalid YAML",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_errors_name_file_field_and_line(tmp_path: Path, case: str) -> None:
    assert_names_line(tmp_path, *BAD_FILES[case])


def assert_names_line(tmp_path: Path, text: str, expected: str) -> None:
    """Loading `text` (one line marked `# <-`) fails naming the file, that line and `expected`."""
    text = textwrap.dedent(text).lstrip("\n")
    line = next(i for i, row in enumerate(text.splitlines(), start=1) if "# <-" in row)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert expected in message, message


def test_errors_from_a_mapping_name_the_field() -> None:
    with pytest.raises(ScenarioError, match=r"^<dict>: devices\[0\]\.ecc: expected true or false"):
        load_scenario({"name": "t", "devices": [{"ecc": "yes please"}]})
    with pytest.raises(ScenarioError, match=r"<dict>: \(top level\): missing required key"):
        load_scenario({"name": "t"})


# -- the format doc stays in step with the code ---------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "scenarios.md"


def test_doc_lists_exactly_the_implemented_symbols() -> None:
    text = DOC.read_text()
    block = text[text.index("<!-- symbols:begin -->") : text.index("<!-- symbols:end -->")]
    documented = set(re.findall(r"`(nvml\w+)`", block))
    assert documented == implemented_functions()


def test_doc_names_every_quantity_feature_and_reason() -> None:
    text = DOC.read_text()
    for name in (*QUANTITIES, *FEATURES, *CLOCK_EVENT_REASONS):
        assert f"`{name}`" in text, name


# -- identities and size --------------------------------------------------------------------


def _scenario_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_two_gpus_with_one_uuid_are_refused_at_the_second(tmp_path: Path) -> None:
    # Looked up by UUID, the second GPU was silently the first.
    path = _scenario_file(
        tmp_path,
        """
        name: t
        devices:
          - uuid: GPU-11111111-2222-3333-4444-555555555555
          - {}
          - uuid: GPU-11111111-2222-3333-4444-555555555555
        """,
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value) == (
        f"{path}:5: devices[2].uuid: UUID 'GPU-11111111-2222-3333-4444-555555555555' "
        "is also GPU 0's"
    )


def test_a_uuid_in_defaults_is_shared_by_every_gpu(tmp_path: Path) -> None:
    path = _scenario_file(
        tmp_path,
        """
        name: t
        defaults:
          uuid: GPU-11111111-2222-3333-4444-555555555555
        devices: [{}, {}]
        """,
    )
    with pytest.raises(ScenarioError, match=r"s\.yaml:3: defaults\.uuid: .* every GPU shares"):
        load_scenario(path)


def test_two_gpus_on_one_pci_bus_id_are_refused_however_written(tmp_path: Path) -> None:
    path = _scenario_file(
        tmp_path,
        """
        name: t
        devices:
          - pci_bus_id: "0000:5d:00.0"
          - pci_bus_id: 5D:00.0
        """,
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert str(err.value) == (
        f"{path}:4: devices[1].pci_bus_id: PCI bus id '00000000:5D:00.0' is also GPU 0's"
    )


def test_a_default_bus_id_taken_explicitly_is_refused() -> None:
    with pytest.raises(
        ScenarioError,
        match=r"devices\[1\]\.pci_bus_id: PCI bus id '00000000:18:00.0' is also GPU 0's",
    ):
        load_scenario({"name": "t", "devices": [{}, {"pci_bus_id": "18:00.0"}]})


def test_the_largest_scenario_has_distinct_default_identities() -> None:
    scenario = load_scenario({"name": "t", "devices": [{}] * MAX_DEVICES})
    assert len({d.uuid for d in scenario.devices}) == MAX_DEVICES
    assert len({d.pci_bus_id for d in scenario.devices}) == MAX_DEVICES
    assert scenario.devices[0].pci_bus_id == "00000000:18:00.0"  # the HGX buses first
    assert scenario.devices[8].pci_bus_id == "00000000:E4:00.0"
    assert scenario.devices[36].pci_bus_id == "00000001:00:00.0"


def test_more_gpus_than_the_cap_are_refused_before_any_is_built(tmp_path: Path) -> None:
    # 10,000 GPUs used to end in a thread-creation traceback in the daemon.
    path = _scenario_file(tmp_path, "name: t\ndevices:\n" + "  - {model: nope}\n" * 10_000)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)  # `model: nope` would be an error in the first GPU built
    assert str(err.value) == (
        f"{path}:2: devices: 10000 GPUs, more than the {MAX_DEVICES} a scenario holds"
    )


def test_serve_exits_2_for_a_scenario_of_10000_gpus(tmp_path: Path) -> None:
    import subprocess

    from tests.daemon import command, free_port

    path = _scenario_file(tmp_path, "name: t\ndevices:\n" + "  - {}\n" * 10_000)
    listen = f"127.0.0.1:{free_port()}"
    result = subprocess.run(
        command("serve", "--listen-address", listen, "--simulate", str(path)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"scenario error: {path}:2: devices: 10000 GPUs, more than the {MAX_DEVICES} a scenario "
        "holds"
    )


# -- one validator for every file: each problem a `file:line: field: message` line ----------


def test_every_problem_is_reported_one_line_each(tmp_path: Path) -> None:
    path = _scenario_file(
        tmp_path,
        """
        name: t
        devices:
          - colour: blue
          - values: {utilization: 2}
        pods:
          - {namespace: a, pod: p, gpu: 0, until: -1}
        """,
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert isinstance(err.value, InputError)  # the configuration's validator, its lines
    problems = err.value.problems
    assert [p.split(": ", 2)[:2] for p in problems] == [
        [f"{path}:3", "devices[0].colour"],
        [f"{path}:4", "devices[1].values.utilization"],
        [f"{path}:6", "pods[0].until"],
    ]
    assert problems[0].endswith("unknown key 'colour' (known: application_clocks_mhz, "
                                "architecture, compute_capability, compute_mode, cpus, "
                                "default_application_clocks_mhz, ecc, ecc_pending, fabric, label, "
                                "max_clocks_mhz, memory_reserved_bytes, memory_total_bytes, mig, "
                                "model, numa_node, nvlink_links, nvlink_version, pci_bus_id, "
                                "pci_device_id, pcie, performance_state, persistence_mode, "
                                "power_default_limit_watts, power_limit_range_watts, "
                                "power_limit_watts, power_management_limit_watts, serial, "
                                "unsupported, uuid, values, vbios_version)")  # fmt: skip
    assert problems[1:] == (
        f"{path}:4: devices[1].values.utilization: must be <= 1, got 2",
        f"{path}:6: pods[0].until: must be >= 0, got -1",
    )
    assert str(err.value) == "\n".join(problems)


def test_a_fault_names_the_keys_its_kind_takes() -> None:
    fault = {"kind": "gpu_lost", "at": 1, "device": 0, "colour": 1}
    with pytest.raises(ScenarioError) as err:
        load_scenario({"name": "t", "devices": [{}], "faults": [fault]})
    assert str(err.value) == (
        "<dict>: faults[0].colour: unknown key 'colour' (known: at, device, kind, until)"
    )


def test_what_a_device_takes_from_defaults_is_reported_there_once(tmp_path: Path) -> None:
    path = _scenario_file(
        tmp_path,
        """
        name: t
        defaults:
          values: {utilization: 2, power_watts: 100}
          pcie: {max_width: 8}
        devices:
          - values: {power_watts: 200}
            pcie: {max_width: 99}
          - {}
        """,
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert sorted(err.value.problems) == [  # once, though both GPUs take it
        f"{path}:3: defaults.values.utilization: must be <= 1, got 2",
        f"{path}:7: devices[0].pcie.max_width: must be <= 32, got 99",
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"steps": None}, "utilization.steps: expected a list, got nothing"),
        ({"sine": None}, "utilization.sine: expected a mapping, got nothing"),
        ({"ramp": [[0, 1]], "max": None}, "utilization.max: expected a number, got nothing"),
    ],
)
def test_a_form_written_empty_is_refused(spec: dict, message: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(f"<dict>: devices[0].values.{message}")):
        _spec("utilization", spec)


def test_serve_and_diagnose_print_each_scenario_problem_on_a_line_of_its_own(
    tmp_path: Path,
) -> None:
    import subprocess

    from tests.daemon import command, free_port

    path = _scenario_file(tmp_path, "name: 3\ndevices: [{ecc: x}]\n")
    expected = [
        f"scenario error: {path}:1: name: expected a string, got int 3",
        f"scenario error: {path}:2: devices[0].ecc: expected true or false, got str 'x'",
    ]
    serve = ("serve", "--listen-address", f"127.0.0.1:{free_port()}", "--simulate", str(path))
    for args in (serve, ("diagnose", "--simulate", str(path))):
        result = subprocess.run(
            command(*args), capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == expected, result.stderr
