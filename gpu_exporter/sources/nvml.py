"""The NVML source: every GPU on the node, read concurrently, each within a deadline.

Lifecycle:
- `start()` initialises NVML, lists GPUs by index and keys them by UUID, starts the XID thread.
  Identity and slow-changing data are read in each GPU's first tick, under its deadline.
- `sample()` gives each GPU's `DeviceReader.read_tick` (every enabled collector of
  `sources/collectors/`, guarded) to that GPU's own worker thread and waits at most
  `device_deadline_seconds`. A GPU that does not answer in time is reported down for that tick,
  the call it hung in is quarantined, and its stuck thread is abandoned (ctypes calls cannot be
  cancelled); the other GPUs are not held up. `collector_status()` then says how each
  collector did, over all GPUs.
- Recovery never runs NVML calls on the sampler thread: a recovery job on its own worker first
  tries to re-acquire only the lost GPUs by UUID; only if that fails, or when the driver itself
  went away (LibRmVersionMismatch, Uninitialized), does a later attempt shut NVML down,
  initialise it again and re-enumerate by UUID (indices may change after a driver reload).
  Attempts back off exponentially, so a GPU that is gone for good costs one re-init every
  `recovery_max_backoff_seconds`, not one per tick.
- Every NVML call here, in the topology reader and on the XID thread goes through the choke
  point's `NvmlCalls` (`sources/nvml_device.py`), so its failures are counted as the GPUs' are.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pynvml as N

from gpu_exporter import guard
from gpu_exporter.guard import Guard
from gpu_exporter.snapshot import CollectorStatus, DeviceSample
from gpu_exporter.sources import collectors
from gpu_exporter.sources.base import ErrorLog, SourceUnavailableError
from gpu_exporter.sources.nvml_device import (
    DRIVER_GONE,
    DeviceLostError,
    DeviceReader,
    DeviceUnresponsiveError,
    DriverGoneError,
    NvmlCalls,
    TickAbandonedError,
    TickResult,
    error_name,
)
from gpu_exporter.sources.settings import NvmlSettings
from gpu_exporter.sources.worker import Worker
from gpu_exporter.sources.xid import XidCounts, XidWatcher

__all__ = ["SIMULATE_HINT", "NvmlSettings", "NvmlSource", "TopologyReader"]

log = logging.getLogger(__name__)

SIMULATE_HINT = "run `gpu-exporter serve --simulate` to try the exporter on a simulated node"


class TopologyReader(Protocol):
    """Reads GPU-to-GPU topology from [(uuid, index, handle)], counting NVML failures in
    `errors`; returns an object with `readings_for(uuid)` (`gpu_exporter.topology.Topology`)."""

    def __call__(self, devices: list[tuple[str, int, Any]], *, errors: ErrorLog) -> Any: ...


@dataclass
class _Device:
    reader: DeviceReader
    worker: Worker
    lost: bool = False
    down_reason: str = ""
    pending: futures.Future[Any] | None = None
    abandoned: list[futures.Future[Any]] = field(default_factory=list)  # ticks stuck in a call


@dataclass
class _Found:
    index: int
    handle: Any


@dataclass
class _RecoveryResult:
    full: bool
    found: dict[str, _Found] = field(default_factory=dict)
    node_info: dict[str, str] = field(default_factory=dict)
    error: str = ""
    incomplete: bool = False  # NVML listed a GPU whose handle or UUID could not be read
    topology: Any = None
    topology_error: str = ""  # the topology reader raised: why


@dataclass
class _Recovery:
    backoff: float
    next_attempt: float = 0.0
    attempts: int = 0
    job: futures.Future[_RecoveryResult] | None = None
    job_full: bool = False
    driver_gone: bool = False
    incomplete: bool = False  # some GPU could not be listed at start


def _start_error(exc: BaseException) -> SourceUnavailableError:
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
    # Run at start and after a full re-init, never per tick; None: no topology collector.
    topology_reader: TopologyReader | None = None
    guard: Guard = field(default_factory=Guard)  # shared by every GPU's collectors

    def __post_init__(self) -> None:
        self._calls = NvmlCalls(self.errors, self.name)
        self.collectors = collectors.enabled(
            self.settings, topology=self.topology_reader is not None
        )
        self._statuses: list[CollectorStatus] = []
        self._last_statuses: tuple[CollectorStatus, ...] = ()
        self._devices: dict[str, _Device] = {}
        self._node_info: dict[str, str] = {}
        self._xid_counts = XidCounts()
        self._xid: XidWatcher | None = None
        self._tick = 0
        self._initialised = False
        self.started = False
        self._recovery = _Recovery(self.settings.recovery_initial_backoff_seconds)
        self._recovery_worker = Worker("nvml-recovery")
        self.timings: dict[str, list[float]] = {}
        self.topology: Any = None
        self._topology_error = ""  # the latest topology read raised (see `_read_topology`)

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def initialised(self) -> bool:
        return self._initialised

    def start(self) -> None:
        calls = self._calls
        try:
            calls.run("init", N.nvmlInit)
            self._initialised = True
            self._node_info = self._read_node_info()
            count = calls.run("device_count", N.nvmlDeviceGetCount)
        except N.NVMLError as exc:
            raise _start_error(exc) from exc
        for index in range(count):
            try:
                handle = calls.run("device_handle", N.nvmlDeviceGetHandleByIndex, index)
                uuid = calls.run("device_handle", N.nvmlDeviceGetUUID, handle)
            except N.NVMLError as exc:
                # Listed but unusable (e.g. lost): a later full re-init will pick it up.
                log.warning("GPU %d not usable at start (%s); will retry", index, exc)
                self._recovery.incomplete = True
                continue
            self._bind(uuid, _Found(index, handle), full=False)
        self.topology, self._topology_error = self._read_topology(
            {uuid: _Found(d.reader.index, d.reader.handle) for uuid, d in self._devices.items()}
        )
        self._start_xid()
        self.started = True

    def close(self) -> None:
        if self._xid is not None:
            self._xid.stop(join=True)
            self._xid = None
        for device in self._devices.values():
            device.reader.close()
            device.worker.stop()
        self._devices.clear()
        self._recovery_worker.stop()
        if self._initialised:
            self._initialised = False
            self._calls.call("shutdown", N.nvmlShutdown)

    def node_info(self) -> dict[str, str]:
        return dict(self._node_info)

    def collector_names(self) -> tuple[str, ...]:
        """The enabled collectors, in order: the `collector` labels `collector_status()` uses
        (and the ones to report failed when `sample()` itself raises)."""
        return tuple(collector.name for collector in self.collectors)

    def collector_status(self) -> tuple[CollectorStatus, ...]:
        """One status per enabled collector for the last `sample()`, merged over the GPUs:
        failed if it failed on any GPU, durations summed. A collector that ran on no GPU
        (all down) did not fail: success, 0 s. `topology` fails while the latest topology
        read failed (see `_read_topology`)."""
        return self._last_statuses

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
            value, error = self._calls.attempt(key, fn)
            if not error:
                info[key] = str(value)
        return info

    def _bind(self, uuid: str, found: _Found, full: bool) -> None:
        """Attach a (re-)acquired handle to the reader kept for this UUID."""
        device = self._devices.get(uuid)
        if device is None:
            reader = DeviceReader(
                index=found.index,
                handle=found.handle,
                errors=self.errors,
                xid_counts=self._xid_counts,
                settings=self.settings,
                collectors=[collector() for collector in self.collectors],
                guard=self.guard,
                clock=self.clock,
                timings=self.timings if self.record_timings else None,
                uuid=uuid,
            )
            self._devices[uuid] = _Device(reader, Worker(f"nvml-gpu{found.index}"))
            return
        if device.lost or full or device.reader.handle is not found.handle:
            device.reader.rebind(found.index, found.handle)
        device.lost, device.down_reason = False, ""

    def _start_xid(self) -> None:
        if not self.settings.xid_events:
            return
        handles = {uuid: d.reader.handle for uuid, d in self._devices.items() if not d.lost}
        self._xid = XidWatcher(handles, self._xid_counts, self.errors)
        self._xid.start()

    # -- recovery --------------------------------------------------------------------------------

    def _needs_recovery(self) -> bool:
        r = self._recovery
        return r.driver_gone or r.incomplete or any(d.lost for d in self._devices.values())

    def _schedule_recovery(self, now: float) -> None:
        r = self._recovery
        if r.job is not None or not self._needs_recovery():
            if not self._needs_recovery():
                self._recovery = _Recovery(self.settings.recovery_initial_backoff_seconds)
            return
        if now < r.next_attempt and not r.driver_gone:
            return
        r.attempts += 1
        # Re-acquiring lost GPUs by UUID disturbs nobody; a full re-init interrupts every
        # GPU's GPM window and XID registration, so it comes second.
        lost = [uuid for uuid, d in self._devices.items() if d.lost]
        full = r.driver_gone or r.attempts % 2 == 0 or (r.incomplete and not lost)
        xid, self._xid = self._xid, None
        if full and xid is not None:
            xid.stop(join=False)  # the recovery job waits for it, not the sampler thread
        log.info("NVML recovery attempt %d (%s)", r.attempts, "full re-init" if full else "by UUID")
        r.job = self._recovery_worker.submit(self._recover, lost, full, xid if full else None)
        r.job_full = full
        r.next_attempt = now + r.backoff
        r.backoff = min(r.backoff * 2, self.settings.recovery_max_backoff_seconds)
        if not full:
            self._xid = xid

    def _recover(self, lost: list[str], full: bool, xid: XidWatcher | None) -> _RecoveryResult:
        """Runs on the recovery worker: may block in NVML without stalling the sampler."""
        result = _RecoveryResult(full=full)
        calls = self._calls
        try:
            if not full:
                for uuid in lost:
                    handle = calls.run("recovery", N.nvmlDeviceGetHandleByUUID, uuid)
                    calls.run("recovery", N.nvmlDeviceGetPowerUsage, handle)  # a handle alone
                    index = calls.run("recovery", N.nvmlDeviceGetIndex, handle)  # proves nothing
                    result.found[uuid] = _Found(index, handle)
                return result
            if xid is not None:
                xid.join()
            if self._initialised:
                # A driver that went away has already shut NVML down under us.
                calls.attempt("recovery", N.nvmlShutdown, expected=DRIVER_GONE)
                self._initialised = False
            calls.run("recovery", N.nvmlInit)
            self._initialised = True
            result.node_info = self._read_node_info()
            for index in range(calls.run("recovery", N.nvmlDeviceGetCount)):
                try:
                    handle = calls.run("device_handle", N.nvmlDeviceGetHandleByIndex, index)
                    uuid = calls.run("device_handle", N.nvmlDeviceGetUUID, handle)
                    result.found[uuid] = _Found(index, handle)
                except N.NVMLError:
                    result.incomplete = True
            result.topology, result.topology_error = self._read_topology(result.found)
        except N.NVMLError as exc:
            result.incomplete = True
            result.error = error_name(exc)
        return result

    def _apply_recovery(self) -> None:
        """Apply a finished recovery job (on the sampler thread, between device ticks)."""
        r = self._recovery
        if r.job is None or not r.job.done():
            return
        result = r.job.result()
        r.job = None
        if result.full:
            r.driver_gone = False
            if result.node_info:
                self._node_info = result.node_info
            listed = set(result.found)
            r.incomplete = result.incomplete
            for uuid, device in self._devices.items():
                if uuid not in listed:
                    device.lost = True
                    device.down_reason = device.down_reason or "not listed by NVML after re-init"
        for uuid, found in result.found.items():
            self._bind(uuid, found, full=result.full)
            log.info("GPU %s answering again (index %d)", uuid, found.index)
        if result.full and self._initialised:
            if result.topology is not None:
                self.topology = result.topology
            self._topology_error = result.topology_error
            self._start_xid()

    def _read_topology(self, found: dict[str, _Found]) -> tuple[Any, str]:
        """(the topology, "") or, when the reader raised, (None, why).

        A failed read is counted as {source="nvml", field="topology", error="exception"} and
        fails the `topology` collector on every tick until a later read (at a full re-init)
        succeeds: with no topology its families are missing; after a failed re-read the last
        topology is still repeated, but may be out of date. The reader's own NVML failures are
        counted by it under source="topology" (see `sources/nvml_device.py`).
        """
        if self.topology_reader is None:
            return None, ""
        devices = [(uuid, f.index, f.handle) for uuid, f in found.items()]
        try:
            return self.topology_reader(devices, errors=self.errors), ""
        except Exception as exc:  # topology is a nicety: never let it stop sampling
            log.exception("reading the GPU topology failed")
            self.errors.add(self.name, "topology", "exception")
            return None, f"{type(exc).__name__}: {exc}"

    # -- sampling --------------------------------------------------------------------------------

    def sample(self) -> list[DeviceSample]:
        self._statuses = []
        try:
            return self._sample()
        finally:
            self._last_statuses = self._merged_statuses()

    def _merged_statuses(self) -> tuple[CollectorStatus, ...]:
        ran = {status.collector for status in self._statuses}
        idle = [CollectorStatus(c.name, True, 0.0) for c in self.collectors if c.name not in ran]
        failed = []
        if self._topology_error and collectors.Topology in self.collectors:
            failed.append(CollectorStatus(collectors.Topology.name, False, 0.0))
        return guard.merge([*self._statuses, *idle, *failed])

    def _sample(self) -> list[DeviceSample]:
        now = self.clock()
        for device in self._devices.values():
            device.reader.free_orphans()
        self._apply_recovery()
        self._schedule_recovery(now)
        if self._recovery.job is not None:
            # A quick recovery is applied in this very tick; a slow one is left running.
            with contextlib.suppress(futures.TimeoutError):
                self._recovery.job.result(timeout=self.settings.device_deadline_seconds)
            self._apply_recovery()
        if self._recovery.job is not None and self._recovery.job_full:
            # NVML is being re-initialised: reading devices now would only collect errors.
            return self._all_down("NVML is being re-initialised")
        self._tick += 1
        running: dict[str, futures.Future[Any]] = {}
        driver = self._node_info.get("driver_version", "")
        for uuid, device in self._devices.items():
            if device.lost or not self._ready_for_tick(device):
                continue
            device.reader.active_tick = self._tick
            device.pending = device.worker.submit(
                device.reader.read_tick, self._tick, now, driver, self.topology
            )
            running[uuid] = device.pending
        if running:
            futures.wait(running.values(), timeout=self.settings.device_deadline_seconds)
        samples = [
            self._collect(uuid, device, running.get(uuid)) for uuid, device in self._devices.items()
        ]
        return sorted(samples, key=lambda s: s.index)

    def _all_down(self, reason: str) -> list[DeviceSample]:
        return sorted(
            (self._down(d, reason) for d in self._devices.values()), key=lambda s: s.index
        )

    def _ready_for_tick(self, device: _Device) -> bool:
        """False while a hung call holds the device and no fresh thread may be spent on it."""
        device.abandoned = [job for job in device.abandoned if not job.done()]
        if device.pending is None or device.pending.done():
            return True
        # The previous tick is still stuck in a call: give the device a fresh thread, within
        # limits (a driver that hangs every call must not make us spawn threads forever).
        if len(device.abandoned) >= self.settings.max_abandoned_threads_per_device:
            device.down_reason = "NVML calls still hung"
            return False
        device.abandoned.append(device.pending)
        device.worker.stop()
        device.worker = Worker(f"nvml-gpu{device.reader.index}")
        return True

    def _collect(self, uuid: str, device: _Device, job: futures.Future[Any] | None) -> DeviceSample:
        reader = device.reader
        if job is None:
            return self._down(device, device.down_reason or "not sampled")
        if not job.done():
            hung = reader.abandon_tick(self.clock(), job)
            self.errors.add(self.name, hung or "tick", "Timeout")
            log.warning(
                "GPU %d: %s did not answer within %.2fs",
                reader.index,
                hung or "the tick",
                self.settings.device_deadline_seconds,
            )
            return self._down(device, f"NVML call {hung or '(tick)'} did not answer in time")
        try:
            result: TickResult = job.result()
        except DriverGoneError as exc:  # counted by the choke point
            self._recovery.driver_gone = True
            device.lost, device.down_reason = True, str(exc)
            return self._down(device, device.down_reason)
        except DeviceLostError as exc:
            device.lost, device.down_reason = True, str(exc)
            log.error("GPU %d (%s) lost: %s", reader.index, uuid, exc)
            return self._down(device, device.down_reason)
        except TickAbandonedError:
            return self._down(device, "previous call hung")
        except DeviceUnresponsiveError as exc:
            return self._down(device, str(exc))
        except Exception as exc:  # a bug outside the guarded collectors: the GPU is down
            self.errors.add(self.name, "tick", type(exc).__name__)
            log.exception("GPU %d: unexpected error while reading", reader.index)
            return self._down(device, f"read failed: {type(exc).__name__}")
        device.down_reason = ""
        self._statuses += result.statuses
        return DeviceSample(reader.index, uuid, dict(reader.info), True, result.readings)

    def _down(self, device: _Device, reason: str) -> DeviceSample:
        reader = device.reader
        offline = reader.read_offline()  # XIDs are known without NVML; XID 79 comes with a loss
        self._statuses += offline.statuses
        return DeviceSample(
            reader.index, reader.uuid, dict(reader.info), False, offline.readings, reason
        )
