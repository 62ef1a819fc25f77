"""How far a source's start-up got, for /healthz and /readyz while it runs on its own thread.

The start-up thread names each step as it begins it ("NVML init", "GPU enumeration", ...) and
beats while it waits; the HTTP app asks `reason()` (None once the GPUs can be sampled) and
`stuck_for()` (how long the thread itself has not moved: only a bug in our code, never a hung
NVML call, which the thread waits for with a deadline).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class StartupProgress:
    """Thread-safe: written by the start-up thread, read by the HTTP app and `serve`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._step = "NVML init"
        self._note = ""  # e.g. why the last attempt failed and when the next one is
        self._since = self._beat = clock()
        self._ready = False  # the GPUs are known: sampling may begin
        self._finished = False  # everything start-up does is done (topology included)
        self._failure: BaseException | None = None  # start-up gave up: the reason
        self._init_answered = False  # the first NVML init attempt has answered (either way)
        self._retrying = False  # set by `commit`: init failures are retried from then on

    # -- the start-up thread --------------------------------------------------------------------

    def step(self, name: str, note: str = "") -> None:
        with self._changed:
            self._step, self._note = name, note
            self._since = self._beat = self._clock()
            self._changed.notify_all()

    def beat(self) -> None:
        with self._lock:
            self._beat = self._clock()

    def init_answered(self, error: BaseException | None) -> bool:
        """The first NVML init attempt's outcome. True: retry a failure; False: give up (the
        daemon was not yet serving, so `serve` exits with the error instead)."""
        with self._changed:
            self._init_answered = True
            self._changed.notify_all()
            if error is not None and not self._retrying:
                self._failure = error
                return False
            return True

    def mark_ready(self) -> None:
        with self._changed:
            self._ready = True
            self._beat = self._clock()
            self._changed.notify_all()

    def mark_finished(self) -> None:
        with self._changed:
            self._finished = True
            self._changed.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._changed:
            self._failure = error
            self._changed.notify_all()

    # -- readers ------------------------------------------------------------------------------

    def commit(self, timeout: float) -> BaseException | None:
        """Wait up to `timeout` for the first init attempt; then either its error (the caller
        exits with it) or None: serve, and retry any later init failure with back-off."""
        with self._changed:
            self._changed.wait_for(lambda: self._init_answered, timeout)
            if self._failure is not None:
                return self._failure
            self._retrying = True
            return None

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._ready

    @property
    def failure(self) -> BaseException | None:
        with self._lock:
            return self._failure

    def wait_ready(self, timeout: float | None = None) -> bool:
        with self._changed:
            self._changed.wait_for(lambda: self._ready or self._failure is not None, timeout)
            return self._ready

    def wait_finished(self, timeout: float | None = None) -> bool:
        with self._changed:
            self._changed.wait_for(lambda: self._finished or self._failure is not None, timeout)
            return self._finished

    def reason(self) -> str | None:
        """Why the source is not ready yet, for a person; None once it is."""
        with self._lock:
            if self._failure is not None:
                return f"start-up failed: {self._failure}"
            if self._ready:
                return None
            waited = self._clock() - self._since
            text = f"{self._step} not finished after {waited:.1f}s"
            return f"{text} ({self._note})" if self._note else text

    def stuck_for(self) -> float:
        """Seconds since the start-up thread last moved (0 once ready)."""
        with self._lock:
            if self._ready:
                return 0.0
            return self._clock() - self._beat
