"""The daemon's uvicorn server: idle, it wakes once a second; it stops at once when asked."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from gpu_exporter.web import http_server
from tests.daemon import serve
from tests.support import wait_for

HOUR = 3600.0


async def _app(scope: Any, receive: Any, send: Any) -> None:  # never called: no requests
    raise AssertionError("no request expected")


def make_server() -> uvicorn.Server:
    return http_server.server_class()(uvicorn.Config(_app, log_level="warning"))


def run_until_stopped(server: uvicorn.Server, stop: Callable[[], None]) -> None:
    """Run `server.main_loop()` on this thread; once the event loop idles in select(), call
    `stop()` on another thread; fail unless the main loop then returns within 30 s.

    Nothing else can end the select in time: the main loop's waits are an hour long and the
    test sets no timer of its own (an asyncio timeout would wake the loop itself).
    """
    returned = threading.Event()
    failures: list[str] = []

    def stop_then_watch(
        loop: asyncio.AbstractEventLoop, task: asyncio.Task[None], thread: int
    ) -> None:
        try:
            wait_for(lambda: _in_select(thread), timeout=30, what="an idle loop", interval=0.01)
        except AssertionError as exc:
            failures.append(str(exc))
        else:
            stop()
            if returned.wait(timeout=30):
                return
            failures.append("the main loop was still waiting 30 s after stop()")
        loop.call_soon_threadsafe(task.cancel)

    async def main() -> None:
        task = asyncio.create_task(server.main_loop())
        # The first on_tick sets the default headers; then the task waits for its wake-up.
        while not server.server_state.default_headers:
            assert not task.done(), "the main loop ended before it was asked to"
            await asyncio.sleep(0)
        args = (asyncio.get_running_loop(), task, threading.get_ident())
        watcher = threading.Thread(target=stop_then_watch, args=args)
        watcher.start()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        returned.set()
        watcher.join()

    asyncio.run(main())
    assert not failures, failures[0]


def _in_select(thread: int) -> bool:
    frame = sys._current_frames().get(thread)
    return frame is not None and frame.f_code.co_name == "select"


@pytest.fixture
def hour_long_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle waits of an hour: only a wake-up can end the main loop within a test."""
    monkeypatch.setattr(http_server, "seconds_to_next_second", lambda: HOUR)


@pytest.mark.usefixtures("hour_long_waits")
def test_setting_should_exit_from_another_thread_ends_the_main_loop() -> None:
    server = make_server()

    def stop() -> None:
        server.should_exit = True

    run_until_stopped(server, stop)
    assert server.should_exit


@pytest.mark.usefixtures("hour_long_waits")
def test_sigterm_ends_the_main_loop_blocked_in_select() -> None:
    server = make_server()
    with server.capture_signals():  # uvicorn's handler; ours does not re-raise afterwards
        run_until_stopped(server, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert server.should_exit and not server.force_exit


def test_limit_max_requests_is_checked_at_each_wake_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "seconds_to_next_second", lambda: 0.01)
    server = http_server.server_class()(
        uvicorn.Config(_app, log_level="warning", limit_max_requests=3)
    )

    async def main() -> None:
        task = asyncio.create_task(server.main_loop())
        for _ in range(3):
            await asyncio.sleep(0.02)
            assert not task.done(), "stopped before the limit was reached"
        server.server_state.total_requests = 3
        await asyncio.wait_for(task, timeout=30)

    asyncio.run(main())


def test_each_tick_refreshes_the_date_header() -> None:
    """The main loop calls on_tick(0) once a second; uvicorn refreshes the Date header when
    the counter is a multiple of 10."""
    server = make_server()

    async def tick_twice() -> None:
        for _ in range(2):
            server.server_state.default_headers = []
            before = time.time()
            assert not await server.on_tick(0)
            (date,) = [v for k, v in server.server_state.default_headers if k == b"date"]
            after = time.time()
            assert date in {formatdate(t, usegmt=True).encode() for t in (before, after)}

    asyncio.run(tick_twice())


@pytest.mark.parametrize(("now", "wait"), [(1000.0, 1.001), (1000.25, 0.751), (1000.9995, 0.0015)])
def test_the_idle_wait_ends_just_past_the_next_second(
    monkeypatch: pytest.MonkeyPatch, now: float, wait: float
) -> None:
    monkeypatch.setattr(time, "time", lambda: now)
    assert http_server.seconds_to_next_second() == pytest.approx(wait)


def test_sigint_stops_cleanly_with_status_0(tmp_path: Path) -> None:
    # SIGTERM: tests/test_serve.py
    with serve(tmp_path, "--simulate", "mixed", "--interval", "0.5") as daemon:
        daemon.wait_ready()
        daemon.process.send_signal(signal.SIGINT)
        assert daemon.process.wait(timeout=15) == 0, daemon.output()
