"""XID errors and MIG configuration changes from NVML events, on a dedicated thread blocked in
nvmlEventSetWait.

ctypes releases the GIL during the wait, so the blocked thread costs nothing. NVML only
reports XIDs that happen after registration; older ones live in the kernel log. Its NVML calls
go through the choke point (`NvmlCalls`), counted under the field `xid_events`; the counts are
exported by the `xid` collector (`collect/nvml/collectors/xid.py`). A MIG configuration change
(nvmlEventMigConfigChange, registered where the GPU supports it) is counted per GPU too: the
`mig` collector enumerates the GPU's MIG devices again at its next tick.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml.calls import NvmlCalls
from gpu_exporter.collect.source import ErrorLog

log = logging.getLogger(__name__)

WAIT_MS = 500  # short enough for a prompt stop, long enough to stay idle
KEY = "xid_events"  # the errors_total `field` of every call made here


def handle_address(handle: Any) -> int | None:
    """A device handle's pointer value, to match an event's device to ours."""
    return ctypes.cast(handle, ctypes.c_void_p).value


@dataclass
class XidCounts:
    """Per-GPU-UUID XID counts and last-seen times, and MIG configuration changes seen; survives
    NVML re-initialisation."""

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _counts: dict[str, dict[int, tuple[int, float]]] = field(default_factory=dict)
    _mig_changes: dict[str, int] = field(default_factory=dict)
    _watched: set[str] = field(default_factory=set)  # ever registered for XID events

    def watch(self, uuid: str) -> None:
        """The GPU is registered for XID events: from now on a count of 0 is a fact."""
        with self._lock:
            self._watched.add(uuid)

    def watched(self, uuid: str) -> bool:
        """Whether the GPU was ever registered for XID events (so its XIDs can be counted)."""
        with self._lock:
            return uuid in self._watched

    def record_mig_change(self, uuid: str) -> None:
        with self._lock:
            self._mig_changes[uuid] = self._mig_changes.get(uuid, 0) + 1

    def mig_changes(self, uuid: str) -> int:
        """How many MIG configuration changes the GPU reported (a change means re-enumerate)."""
        with self._lock:
            return self._mig_changes.get(uuid, 0)

    def record(self, uuid: str, xid: int, when: float) -> None:
        with self._lock:
            per_gpu = self._counts.setdefault(uuid, {})
            count, _ = per_gpu.get(xid, (0, 0.0))
            per_gpu[xid] = (count + 1, when)

    def for_gpu(self, uuid: str) -> dict[int, tuple[int, float]]:
        with self._lock:
            return dict(self._counts.get(uuid, {}))


class XidWatcher:
    """Registers every device for XID events and counts them until stopped."""

    def __init__(
        self,
        handles_by_uuid: Mapping[str, object],
        counts: XidCounts,
        errors: ErrorLog,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._uuid_by_address = {
            handle_address(handle): uuid for uuid, handle in handles_by_uuid.items()
        }
        self._handles = dict(handles_by_uuid)
        self._counts = counts
        self._calls = NvmlCalls(errors)
        self._wall_clock = wall_clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: object | None = None
        self.registered: set[str] = set()

    def start(self) -> None:
        self._event_set, error = self._calls.attempt(KEY, N.nvmlEventSetCreate)
        if error:
            log.warning("XID events unavailable: %s", error)
            return
        for uuid, handle in self._handles.items():
            self._register(uuid, handle)
        if not self.registered:
            return
        thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
        thread.start()
        self._thread = thread  # only once started: stop() may join it from another thread

    def _register(self, uuid: str, handle: object) -> None:
        supported = self._calls.call(KEY, N.nvmlDeviceGetSupportedEventTypes, handle)
        wanted = N.nvmlEventTypeXidCriticalError & (supported or 0)
        if wanted:
            # A failure (even NOT_SUPPORTED) leaves the set usable (nvml.h): others register.
            _, error = self._calls.attempt(
                KEY, N.nvmlDeviceRegisterEvents, handle, wanted, self._event_set
            )
            if not error:
                self.registered.add(uuid)
                self._counts.watch(uuid)
        if N.nvmlEventMigConfigChange & (supported or 0):
            # Separately, so that a GPU refusing it still reports XIDs; without it, a new
            # MIG layout is found at the next slow refresh instead.
            _, error = self._calls.attempt(
                KEY,
                N.nvmlDeviceRegisterEvents,
                handle,
                N.nvmlEventMigConfigChange,
                self._event_set,
                expected=(N.NVMLError_NotSupported, N.NVMLError_NoPermission),
            )
            if not error:
                self.registered.add(uuid)

    def _run(self) -> None:
        try:
            self._wait_loop()
        finally:
            # The thread that waits on the set frees it: freeing it under a waiting thread
            # would pull the memory out from under nvmlEventSetWait.
            self._free()

    def _wait_loop(self) -> None:
        while not self._stop.is_set():
            event, error = self._calls.attempt(
                KEY, N.nvmlEventSetWait, self._event_set, WAIT_MS, expected=(N.NVMLError_Timeout,)
            )
            if error == "Timeout":
                continue
            if error:
                # GPU lost or driver trouble: back off; the source re-initialises and restarts us.
                self._stop.wait(1.0)
                continue
            uuid = self._uuid_by_address.get(handle_address(event.device))
            if uuid is None:
                continue
            if event.eventType & N.nvmlEventMigConfigChange:
                log.info("MIG configuration changed on GPU %s", uuid)
                self._counts.record_mig_change(uuid)
            if not event.eventType & N.nvmlEventTypeXidCriticalError:
                continue
            log.warning("XID %d on GPU %s", event.eventData, uuid)
            self._counts.record(uuid, int(event.eventData), self._wall_clock())

    def stop(self, join: bool = True) -> None:
        """Ask the thread to finish (within one wait, 0.5 s); optionally wait for it."""
        self._stop.set()
        if self._thread is None:
            self._free()
        elif join:
            self.join()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=WAIT_MS / 1000 * 4)
            if self._thread.is_alive():
                log.warning("XID thread still blocked in NVML; leaving its event set allocated")

    def _free(self) -> None:
        event_set, self._event_set = self._event_set, None
        if event_set is not None:
            self._calls.call(KEY, N.nvmlEventSetFree, event_set)
