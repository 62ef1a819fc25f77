"""Shared fixtures: a manual clock and the fake NVML, always uninstalled after a test; and how
the suite is spread over pytest-xdist's workers (scripts/test.sh runs `--dist loadgroup`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_exporter.sim.clock import ManualClock

__all__ = ["ManualClock"]  # tests import it from here too


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each module's tests run on one worker, so a module-scoped server (Prometheus with its
    data, a browser, a PKI) starts once; a module whose tests share nothing and each take long
    (each starts its own daemon, Prometheus and Alertmanager) sets `SPREAD_OVER_WORKERS = True`
    and has its tests spread over all workers."""
    for item in items:
        module = item.module
        if module is not None and not getattr(module, "SPREAD_OVER_WORKERS", False):
            item.add_marker(pytest.mark.xdist_group(module.__name__))


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
    """start_source(scenario, topology=False, **NvmlSettings) -> a started NvmlSource on the
    fake NVML and `clock` (its fake as `.fake`, for tests that count calls); all are closed
    after the test."""
    from gpu_exporter.collect.nvml.source import NvmlSettings, NvmlSource
    from gpu_exporter.collect.nvml.topology import read_topology
    from gpu_exporter.collect.source import ErrorLog

    sources: list[NvmlSource] = []

    def start(spec: Any, topology: bool = False, **settings: Any) -> NvmlSource:
        fake = fake_nvml.install(spec, clock=clock)
        source = NvmlSource(
            settings=NvmlSettings(**settings),
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
