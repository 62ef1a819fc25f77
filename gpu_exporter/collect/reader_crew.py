"""A tick's per-GPU reads on as few threads as keep up with them.

One thread per GPU, all started at once, is what isolates a GPU that hangs; but eight threads
runnable together fight for the GIL at every NVML call (ctypes releases it around each foreign
call and retakes it after), and on a small node that fight costs more CPU than the reads. So the
reads of a tick go to one reader thread, one GPU after another, and a second reader joins only
when no read has finished for `handover_seconds`: a GPU whose call hangs, or calls slow enough
that one thread would not finish in time, bring in more threads, up to one per GPU. A thread
still stuck in a call when the tick ends is left behind (ctypes calls cannot be cancelled); the
next tick starts a fresh one.
"""

from __future__ import annotations

import collections
import concurrent.futures as futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpu_exporter.collect.worker import Worker

__all__ = ["ReaderCrew", "handover_seconds"]

# The longest one read may run before the next GPU's read starts on another thread: a read of
# one GPU at NVML's usual speed takes about a millisecond of CPU.
HANDOVER_SECONDS = 0.01


def handover_seconds(deadline_seconds: float, devices: int) -> float:
    """At most HANDOVER_SECONDS, and small enough that reads each just under it, one after
    another, still leave the last GPU three quarters of the deadline."""
    return min(HANDOVER_SECONDS, deadline_seconds / (4 * max(1, devices)))


class _Run:
    """One tick's reads: a queue of them, taken in order by the crew's threads."""

    def __init__(self, reads: Sequence[Callable[[], Any]]) -> None:
        self.reads = reads
        self.results: list[futures.Future[Any]] = [futures.Future() for _ in reads]
        self.finished = threading.Event()  # every read answered
        self.answered = 0  # how many: the sampler's measure of progress
        self._waiting = collections.deque(range(len(reads)))
        self._lock = threading.Lock()
        self._closed = False

    def serve(self) -> None:
        """On a reader thread: take reads until none is left or the tick is over."""
        while (index := self._take()) is not None:
            result = self.results[index]
            try:
                result.set_result(self.reads[index]())
            except BaseException as exc:  # delivered to the sampler, which waits on it
                result.set_exception(exc)
            with self._lock:
                self.answered += 1
                if self.answered == len(self.reads):
                    self.finished.set()

    def waiting(self) -> bool:
        with self._lock:
            return bool(self._waiting)

    def close(self) -> None:
        """The tick is over: reads not yet started never will be (their results cancelled)."""
        with self._lock:
            self._closed = True
            never = list(self._waiting)
            self._waiting.clear()
        for index in never:
            self.results[index].cancel()

    def _take(self) -> int | None:
        with self._lock:
            if self._closed or not self._waiting:
                return None
            index = self._waiting.popleft()
        self.results[index].set_running_or_notify_cancel()
        return index


class ReaderCrew:
    """The reader threads, kept from one tick to the next while they are free."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._free: list[Worker] = []
        self._started = 0  # threads made so far, for their names
        self._lock = threading.Lock()  # the sampler's ticks and a recovery's enumeration
        self._stopped = False

    def run(
        self, reads: Sequence[Callable[[], Any]], handover: float, deadline: float
    ) -> list[futures.Future[Any]]:
        """Each read's result, waiting at most `deadline` seconds: one not done by then is
        still running (hung), one cancelled never started (no thread was free in time)."""
        run = _Run(reads)
        if not reads:
            return []
        ends = time.monotonic() + deadline
        crew = [self._join(run)]
        # The sampler wakes once per handover, not at each answer: each wake-up would take the
        # GIL from the reader.
        answered = 0
        while not run.finished.wait(max(0.0, min(handover, ends - time.monotonic()))):
            if time.monotonic() >= ends:
                break
            stalled, answered = run.answered == answered, run.answered
            if stalled and run.waiting() and len(crew) < len(reads):
                crew.append(self._join(run))  # nothing answered for a while: one more reader
        run.close()
        for worker, serving in crew:
            with self._lock:
                keep = serving.done() and not self._stopped
                if keep:
                    self._free.append(worker)
            if not keep:
                worker.stop()  # stuck in a call: it exits once that returns
        return run.results

    def stop(self) -> None:
        """Let the free threads exit (a run still under way keeps its own)."""
        with self._lock:
            free, self._free, self._stopped = self._free, [], True
        for worker in free:
            worker.stop()

    def _join(self, run: _Run) -> tuple[Worker, futures.Future[Any]]:
        with self._lock:
            if self._free:
                worker = self._free.pop()
            else:
                self._started += 1
                worker = Worker(f"{self.name}-{self._started}")
        return worker, worker.submit(run.serve)
