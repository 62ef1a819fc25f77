"""Simulated NVIDIA driver: a fake `libnvidia-ml` under pynvml, driven by scenario files.

    from gpu_exporter import sim
    fake = sim.install("mixed")          # pynvml now talks to the fake
    ...                                  # production code: import pynvml; pynvml.nvmlInit() ...
    sim.uninstall()

See docs/scenarios.md for the scenario format.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pynvml

from gpu_exporter.sim.fake_nvml import FakeNvmlLib
from gpu_exporter.sim.scenario import Scenario, ScenarioError, builtin_scenarios, load_scenario

__all__ = [
    "FakeNvmlLib",
    "Scenario",
    "ScenarioError",
    "builtin_scenarios",
    "install",
    "load_scenario",
    "uninstall",
]


def install(
    scenario: Scenario | str | Path | Mapping[str, Any],
    clock: Callable[[], float] | None = None,
) -> FakeNvmlLib:
    """Make pynvml use a fake library for `scenario` (a Scenario, name, path or mapping).

    `clock()` returns seconds since the scenario started; by default real monotonic time
    since this call. pynvml's own refcount is reset, so the caller must `nvmlInit()` next.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    fake = FakeNvmlLib(scenario, clock)
    _swap(fake)
    return fake


def uninstall() -> None:
    """Forget the fake: pynvml is back to "library not loaded" (next init loads the real one)."""
    _swap(None)


def _swap(lib: FakeNvmlLib | None) -> None:
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
