"""Shared fixtures: a manual clock and the fake NVML, always uninstalled after a test; and how
the suite is spread over pytest-xdist's workers (scripts/test.sh runs it on four)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_exporter.sim.clock import ManualClock

__all__ = ["ManualClock"]  # tests import it from here too


# Modules whose tests share nothing and each take long (each starts its own daemon, Prometheus
# and Alertmanager): their tests are spread over the workers one by one.
SPREAD_OVER_WORKERS = frozenset({"tests/test_e2e_parity_pods.py"})


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """A module's tests run on one worker, in order, so a module-scoped server (Prometheus with
    its data, a browser, a PKI) starts once; the modules in SPREAD_OVER_WORKERS are spread."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return nodeid if module in SPREAD_OVER_WORKERS else module

    return ByModule(config, log)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def fake_nvml() -> Iterator[object]:
    """Yields the `gpu_exporter.sim` module; whatever the test installs is always removed."""
    from gpu_exporter import sim

    try:
        yield sim
    finally:
        sim.uninstall()


@pytest.fixture
def start_source(fake_nvml: Any, clock: ManualClock) -> Iterator[Callable[..., Any]]:
    """start_source(scenario, topology=False, **NvmlConfig) -> a started NvmlSource on the
    fake NVML and `clock` (its fake as `.fake`, for tests that count calls); all are closed
    after the test."""
    from gpu_exporter.collect.nvml.source import NvmlConfig, NvmlSource
    from gpu_exporter.collect.nvml.topology import read_topology
    from gpu_exporter.collect.source import ErrorLog

    sources: list[NvmlSource] = []

    def start(spec: Any, topology: bool = False, **settings: Any) -> NvmlSource:
        fake = fake_nvml.install(spec, clock=clock)
        source = NvmlSource(
            settings=NvmlConfig(**settings),
            errors=ErrorLog(),
            clock=clock,
            topology_reader=read_topology if topology else None,
        )
        source.fake = fake  # type: ignore[attr-defined]
        source.start()
        sources.append(source)
        return source

    yield start
    for source in sources:
        source.close()
