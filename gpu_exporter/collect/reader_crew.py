"""A tick's per-GPU reads on as few threads as keep up with them.

One thread per GPU, all started at once, is what isolates a GPU that hangs; but eight threads
runnable together fight for the GIL at every NVML call (ctypes releases it around each foreign
call and retakes it after), and on a small node that fight costs more CPU than the reads. So the
reads of a tick go to one reader thread, one GPU after another, and another reader joins when
no read has answered for `HANDOVER_SECONDS` (a GPU stuck in a call holds the others up that
long), or when the reads so far say the rest would not be done within `BUDGET_SHARE` of the
deadline (calls slow enough, or GPUs enough, that one thread would not keep up), up to one
reader per GPU. A thread still stuck in a call when the tick ends is left behind (ctypes calls
cannot be cancelled); the next tick starts a fresh one.
"""

from __future__ import annotations

import collections
import concurrent.futures as futures
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpu_exporter.collect.worker import Worker

__all__ = ["ReaderCrew"]

# How long no read may answer before another reader joins: a read of one GPU at NVML's usual
# speed takes about a millisecond of CPU. Also how often the waiting thread looks: each look
# takes the GIL from a reader, so not at every answer.
HANDOVER_SECONDS = 0.01
# The share of the deadline all reads should take: past it, by the pace so far, another joins.
BUDGET_SHARE = 0.25


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

    def run(self, reads: Sequence[Callable[[], Any]], deadline: float) -> list[futures.Future[Any]]:
        """Each read's result, waiting at most `deadline` seconds: one not done by then is
        still running (hung), one cancelled never started (no thread was free in time)."""
        if not reads:
            return []
        run = _Run(reads)
        started = time.monotonic()
        ends, budget_ends = started + deadline, started + deadline * BUDGET_SHARE
        crew = [self._join(run)]
        answered = 0
        while not run.finished.wait(max(0.0, min(HANDOVER_SECONDS, ends - time.monotonic()))):
            now = time.monotonic()
            if now >= ends:
                break
            stalled, answered = run.answered == answered, run.answered
            pace = (now - started) / answered if answered else 0.0
            behind = now + (len(reads) - answered) * pace > budget_ends
            if (stalled or behind) and run.waiting() and len(crew) < len(reads):
                crew.append(self._join(run))
        run.close()
        leaving = []
        with self._lock:
            for worker, serving in crew:
                if serving.done() and not self._stopped:
                    self._free.append(worker)
                else:
                    leaving.append(worker)  # stuck in a call: it exits once that returns
            # Kept: as many as this run needed. A thread each slow tick once brought in would
            # otherwise stay for good, and each holds a stack and a malloc arena.
            while len(self._free) > len(crew):
                leaving.append(self._free.pop(0))
        for worker in leaving:
            worker.stop()
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
