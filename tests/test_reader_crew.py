"""The reader crew: a tick's per-GPU reads on one thread in turn, more when reads stall or fall
behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpu_exporter.collect import reader_crew
from gpu_exporter.collect.reader_crew import ReaderCrew


def reader(value: Any, threads: list[str] | None = None) -> Callable[[], Any]:
    """A read that answers at once, noting the thread it ran on."""

    def read() -> Any:
        if threads is not None:
            threads.append(threading.current_thread().name)
        return value

    return read


def sleeping(value: Any, seconds: float, threads: list[str]) -> Callable[[], Any]:
    """A read that takes `seconds` (a slow NVML call), noting the thread it ran on."""

    def read() -> Any:
        threads.append(threading.current_thread().name)
        time.sleep(seconds)
        return value

    return read


def stuck(release: threading.Event, threads: list[str]) -> Callable[[], str]:
    def read() -> str:
        threads.append(threading.current_thread().name)
        release.wait(30)
        return "late"

    return read


@pytest.fixture
def crew() -> Any:
    made = ReaderCrew("test-reader")
    yield made
    made.stop()


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """No reader joins in these tests' time: reads that answer stay on one thread even on a
    loaded machine."""
    monkeypatch.setattr(reader_crew, "HANDOVER_SECONDS", 5.0)
    monkeypatch.setattr(reader_crew, "BUDGET_SHARE", 1.0)


def quick_handover(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    monkeypatch.setattr(reader_crew, "HANDOVER_SECONDS", seconds)


def test_reads_that_answer_run_in_turn_on_one_thread(crew: ReaderCrew, patient: None) -> None:
    threads: list[str] = []
    results = crew.run([reader(i, threads) for i in range(8)], deadline=10.0)
    assert [r.result() for r in results] == list(range(8))
    assert len(set(threads)) == 1 and threads[0].startswith("test-reader-")
    again: list[str] = []
    crew.run([reader(i, again) for i in range(8)], deadline=10.0)
    assert again == threads  # the same thread, kept from one run to the next


def test_a_read_stuck_in_a_call_does_not_hold_up_the_others(
    crew: ReaderCrew, monkeypatch: pytest.MonkeyPatch
) -> None:
    quick_handover(monkeypatch, 0.05)
    monkeypatch.setattr(reader_crew, "BUDGET_SHARE", 1.0)  # only the stall brings a reader
    release, threads = threading.Event(), list[str]()
    reads = [stuck(release, threads), *(reader(i, threads) for i in range(1, 4))]
    try:
        started = time.monotonic()
        results = crew.run(reads, deadline=2.0)
        assert time.monotonic() - started >= 2.0  # waited its deadline for the stuck one
        assert not results[0].done()
        assert [r.result() for r in results[1:]] == [1, 2, 3]
        assert threads[0] != threads[1]  # a second reader took over the rest
        fresh: list[str] = []
        crew.run([reader(0, fresh)], deadline=5.0)
        assert fresh[0] != threads[0]  # the stuck thread left the crew
    finally:
        release.set()
    assert results[0].result(timeout=5) == "late"


def test_slow_reads_bring_in_more_readers(
    crew: ReaderCrew, monkeypatch: pytest.MonkeyPatch
) -> None:
    quick_handover(monkeypatch, 0.02)
    threads: list[str] = []
    results = crew.run([sleeping(i, 0.2, threads) for i in range(4)], deadline=5.0)
    assert [r.result() for r in results] == [0, 1, 2, 3]
    assert len(set(threads)) > 1


def test_threads_a_slow_run_brought_in_leave_after_a_quick_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crew = ReaderCrew("test-trim")

    def readers() -> int:
        return sum(t.name.startswith("test-trim-") for t in threading.enumerate())

    def slow() -> None:
        time.sleep(0.2)

    try:
        quick_handover(monkeypatch, 0.02)
        crew.run([slow] * 4, deadline=5.0)
        assert readers() > 1
        monkeypatch.setattr(reader_crew, "HANDOVER_SECONDS", 5.0)
        monkeypatch.setattr(reader_crew, "BUDGET_SHARE", 1.0)
        crew.run([reader(1)], deadline=5.0)
        deadline = time.monotonic() + 5
        while readers() > 1:
            assert time.monotonic() < deadline, "the extra readers stayed"
            time.sleep(0.01)
    finally:
        crew.stop()


def test_a_read_that_raises_delivers_its_error(crew: ReaderCrew, patient: None) -> None:
    def broken() -> None:
        raise RuntimeError("bad read")

    results = crew.run([broken, reader("ok")], deadline=5.0)
    with pytest.raises(RuntimeError, match="bad read"):
        results[0].result()
    assert results[1].result() == "ok"


def test_reads_never_started_by_the_deadline_are_cancelled(crew: ReaderCrew, patient: None) -> None:
    """A handover longer than the deadline: no second reader joins, so the reads behind the
    stuck one never start, and say so (cancelled), instead of looking hung."""
    release, threads = threading.Event(), list[str]()
    try:
        results = crew.run([stuck(release, threads), reader(1)], deadline=0.3)
        assert not results[0].done() and results[1].cancelled()
    finally:
        release.set()


def test_no_reads_no_thread(crew: ReaderCrew) -> None:
    before = threading.active_count()
    assert crew.run([], deadline=1.0) == []
    assert threading.active_count() == before


def test_stop_lets_the_free_threads_exit() -> None:
    crew = ReaderCrew("test-stopping")
    crew.run([reader(1)], deadline=5.0)
    assert any(t.name.startswith("test-stopping-") for t in threading.enumerate())
    crew.stop()
    deadline = time.monotonic() + 5
    while any(t.name.startswith("test-stopping-") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the free reader did not exit"
        time.sleep(0.01)


def test_reads_that_would_overrun_the_budget_bring_in_readers(
    crew: ReaderCrew, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read answers within the handover (no stall), but at one reader's pace twenty of
    them would take 0.6 s, past a quarter of the 1 s deadline: readers join, and all are done
    well within it."""
    quick_handover(monkeypatch, 0.05)
    threads: list[str] = []
    started = time.monotonic()
    results = crew.run([sleeping(i, 0.03, threads) for i in range(20)], deadline=1.0)
    assert [r.result() for r in results] == list(range(20))
    assert len(set(threads)) > 1 and time.monotonic() - started < 1.0
