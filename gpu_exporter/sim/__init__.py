"""Simulated NVIDIA driver: a fake `libnvidia-ml` under pynvml, driven by scenario files.

    from gpu_exporter import sim
    fake = sim.install("mixed")          # pynvml now talks to the fake
    ...                                  # production code: import pynvml; pynvml.nvmlInit() ...
    sim.uninstall()

A scenario with `processes:` also gets the node around its GPUs (`sim.node.SimulatedNode`): a
fake /proc tree and a fake CRI runtime on a unix socket, kept in step with the scenario's clock
and closed by `uninstall`; the installed fake's `proc_root` and `cri_socket_path` say where they
are (None without processes), `installed_node()` returns the node (tests make faults with it).
gRPC is imported only then.

A scenario with a `dcgm:` section also gets a fake libdcgm (`FakeDcgmLib`, on the same clock),
which the DCGM binding then uses instead of libdcgm.so.4 (`installed_dcgm()` returns it); one
without makes the binding behave as if libdcgm.so.4 were not installed, so a real one on this
machine is never picked up in simulation.

See docs/scenarios.md for the scenario format.

Imports `collect` (the DCGM binding's structs, the PodResources and CRI stubs), `model` and
`support`; never `alerting`, `web`, `config` or `pipeline` (checked in CI: `lint-imports`).

The fake plugs in under pynvml's public API through a few of its private attributes
(`BINDING_PRIVATES`); pyproject.toml bounds nvidia-ml-py to releases known to keep them, and
`install` refuses, naming the attribute, a binding that changed one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pynvml

from gpu_exporter.collect import dcgm_api
from gpu_exporter.sim.fake_dcgm import FakeDcgmLib
from gpu_exporter.sim.fake_nvml import FakeNvmlLib
from gpu_exporter.sim.scenario import Scenario, ScenarioError, builtin_scenarios, load_scenario

if TYPE_CHECKING:
    from gpu_exporter.sim.node import SimulatedNode

__all__ = [
    "BINDING_PRIVATES",
    "BindingChangedError",
    "FakeDcgmLib",
    "FakeNvmlLib",
    "Scenario",
    "ScenarioError",
    "binding_problems",
    "builtin_scenarios",
    "install",
    "installed_dcgm",
    "installed_node",
    "load_scenario",
    "uninstall",
]


# pynvml's private attributes the fake relies on, and why (tests/test_fake_nvml.py also checks
# how they behave).
BINDING_PRIVATES: dict[str, str] = {
    "nvmlLib": "the loaded library: the fake is assigned here, and pynvml loads the real one "
    "only while it is None",
    "libLoadLock": "the lock pynvml holds while it loads the library or looks up a symbol",
    "_nvmlLib_refcount": "nvmlInit's reference count, reset to 0 when the fake is swapped",
    "_nvmlGetFunctionPointer_cache": "the symbols already looked up (a dict), cleared when "
    "the fake is swapped",
    "_nvmlGetFunctionPointer": "looks a C symbol up as getattr(nvmlLib, name)",
    "_LoadNvmlLibrary": "loads libnvidia-ml.so.1 unless nvmlLib is already set",
}
_KINDS: dict[str, Callable[[Any], bool]] = {
    "nvmlLib": lambda value: True,  # None until loaded, or the library (real or fake)
    "libLoadLock": lambda value: all(
        hasattr(value, m) for m in ("acquire", "release", "__enter__")
    ),
    "_nvmlLib_refcount": lambda value: isinstance(value, int),
    "_nvmlGetFunctionPointer_cache": lambda value: isinstance(value, dict),
    "_nvmlGetFunctionPointer": callable,
    "_LoadNvmlLibrary": callable,
}


class BindingChangedError(RuntimeError):
    """The installed nvidia-ml-py no longer has what the fake relies on."""


def binding_problems() -> list[str]:
    """How the installed pynvml differs from what the fake relies on; empty when it does not."""
    problems = []
    for name, why in BINDING_PRIVATES.items():
        if not hasattr(pynvml, name):
            problems.append(f"pynvml.{name} is gone ({why})")
        elif not _KINDS[name](getattr(pynvml, name)):
            kind = type(getattr(pynvml, name)).__name__
            problems.append(f"pynvml.{name} is now a {kind} ({why})")
    return problems


def install(
    scenario: Scenario | str | Path | Mapping[str, Any],
    clock: Callable[[], float] | None = None,
    *,
    node: bool = True,
) -> FakeNvmlLib:
    """Make pynvml use a fake library for `scenario` (a Scenario, name, path or mapping).

    `clock()` returns seconds since the scenario started; by default real monotonic time
    since this call. pynvml's own refcount is reset, so the caller must `nvmlInit()` next.
    `node=False`: a scenario's `processes:` get no /proc or runtime in this process, because
    another one serves them on the same clock (bench/run_node.py), as on a real node.
    """
    problems = binding_problems()
    if problems:
        raise BindingChangedError(
            "the fake NVML cannot plug into this nvidia-ml-py: " + "; ".join(problems)
        )
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    _close_node()
    fake = FakeNvmlLib(scenario, clock)
    if scenario.processes and node:
        from gpu_exporter.sim.node import SimulatedNode  # gRPC: only for a node with processes

        global _node
        _node = SimulatedNode(scenario, fake.clock, fake)
    _swap(fake)
    _use_dcgm(FakeDcgmLib(scenario, fake.clock) if scenario.dcgm is not None else None)
    return fake


def uninstall() -> None:
    """Forget the fakes: pynvml is back to "library not loaded" (next init loads the real one),
    and the DCGM binding to the real libdcgm.so.4."""
    _swap(None)
    global _dcgm
    _dcgm = None
    dcgm_api.use_library(None)
    _close_node()


def installed_dcgm() -> FakeDcgmLib | None:
    """The fake libdcgm of the installed scenario (None: none installed, or no `dcgm:`)."""
    return _dcgm


def installed_node() -> SimulatedNode | None:
    """The simulated node (fake /proc and CRI runtime) of the installed scenario (None: none
    installed, or no `processes:`)."""
    return _node


_dcgm: FakeDcgmLib | None = None
_node: SimulatedNode | None = None


def _close_node() -> None:
    global _node
    if _node is not None:
        _node.close()
        _node = None


def _use_dcgm(lib: FakeDcgmLib | None) -> None:
    global _dcgm
    _dcgm = lib
    dcgm_api.use_library(dcgm_api.NO_LIBRARY if lib is None else lib)


def _swap(lib: FakeNvmlLib | None) -> None:
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
