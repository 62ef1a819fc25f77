"""Shared fixtures: a manual clock and the fake NVML, always uninstalled after a test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_exporter.sim.clock import ManualClock

__all__ = ["ManualClock"]  # tests import it from here too


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
