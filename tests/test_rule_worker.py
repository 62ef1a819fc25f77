"""The rule thread: jobs in order, one evaluation at a time, a capped queue, and failures
reported by the next tick rather than lost on the thread."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpu_exporter.alerting.rules.manager import RuleManager
from gpu_exporter.alerting.rules.worker import RuleWorker
from gpu_exporter.alerting.settings import RulesConfig
from gpu_exporter.model.series import SeriesSet, series


def test_jobs_run_in_order_and_the_queue_is_capped() -> None:
    worker = RuleWorker(max_jobs=3)
    release = threading.Event()
    ran: list[int] = []
    worker.start()
    try:
        running = threading.Event()

        def block() -> None:
            running.set()
            release.wait()

        blocking = worker.submit(block, evaluation=True)
        assert blocking is not None and worker.evaluating
        assert running.wait(10)  # taken off the queue
        queued = [worker.submit(lambda i=i: ran.append(i)) for i in range(5)]
        accepted = [q is not None for q in queued]
        assert accepted == [True, True, True, False, False]
        release.set()
        assert blocking.wait(10)
        last = worker.submit(lambda: None, evaluation=True)
        assert last is not None and last.wait(10)
        assert ran == [i for i, ok in enumerate(accepted) if ok]
        assert not worker.evaluating
    finally:
        release.set()
        worker.stop()
    assert worker.submit(lambda: None) is None  # stopped: refused


def test_a_failure_on_the_rule_thread_is_raised_by_the_next_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: x > 0\n")
    manager = RuleManager(RulesConfig(files=[str(path)]), interval_seconds=4.0)
    manager.load()

    evaluate = manager._evaluate
    calls: list[float] = []

    def broken_once(now: float) -> None:
        calls.append(now)
        if len(calls) == 1:
            raise ValueError("evaluation bug")
        evaluate(now)

    monkeypatch.setattr(manager, "_evaluate", broken_once)
    manager.start()
    try:
        # Each tick waits for its evaluation a quarter of 4 s at most: done long before.
        manager.on_series(SeriesSet(1000.0, {"x": (series("x", 1.0),)}))
        with pytest.raises(RuntimeError, match="rule evaluation failed: ValueError"):
            manager.on_series(SeriesSet(1001.0, {"x": (series("x", 1.0),)}))
        manager.on_series(SeriesSet(1002.0, {"x": (series("x", 1.0),)}))  # reported once
        assert calls == [1000.0, 1001.0, 1002.0]
        # 1001 evaluated the group; at 1002 it is not due yet (a 4 s interval).
        assert manager.evaluations_total == 1 and len(manager.alerts_json()) == 1
    finally:
        manager.stop()
