"""The rule engine's own thread: the ticks hand it their series and it ingests and evaluates
them there, one job at a time, in the order handed over, so the thread that samples the GPUs
never runs (or waits long for) a rule.

One evaluation at a time: while one is queued or running, a tick queues its series for the
history only (`evaluating` tells the tick so; it counts the evaluation as skipped). Jobs are
capped (`max_jobs`): past the cap a job is refused and its series miss the history, so a
stalled engine can hold only that many ticks' series in memory.

A job that raises is not logged here: the next tick takes the exception (`take_failure`) and
raises it under the tick's guard, which logs it and reports the rule evaluation as failed.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable


class RuleWorker:
    def __init__(self, max_jobs: int, name: str = "rule-evaluation") -> None:
        self.max_jobs = max_jobs
        self._jobs: deque[tuple[Callable[[], None], threading.Event | None]] = deque()
        self._wake = threading.Condition()
        self._evaluating = False  # an evaluation queued or running
        self._failure: Exception | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread after the job it is running (a group stops at its time budget);
        queued jobs are dropped."""
        with self._wake:
            self._stopping = True
            self._jobs.clear()
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def evaluating(self) -> bool:
        """Whether an evaluation is queued or running."""
        return self._evaluating

    def submit(
        self, job: Callable[[], None], *, evaluation: bool = False
    ) -> threading.Event | None:
        """Queue `job`; None when the queue is full or the worker stopped (the job is dropped).
        For an evaluation, the returned event is set once it has run."""
        with self._wake:
            if self._stopping or len(self._jobs) >= self.max_jobs:
                return None
            done = threading.Event()
            if evaluation:
                self._evaluating = True
            self._jobs.append((job, done if evaluation else None))
            self._wake.notify()
            return done

    def take_failure(self) -> Exception | None:
        """The exception a job raised since the last call, if any (the latest one)."""
        with self._wake:
            failure, self._failure = self._failure, None
            return failure

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._jobs and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return
                job, done = self._jobs.popleft()
            try:
                job()
            except Exception as exc:  # the thread must outlive any job; the next tick says it
                with self._wake:
                    self._failure = exc
            finally:
                if done is not None:
                    self._evaluating = False
                    done.set()
