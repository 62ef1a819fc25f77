"""NVML facts are written once (gpu_exporter/model/nvml_facts.py); every copy that must stay one is
checked here: against the vendor's binding, the fake NVML's own numbers, the scenario format,
the classifier and the dashboards."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pynvml as N
import pytest

from gpu_exporter.collect import classify
from gpu_exporter.collect.nvml.collectors.clocks import COUNTERS
from gpu_exporter.model import nvml_facts as facts
from gpu_exporter.model.nvml_facts import Effect
from gpu_exporter.sim import fake_nvml, scenario

ROOT = Path(__file__).resolve().parents[1]
# nvml.h's names of the per-reason throttle-time fields (pynvml >= 12.535 defines them).
COUNTER_FIELD_NAMES = {
    "sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "sync_boost": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",
    "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}


def dashboards_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("facts_build", ROOT / "dashboards" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("reason", facts.ALL_CLOCK_EVENT_REASONS, ids=lambda r: r.name)
def test_reason_bits_are_the_bindings(reason: facts.ClockEventReason) -> None:
    assert getattr(N, f"nvmlClocksThrottleReason{reason.binding}") == reason.bit
    newer = getattr(N, f"nvmlClocksEventReason{reason.binding}", None)  # R535 names
    assert newer in (None, reason.bit)


def test_documented_reasons_are_the_c_headers_all() -> None:
    assert facts.KNOWN_REASON_BITS == 0x1FF  # nvml.h: nvmlClocksEventReasonAll
    assert getattr(N, "nvmlClocksEventReasonAll", 0x1FF) == facts.KNOWN_REASON_BITS
    bits = [r.bit for r in facts.ALL_CLOCK_EVENT_REASONS]
    assert bits == sorted(bits) and len(set(bits)) == len(bits)
    assert len({r.name for r in facts.ALL_CLOCK_EVENT_REASONS}) == len(bits)
    assert sum(bits) == N.nvmlClocksThrottleReasonAll  # pynvml's own 0x7FF


def test_counter_fields_are_the_bindings() -> None:
    with_counter = {r.name: r.counter_field for r in facts.CLOCK_EVENT_REASONS if r.counter_field}
    assert set(with_counter) == set(COUNTER_FIELD_NAMES)
    for name, field_id in with_counter.items():
        assert getattr(N, COUNTER_FIELD_NAMES[name], field_id) == field_id, name
    assert {spec.field_id for spec in COUNTERS.values()} == set(with_counter.values())


def test_the_fakes_own_field_numbers_count_the_right_reasons() -> None:
    """The fake keeps its own copy of the field ids (an independent fake); they must agree."""
    for reason in facts.CLOCK_EVENT_REASONS:
        if reason.counter_field is not None:
            assert fake_nvml.THROTTLE_FIELDS[reason.counter_field] == reason.bit, reason.name
    perf_policy = {74: "POWER", 76: "SYNC_BOOST", 77: "BOARD_LIMIT", 78: "LOW_UTILIZATION"}
    for field_id, policy in {**perf_policy, 79: "RELIABILITY", 81: "TOTAL_BASE_CLOCKS"}.items():
        assert getattr(N, f"NVML_FI_DEV_PERF_POLICY_{policy}") == field_id


def test_violation_policies_are_the_bindings_and_the_fakes() -> None:
    names = {"board_limit": "BOARD_LIMIT", "low_utilization": "LOW_UTILIZATION"}
    names["reliability"] = "RELIABILITY"
    assert [p.name for p in facts.VIOLATION_POLICIES] == list(names)
    for policy in facts.VIOLATION_POLICIES:
        assert getattr(N, f"NVML_PERF_POLICY_{names[policy.name]}") == policy.policy
        assert getattr(N, f"NVML_FI_DEV_PERF_POLICY_{names[policy.name]}") == policy.counter_field
        # The fake's field and its status call count the same time.
        mask = fake_nvml.THROTTLE_FIELDS[policy.counter_field]
        assert fake_nvml._POLICY_MASKS[policy.policy] == mask, policy.name
    # None of them is a clock-event reason's counter (those are gpu_clock_event_seconds_total).
    counted = {r.counter_field for r in facts.CLOCK_EVENT_REASONS}
    assert not counted & {p.counter_field for p in facts.VIOLATION_POLICIES}


def test_architectures_are_the_bindings_in_release_order() -> None:
    for name, code in facts.ARCHITECTURES.items():
        assert getattr(N, f"NVML_DEVICE_ARCH_{name.upper()}", code) == code, name
    codes = list(facts.ARCHITECTURES.values())
    assert codes == sorted(codes)
    assert dict(facts.ARCHITECTURE_NAMES) == {c: n for n, c in facts.ARCHITECTURES.items()}


def test_the_scenario_format_uses_the_facts() -> None:
    assert scenario.ARCHITECTURES is facts.ARCHITECTURES
    assert dict(scenario.CLOCK_EVENT_REASONS) == {
        r.name: r.bit for r in facts.ALL_CLOCK_EVENT_REASONS
    }


def test_the_classifier_uses_the_facts() -> None:
    protective = {r.name for r in facts.CLOCK_EVENT_REASONS if r.effect is Effect.PROTECTIVE}
    assert set(classify.THROTTLE_REASONS) == protective
    counted = {r.name for r in facts.CLOCK_EVENT_REASONS if r.counter_field is not None}
    assert set(classify.THROTTLE_COUNTERS) == (protective & counted) | {
        facts.COMBINED_THERMAL_REASON
    }
    assert set(classify.NVLINK_LINK_BYTES_PER_SECOND) <= set(facts.ARCHITECTURES)


def test_the_dashboards_cover_every_documented_reason_once() -> None:
    build = dashboards_builder()
    slowdown = [name for name, _, _ in build.SLOWDOWN_REASONS]
    informational = build.INFORMATIONAL_REASONS.split("|")
    assert sorted(slowdown + informational) == sorted(r.name for r in facts.CLOCK_EVENT_REASONS)
    assert set(informational) == {
        r.name for r in facts.CLOCK_EVENT_REASONS if r.effect is Effect.INFORMATIONAL
    }


def test_facts_and_the_dashboard_generator_import_without_pynvml() -> None:
    code = (
        "import runpy, sys; import gpu_exporter.model.nvml_facts; "
        "runpy.run_path('dashboards/build.py', run_name='not_main'); "
        "assert 'pynvml' not in sys.modules, 'pynvml was imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
