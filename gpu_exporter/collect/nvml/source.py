"""The NVML source: every GPU on the node, each read within a deadline, none held up by another.

Lifecycle:
- `begin()` starts NVML on a start-up thread of its own, so that nothing NVML does can keep the
  caller (the HTTP server) from answering; `progress` says how far it got. `start()` is
  `begin()` and a wait for it. The start-up thread initialises NVML (an init that does not
  answer is waited for and, after `hang_quarantine_seconds`, tried again on a fresh thread, at
  most `max_abandoned_threads_per_device` left behind; one that fails is retried with the
  recovery back-off once the daemon serves, else it is the caller's error); refuses more than
  `max_devices` GPUs (TooManyDevicesError); lists GPUs by index, each GPU's handle and UUID read
  on the reader crew within `deadline_seconds` (a GPU that does not answer in time, or
  fails, comes up down with the reason, as an unidentified GPU with uuid "", and joins after a
  full re-init, like a lost GPU); registers for XID events within the deadline; is then
  ready (sampling may begin) and reads the topology, each call within the deadline.
  Identity and slow-changing data are read in each GPU's first tick, under its deadline.
- `sample()` gives each GPU's `DeviceReader.read_tick` (every enabled collector of
  `collect/nvml/collectors/`, guarded) to the reader crew (`collect/reader_crew.py`: one
  thread reads the GPUs in turn, and another joins when no read has answered for 10 ms, so a
  GPU stuck in a call holds the others up that long at most, or when at the pace so far the
  reads would take more than a quarter of the deadline) and waits at most
  `deadline_seconds`. A GPU that does not answer in time is reported down for that tick,
  the call it hung in is quarantined, and its stuck thread is abandoned (ctypes calls cannot be
  cancelled). `collector_status()` then says how each
  collector did, over all GPUs.
- Recovery never runs NVML calls on the sampler thread: a recovery job on its own worker first
  tries to re-acquire only the lost GPUs by UUID; only if that fails, or when the driver itself
  went away (LibRmVersionMismatch, Uninitialized), does a later attempt shut NVML down,
  initialise it again and re-enumerate by UUID (indices may change after a driver reload).
  Attempts back off exponentially, so a GPU that is gone for good costs one re-init every
  `recovery_max_backoff_seconds`, not one per tick.
- Every NVML call here, in the topology reader and on the XID thread goes through the choke
  point's `NvmlCalls` (`collect/nvml/device.py`), so its failures are counted as the GPUs' are.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import pynvml as N

from gpu_exporter.collect.dcgm import DcgmSource, with_dcgm_activity
from gpu_exporter.collect.nvml import collectors
from gpu_exporter.collect.nvml.calls import (
    DRIVER_GONE,
    DeviceLostError,
    DeviceUnresponsiveError,
    DriverGoneError,
    NvmlCalls,
    TickAbandonedError,
)
from gpu_exporter.collect.nvml.collectors.mig import MIG_GPM
from gpu_exporter.collect.nvml.device import DeviceReader, TickResult
from gpu_exporter.collect.nvml.values import error_name
from gpu_exporter.collect.nvml.xid import XidCounts, XidWatcher
from gpu_exporter.collect.reader_crew import ReaderCrew
from gpu_exporter.collect.settings import DEFAULT_INTERVAL_SECONDS, NvmlConfig
from gpu_exporter.collect.source import ErrorLog, SourceUnavailableError, TooManyDevicesError
from gpu_exporter.collect.startup import StartupProgress
from gpu_exporter.collect.worker import Worker, on_own_thread
from gpu_exporter.model import guard
from gpu_exporter.model.guard import Guard
from gpu_exporter.model.snapshot import CollectorStatus, DeviceSample, DownCause

__all__ = ["SIMULATE_HINT", "NvmlConfig", "NvmlSource", "TopologyReader"]

log = logging.getLogger(__name__)

SIMULATE_HINT = "run `gpu-exporter serve --simulate` to try the exporter on a simulated node"


class TopologyReader(Protocol):
    """Reads GPU-to-GPU topology from [(uuid, index, handle)], counting NVML failures in
    `errors`; returns an object with `readings_for(uuid)`
    (`gpu_exporter.collect.nvml.topology.Topology`)."""

    def __call__(
        self,
        devices: list[tuple[str, int, Any]],
        *,
        errors: ErrorLog,
        deadline: float | None = None,
        max_hung_per_gpu: int = 2,
    ) -> Any: ...


@dataclass
class _Device:
    reader: DeviceReader
    lost: bool = False
    down_reason: str = ""
    pending: futures.Future[Any] | None = None
    abandoned: list[futures.Future[Any]] = field(default_factory=list)  # ticks stuck in a call

    @property
    def identified(self) -> bool:
        """False for a GPU listed by NVML whose handle or UUID could not be read."""
        return bool(self.reader.uuid)


@dataclass
class _Found:
    index: int
    handle: Any


@dataclass
class _Unlisted:
    """A GPU index whose handle or UUID could not be read: it is shown down, unidentified."""

    reason: str
    hung: futures.Future[Any] | None = None  # the read still stuck in a call


class _Identify:
    """Reads one GPU's handle and UUID by index; `current` names the call it is in."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.current = "nvmlDeviceGetHandleByIndex"

    def run(self, calls: NvmlCalls) -> tuple[Any, str]:
        handle = calls.run("device_handle", N.nvmlDeviceGetHandleByIndex, self.index)
        self.current = "nvmlDeviceGetUUID"
        uuid = calls.run("device_handle", N.nvmlDeviceGetUUID, handle)
        return handle, uuid


@dataclass
class _RecoveryResult:
    full: bool
    found: dict[str, _Found] = field(default_factory=dict)
    unlisted: dict[int, _Unlisted] = field(default_factory=dict)
    node_info: dict[str, str] = field(default_factory=dict)
    error: str = ""
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
    settings: NvmlConfig = field(default_factory=NvmlConfig)
    errors: ErrorLog = field(default_factory=ErrorLog)
    clock: Callable[[], float] = time.monotonic
    record_timings: bool = False
    name: str = "nvml"
    # Run at start and after a full re-init, never per tick; None: no topology collector.
    topology_reader: TopologyReader | None = None
    guard: Guard = field(default_factory=Guard)  # shared by every GPU's collectors
    # DCGM's profiling fields, for the GPUs without GPM (None: no DCGM; collect/dcgm.py).
    dcgm: DcgmSource | None = None
    # The sampling interval: the deadline's default is a share of it (NvmlConfig.deadline).
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS
    # Threads stuck in calls that never returned that one GPU may hold at once before it gets
    # no fresh one (it is down meanwhile): a driver that hangs every call must not make the
    # source spawn threads for ever. Not a setting; tests lower it.
    max_abandoned_threads_per_device: int = 2

    def __post_init__(self) -> None:
        self.deadline_seconds = self.settings.deadline(self.interval_seconds)
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
        self._crew = ReaderCrew("nvml-reader")  # every GPU's reads: identity, ticks, one-offs
        self.timings: dict[str, list[float]] = {}
        self.topology: Any = None
        self._topology_error = ""  # the latest topology read raised (see `_read_topology`)
        self._topology_lock = threading.Lock()
        self._topology_generation = 0  # full re-inits applied
        self.progress = StartupProgress()
        self._startup: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def initialised(self) -> bool:
        return self._initialised

    def start(self) -> None:
        """`begin()`, then wait until start-up finished (the topology read included); raises
        SourceUnavailableError (TooManyDevicesError) when it failed."""
        self.begin()
        self.progress.wait_finished()
        failure = self.progress.failure
        if failure is not None:
            raise failure

    def begin(self) -> None:
        """Start NVML on the start-up thread; `progress` says how far it got."""
        if self._startup is None:
            self._startup = threading.Thread(target=self._start_up, name="nvml-start", daemon=True)
            self._startup.start()

    def _start_up(self) -> None:
        try:
            count = self._initialise()
            if count is None or self._stopping.is_set():
                return
            self.progress.step("GPU enumeration")
            found, unlisted = self._enumerate(count)
            for uuid, gpu in found.items():
                self._bind(uuid, gpu, full=False)
            for index, why in unlisted.items():
                self._add_unidentified(index, why)
            self.progress.step("XID registration")
            self._start_xid()
            self.started = True
            self.progress.mark_ready()
            generation = self._topology_generation
            topology, error = self._read_topology(found)
            with self._topology_lock:  # a full re-init since then has read a newer one
                if generation == self._topology_generation and not self._stopping.is_set():
                    self.topology, self._topology_error = topology, error
            self.progress.mark_finished()
        except Exception as exc:  # a bug: say so, rather than stay unready without a reason
            log.exception("NVML start-up failed")
            self.progress.fail(exc)

    def _initialise(self) -> int | None:
        """NVML init, driver facts and the GPU count, on a thread of their own (the start-up
        thread waits, beating); None when start-up gave up or is being stopped."""
        settings = self.settings
        backoff = settings.recovery_initial_backoff_seconds
        note = ""  # why the last attempt failed
        while not self._stopping.is_set():
            self.progress.step("NVML init", note)
            job = self._await_init()
            if job is None:
                return None
            error = job.exception()
            if error is None:
                self._node_info, count = job.result()
                self.progress.init_answered(None)
                return int(count)
            if isinstance(error, TooManyDevicesError) or not isinstance(error, N.NVMLError):
                self.progress.fail(error)
                self.progress.init_answered(error)
                return None
            failure = _start_error(error)
            if not self.progress.init_answered(failure):
                return None  # not serving yet: the caller exits with the error
            log.warning("NVML init failed (%s); retrying in %gs", error_name(error), backoff)
            note = f"last attempt: {error_name(error)}; next in {backoff:g}s"
            if self._sleep_beating(backoff):
                return None
            backoff = min(backoff * 2, settings.recovery_max_backoff_seconds)
        return None

    def _await_init(self) -> futures.Future[Any] | None:
        """The first init attempt to answer (None: stopped). One that does not answer within
        `hang_quarantine_seconds` is left behind and another started, at most
        `max_abandoned_threads_per_device` left behind at once; whichever answers first wins."""
        settings = self.settings
        attempts = [on_own_thread("nvml-init", self._init_nvml)]
        asked = time.monotonic()
        while True:
            futures.wait(attempts, timeout=1.0, return_when=futures.FIRST_COMPLETED)
            self.progress.beat()
            answered = next((job for job in attempts if job.done()), None)
            if answered is not None:
                return answered
            if self._stopping.is_set():
                return None
            overdue = time.monotonic() - asked >= settings.hang_quarantine_seconds
            if overdue and len(attempts) <= self.max_abandoned_threads_per_device:
                log.warning(
                    "nvmlInit did not answer in %.0fs; trying again", time.monotonic() - asked
                )
                self.errors.add(self.name, "init", "Timeout")
                attempts.append(on_own_thread("nvml-init", self._init_nvml))
                asked = time.monotonic()

    def _init_nvml(self) -> tuple[dict[str, str], int]:
        # An attempt left behind that answers after another one did raises NVML's init count
        # once more (nvmlInit is reference-counted); close() shuts down once, which leaves the
        # library initialised in a process that is about to exit: harmless.
        self._calls.run("init", N.nvmlInit)
        self._initialised = True
        node_info = self._read_node_info()
        count = int(self._calls.run("device_count", N.nvmlDeviceGetCount))
        if count > self.settings.max_devices:
            raise TooManyDevicesError(
                f"NVML lists {count} GPUs, more than nvml.max_devices ({self.settings.max_devices}"
                "); raise nvml.max_devices in the configuration to monitor them all (each GPU "
                "costs a reader thread)"
            )
        return node_info, count

    def _sleep_beating(self, seconds: float) -> bool:
        """Sleep, beating every second; True when stopped meanwhile."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            if self._stopping.wait(min(1.0, left)):
                return True
            self.progress.beat()
        return self._stopping.is_set()

    def _enumerate(self, count: int) -> tuple[dict[str, _Found], dict[int, _Unlisted]]:
        """Each GPU's handle and UUID by index, on the reader crew within the deadline."""
        found: dict[str, _Found] = {}
        unlisted: dict[int, _Unlisted] = {}
        probes: dict[int, _Identify] = {}
        for index in range(count):
            if self._still_hung(index):
                unlisted[index] = _Unlisted("NVML calls still hung")
                continue
            probes[index] = _Identify(index)
        results = self._read_on_crew([partial(p.run, self._calls) for p in probes.values()])
        for (index, probe), job in zip(probes.items(), results, strict=True):
            if job.cancelled():
                unlisted[index] = _Unlisted("not read in time: every reader thread was busy")
                continue
            if not job.done():
                self.errors.add(self.name, "device_handle", "Timeout")
                log.warning(
                    "GPU %d: %s did not answer within %.2fs; the GPU is down",
                    index,
                    probe.current,
                    self.deadline_seconds,
                )
                why = f"NVML call {probe.current} did not answer in time"
                unlisted[index] = _Unlisted(why, job)
                continue
            error = job.exception()
            if error is None:
                handle, uuid = job.result()
                if uuid not in found:
                    found[uuid] = _Found(index, handle)
                    continue
                error_text = f"UUID {uuid} also listed at index {found[uuid].index}"
            elif isinstance(error, N.NVMLError):
                error_text = f"{error_name(error)} from {probe.current}"
            else:
                log.error("GPU %d: reading its handle failed", index, exc_info=error)
                error_text = f"{type(error).__name__} from {probe.current}"
            # Listed but unusable (e.g. lost): shown down; a later full re-init picks it up.
            log.warning("GPU %d not usable (%s); will retry", index, error_text)
            unlisted[index] = _Unlisted(f"not usable: {error_text}")
        return found, unlisted

    def _still_hung(self, index: int) -> bool:
        """An earlier read of this unidentified GPU is still stuck, and no thread may be spent."""
        device = self._devices.get(_unidentified_key(index))
        if device is None:
            return False
        device.abandoned = [job for job in device.abandoned if not job.done()]
        return len(device.abandoned) >= self.max_abandoned_threads_per_device

    def _add_unidentified(self, index: int, unlisted: _Unlisted) -> None:
        key = _unidentified_key(index)
        device = self._devices.get(key)
        if device is None:
            # Never ticks: it joins, identified, after a full re-init.
            device = _Device(self._new_reader(index, None, ""), lost=True)
            self._devices[key] = device
        device.down_reason = unlisted.reason
        if unlisted.hung is not None:
            device.abandoned.append(unlisted.hung)

    def close(self) -> None:
        self._stopping.set()
        startup = self._startup
        if startup is not None and startup is not threading.current_thread():
            # Let a start-up still under way finish adding GPUs before they are closed; one
            # stuck in NVML is left behind (its calls are abandoned as at any other time).
            startup.join(timeout=self.deadline_seconds + 1.0)
        if self._xid is not None:
            self._xid.stop(join=True)
            self._xid = None
        for device in list(self._devices.values()):
            device.reader.close()
        self._devices.clear()
        self._crew.stop()
        self._recovery_worker.stop()
        if self.dcgm is not None:
            self.dcgm.close()
        if self._initialised:
            self._initialised = False
            self._calls.call("shutdown", N.nvmlShutdown)

    def node_info(self) -> dict[str, str]:
        return dict(self._node_info)

    def collector_names(self) -> tuple[str, ...]:
        """The enabled collectors, in order: the `collector` labels `collector_status()` uses
        (and the ones to report failed when `sample()` itself raises)."""
        names = tuple(collector.name for collector in self.collectors)
        return names if self.dcgm is None else (*names, self.dcgm.name)

    def collector_status(self) -> tuple[CollectorStatus, ...]:
        """One status per enabled collector for the last `sample()`, merged over the GPUs:
        failed if it failed on any GPU, durations summed. A collector that ran on no GPU
        (all down) did not fail: success, 0 s. `topology` fails while the latest topology
        read failed (see `_read_topology`)."""
        if self.dcgm is None:
            return self._last_statuses
        return (*self._last_statuses, *self.dcgm.collector_status())

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

    def _new_reader(self, index: int, handle: Any, uuid: str) -> DeviceReader:
        return DeviceReader(
            index=index,
            handle=handle,
            errors=self.errors,
            xid_counts=self._xid_counts,
            settings=self.settings,
            collectors=[collector() for collector in self.collectors],
            guard=self.guard,
            clock=self.clock,
            timings=self.timings if self.record_timings else None,
            uuid=uuid,
        )

    def _bind(self, uuid: str, found: _Found, full: bool) -> None:
        """Attach a (re-)acquired handle to the reader kept for this UUID."""
        device = self._devices.get(uuid)
        if device is None:
            self._devices[uuid] = _Device(self._new_reader(found.index, found.handle, uuid))
            return
        if device.lost or full or device.reader.handle is not found.handle:
            device.reader.rebind(found.index, found.handle)
        device.lost, device.down_reason = False, ""

    def _start_xid(self) -> None:
        """Register for XID events, waiting at most the deadline: a registration that hangs
        costs only the XID counts until it answers (the watcher starts then)."""
        if not self.settings.xid_events:
            return
        handles = {uuid: d.reader.handle for uuid, d in self._devices.items() if not d.lost}
        self._xid = watcher = XidWatcher(handles, self._xid_counts, self.errors)
        registering = on_own_thread("nvml-xid-register", watcher.start)
        with contextlib.suppress(futures.TimeoutError):
            registering.result(timeout=self.deadline_seconds)
        if not registering.done():
            self.errors.add(self.name, "xid_events", "Timeout")
            log.warning("XID event registration did not answer in time; XIDs wait for it")

    # -- recovery --------------------------------------------------------------------------------

    def _needs_recovery(self) -> bool:
        r = self._recovery
        if r.driver_gone or any(d.lost and d.identified for d in self._devices.values()):
            return True
        # An unidentified GPU is read again by a full re-init, but not while its last read is
        # still stuck in a call: that re-init would only hang there too, every GPU down
        # meanwhile. When the call returns, the next tick starts one.
        return any(self._unidentified_to_retry())

    def _unidentified_to_retry(self) -> Iterator[_Device]:
        """Unidentified GPUs whose reads are no longer stuck."""
        for device in self._devices.values():
            if not device.identified:
                device.abandoned = [job for job in device.abandoned if not job.done()]
                if not device.abandoned:
                    yield device

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
        lost = [uuid for uuid, d in self._devices.items() if d.lost and d.identified]
        full = r.driver_gone or r.attempts % 2 == 0 or not lost
        xid, self._xid = self._xid, None
        if full and xid is not None:
            xid.stop(join=False)  # the recovery job waits for it, not the sampler thread
        if full:
            # GPM samples are freed before NVML shuts down (nvml.h frees nothing for us);
            # every reader re-binds after the re-init anyway. No tick runs now.
            for device in self._devices.values():
                device.reader.close()
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
            count = calls.run("recovery", N.nvmlDeviceGetCount)
            if count > self.settings.max_devices:
                log.error("NVML lists %d GPUs after re-init, more than nvml.max_devices", count)
                count = self.settings.max_devices  # the GPUs of the start, not a thread each
            result.found, result.unlisted = self._enumerate(count)
            result.topology, result.topology_error = self._read_topology(result.found)
        except N.NVMLError as exc:
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
            if not result.error:  # a failed re-init listed nothing: keep showing them
                self._replace_unidentified(result.unlisted)
            for uuid, device in self._devices.items():
                if device.identified and uuid not in listed:
                    device.lost = True
                    unlisted = result.unlisted.get(device.reader.index)
                    device.down_reason = (
                        unlisted.reason
                        if unlisted
                        else device.down_reason or "not listed by NVML after re-init"
                    )
        for uuid, found in result.found.items():
            self._bind(uuid, found, full=result.full)
            log.info("GPU %s answering again (index %d)", uuid, found.index)
        if result.full and self._initialised:
            with self._topology_lock:
                self._topology_generation += 1
                if result.topology is not None:
                    self.topology = result.topology
                self._topology_error = result.topology_error
            self._start_xid()

    def _replace_unidentified(self, unlisted: dict[int, _Unlisted]) -> None:
        """After a full re-init: unidentified GPUs are those it could not read (an index now
        held by a known GPU that is lost shows as that GPU, down, not a second time)."""
        known = {d.reader.index for d in self._devices.values() if d.identified}
        for key in [k for k, d in self._devices.items() if not d.identified]:
            device = self._devices[key]
            if device.reader.index not in unlisted or device.reader.index in known:
                device.reader.close()
                del self._devices[key]
        for index, why in unlisted.items():
            if index not in known:
                self._add_unidentified(index, why)

    def _read_topology(self, found: dict[str, _Found]) -> tuple[Any, str]:
        """(the topology, "") or, when the reader raised, (None, why).

        A failed read is counted as {source="nvml", field="topology", error="exception"} and
        fails the `topology` collector on every tick until a later read (at a full re-init)
        succeeds: with no topology its families are missing; after a failed re-read the last
        topology is still repeated, but may be out of date. The reader's own NVML failures are
        counted by it under source="topology" (see `collect/nvml/device.py`).
        """
        if self.topology_reader is None:
            return None, ""
        devices = [(uuid, f.index, f.handle) for uuid, f in found.items()]
        try:
            topology = self.topology_reader(
                devices,
                errors=self.errors,
                deadline=self.deadline_seconds,
                max_hung_per_gpu=self.max_abandoned_threads_per_device,
            )
            return topology, ""
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
                self._recovery.job.result(timeout=self.deadline_seconds)
            self._apply_recovery()
        if self._recovery.job is not None and self._recovery.job_full:
            # NVML is being re-initialised: reading devices now would only collect errors.
            return self._all_down("NVML is being re-initialised", DownCause.UNREAD)
        self._tick += 1
        started = self.clock()
        needing_dcgm, mig_needing_dcgm = self._needing_dcgm()
        if self.dcgm is not None:
            self.dcgm.begin(needing_dcgm, mig_needing_dcgm)  # in parallel with the NVML reads
        driver = self._node_info.get("driver_version", "")
        reading = [
            (uuid, device)
            for uuid, device in self._devices.items()
            if not device.lost and self._ready_for_tick(device)
        ]
        for _, device in reading:
            device.reader.active_tick = self._tick
        topology = self.topology
        results = self._read_on_crew(
            [partial(d.reader.read_tick, self._tick, now, driver, topology) for _, d in reading]
        )
        running: dict[str, futures.Future[Any]] = {}
        for (uuid, device), result in zip(reading, results, strict=True):
            device.pending = running[uuid] = result
        samples = [
            self._collect(uuid, device, running.get(uuid)) for uuid, device in self._devices.items()
        ]
        if self.dcgm is not None:
            left = started + self.deadline_seconds - self.clock()
            readings = self.dcgm.finish(left)
            whole, mig = self._needing_dcgm()  # asked from the next tick on
            starting = (whole - needing_dcgm) | (mig - mig_needing_dcgm)
            samples = with_dcgm_activity(
                samples, needing_dcgm, readings, mig_needing_dcgm, starting
            )
        return sorted(samples, key=lambda s: s.index)

    def _read_on_crew(
        self, reads: list[Callable[[], Any]], timeout: float | None = None
    ) -> list[futures.Future[Any]]:
        """`reads` (one per GPU) on the reader crew, waiting at most `timeout` (the deadline)."""
        return self._crew.run(reads, self.deadline_seconds if timeout is None else timeout)

    def _needing_dcgm(self) -> tuple[frozenset[str], frozenset[str]]:
        """The answering GPUs whose activity GPM cannot give (learned unsupported before
        Hopper, or the gpm setting off): the whole GPUs, and the MIG-enabled GPUs, whose
        activity is per GPU instance (the mig collector learns "mig_gpm" unsupported)."""
        if self.dcgm is None or not self.dcgm.available:
            return frozenset(), frozenset()
        answering = [
            (uuid, device.reader)
            for uuid, device in self._devices.items()
            if device.identified and not device.lost
        ]
        gpm = self.settings.gpm
        whole = frozenset(
            uuid
            for uuid, reader in answering
            if not reader.mig_enabled and (not gpm or reader.is_unsupported("gpm"))
        )
        mig = frozenset(
            uuid
            for uuid, reader in answering
            if reader.mig_enabled and (not gpm or reader.is_unsupported(MIG_GPM))
        )
        return whole, mig

    def read_each_device(
        self, read: Callable[[DeviceReader], Any], timeout: float
    ) -> dict[str, Any]:
        """`read(reader)` for each answering GPU on the reader crew, between ticks (one-off reads
        such as diagnose's settings check): by UUID, its result, or a string saying why there
        is none (the GPU is down or busy, the read raised, or it did not answer in `timeout`
        seconds: then it is left behind as a hung tick is)."""
        out: dict[str, Any] = {}
        answering: list[tuple[str, _Device]] = []
        for uuid, device in self._devices.items():
            if not device.identified:
                continue
            if device.lost or (device.pending is not None and not device.pending.done()):
                out[uuid] = device.down_reason or "the GPU is not answering"
                continue
            answering.append((uuid, device))
        results = self._read_on_crew([partial(read, d.reader) for _, d in answering], timeout)
        jobs: dict[str, futures.Future[Any]] = {}
        for (uuid, device), result in zip(answering, results, strict=True):
            device.pending = jobs[uuid] = result
        for uuid, job in jobs.items():
            if job.cancelled():
                out[uuid] = f"not read within {timeout:g}s: every reader thread was busy"
            elif not job.done():
                out[uuid] = f"no answer within {timeout:g}s"
            elif job.exception() is not None:
                exc = job.exception()
                out[uuid] = f"the read failed: {type(exc).__name__}: {exc}"
            else:
                out[uuid] = job.result()
        return out

    def _all_down(self, reason: str, cause: DownCause) -> list[DeviceSample]:
        return sorted(
            (self._down(d, reason, cause) for d in self._devices.values()),
            key=lambda s: s.index,
        )

    def _ready_for_tick(self, device: _Device) -> bool:
        """False while a hung call holds the device and no fresh thread may be spent on it."""
        device.abandoned = [job for job in device.abandoned if not job.done()]
        if device.pending is None or device.pending.done():
            return True
        # The previous tick is still stuck in a call: give the device a fresh thread, within
        # limits (a driver that hangs every call must not make us spawn threads forever).
        if len(device.abandoned) >= self.max_abandoned_threads_per_device:
            device.down_reason = "NVML calls still hung"
            return False
        device.abandoned.append(device.pending)  # its thread left the crew; a fresh one reads
        return True

    def _collect(self, uuid: str, device: _Device, job: futures.Future[Any] | None) -> DeviceSample:
        reader = device.reader
        if job is None:
            return self._down(device, device.down_reason or "not sampled")
        if job.cancelled():  # never started: every reader was stuck in another GPU's calls
            busy = "not read in time: every reader thread was busy"
            return self._down(device, busy, DownCause.UNREAD)
        if not job.done():
            hung = reader.abandon_tick(self.clock(), job)
            self.errors.add(self.name, hung or "tick", "Timeout")
            log.warning(
                "GPU %d: %s did not answer within %.2fs",
                reader.index,
                hung or "the tick",
                self.deadline_seconds,
            )
            late = f"NVML call {hung or '(tick)'} did not answer in time"
            return self._down(device, late, DownCause.LATE)
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
            return self._down(device, "previous call hung", DownCause.LATE)
        except DeviceUnresponsiveError as exc:
            return self._down(device, str(exc))
        except Exception as exc:  # a bug outside the guarded collectors: the GPU is down
            self.errors.add(self.name, "tick", type(exc).__name__)
            log.exception("GPU %d: unexpected error while reading", reader.index)
            return self._down(device, f"read failed: {type(exc).__name__}")
        device.down_reason = ""
        self._statuses += result.statuses
        return DeviceSample(
            reader.index,
            uuid,
            dict(reader.info),
            True,
            result.readings,
            "",
            result.instances,
            reader.mig_enabled,
            processes=result.processes,
            instances_unknown=result.instances_unknown,
        )

    def _down(
        self, device: _Device, reason: str, cause: DownCause = DownCause.FAILED
    ) -> DeviceSample:
        """A GPU that did not answer: what needs no NVML call, and its MIG instances as last
        enumerated, down (so the pods that lost them stay named, as a whole GPU's do)."""
        reader = device.reader
        offline = reader.read_offline()  # XIDs are known without NVML; XID 79 comes with a loss
        self._statuses += offline.statuses
        return DeviceSample(
            reader.index,
            reader.uuid,
            dict(reader.info),
            False,
            offline.readings,
            reason,
            reader.known_instances,
            reader.mig_enabled,
            down_cause=cause,
        )


def _unidentified_key(index: int) -> str:
    """The key of a GPU listed at `index` whose UUID is unknown (never a real UUID)."""
    return f"unidentified:{index}"
