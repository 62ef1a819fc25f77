"""The NVML source: every GPU on the node, read concurrently, each within a deadline.

Lifecycle:
- `start()` initialises NVML, enumerates GPUs by index, keys them by UUID, starts the XID thread.
- `sample()` gives each GPU's `DeviceReader.read_tick` to that GPU's own worker thread and waits
  at most `device_deadline_seconds`. A GPU that does not answer in time is reported down for
  that tick, the call it hung in is quarantined, and its stuck thread is abandoned (ctypes
  calls cannot be cancelled); the other GPUs are not held up.
- A GPU answering GPU_IS_LOST is reported down; with back-off, the source shuts NVML down,
  re-initialises it and re-enumerates by UUID (indices may change after a driver reload).
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml as N

from gpu_exporter.snapshot import DeviceSample
from gpu_exporter.sources.base import ErrorLog, SourceUnavailableError
from gpu_exporter.sources.nvml_device import (
    DeviceLostError,
    DeviceReader,
    ReaderSettings,
    TickAbandonedError,
    error_name,
)
from gpu_exporter.sources.worker import Worker
from gpu_exporter.sources.xid import XidCounts, XidWatcher

log = logging.getLogger(__name__)

SIMULATE_HINT = "run `gpu-exporter serve --simulate` to try the exporter on a simulated node"


@dataclass
class NvmlSettings:
    device_deadline_seconds: float = 0.8
    slow_refresh_seconds: float = 30.0
    recovery_initial_backoff_seconds: float = 2.0
    recovery_max_backoff_seconds: float = 60.0
    hang_quarantine_seconds: float = 60.0
    max_abandoned_threads_per_device: int = 2
    gpm: bool = True
    pcie_throughput_fallback: bool = True
    xid_events: bool = True

    def reader_settings(self) -> ReaderSettings:
        return ReaderSettings(
            slow_refresh_seconds=self.slow_refresh_seconds,
            hang_quarantine_seconds=self.hang_quarantine_seconds,
            gpm=self.gpm,
            pcie_throughput_fallback=self.pcie_throughput_fallback,
        )


@dataclass
class _Device:
    reader: DeviceReader
    worker: Worker
    lost: bool = False
    down_reason: str = ""
    pending: futures.Future[list] | None = None
    abandoned: list[futures.Future[list]] = field(default_factory=list)  # ticks stuck in a call


@dataclass
class _Recovery:
    backoff: float
    next_attempt: float = 0.0
    attempts: int = 0


def _start_error(exc: N.NVMLError) -> SourceUnavailableError:
    reasons = {
        N.NVML_ERROR_LIBRARY_NOT_FOUND: "the NVIDIA driver library libnvidia-ml.so.1 was not found",
        N.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
        N.NVML_ERROR_NO_PERMISSION: "this user may not open the NVIDIA devices",
    }
    why = reasons.get(getattr(exc, "value", None), f"NVML could not start ({exc})")
    return SourceUnavailableError(f"No GPU telemetry: {why}; {SIMULATE_HINT}.")


@dataclass
class NvmlSource:
    settings: NvmlSettings = field(default_factory=NvmlSettings)
    errors: ErrorLog = field(default_factory=ErrorLog)
    clock: Callable[[], float] = time.monotonic
    record_timings: bool = False
    name: str = "nvml"

    def __post_init__(self) -> None:
        self._devices: dict[str, _Device] = {}
        self._node_info: dict[str, str] = {}
        self._xid_counts = XidCounts()
        self._xid: XidWatcher | None = None
        self._tick = 0
        self._initialised = False
        self._recovery = _Recovery(self.settings.recovery_initial_backoff_seconds)
        self.timings: dict[str, list[float]] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def initialised(self) -> bool:
        return self._initialised

    def start(self) -> None:
        try:
            N.nvmlInit()
        except N.NVMLError as exc:
            raise _start_error(exc) from exc
        self._initialised = True
        self._node_info = self._read_node_info()
        self._enumerate()
        self._start_xid()

    def close(self) -> None:
        if self._xid is not None:
            self._xid.stop()
            self._xid = None
        for device in self._devices.values():
            device.reader.close()
            device.worker.stop()
        self._devices.clear()
        if self._initialised:
            self._initialised = False
            with contextlib.suppress(N.NVMLError):
                N.nvmlShutdown()

    def node_info(self) -> dict[str, str]:
        return dict(self._node_info)

    def unsupported_by_device(self) -> dict[str, list[str]]:
        """What each GPU was learned not to support (diagnostics and validation)."""
        return {uuid: sorted(d.reader.unsupported) for uuid, d in self._devices.items()}

    def _read_node_info(self) -> dict[str, str]:
        info: dict[str, str] = {}
        for key, fn in (
            ("driver_version", N.nvmlSystemGetDriverVersion),
            ("nvml_version", N.nvmlSystemGetNVMLVersion),
            ("cuda_driver_version", N.nvmlSystemGetCudaDriverVersion),
        ):
            try:
                info[key] = str(fn())
            except N.NVMLError as exc:
                self.errors.add(self.name, key, error_name(exc))
        return info

    def _enumerate(self) -> None:
        """Bind every GPU NVML lists to a reader, keyed by UUID (kept across re-inits)."""
        count = N.nvmlDeviceGetCount()
        driver = self._node_info.get("driver_version", "")
        for index in range(count):
            try:
                handle = N.nvmlDeviceGetHandleByIndex(index)
                uuid = N.nvmlDeviceGetUUID(handle)
            except N.NVMLError as exc:
                self.errors.add(self.name, "device_handle", error_name(exc))
                log.warning("GPU %d not usable now (%s); will retry", index, exc)
                continue
            device = self._devices.get(uuid)
            if device is None:
                reader = DeviceReader(
                    index=index,
                    handle=handle,
                    errors=self.errors,
                    xid_counts=self._xid_counts,
                    settings=self.settings.reader_settings(),
                    clock=self.clock,
                    timings=self.timings if self.record_timings else None,
                )
                device = _Device(reader, self._new_worker(index))
                self._devices[uuid] = device
            else:
                device.reader.close()
                device.reader.index, device.reader.handle = index, handle
                device.lost, device.down_reason = False, ""
            try:
                device.reader.read_identity(driver)
            except N.NVMLError as exc:
                device.lost, device.down_reason = True, f"identity unreadable: {error_name(exc)}"

    @staticmethod
    def _new_worker(index: int) -> Worker:
        return Worker(f"nvml-gpu{index}")

    def _start_xid(self) -> None:
        if not self.settings.xid_events:
            return
        handles = {uuid: d.reader.handle for uuid, d in self._devices.items() if not d.lost}
        self._xid = XidWatcher(handles, self._xid_counts, self.errors)
        self._xid.start()

    # -- recovery --------------------------------------------------------------------------------

    def _maybe_recover(self, now: float) -> None:
        needs = not self._initialised or any(d.lost for d in self._devices.values())
        if not needs:
            self._recovery = _Recovery(self.settings.recovery_initial_backoff_seconds)
            return
        if now < self._recovery.next_attempt:
            return
        self._recovery.attempts += 1
        log.info("re-initialising NVML (attempt %d)", self._recovery.attempts)
        if self._xid is not None:
            self._xid.stop()
            self._xid = None
        if self._initialised:
            try:
                N.nvmlShutdown()
            except N.NVMLError as exc:
                self.errors.add(self.name, "shutdown", error_name(exc))
            self._initialised = False
        try:
            N.nvmlInit()
            self._initialised = True
            self._node_info = self._read_node_info() or self._node_info
            self._enumerate()
            self._start_xid()
        except N.NVMLError as exc:
            self.errors.add(self.name, "reinit", error_name(exc))
            for device in self._devices.values():
                device.lost, device.down_reason = True, f"NVML unavailable: {error_name(exc)}"
        self._recovery.next_attempt = now + self._recovery.backoff
        self._recovery.backoff = min(
            self._recovery.backoff * 2, self.settings.recovery_max_backoff_seconds
        )

    # -- sampling --------------------------------------------------------------------------------

    def sample(self) -> list[DeviceSample]:
        now = self.clock()
        self._maybe_recover(now)
        self._tick += 1
        running: dict[str, futures.Future[list]] = {}
        for uuid, device in self._devices.items():
            if device.lost or not self._ready_for_tick(device, now):
                continue
            reader = device.reader
            reader.active_tick = self._tick
            device.pending = device.worker.submit(reader.read_tick, self._tick, now)
            running[uuid] = device.pending
        if running:
            futures.wait(running.values(), timeout=self.settings.device_deadline_seconds)
        samples = [
            self._collect(uuid, device, running.get(uuid)) for uuid, device in self._devices.items()
        ]
        return sorted(samples, key=lambda s: s.index)

    def _ready_for_tick(self, device: _Device, now: float) -> bool:
        """False while a hung call holds the device and no fresh thread may be spent on it."""
        device.abandoned = [job for job in device.abandoned if not job.done()]
        if device.pending is None or device.pending.done():
            return True
        # The previous tick is still stuck in a call: give the device a fresh thread, within
        # limits (a driver that hangs every call must not make us spawn threads forever).
        if len(device.abandoned) >= self.settings.max_abandoned_threads_per_device:
            device.down_reason = f"NVML call {device.reader.current_call} still hung"
            return False
        device.abandoned.append(device.pending)
        device.worker.stop()
        device.worker = self._new_worker(device.reader.index)
        return True

    def _collect(
        self, uuid: str, device: _Device, job: futures.Future[list] | None
    ) -> DeviceSample:
        reader = device.reader
        if job is None:
            return self._down(device, device.down_reason or "not sampled")
        if not job.done():
            hung = reader.abandon_tick(self.clock())
            self.errors.add(self.name, hung, "Timeout")
            log.warning(
                "GPU %d: %s did not answer within %.2fs",
                reader.index,
                hung,
                self.settings.device_deadline_seconds,
            )
            return self._down(device, f"NVML call {hung} did not answer in time")
        try:
            readings = job.result()
        except DeviceLostError as exc:
            device.lost, device.down_reason = True, str(exc)
            self.errors.add(self.name, exc.call, "GpuIsLost")
            log.error("GPU %d (%s) lost: %s", reader.index, uuid, exc)
            return self._down(device, device.down_reason)
        except TickAbandonedError:
            return self._down(device, "previous call hung")
        except Exception as exc:  # a bug in a reader must not take the daemon down
            self.errors.add(self.name, reader.current_call or "tick", type(exc).__name__)
            log.exception("GPU %d: unexpected error while reading", reader.index)
            return self._down(device, f"read failed: {type(exc).__name__}")
        device.down_reason = ""
        return DeviceSample(reader.index, uuid, dict(reader.info), True, tuple(readings))

    @staticmethod
    def _down(device: _Device, reason: str) -> DeviceSample:
        reader = device.reader
        return DeviceSample(reader.index, reader.uuid, dict(reader.info), False, (), reason)
