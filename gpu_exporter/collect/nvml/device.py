"""The reader that runs one GPU's collectors, through the per-GPU side of the choke point.

`DeviceReader.call` is where a GPU's tick meets NVML's error semantics (`calls.py` says them):
it counts a failure once, learns what will not change, quarantines a call that hung, and ends
the tick on a lost GPU or a driver gone.

A GPU's tick runs on that GPU's own worker thread (`DeviceReader.read_tick`): every enabled
collector (`collect/nvml/collectors/`) first refreshes its slow-changing data when due, then
reads. Each runs guarded (`gpu_exporter/model/guard.py`): a bug in one costs only its own
families on that GPU for that tick. The choke point's control flow (`DeviceReadAborted`: lost,
driver gone, every call failing, an abandoned tick) is not a bug and still ends the whole tick.
The source abandons a tick that misses its deadline (see `collect/nvml/source.py`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import cache, partial
from typing import TYPE_CHECKING, Any

import pynvml as N

from gpu_exporter.collect.nvml.calls import (
    DRIVER_GONE,
    PERMANENT,
    SOURCE,
    DeviceLostError,
    DeviceReadAborted,
    DeviceUnresponsiveError,
    DriverGoneError,
    GoneError,
    TickAbandonedError,
    count_failure,
)
from gpu_exporter.collect.nvml.values import (
    error_name,
    field_value,
    return_code_name,
)
from gpu_exporter.collect.settings import NvmlConfig
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.model import catalog
from gpu_exporter.model.guard import Guard
from gpu_exporter.model.snapshot import CollectorStatus, InstanceSample, ProcessSample, Reading

if TYPE_CHECKING:
    from gpu_exporter.collect.nvml.collectors.base import Collector, Device, FieldSpec
    from gpu_exporter.collect.nvml.topology import Topology
    from gpu_exporter.collect.nvml.xid import XidCounts

__all__ = [
    "DeviceReader",
    "InvalidReadingError",
    "TickResult",
    "UndeclaredFamilyError",
]


# Per-field return codes that mean this driver or board lacks the field (learned, as the choke
# point learns NOT_SUPPORTED and FUNCTION_NOT_FOUND of a call).
_FIELD_GONE = (
    N.NVML_ERROR_NOT_SUPPORTED,
    N.NVML_ERROR_INVALID_ARGUMENT,
    N.NVML_ERROR_FUNCTION_NOT_FOUND,
)


class InvalidReadingError(ValueError):
    """A collector emitted a reading the catalog refuses (a bug: it fails for that tick)."""


class UndeclaredFamilyError(InvalidReadingError):
    """A collector emitted a family it does not declare."""


@dataclass(frozen=True, slots=True)
class TickResult:
    """One GPU's tick: its readings, its MIG instances', how each collector did, and the
    processes on it (None: not read). `instances_unknown`: why its MIG layout could not be
    read ("" when it was); `instances` are then the last known ones, down."""

    readings: tuple[Reading, ...]
    statuses: tuple[CollectorStatus, ...]
    instances: tuple[InstanceSample, ...] = ()
    processes: tuple[ProcessSample, ...] | None = None
    instances_unknown: str = ""


# How a collector's phase is run: guarded in the daemon, plainly in the bare benchmark loop.
Phase = Callable[["Device"], list[Reading]]
Runner = Callable[["Collector", Phase], tuple[list[Reading], CollectorStatus]]


class FieldBatch:
    """A tick's one `nvmlDeviceGetFieldValues` call, for every enabled collector's fields.

    Made when the first collector asks for its fields, so the tick's other calls keep their
    order; each collector then turns its own entries into readings. The call's time is first
    measured inside that collector's run; `share_time` then moves it onto every collector
    whose entries the call carried, in proportion to their number.
    """

    def __init__(self, collectors: Sequence[Collector]) -> None:
        self._collectors = collectors
        self._values: dict[str, Any] | None = None
        self._seconds = 0.0  # how long the call took
        self._charged_to = ""  # the collector running when it was made
        self._entries: Counter[str] = Counter()  # collector -> its entries in the call

    def readings(self, device: DeviceReader, specs: Sequence[FieldSpec]) -> list[Reading]:
        if not specs:
            return []
        if self._values is None:
            self._values = self._fetch(device)
        out: list[Reading] = []
        for spec in specs:
            value = self._values.get(spec.key)
            if value is None:
                continue
            if value.nvmlReturn == N.NVML_SUCCESS:
                out.append(Reading(spec.family, field_value(value) * spec.scale, spec.labels))
            elif value.nvmlReturn in _FIELD_GONE:
                device.learn_unsupported(spec.key)  # this driver or board lacks it
            else:
                device.count_error(SOURCE, spec.key, return_code_name(value.nvmlReturn))
        return out

    def _fetch(self, device: DeviceReader) -> dict[str, Any]:
        wanted = [
            (collector.name, spec)
            for collector in self._collectors
            for spec in collector.wanted_fields()
            if not device.is_unsupported(spec.key)
        ]
        if not wanted or device.is_unsupported("field_values"):
            return {}
        request = [(spec.field_id, spec.scope) for _, spec in wanted]
        self._entries = Counter(name for name, _ in wanted)
        self._charged_to = device.running
        started = time.perf_counter()
        try:
            values = device.call("field_values", N.nvmlDeviceGetFieldValues, device.handle, request)
        finally:
            self._seconds = time.perf_counter() - started
        if values is None:
            return {}
        return {spec.key: value for (_, spec), value in zip(wanted, values, strict=True)}

    def share_time(self, statuses: dict[str, CollectorStatus]) -> None:
        """Move the call's time from the collector that made it onto the collectors in it."""
        total = self._entries.total()
        if not total or self._charged_to not in statuses:
            return  # no call, or made outside a guarded run (the bare benchmark loop)
        for name, status in statuses.items():
            moved = self._seconds * self._entries[name] / total
            if name == self._charged_to:
                moved -= self._seconds
            if moved:
                seconds = max(0.0, status.duration_seconds + moved)
                statuses[name] = CollectorStatus(status.collector, status.success, seconds)


@dataclass
class DeviceReader:
    """One GPU: its handle, its collectors, what it lacks; the per-GPU choke point.

    Implements the `Device` protocol the collectors read through
    (`collect/nvml/collectors/base.py`).
    """

    index: int
    handle: Any
    errors: ErrorLog
    xid_counts: XidCounts
    settings: NvmlConfig
    collectors: list[Collector] = field(default_factory=list)
    guard: Guard = field(default_factory=Guard)
    clock: Callable[[], float] = time.monotonic
    timings: dict[str, list[float]] | None = None
    uuid: str = ""
    info: dict[str, str] = field(default_factory=dict)
    unsupported: set[str] = field(default_factory=set)
    quarantine: dict[str, float] = field(default_factory=dict)
    # The tick stuck in each quarantined call: done once the call answered (`call`'s
    # retry_when_answered).
    hung_ticks: dict[str, Future[Any]] = field(default_factory=dict)
    current_call: str = ""
    running: str = ""  # the collector running on the worker thread now
    active_tick: int = 0
    calls_succeeded: int = 0
    calls_failed: int = 0
    driver_version: str = ""
    topology: Topology | None = None
    mig_enabled: bool = False  # as the mig collector last read it
    # The MIG instances last enumerated, identity only and down: what a tick that cannot read
    # them reports (a GPU down, a layout unread), so their pods stay named. Bounded by one
    # layout; kept across a re-bind, replaced at the next enumeration.
    known_instances: tuple[InstanceSample, ...] = ()
    _instances: tuple[InstanceSample, ...] = ()  # reported in this tick
    _instances_unknown: str = ""  # this tick's: why the layout could not be read
    _mig_reported: bool = False  # the mig collector reported in this tick
    _mig_handles: Mapping[str, Any] = field(default_factory=dict)  # this tick's, by MIG UUID
    _processes: tuple[ProcessSample, ...] | None = None  # reported in this tick
    _fields: FieldBatch | None = None
    _local: threading.local = field(default_factory=threading.local)

    # -- the choke point -------------------------------------------------------------------

    def call(
        self,
        key: str,
        fn: Callable[..., Any] | None,
        *args: Any,
        gone: tuple[type[N.NVMLError], ...] = (),
        retry_when_answered: bool = False,
    ) -> Any:
        """Run one NVML call; None when unsupported, quarantined or failed this tick.

        `fn` is None when the installed nvidia-ml-py predates the call: same as an old driver.
        An error in `gone` raises GoneError instead (neither counted nor learned).
        `retry_when_answered`: the call's quarantine after a hang ends as soon as the hung call
        has returned, not after `hang_quarantine_seconds` (for calls without which whole
        series are unknown: the MIG layout's).
        """
        if key in self.unsupported:
            return None
        if fn is None:
            self.unsupported.add(key)
            return None
        until = self.quarantine.get(key)
        if until is not None:
            hung = self.hung_ticks.get(key)
            answered = retry_when_answered and hung is not None and hung.done()
            if self.clock() < until and not answered:
                return None
            del self.quarantine[key]
            self.hung_ticks.pop(key, None)
        self._check_owner()
        self.current_call = key
        started = time.perf_counter()
        try:
            result = fn(*args)
            self.calls_succeeded += 1
            return result
        except N.NVMLError as exc:
            if gone and isinstance(exc, gone):
                raise GoneError(key, error_name(exc)) from exc
            count_failure(self.errors, SOURCE, key, exc)
            if isinstance(exc, N.NVMLError_GpuIsLost):
                raise DeviceLostError(key) from exc
            if isinstance(exc, DRIVER_GONE):
                raise DriverGoneError(key, error_name(exc)) from exc
            if isinstance(exc, PERMANENT):
                self.unsupported.add(key)
            else:
                self.calls_failed += 1
            return None
        finally:
            self.current_call = ""  # between calls nothing is hung
            if self.timings is not None:
                self.timings.setdefault(key, []).append(time.perf_counter() - started)
            self._check_owner()

    def first(self, *attempts: tuple[Any, ...]) -> Any:
        """Try (key, fn, *args) alternatives in order, moving on only past unsupported ones.

        This is how newer calls fall back to older names on older drivers.
        """
        for key, fn, *args in attempts:
            result = self.call(key, fn, *args)
            if result is not None or key not in self.unsupported:
                return result
        return None

    def field_readings(self, specs: Sequence[FieldSpec]) -> list[Reading]:
        if self._fields is None:  # outside a tick (a collector run on its own)
            self._fields = FieldBatch(self.collectors)
        return self._fields.readings(self, specs)

    def fields_gone(self, *field_ids: int) -> bool:
        return "field_values" in self.unsupported or all(
            f"field_{fid}" in self.unsupported for fid in field_ids
        )

    def is_unsupported(self, key: str) -> bool:
        return key in self.unsupported

    def is_quarantined(self, key: str) -> bool:
        return key in self.quarantine

    def learn_unsupported(self, key: str) -> None:
        self.unsupported.add(key)

    def count_error(self, source: str, key: str, error: str) -> None:
        self.errors.add(source, key, error)

    def identify(self, uuid: str | None, info: Mapping[str, str]) -> None:
        self.uuid = uuid or self.uuid
        self.info = dict(info)

    def report_mig(
        self,
        enabled: bool,
        instances: tuple[InstanceSample, ...] = (),
        handles: Mapping[str, Any] | None = None,
        unknown: str = "",
    ) -> None:
        """The mig collector's result (from its read: after the tick's commit point). A change
        of mode forgets what was learned about the calls that answer differently with MIG on
        and off (the collectors' `mig_dependent` keys). Instance readings are checked as a
        collector's own are (InvalidReadingError fails the reporting collector). `unknown`:
        why the layout could not be read; the last known instances are reported, down."""
        if instances:
            reporter = next(c for c in self.collectors if c.instance_families)
            for instance in instances:
                _declared(reporter, list(instance.readings), reporter.instance_families)
        if enabled != self.mig_enabled:
            for collector in self.collectors:
                self.unsupported.difference_update(collector.mig_dependent)
        self.mig_enabled = enabled
        self._mig_reported = True
        self._instances_unknown = unknown if enabled else ""
        if not enabled:
            self.known_instances = ()
        elif not unknown:
            self.known_instances = tuple(_down(instance) for instance in instances)
        self._instances = self.known_instances if self._instances_unknown else instances
        self._mig_handles = {} if self._instances_unknown else dict(handles or {})

    @property
    def mig_handles(self) -> Mapping[str, Any]:
        return self._mig_handles

    def report_processes(
        self,
        processes: tuple[ProcessSample, ...] | None,
        by_instance: Mapping[str, tuple[ProcessSample, ...]] | None = None,
    ) -> None:
        """The processes collector's result: kept for the tick's result, each MIG instance's
        on its InstanceSample."""
        self._processes = processes
        if by_instance:
            self._instances = tuple(
                replace(i, processes=by_instance[i.mig_uuid]) if i.mig_uuid in by_instance else i
                for i in self._instances
            )

    def _check_owner(self) -> None:
        tick = getattr(self._local, "tick", None)
        if tick is not None and tick != self.active_tick:
            raise TickAbandonedError

    # -- one tick ------------------------------------------------------------------------------

    def read_tick(
        self, tick: int, now: float, driver_version: str = "", topology: Topology | None = None
    ) -> TickResult:
        """Every enabled collector, guarded. Runs on this device's worker thread."""
        self._local.tick = tick
        self.calls_succeeded = self.calls_failed = 0
        self.driver_version, self.topology = driver_version, topology
        result = self.collect(now, self._guarded)
        if self.calls_failed and not self.calls_succeeded:
            raise DeviceUnresponsiveError(f"every NVML call failed ({self.calls_failed})")
        return result

    def collect(self, now: float, run: Runner) -> TickResult:
        """Slow refreshes that are due first (committed together), then every collector's read.

        A collector that fails in either phase loses all its readings for this tick.
        """
        self._fields = FieldBatch(self.collectors)
        self._instances = ()
        self._instances_unknown = ""
        self._mig_reported = False
        self._mig_handles = {}
        self._processes = None
        statuses: dict[str, CollectorStatus] = {}
        refreshed: list[tuple[Collector, list[Reading]]] = []
        every = self.settings.slow_refresh_seconds
        for collector in self.collectors:
            if collector.refresh_due(now, every):
                static, status = run(collector, collector.refresh)
                statuses[collector.name] = status
                if status.success:
                    refreshed.append((collector, static))
        self._check_owner()  # an abandoned tick must not overwrite the live tick's state
        for collector, static in refreshed:
            collector.static, collector.static_at = static, now
        out: list[Reading] = []
        for collector in self.collectors:
            earlier = statuses.get(collector.name)
            if earlier is not None and not earlier.success:
                continue
            readings, status = run(collector, collector.read)
            statuses[collector.name] = _combined(earlier, status)
            if status.success:
                out += [*collector.static, *readings]
        self._fields.share_time(statuses)
        if self.mig_enabled and not self._mig_reported:  # the mig collector failed
            self._instances, self._instances_unknown = self.known_instances, "mig collector failed"
        return TickResult(
            tuple(out),
            tuple(statuses.values()),
            self._instances,
            self._processes,
            self._instances_unknown,
        )

    def read_offline(self) -> TickResult:
        """What needs no NVML call (XID counts), for a GPU that is down this tick."""
        out: list[Reading] = []
        statuses = []
        for collector in self.collectors:
            if collector.works_offline:
                readings, status = self.guard.run(
                    collector.name, partial(_read_declared, collector, self), _NOTHING
                )
                out += readings
                statuses.append(status)
        return TickResult(tuple(out), tuple(statuses))

    def _guarded(self, collector: Collector, phase: Phase) -> tuple[list[Reading], CollectorStatus]:
        aborted: list[DeviceReadAborted] = []

        def produce() -> list[Reading]:
            self.running = collector.name
            try:
                readings = phase(self)
            except DeviceReadAborted as exc:  # the choke point's control flow, not a bug
                aborted.append(exc)
                return []
            finally:
                self.running = ""
            return _declared(collector, readings)

        readings, status = self.guard.run(collector.name, produce, _NOTHING)
        if aborted:
            raise aborted[0]
        return readings, status

    # -- lifecycle -----------------------------------------------------------------------------

    def abandon_tick(self, now: float, stuck_tick: Future[Any]) -> str:
        """Called by the source when a tick missed its deadline; returns the hung call.

        Only the call that was running at the deadline is quarantined ("" when the tick was
        merely slow between calls). Collectors set aside what the stuck thread may still use
        (the GPM window) and free it once that tick's future completes.
        """
        hung = self.current_call
        if hung:
            self.quarantine[hung] = now + self.settings.hang_quarantine_seconds
            self.hung_ticks[hung] = stuck_tick
        self.active_tick += 1  # the stuck thread raises TickAbandonedError when it wakes
        for collector in self.collectors:
            collector.abandon(stuck_tick)
        return hung

    def free_orphans(self) -> None:
        """Free what abandoned ticks held, once they have finished (sampler thread)."""
        for collector in self.collectors:
            collector.free_orphans()

    def rebind(self, index: int, handle: Any) -> None:
        """After recovery: a new handle, identity to re-read, GPM from a fresh baseline."""
        self.close()
        self.index, self.handle = index, handle
        for collector in self.collectors:
            collector.reset()

    def close(self) -> None:
        for collector in self.collectors:
            collector.close()


_NOTHING: list[Reading] = []  # a failed collector's readings (never appended to)


def _down(instance: InstanceSample) -> InstanceSample:
    """The instance as a tick that cannot read it reports it: identity only, down."""
    return InstanceSample(
        instance.gpu_instance,
        instance.compute_instance,
        instance.mig_uuid,
        instance.profile,
        instance.shared,
        up=False,
    )


def _read_declared(collector: Collector, device: Device) -> list[Reading]:
    return _declared(collector, collector.read(device))


def _declared(
    collector: Collector, readings: list[Reading], families: tuple[str, ...] | None = None
) -> list[Reading]:
    """The readings, or InvalidReadingError when one is not what the catalog promises: a family
    the collector does not declare (UndeclaredFamilyError; the catalog test relies on the
    declarations being complete), label names other than the family's (in any order), a label
    value that is not a str, or a value that is not an int or float (bool and None refused).

    Checked here, inside the collector's guard, so a bad reading costs only that collector on
    that GPU for that tick instead of reaching the stages downstream. The message names the
    family and types, never the value, so a bug that fires every tick is logged once.
    """
    expected = _label_names(collector.families if families is None else families)
    for reading in readings:
        family, value, labels = reading.family, reading.value, reading.labels
        names = expected.get(family)
        if names is None:
            undeclared = sorted({r.family for r in readings} - set(expected))
            raise UndeclaredFamilyError(
                f"collector {collector.name} emitted undeclared families {undeclared}"
            )
        if type(value) is not float and type(value) is not int:  # bool and None refused
            raise InvalidReadingError(
                f"{family}: value of type {type(value).__name__}, not int or float"
            )
        # Most readings have no label or one: compare those without sorting (a tick checks
        # about a hundred readings per GPU).
        if len(labels) == 1 and len(names) == 1:
            wrong = labels[0][0] != names[0]
        else:
            wrong = bool(labels or names) and tuple(sorted(n for n, _ in labels)) != names
        if wrong:
            raise InvalidReadingError(
                f"{family}: labels {sorted(name for name, _ in labels)}, "
                f"the catalog says {list(names)}"
            )
        for name, label_value in labels:
            if type(label_value) is not str:
                raise InvalidReadingError(
                    f"{family}: label {name} of type {type(label_value).__name__}, not str"
                )
    return readings


@cache
def _label_names(families: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Declared family -> its catalog labels (beyond gpu/uuid), sorted."""
    return {family: tuple(sorted(catalog.BY_NAME[family].labels)) for family in families}


def _combined(earlier: CollectorStatus | None, later: CollectorStatus) -> CollectorStatus:
    if earlier is None:
        return later
    return CollectorStatus(
        later.collector,
        earlier.success and later.success,
        earlier.duration_seconds + later.duration_seconds,
    )
