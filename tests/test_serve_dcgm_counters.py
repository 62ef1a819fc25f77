"""`serve --dcgm-compat --dcgm-compat-counters-file FILE` over the wire: /metrics/dcgm serves
the families of dcgm-exporter's own counters file (vendored in tests/upstream/dcgm-exporter)
and of one that adds the clock and power limits, with the file's types and help texts and the
simulator's values; a file with an unknown field stops the start and fails `config check`,
each naming its line; a row not served is a warning, or an error with strict checking.

Values are compared with what the simulator was told (its scenario) and with the native
/metrics of the same tick, never with numbers written here.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import yaml

from gpu_exporter import sim
from tests.daemon import Daemon, serve
from tests.support import wait_for

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILE = ROOT / "tests/upstream/dcgm-exporter/default-counters.csv"
MIXED = ROOT / "gpu_exporter/sim/scenarios/mixed.yaml"
VGPU = "DCGM_FI_DEV_VGPU_LICENSE_STATUS"
MIB = 1024 * 1024
# The static limits, as the migration guide tells users to add them: (name, help).
LIMITS = {
    "DCGM_FI_DEV_MAX_SM_CLOCK": "Maximum supported SM clock (in MHz).",
    "DCGM_FI_DEV_MAX_MEM_CLOCK": "Maximum supported memory clock (in MHz).",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "Enforced power limit (in W).",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "Power management limit (in W).",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN": "Minimum power management limit (in W).",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": "Maximum power management limit (in W).",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": "Default power management limit (in W).",
}
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

Sample = tuple[str, dict[str, str], float]


def samples(text: str) -> list[Sample]:
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match, line
            name, labels, value = match.groups()
            out.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return out


def first_by_gpu(rows: list[Sample], name: str) -> dict[str, float]:
    """Each GPU's first series of `name` (a shared GPU's first is the device's own)."""
    values: dict[str, float] = {}
    for family, labels, value in rows:
        if family == name:
            values.setdefault(labels["gpu"], value)
    return values


def native(rows: list[Sample], name: str, **labels: str) -> dict[str, float]:
    """Each whole GPU's `name{labels}` in the native exposition."""
    return {
        own["gpu"]: value
        for family, own, value in rows
        if family == name and "mig_uuid" not in own and labels.items() <= own.items()
    }


def active_rows(path: Path) -> list[tuple[int, list[str]]]:
    """(line, trimmed fields) of the lines that are neither blank nor comments."""
    return [
        (number, [field.strip(" ") for field in line.split(",")])
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if line.strip() and not line.startswith("#")
    ]


def same_tick(daemon: Daemon) -> tuple[str, list[Sample]]:
    """/metrics/dcgm and /metrics of one tick, the second tick or a later one (the rates
    need two)."""

    def scrape() -> tuple[str, list[Sample]] | None:
        before = samples(daemon.metrics_text())
        compat = daemon.get("/metrics/dcgm")
        after = samples(daemon.metrics_text())
        ticks = [v for n, _, v in before if n == "gpu_exporter_ticks_total"]
        again = [v for n, _, v in after if n == "gpu_exporter_ticks_total"]
        if compat.status_code != 200 or ticks != again or ticks[0] < 2:
            return None
        return compat.text, after

    return wait_for(scrape, 30, "two ticks and a scrape within one")


def check_families(text: str, expected: dict[str, tuple[str, str]]) -> None:
    """The families written are exactly `expected` (name -> (type, help)), in field-id order."""
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    assert {name: (types[name], helps[name]) for name in types} == expected


def test_dcgm_exporters_default_counters_file(tmp_path: Path) -> None:
    rows = active_rows(DEFAULT_FILE)
    scenario = sim.load_scenario("mixed")
    args = ("--simulate", "mixed", "--interval", "2", "--dcgm-compat")
    with serve(tmp_path, *args, "--dcgm-compat-counters-file", str(DEFAULT_FILE)) as daemon:
        daemon.wait_ready()
        text, metrics = same_tick(daemon)
        output = daemon.output()
    expected = {n: (t, h) for _, (n, t, h) in rows if t != "label" and n != VGPU}
    check_families(text, expected)
    compat = samples(text)
    gpus = [str(device.index) for device in scenario.devices]
    # The file's one label row, on every series; its value is the simulated driver's.
    (label_row,) = [name for _, (name, type_, _) in rows if type_ == "label"]
    assert {labels.get(label_row) for _, labels, _ in compat} == {scenario.driver.version}
    # Values: the native ones of the same tick after dcgm-exporter's units, and the reserved
    # memory the scenario set.
    assert first_by_gpu(compat, "DCGM_FI_DEV_GPU_TEMP") == native(
        metrics, "gpu_temperature_celsius", sensor="gpu"
    )
    power = first_by_gpu(compat, "DCGM_FI_DEV_POWER_USAGE")
    watts = native(metrics, "gpu_power_watts")
    assert sorted(power) == gpus and all(
        math.isclose(power[g], watts[g], abs_tol=5e-7) for g in gpus
    )
    clocks = native(metrics, "gpu_clock_hertz", clock="sm")
    assert first_by_gpu(compat, "DCGM_FI_DEV_SM_CLOCK") == {g: v / 1e6 for g, v in clocks.items()}
    used = native(metrics, "gpu_memory_used_bytes")
    assert first_by_gpu(compat, "DCGM_FI_DEV_FB_USED") == {
        g: float(math.floor(v / MIB)) for g, v in used.items()
    }
    assert first_by_gpu(compat, "DCGM_FI_DEV_FB_RESERVED") == {
        str(d.index): float(d.memory_reserved_bytes // MIB) for d in scenario.devices
    }
    # The one row not served, logged once with its line.
    (vgpu_line,) = [number for number, fields in rows if fields[0] == VGPU]
    assert output.count(f"{DEFAULT_FILE}:{vgpu_line}: {VGPU} ") == 1, output


def test_a_file_adding_the_clock_and_power_limits_serves_the_scenarios_limits(
    tmp_path: Path,
) -> None:
    # The mixed scenario with GPU 1's limits set apart from the others', so that a limit
    # read from another GPU or another quantity shows.
    data = yaml.safe_load(MIXED.read_text())
    data["devices"][1].update(
        power_limit_watts=550,
        power_management_limit_watts=600,
        power_default_limit_watts=650,
        power_limit_range_watts=[250, 720],
        max_clocks_mhz={"sm": 2100, "graphics": 2100, "memory": 3400, "video": 1965},
    )
    scenario_file = tmp_path / "limits.yaml"
    scenario_file.write_text(yaml.safe_dump(data, sort_keys=False))
    scenario = sim.load_scenario(str(scenario_file))
    counters = tmp_path / "counters.csv"
    extra = "".join(f"{name}, gauge, {help_}\n" for name, help_ in LIMITS.items())
    counters.write_text(DEFAULT_FILE.read_text() + "\n# Limits\n" + extra)
    args = ("--simulate", str(scenario_file), "--interval", "2", "--dcgm-compat")
    with serve(tmp_path, *args, "--dcgm-compat-counters-file", str(counters)) as daemon:
        daemon.wait_ready()
        text, _ = same_tick(daemon)
    expected = {n: (t, h) for _, (n, t, h) in active_rows(DEFAULT_FILE) if t != "label"}
    del expected[VGPU]
    check_families(text, expected | {name: ("gauge", help_) for name, help_ in LIMITS.items()})
    compat = samples(text)
    want = {
        "DCGM_FI_DEV_MAX_SM_CLOCK": lambda d: d.max_clocks_mhz["sm"],
        "DCGM_FI_DEV_MAX_MEM_CLOCK": lambda d: d.max_clocks_mhz["memory"],
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": lambda d: d.power_limit_watts,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": lambda d: d.power_management_limit_watts,
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN": lambda d: d.power_limit_range_watts[0],
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX": lambda d: d.power_limit_range_watts[1],
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF": lambda d: d.power_default_limit_watts,
    }
    for name, of in want.items():
        expected_values = {str(d.index): float(of(d)) for d in scenario.devices}
        assert first_by_gpu(compat, name) == expected_values, name
    # dcgm-exporter's units and formats: MHz as integers, watts as Go's %f.
    assert re.search(r"^DCGM_FI_DEV_MAX_SM_CLOCK\{gpu=\"1\",.*\} 2100$", text, re.M)
    assert re.search(r"^DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX\{gpu=\"1\",.*\} 720\.000000$", text, re.M)


def config_check(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "config", "check", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unknown_field_stops_the_start_and_fails_config_check_naming_its_line(
    tmp_path: Path,
) -> None:
    counters = tmp_path / "counters.csv"
    text = DEFAULT_FILE.read_text() + "DCGM_FI_DEV_GPU_TEMPP, gauge, a typo\n"
    counters.write_text(text)
    line = len(text.splitlines())
    problem = (
        f"{counters}:{line}: unknown DCGM field 'DCGM_FI_DEV_GPU_TEMPP'; did you mean "
        "DCGM_FI_DEV_GPU_TEMP?"
    )
    args = ("--simulate", "mixed", "--dcgm-compat", "--dcgm-compat-counters-file", str(counters))
    with serve(tmp_path, *args) as daemon:
        assert daemon.process.wait(timeout=30) == 2
        assert f"counters file error: {problem}" in daemon.output()
        assert "Traceback" not in daemon.output()
    config = tmp_path / "config.yaml"
    config.write_text(f"dcgm_compat:\n  enabled: true\n  counters_file: {counters}\n")
    result = config_check(config, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert problem in result.stderr.splitlines(), result.stderr
    assert f"{config}: OK" not in result.stdout


def test_a_row_not_served_is_a_warning_or_with_strict_an_error(tmp_path: Path) -> None:
    (vgpu_line,) = [number for number, fields in active_rows(DEFAULT_FILE) if fields[0] == VGPU]
    where = f"{DEFAULT_FILE}:{vgpu_line}: {VGPU} "
    config = tmp_path / "config.yaml"
    config.write_text(f"dcgm_compat:\n  enabled: true\n  counters_file: {DEFAULT_FILE}\n")
    warned = config_check(config, cwd=tmp_path)
    assert warned.returncode == 0, warned.stderr
    assert warned.stdout == f"{config}: OK\n"
    assert [line for line in warned.stderr.splitlines() if line.startswith("warning: ")] == [
        line for line in warned.stderr.splitlines() if where in line
    ]
    assert where in warned.stderr
    refused = config_check("--strict", config, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.startswith(where), refused.stderr
    strict = tmp_path / "strict.yaml"
    strict.write_text(config.read_text() + "  strict: true\n")
    assert config_check(strict, cwd=tmp_path).returncode == 2
    with serve(tmp_path, "--simulate", "mixed", "--config", str(strict)) as daemon:
        assert daemon.process.wait(timeout=30) == 2
        assert f"counters file error: {where}" in daemon.output()


def test_config_check_under_a_root_names_the_file_as_the_configuration_does(
    tmp_path: Path,
) -> None:
    root = tmp_path / "pod"
    mounted = root / "etc/dcgm-exporter/counters.csv"
    mounted.parent.mkdir(parents=True)
    mounted.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_NOPE, gauge, x\n")
    config = tmp_path / "config.yaml"
    config.write_text(
        "dcgm_compat:\n  enabled: true\n  counters_file: /etc/dcgm-exporter/counters.csv\n"
    )
    result = config_check("--root", root, config, cwd=tmp_path)
    assert result.returncode == 2
    (problem,) = result.stderr.splitlines()
    assert problem.startswith("/etc/dcgm-exporter/counters.csv:2: unknown DCGM field "), problem


def test_a_counters_file_needs_the_compat_output_on(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"dcgm_compat:\n  counters_file: {DEFAULT_FILE}\n")
    result = config_check(config, cwd=tmp_path)
    assert result.returncode == 2
    assert (
        f"{config}:1: dcgm_compat: counters_file picks the compat output's families, which is "
        "off: set enabled: true (flag --dcgm-compat) too"
    ) in result.stderr, result.stderr
