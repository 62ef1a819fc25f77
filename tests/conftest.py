"""Shared fixtures: a manual clock and the fake NVML, always uninstalled after a test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


class ManualClock:
    """Scenario time under the test's control (seconds since the fake driver loaded)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


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
