"""The log rate limit: bursts per window, one count of what was left out, bounded keys."""

from __future__ import annotations

import threading
import time

import pytest

from gpu_exporter.support.ratelimit import RateLimit


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    return clock


def test_a_burst_passes_then_the_rest_is_counted_on_the_next_line(now: list[float]) -> None:
    limit = RateLimit(30, burst=3)
    passed = [limit.allow() for _ in range(10)]
    assert [p is not None for p in passed] == [True] * 3 + [False] * 7
    assert all(p.note == "" for p in passed if p is not None)
    now[0] += 29.0
    assert limit.allow() is None  # still the same window
    now[0] += 2.0
    later = limit.allow()
    assert later is not None
    assert (later.left_out, later.seconds) == (8, 31.0)
    assert later.note == " (8 more like this in the last 31s)"
    again = limit.allow()
    assert again is not None and again.left_out == 0  # counted once, then reset


def test_each_key_has_its_own_window(now: list[float]) -> None:
    limit = RateLimit(60)
    assert limit.allow("a") is not None
    assert limit.allow("a") is None
    assert limit.allow("b") is not None


def test_the_key_let_through_longest_ago_is_forgotten(now: list[float]) -> None:
    limit = RateLimit(60, max_keys=2)
    for key in ("a", "b", "c"):
        assert limit.allow(key) is not None
    assert len(limit) == 2
    assert limit.allow("b") is None and limit.allow("c") is None
    assert limit.allow("a") is not None  # forgotten: passes again


def test_threads_racing_let_exactly_the_burst_through() -> None:
    limit = RateLimit(3600, burst=5)
    passed: list[bool] = []
    lock = threading.Lock()

    def hammer() -> None:
        for _ in range(2000):
            result = limit.allow() is not None
            with lock:
                passed.append(result)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert passed.count(True) == 5
