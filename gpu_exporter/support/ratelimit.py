"""Rate limits for log lines a fault can repeat many times a second.

A flood of bad HTTP clients, an Alertmanager refusing every alert, a rule group over its time
budget every tick: each must cost a few lines a minute, not one per event, while the lines
that are written say how many were left out (the counters still count them all).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class Passed:
    """An event let through, and what was left out before it."""

    left_out: int  # events of its key left out since the last one let through
    seconds: float  # since the window those were left out in began

    @property
    def note(self) -> str:
        """ " (N more like this in the last Ss)" to append to the line, or "" when none."""
        if not self.left_out:
            return ""
        return f" ({self.left_out} more like this in the last {self.seconds:.0f}s)"


class RateLimit:
    """Lets through at most `burst` events of each key per `interval` seconds (monotonic time)
    and counts the others; thread-safe. At most `max_keys` keys are remembered: past that, the
    one let through longest ago is forgotten (its next event passes)."""

    def __init__(self, interval: float, burst: int = 1, max_keys: int = 256) -> None:
        self.interval, self.burst, self.max_keys = interval, burst, max_keys
        self._lock = threading.Lock()
        # key -> [start of its window, events let through in it, events left out since]
        self._keys: OrderedDict[Hashable, list[float]] = OrderedDict()

    def allow(self, key: Hashable = None) -> Passed | None:
        """None when this event is left out (and counted); else it may be logged."""
        now = time.monotonic()
        with self._lock:
            state = self._keys.get(key)
            if state is None:
                state = self._keys[key] = [-math.inf, 0, 0]
            started, passed, left_out = state
            if now - started < self.interval:
                if passed >= self.burst:
                    state[2] += 1
                    return None
                state[1] += 1
            else:
                state[:] = [now, 1, 0]
            self._keys.move_to_end(key)
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
        return Passed(int(left_out), now - started)

    def __len__(self) -> int:
        """Keys remembered."""
        with self._lock:
            return len(self._keys)
