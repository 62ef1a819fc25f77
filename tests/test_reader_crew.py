"""The reader crew: a tick's per-GPU reads on one thread in turn, more only when reads stall."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpu_exporter.collect.reader_crew import HANDOVER_SECONDS, ReaderCrew, handover_seconds


def reader(value: Any, threads: list[str] | None = None) -> Callable[[], Any]:
    """A read that answers at once, noting the thread it ran on."""

    def read() -> Any:
        if threads is not None:
            threads.append(threading.current_thread().name)
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


def test_reads_that_answer_run_in_turn_on_one_thread(crew: ReaderCrew) -> None:
    threads: list[str] = []
    results = crew.run([reader(i, threads) for i in range(8)], handover=5.0, deadline=10.0)
    assert [r.result() for r in results] == list(range(8))
    assert len(set(threads)) == 1 and threads[0].startswith("test-reader-")
    again: list[str] = []
    crew.run([reader(i, again) for i in range(8)], handover=5.0, deadline=10.0)
    assert again == threads  # the same thread, kept from one run to the next


def test_a_read_stuck_in_a_call_does_not_hold_up_the_others(crew: ReaderCrew) -> None:
    release, threads = threading.Event(), list[str]()
    reads = [stuck(release, threads), *(reader(i, threads) for i in range(1, 4))]
    try:
        started = time.monotonic()
        results = crew.run(reads, handover=0.05, deadline=2.0)
        assert time.monotonic() - started >= 2.0  # waited its deadline for the stuck one
        assert not results[0].done()
        assert [r.result() for r in results[1:]] == [1, 2, 3]
        assert threads[0] != threads[1]  # a second reader took over the rest
        fresh: list[str] = []
        crew.run([reader(0, fresh)], handover=5.0, deadline=5.0)
        assert fresh[0] != threads[0]  # the stuck thread left the crew
    finally:
        release.set()
    assert results[0].result(timeout=5) == "late"


def test_slow_reads_bring_in_more_readers(crew: ReaderCrew) -> None:
    threads: list[str] = []

    def slow(i: int) -> Callable[[], int]:
        def read() -> int:
            threads.append(threading.current_thread().name)
            time.sleep(0.2)
            return i

        return read

    results = crew.run([slow(i) for i in range(4)], handover=0.02, deadline=5.0)
    assert [r.result() for r in results] == [0, 1, 2, 3]
    assert len(set(threads)) > 1


def test_a_read_that_raises_delivers_its_error(crew: ReaderCrew) -> None:
    def broken() -> None:
        raise RuntimeError("bad read")

    results = crew.run([broken, reader("ok")], handover=5.0, deadline=5.0)
    with pytest.raises(RuntimeError, match="bad read"):
        results[0].result()
    assert results[1].result() == "ok"


def test_reads_never_started_by_the_deadline_are_cancelled(crew: ReaderCrew) -> None:
    """A handover longer than the deadline: no second reader joins, so the reads behind the
    stuck one never start, and say so (cancelled), instead of looking hung."""
    release, threads = threading.Event(), list[str]()
    try:
        results = crew.run([stuck(release, threads), reader(1)], handover=60.0, deadline=0.3)
        assert not results[0].done() and results[1].cancelled()
    finally:
        release.set()


def test_no_reads_no_thread(crew: ReaderCrew) -> None:
    before = threading.active_count()
    assert crew.run([], handover=0.01, deadline=1.0) == []
    assert threading.active_count() == before


def test_stop_lets_the_free_threads_exit() -> None:
    crew = ReaderCrew("test-stopping")
    crew.run([reader(1)], handover=5.0, deadline=5.0)
    assert any(t.name.startswith("test-stopping-") for t in threading.enumerate())
    crew.stop()
    deadline = time.monotonic() + 5
    while any(t.name.startswith("test-stopping-") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the free reader did not exit"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("deadline", "devices", "expected"),
    [(0.8, 8, HANDOVER_SECONDS), (0.8, 64, 0.8 / 256), (0.8, 0, HANDOVER_SECONDS)],
)
def test_the_handover_leaves_the_last_gpu_most_of_the_deadline(
    deadline: float, devices: int, expected: float
) -> None:
    assert handover_seconds(deadline, devices) == pytest.approx(expected)
    assert max(devices - 1, 0) * handover_seconds(deadline, devices) <= deadline / 4
