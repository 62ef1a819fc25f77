"""A scenario's numbers within what their C types hold (gpu_exporter/sim/limits.py).

`1e308` used to be accepted anywhere a number went, then overflowed where the fake converts it
(`round(inf)` in every power read, a process's start time at load); NaN and infinities were
refused but a finite value past its type was not. Now every number is checked at load against
a bound that names its type or the physical fact behind it, and the error names the file, the
line and the field; what is accepted reads without a failed collector.
"""

from __future__ import annotations

import copy
import logging
import math
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.scenario import ScenarioError, load_scenario
from gpu_exporter.support.yamlfile import format_path
from tests.test_scenario import assert_names_line

# -- refused at load, naming file, line, field and the bound -------------------------------

PAST_THE_LIMIT = {
    "memory_total_bytes": (
        """
        name: t
        devices:
          - memory_total_bytes: 1.0e308  # <-
        """,
        "devices[0].memory_total_bytes: 1e+308 is more than 2^64-1 bytes, "
        "NVML's unsigned long long",
    ),
    "power": (
        """
        name: t
        devices:
          - values:
              power_watts: 1.0e308  # <-
        """,
        "devices[0].values.power_watts: 1e+308 is more than 4294967.295 W, "
        "NVML's unsigned int of milliwatts",
    ),
    "clock as a sine's mean": (
        """
        name: t
        devices:
          - values:
              sm_clock_mhz: {sine: {mean: 1.0e308, amplitude: 10, period: 30}}  # <-
        """,
        "devices[0].values.sm_clock_mhz.sine.mean: 1e+308 is more than 4294967295 MHz, "
        "NVML's unsigned int",
    ),
    "noise on bytes": (
        """
        name: t
        devices:
          - values:
              memory_used_bytes: {steps: [[0, 1.0e9]], noise: 1.0e308}  # <-
        """,
        "devices[0].values.memory_used_bytes.noise: 1e+308 is more than 2^64-1 bytes",
    ),
    "activity ratio's amplitude": (
        """
        name: t
        devices:
          - values:
              sm_active: {sine: {mean: 0.5, amplitude: 2, period: 30}}  # <-
        """,
        "devices[0].values.sm_active.sine.amplitude: must be <= 1, got 2",
    ),
    "a step's time": (
        """
        name: t
        devices:
          - values:
              sm_active:
                steps:
                  - [0, 0.5]
                  - [1.0e308, 0.7]  # <-
        """,
        "devices[0].values.sm_active.steps[1][0]: 1e+308 is more than 1e9 s (about 32 years)",
    ),
    "a fault's at": (
        """
        name: t
        devices: [{}]
        faults:
          - {at: 1.0e308, device: 0, kind: xid, xid: 79}  # <-
        """,
        "faults[0].at: 1e+308 is more than 1e9 s",
    ),
    "a process's start (was an OverflowError at load)": (
        """
        name: t
        devices: [{}]
        processes:
          - {pid: 100, gpu: 0, from: 1.0e308}  # <-
        """,
        "processes[0].from: 1e+308 is more than 1e9 s",
    ),
    "a call's latency": (
        """
        name: t
        latency:
          default_ms: 1.0e308  # <-
        devices: [{}]
        """,
        "latency.default_ms: 1e+308 is more than 3600000 ms (an hour)",
    ),
    "retired pages (each one listed by the fake)": (
        """
        name: t
        devices:
          - values:
              retired_pages_dbe: 1000000000  # <-
        """,
        "devices[0].values.retired_pages_dbe: 1000000000 is more than 64, the most pages",
    ),
    "a CPU list (was a range built to its end)": (
        """
        name: t
        devices:
          - cpus: "0-99999999999"  # <-
        """,
        "devices[0].cpus: 99999999999 is more than 8191, Linux's highest CPU number",
    ),
}


@pytest.mark.parametrize("case", sorted(PAST_THE_LIMIT))
def test_a_value_past_its_limit_is_refused_naming_file_line_and_the_limit(
    tmp_path: Path, case: str
) -> None:
    assert_names_line(tmp_path, *PAST_THE_LIMIT[case])


def test_serve_and_config_check_exit_2_for_1e308_naming_file_and_line(tmp_path: Path) -> None:
    from tests.daemon import command, free_port

    scenario = tmp_path / "huge.yaml"
    scenario.write_text("name: t\ndevices:\n  - values:\n      power_watts: 1.0e308\n")
    expected = (
        f"{scenario}:4: devices[0].values.power_watts: 1e+308 is more than 4294967.295 W, "
        "NVML's unsigned int of milliwatts"
    )
    listen = f"127.0.0.1:{free_port()}"
    serve = subprocess.run(
        command("serve", "--listen-address", listen, "--simulate", str(scenario)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert serve.returncode == 2, serve.stderr
    assert serve.stderr.strip() == f"scenario error: {expected}"
    config = tmp_path / "config.yaml"
    config.write_text(f"simulate: {scenario}\n")
    check = subprocess.run(
        command("config", "check", str(config)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 2, check.stdout + check.stderr
    assert expected in check.stderr and "Traceback" not in check.stderr


# -- every number: accepted and read cleanly, or refused cleanly ----------------------------

# A scenario writing every kind of number once (two GPUs: the second with MIG).
BASE: dict[str, Any] = {
    "name": "limits",
    "latency": {"default_ms": 0, "functions": {"nvmlDeviceGetPowerUsage": 0}},
    "driver": {"cuda_version": 12080, "unsupported_fields": [269]},
    "devices": [
        {
            "memory_total_bytes": 150754820096,
            "memory_reserved_bytes": 503316480,
            "power_limit_watts": 700,
            "max_clocks_mhz": {"sm": 1980},
            "application_clocks_mhz": {"sm": 1980},
            "compute_capability": [9, 0],
            "numa_node": 0,
            "values": {
                "power_watts": 300,
                "memory_used_bytes": 1e9,
                "sm_clock_mhz": 1500,
                "temperature_celsius": 50,
                "pcie_tx_bytes_per_second": 1e9,
                "nvlink_tx_bytes_per_second": 1e10,
                "ecc_corrected_total": 3,
                "pcie_replay_total": 1,
                "retired_pages_sbe": 2,
                "remapped_rows_correctable": 1,
                "pcie_generation": 5,
                "utilization": {
                    "sine": {"mean": 0.5, "amplitude": 0.2, "period": 30},
                    "noise": 0.05,
                    "min": 0.1,
                    "max": 0.9,
                },
                "dram_active": {"steps": [[0, 0.2], [10, 0.4]]},
                "sm_active": {"ramp": [[0, 0.2], [10, 0.4]]},
                "fp32_active": {"pattern": [[5, 0.2], [5, 0.4]]},
            },
            "fabric": {"changes": [{"from": 5, "until": 10, "summary": "unhealthy"}]},
        },
        {
            "mig": {
                "instances": [
                    {
                        "profile": "1g.18gb",
                        "from": 0,
                        "until": 50,
                        "values": {"memory_used_bytes": 1e9},
                    }
                ]
            }
        },
    ],
    "dcgm": {},
    "faults": [
        {"at": 5, "device": 0, "kind": "xid", "xid": 79},
        {"at": 5, "device": 0, "kind": "gpu_lost", "until": 10},
        {"at": 5, "device": 0, "kind": "hang", "function": "nvmlDeviceGetPowerUsage",
         "duration": 1},
        {"at": 5, "device": 0, "kind": "gpm_nan", "metric": 1},
        {"at": 5, "kind": "dcgm_hang", "function": "dcgmEntitiesGetLatestValues", "duration": 1},
    ],
    "pods": [{"namespace": "a", "pod": "b", "gpu": 0, "from": 0, "until": 50}],
    "processes": [
        {"pid": 100, "gpu": 0, "memory_bytes": 1e9, "from": 0, "until": 50,
         "utilization": {"sm": 0.5}},
    ],
    "dra": {"republish": [60]},
}  # fmt: skip

_VALUES = ("devices", 0, "values")
FIELDS: list[tuple[str | int, ...]] = [
    ("latency", "default_ms"),
    ("latency", "functions", "nvmlDeviceGetPowerUsage"),
    ("driver", "cuda_version"),
    ("driver", "unsupported_fields", 0),
    ("devices", 0, "memory_total_bytes"),
    ("devices", 0, "memory_reserved_bytes"),
    ("devices", 0, "power_limit_watts"),
    ("devices", 0, "max_clocks_mhz", "sm"),
    ("devices", 0, "application_clocks_mhz", "sm"),
    ("devices", 0, "compute_capability", 0),
    ("devices", 0, "numa_node"),
    *[
        (*_VALUES, quantity)
        for quantity in BASE["devices"][0]["values"]
        if quantity != "utilization"
    ],
    (*_VALUES, "utilization", "sine", "mean"),
    (*_VALUES, "utilization", "sine", "amplitude"),
    (*_VALUES, "utilization", "sine", "period"),
    (*_VALUES, "utilization", "noise"),
    (*_VALUES, "utilization", "min"),
    (*_VALUES, "utilization", "max"),
    (*_VALUES, "dram_active", "steps", 1, 0),
    (*_VALUES, "dram_active", "steps", 1, 1),
    (*_VALUES, "sm_active", "ramp", 1, 0),
    (*_VALUES, "fp32_active", "pattern", 0, 0),
    ("devices", 0, "fabric", "changes", 0, "from"),
    ("devices", 0, "fabric", "changes", 0, "until"),
    ("devices", 1, "mig", "instances", 0, "from"),
    ("devices", 1, "mig", "instances", 0, "until"),
    ("devices", 1, "mig", "instances", 0, "values", "memory_used_bytes"),
    ("faults", 0, "at"),
    ("faults", 0, "xid"),
    ("faults", 1, "until"),
    ("faults", 2, "duration"),
    ("faults", 3, "metric"),
    ("faults", 4, "duration"),
    ("pods", 0, "from"),
    ("pods", 0, "until"),
    ("processes", 0, "memory_bytes"),
    ("processes", 0, "from"),
    ("processes", 0, "until"),
    ("processes", 0, "utilization", "sm"),
    ("dra", "republish", 0),
]
# Past every type (1e308, 2^64), not numbers at all (NaN, infinities), below every unsigned
# one (-1), past a scenario's time but inside most types (1e10), and an ordinary one.
ORDINARY = 3
ODD_VALUES: list[Any] = [1e308, -1e308, math.inf, -math.inf, math.nan, -1, 2**64, 1e10, ORDINARY]


def _set(data: dict[str, Any], field: tuple[str | int, ...], value: Any) -> None:
    node: Any = data
    for part in field[:-1]:
        node = node[part]
    node[field[-1]] = value


@pytest.fixture
def read_twice(start_source: Callable[..., NvmlSource], clock: ManualClock) -> Callable[..., Any]:
    """Two ticks of the production NVML source on a scenario: the collectors that failed."""

    def read(path: Path) -> list[str]:
        source = start_source(load_scenario(path), xid_events=False, processes=True)
        failed: list[str] = []
        for _ in range(2):  # before the faults at 5 s
            clock.advance(1.0)
            source.sample()
            failed += [s.collector for s in source.collector_status() if not s.success]
        return failed

    return read


@pytest.mark.parametrize("field", FIELDS, ids=format_path)
def test_every_number_is_read_cleanly_or_refused_naming_its_line(
    tmp_path: Path,
    field: tuple[str | int, ...],
    read_twice: Callable[[Path], list[str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    for value in ODD_VALUES:
        data = copy.deepcopy(BASE)
        _set(data, field, value)
        path = tmp_path / "odd.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        try:
            load_scenario(path)
        except ScenarioError as exc:  # the only exception load_scenario may raise
            assert all(p.startswith(f"{path}:") for p in exc.problems), exc.problems
            assert all(p.split(":")[1].isdigit() for p in exc.problems), exc.problems  # a line
            # An odd value is refused where it is written; an ordinary one may be refused
            # where it contradicts another (a total below the reserved memory).
            named = [p for p in exc.problems if f": {format_path(field)}: " in p]
            assert named or value == ORDINARY, (value, exc.problems)
            continue
        assert not (isinstance(value, float) and not math.isfinite(value)), field
        with caplog.at_level(logging.ERROR):
            assert read_twice(path) == [], (field, value)
        assert not [r for r in caplog.records if r.exc_info], (field, value)


def test_the_ordinary_scenario_of_the_fuzz_reads_cleanly(
    tmp_path: Path, read_twice: Callable[[Path], list[str]]
) -> None:
    # What every case above starts from: a refusal there is the value's, not the scenario's.
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False))
    assert read_twice(path) == []


# -- every quantity at its limit reads without an overflow ----------------------------------


def test_every_quantity_at_its_limit_reads_without_a_failed_collector(
    tmp_path: Path, read_twice: Callable[[Path], list[str]]
) -> None:
    from gpu_exporter.sim import limits
    from gpu_exporter.sim.values import QUANTITIES

    at_limit = {
        name: q.hi.value
        for name, q in QUANTITIES.items()
        if isinstance(q.hi, limits.Limit) and name not in ("clock_event_reasons", "recovery_action")
    }
    text = textwrap.dedent(
        f"""
        name: t
        devices:
          - memory_total_bytes: {limits.BYTES.value}
            power_limit_watts: {limits.WATTS.value}
            max_clocks_mhz: {{sm: {limits.CLOCK_MHZ.value}, memory: {limits.CLOCK_MHZ.value}}}
            values: {yaml.safe_dump(at_limit, default_flow_style=True).strip()}
        processes:
          - {{pid: 100, gpu: 0, memory_bytes: {limits.BYTES.value}, from: {limits.SECONDS.value}}}
        """
    )
    path = tmp_path / "limits.yaml"
    path.write_text(text)
    scenario = load_scenario(path)
    assert scenario.devices[0].value("power_watts", 1) == limits.WATTS.value
    assert read_twice(path) == []
