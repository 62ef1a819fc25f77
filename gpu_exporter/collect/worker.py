"""A one-thread worker per GPU, on a daemon thread.

Not `ThreadPoolExecutor`: its threads are joined at interpreter exit, so one NVML call hung in
the driver would keep the daemon from stopping on SIGTERM. A hung worker is simply abandoned.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_STOP = object()


class Worker:
    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        return future

    def stop(self) -> None:
        """Finish the queued work, then exit; a thread stuck in a call exits when it returns."""
        self._queue.put(_STOP)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # delivered to whoever waits on the future
                future.set_exception(exc)


def on_own_thread(name: str, fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run `fn(*args)` once on a fresh daemon thread (abandoned if it never returns)."""
    worker = Worker(name)
    future = worker.submit(fn, *args)
    worker.stop()
    return future
