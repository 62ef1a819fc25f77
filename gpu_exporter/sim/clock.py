"""The manual clock: scenario time that only moves when told to (tests, benchmarks, goldens)."""

from __future__ import annotations


class ManualClock:
    """Seconds since the fake driver loaded, as `sim.install(..., clock=...)` expects."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
