"""SM, Tensor and DRAM activity from DCGM's profiling fields, for GPUs without NVML GPM.

NVML's GPM (the `gpm` collector) exists only on Hopper and newer; on the A100, A30, L4 and L40S
the same activity exists only as DCGM's profiling fields 1001-1016 (DCGM dcgm_fields.h). This
source keeps one session with a DCGM host engine, either a running `nv-hostengine` (standalone:
`dcgmConnect_v2`, which keeps the exporter unprivileged) or one started inside this process
(embedded: `dcgmStartEmbedded`, needs root and CAP_SYS_ADMIN), watches the configured fields at
the sampling interval and reads their latest values once per tick. Its readings go into the
very families GPM fills (`gpu_sm_active_ratio`, ...): one name per quantity, whichever source
measured it; `gpu_activity_source_info` says which one did. On a GPU with MIG enabled and no
GPM (A100, A30) the fields are watched on its GPU instances and their readings go onto its MIG
instances' series, as GPM's go on Hopper (collect/dcgm_mig.py).

Every DCGM call runs on this source's own worker thread. A tick starts the read (`begin`)
before the NVML reads and collects it (`finish`) by the NVML deadline; a read already late is
not waited for again, so a slow or hung host engine costs the tick only those values. A read
stuck for ten intervals is abandoned with its session and a new one is made (in embedded mode
the source stops instead: its engine cannot be started twice). A failed call (host engine gone,
restarted, refusing) tears the session down; it is re-made with exponential back-off (at once
after a session that worked), and until then the values are absent and counted in
gpu_exporter_errors_total{source="dcgm"}. Blank values (DCGM
writes them while profiling is paused for Nsight or CUPTI: dcgmProfPause) are absent too; they
are counted in gpu_exporter_dcgm_blank_values, not as errors.

Tested against the simulator's fake libdcgm (gpu_exporter/sim/fake_dcgm.py) only, which follows
DCGM's headers and API documentation; not yet run against a real DCGM.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from uuid import uuid4

from gpu_exporter.collect import dcgm_api as api
from gpu_exporter.collect import dcgm_mig
from gpu_exporter.collect.dcgm_mig import InstanceActivity, InstanceKey, WatchedInstance
from gpu_exporter.collect.settings import DcgmConfig
from gpu_exporter.collect.source import ErrorLog, SourceUnavailableError
from gpu_exporter.collect.worker import Worker
from gpu_exporter.model.activity import AWAITED_FAMILY, BY_DCGM_FIELD
from gpu_exporter.model.series import Producer, Series, series
from gpu_exporter.model.snapshot import CollectorStatus, DeviceSample, Labels, Reading

log = logging.getLogger(__name__)

SOURCE = "dcgm"
UP = "gpu_exporter_dcgm_up"
BLANK_VALUES = "gpu_exporter_dcgm_blank_values"
ACTIVITY_SOURCE = "gpu_activity_source_info"

# A value whose DCGM timestamp has not moved for this many watch intervals is stale: the host
# engine stopped sampling it, and an old number must not pass for a current one.
STALE_AFTER_INTERVALS = 5
# A read still running after this many intervals is abandoned with its session (a hung host
# engine); at most this many such threads are left behind before the source stops trying.
ABANDON_AFTER_INTERVALS = 10
MAX_ABANDONED_THREADS = 2


@dataclass(frozen=True, slots=True)
class DcgmField:
    field_id: int
    family: str
    labels: Labels = ()


# The profiling fields (DCGM_FI_PROF_*), in id order, as the families GPM fills for the same
# quantity on Hopper (model/activity.py pairs them). All are ratios of 0..1 (DCGM divides the
# percentages by 100).
FIELDS: tuple[DcgmField, ...] = tuple(
    DcgmField(field_id, activity.family, activity.labels)
    for field_id, activity in BY_DCGM_FIELD.items()
)
BY_ID: Mapping[int, DcgmField] = {f.field_id: f for f in FIELDS}

# What a GPU DCGM has no first value for yet reports (model/activity.py).
AWAITED = Reading(AWAITED_FAMILY, 1.0)

# Per-value problems that are not errors: no sample yet (the first update cycle), a field this
# GPU lacks, and blank values (profiling paused; counted apart).
_QUIET = frozenset({"NoData", "NotSupported", "Blank"})


class _Abandoned(Exception):
    """A read or connect that returned after its connection was abandoned or given up."""


def _problem_hint(exc: api.DcgmError, settings: DcgmConfig) -> str:
    """What a person can do about a session failure."""
    if exc.code == api.ST_CONNECTION_NOT_VALID:
        return f"no nv-hostengine answers at {settings.address} (dcgm.address)"
    if exc.code == api.ST_REQUIRES_ROOT:
        return (
            "the host engine runs without root: watching fields needs root and CAP_SYS_ADMIN "
            "(embedded mode), or point dcgm.address at a privileged nv-hostengine"
        )
    if exc.code == api.ST_MODULE_NOT_LOADED:
        return (
            "the host engine has no profiling module (it ships in NVIDIA's proprietary DCGM "
            "package): SM/Tensor/DRAM activity stays absent"
        )
    if exc.code in (api.ST_NO_PERMISSION, api.ST_PROFILING_NOT_SUPPORTED):
        return "profiling counters are not available to DCGM here (admin-only profiling?)"
    if exc.code == api.ST_PROFILING_MULTI_PASS:
        return "these fields cannot be collected in one pass on this GPU: narrow dcgm.fields"
    return "retrying with back-off"


@dataclass
class _Session:
    handle: int
    gpu_ids: dict[str, int]  # UUID -> DCGM GPU id, of the GPUs watched
    covered: frozenset[str]  # the UUIDs asked for when it was made (watched or unknown)
    embedded: bool = False
    group: int | None = None
    field_group: int | None = None
    good_reads: int = 0
    # MIG GPUs whose GPU instances were asked for, and the instances watched: DCGM entity id
    # -> the NVML GPU instance it was when the watch was set up.
    mig_covered: frozenset[str] = frozenset()
    instances: dict[int, WatchedInstance] = field(default_factory=dict)
    hierarchy_read: bool = False  # the hierarchy answered at setup: check it before each read

    def covers(self, wanted: frozenset[str] | None, mig_parents: frozenset[str]) -> bool:
        return (wanted is None or wanted == self.covered) and mig_parents == self.mig_covered

    def entities(self) -> list[api.Entity]:
        gpus = [(api.FE_GPU, gpu) for gpu in self.gpu_ids.values()]
        return gpus + [(api.FE_GPU_I, entity) for entity in self.instances]


@dataclass(frozen=True)
class DcgmReadings:
    """One read's activity: by GPU UUID for whole GPUs, by (parent UUID, NVML GPU-instance id)
    for the GPU instances of MIG GPUs."""

    gpus: Mapping[str, list[Reading]] = field(default_factory=dict)
    instances: Mapping[InstanceKey, InstanceActivity] = field(default_factory=dict)


NO_READINGS = DcgmReadings()


@dataclass
class _Connection:
    """What one worker thread owns. Abandoning a hung thread abandons its connection: from then
    on that thread may still finish its call, but it no longer changes the source's state."""

    worker: Worker
    session: _Session | None = None


@dataclass
class _Job:
    future: Future[DcgmReadings]
    started: float
    connecting: bool  # no session when it started: a connect may outlast the deadline
    late: bool = False


@dataclass
class _State:
    up: bool = False
    idle: bool = True  # no GPU needs DCGM (all have GPM, or none answered yet): no up series
    blank: int = 0
    last_problem: str = ""
    next_attempt: float = 0.0
    backoff: float = 0.0
    given_up: str = ""  # why the source stopped trying for good (an embedded engine that hung)
    last_hierarchy_problem: str = ""
    # (entity group, entity id, field id) -> (DCGM timestamp, when it was first seen)
    freshness: dict[tuple[int, int, int], tuple[int, float]] = field(default_factory=dict)


class DcgmSource:
    """One host-engine session for the GPUs that need DCGM; see the module docstring.

    libdcgm's state is process-wide (DCGM 4.6.0 dcgmlib/src/DcgmApi.cpp: `dcgmInit` sets a
    flag, `dcgmShutdown` frees every connection and the embedded host engine, a second
    `dcgmStartEmbedded` answers OK without a handle). So `dcgmInit` runs once, the embedded
    engine is started once and kept across sessions, and both end only in `close`.
    """

    name = SOURCE

    def __init__(
        self,
        settings: DcgmConfig,
        errors: ErrorLog,
        interval_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.errors = errors
        self.interval = interval_seconds
        self._clock = clock
        self._lib: api.Library | None = None
        self._connection = _Connection(Worker("dcgm"))
        self._abandoned: list[Future[DcgmReadings]] = []
        self._job: _Job | None = None
        self._closed = False
        self._lock = threading.Lock()  # guards _state and the two below
        self._state = _State(backoff=settings.reconnect_initial_backoff_seconds)
        self._initialised = False  # dcgmInit done
        self._embedded_handle: int | None = None
        self._status = CollectorStatus(SOURCE, True, 0.0)

    # -- Source protocol -----------------------------------------------------------------------

    def start(self) -> None:
        """Load libdcgm; SourceUnavailableError (one sentence) when it is not installed."""
        try:
            self._lib = api.load()
        except api.DcgmLibraryMissingError as exc:
            raise SourceUnavailableError(str(exc)) from None

    def sample(self) -> list[DeviceSample]:
        """Every GPU the host engine knows, with its activity only (standalone use)."""
        self.begin(None)
        readings = self.finish(self.interval)
        return [
            DeviceSample(i, uuid, {}, True, tuple(values))
            for i, (uuid, values) in enumerate(sorted(readings.gpus.items()))
        ]

    def node_info(self) -> dict[str, str]:
        return {}

    def collector_names(self) -> tuple[str, ...]:
        return (SOURCE,)

    def collector_status(self) -> tuple[CollectorStatus, ...]:
        return (self._status,)

    def close(self) -> None:
        """End the session and libdcgm (on the worker, waited for briefly); safe twice. While a
        thread is still inside libdcgm, libdcgm is left alone: shutting it down under that
        call would free what the call uses, and the process is ending anyway."""
        if self._closed:
            return
        self._closed = True
        connection = self._connection
        stuck = [f for f in self._abandoned if not f.done()]
        job = self._job
        if job is not None and not job.future.done():
            stuck.append(job.future)
        done = connection.worker.submit(self._close_all, connection, bool(stuck))
        try:
            done.result(timeout=max(1.0, self.interval))
        except Exception:  # a hung host engine or a failing teardown: nothing left to save
            log.warning("DCGM: the session did not close in time; left to the process exit")
        connection.worker.stop()

    # -- per tick ------------------------------------------------------------------------------

    @property
    def available(self) -> bool:
        """True once the library is loaded."""
        return self._lib is not None

    def begin(
        self, wanted: Collection[str] | None, mig_parents: Collection[str] = frozenset()
    ) -> None:
        """Start reading the GPUs with these UUIDs (None: all) and the GPU instances of the MIG
        GPUs in `mig_parents` on the worker, unless the last read is still running (then this
        tick has no DCGM values)."""
        with self._lock:
            self._state.idle = wanted is not None and not wanted and not mig_parents
            given_up = bool(self._state.given_up)
        job = self._job
        if job is not None and not job.future.done():
            self._maybe_abandon(job)
            return
        if given_up or self._state.idle:
            self._job = None
            return
        connection = self._connection
        wanted_set = None if wanted is None else frozenset(wanted)
        mig_set = frozenset(mig_parents)
        session = connection.session
        connecting = session is None or not session.covers(wanted_set, mig_set)
        future = connection.worker.submit(self._read, connection, wanted_set, mig_set)
        self._job = _Job(future, self._clock(), connecting)

    def finish(self, timeout: float) -> DcgmReadings:
        """The readings of the read `begin` started, waited for up to `timeout` seconds (not at
        all for a read already known to be late); nothing when it is not done by then."""
        job = self._job
        if job is None:
            self._status = CollectorStatus(SOURCE, True, 0.0)
            return NO_READINGS
        try:
            result = job.future.result(timeout=0.0 if job.late else max(0.0, timeout))
        except TimeoutError:  # DCGM not answering is an error count, not a failed collector
            if not job.late:
                job.late = True
                if not job.connecting:  # a connect may take longer; its failure is counted
                    self.errors.add(SOURCE, "read", "Timeout")
                self._set_state(self._connection, up=False, blank=0)
            self._status = CollectorStatus(SOURCE, True, self._clock() - job.started)
            return NO_READINGS
        except Exception:  # a bug in the read (a failed collector): this tick's values lost
            log.exception("DCGM read failed")
            self.errors.add(SOURCE, "read", "exception")
            self._status = CollectorStatus(SOURCE, False, self._clock() - job.started)
            return NO_READINGS
        self._status = CollectorStatus(SOURCE, True, self._clock() - job.started)
        return result

    def producer(self) -> Producer:
        """The source's own health: gpu_exporter_dcgm_up and the blank values of the tick."""
        return Producer(SOURCE, self._series, frozenset({SOURCE}))

    def _series(self) -> Iterator[Series]:
        with self._lock:
            state = self._state
            if state.idle:  # no GPU needs DCGM here: nothing to be up or down for
                return
            up, blank = state.up, state.blank
        yield series(UP, 1.0 if up else 0.0, (("mode", self.settings.mode),))
        yield series(BLANK_VALUES, float(blank))

    def _maybe_abandon(self, job: _Job) -> None:
        """A read stuck far beyond its deadline: leave its thread, and its session, behind."""
        if self._clock() - job.started < ABANDON_AFTER_INTERVALS * self.interval:
            return
        if self.settings.mode == "embedded":
            # The engine is this process's own and cannot be started twice: stop here.
            self._give_up("the embedded host engine did not answer; restart the exporter")
            return
        self._abandoned = [f for f in self._abandoned if not f.done()]
        if len(self._abandoned) >= MAX_ABANDONED_THREADS:
            return
        log.warning(
            "DCGM did not answer for %.0fs: starting a new session", self._clock() - job.started
        )
        self.errors.add(SOURCE, "read", "Hung")
        with self._lock:
            old = self._connection
            self._connection = _Connection(Worker("dcgm"))
        # Once its call returns: disconnect, nothing more. The worker runs in order, so this
        # job being done means the thread has left libdcgm (close() waits for that).
        self._abandoned.append(old.worker.submit(self._teardown, old))
        old.worker.stop()
        self._job = None

    def _give_up(self, why: str) -> None:
        with self._lock:
            first = not self._state.given_up
            self._state.given_up = why
            self._state.up = False
        if first:
            log.error("DCGM: %s", why)
            self.errors.add(SOURCE, "read", "Hung")

    # -- on the worker thread ------------------------------------------------------------------

    def _current(self, connection: _Connection) -> bool:
        with self._lock:
            return self._current_locked(connection)

    def _current_locked(self, connection: _Connection) -> bool:
        """Whether `connection` may still change the source's state: not abandoned, not
        closed, not given up (a hung embedded engine's read that returns changes nothing)."""
        return connection is self._connection and not self._closed and not self._state.given_up

    def _read(
        self, connection: _Connection, wanted: frozenset[str] | None, mig_parents: frozenset[str]
    ) -> DcgmReadings:
        lib = self._lib
        if lib is None or not self._current(connection):
            return NO_READINGS
        try:
            session, instances_checked = self._session(lib, connection, wanted, mig_parents)
        except Exception as exc:  # DcgmError, and anything a bug or a library may raise
            session = connection.session
            self._failed(connection, exc, connecting=session is None or session.good_reads == 0)
            self._teardown(connection)
            return NO_READINGS
        if session is None:  # backing off
            return NO_READINGS
        if not session.gpu_ids and not session.instances:
            # DCGM knows none of the GPUs asked for: nothing is measured, so DCGM is not up.
            self._set_state(connection, up=wanted is None, blank=0)
            return NO_READINGS
        try:
            values = lib.latest_values(session.handle, session.entities(), self.settings.fields)
            readings, blank = self._readings(connection, values, session, instances_checked)
        except Exception as exc:
            # A session that worked and broke (a host engine restart): reconnect at once. One
            # that fails on its first read backs off like a failed connect.
            self._failed(connection, exc, connecting=session.good_reads == 0)
            self._teardown(connection)
            return NO_READINGS
        self._succeeded(connection, session, blank)
        return readings

    def _session(
        self,
        lib: api.Library,
        connection: _Connection,
        wanted: frozenset[str] | None,
        mig_parents: frozenset[str],
    ) -> tuple[_Session | None, bool]:
        """The session to read through (None: backing off), made or made again as needed,
        and whether its GPU instances are known to still be what they were when watched."""
        session = connection.session
        if session is not None and not session.covers(wanted, mig_parents):
            self._teardown(connection)  # GPUs came or went: watch exactly those that need it
            session = None
        if session is not None:
            if not session.hierarchy_read:
                return session, False
            hierarchy = self._hierarchy(lib, session.handle)
            if hierarchy is None:
                return session, False
            if dcgm_mig.watched_instances(hierarchy, mig_parents) == session.instances:
                return session, True
            # A MIG reconfiguration: DCGM numbered its GPU instances again.
            log.info("DCGM: the MIG layout changed: watching the GPU instances anew")
            self._teardown(connection)
        with self._lock:
            if self._clock() < self._state.next_attempt:
                return None, False
        try:
            session = self._connect(lib, connection, wanted, mig_parents)
        except Exception as exc:
            self._failed(connection, exc, connecting=True)
            self._teardown(connection)
            return None, False
        return session, True

    def _hierarchy(self, lib: api.Library, handle: int) -> list[api.MigEntity] | None:
        """DCGM's MIG hierarchy; None when it cannot be read (counted, said once per problem:
        the GPU instances' activity is then absent, the whole GPUs' is not). A connection that
        is gone raises, as any other call would."""
        try:
            hierarchy = lib.gpu_instance_hierarchy(handle)
        except api.DcgmError as exc:
            if exc.code == api.ST_CONNECTION_NOT_VALID:
                raise
            self.errors.add(SOURCE, exc.function, exc.name)
            message = f"{exc}: the activity of MIG instances stays absent"
            with self._lock:
                repeated = message == self._state.last_hierarchy_problem
                self._state.last_hierarchy_problem = message
            if not repeated:
                log.warning("DCGM: %s", message)
            return None
        with self._lock:
            self._state.last_hierarchy_problem = ""
        return hierarchy

    def _connect(
        self,
        lib: api.Library,
        connection: _Connection,
        wanted: frozenset[str] | None,
        mig_parents: frozenset[str] = frozenset(),
    ) -> _Session:
        settings = self.settings
        with self._lock:
            initialised, embedded = self._initialised, self._embedded_handle
        if not initialised:
            lib.init()
            with self._lock:
                self._initialised = True
        if settings.mode == "embedded":
            if embedded is None:
                embedded = lib.start_embedded()
                with self._lock:
                    self._embedded_handle = embedded
            handle = embedded
        else:
            address, unix = _address(settings.address)
            timeout_ms = round(settings.connect_timeout_seconds * 1000)
            handle = lib.connect(address, unix, timeout_ms)
        is_embedded = settings.mode == "embedded"
        connection.session = session = _Session(
            handle, {}, frozenset(wanted or ()), embedded=is_embedded, mig_covered=mig_parents
        )
        known = lib.supported_gpus(handle)
        uuids = {}
        if known:
            gpus = [(api.FE_GPU, gpu) for gpu in known]
            for value in lib.latest_values(handle, gpus, [api.FI_DEV_GPU_UUID], live=True):
                if isinstance(value.value, str):
                    uuids[value.value] = value.entity_id
        session.gpu_ids = {
            uuid: gpu for uuid, gpu in uuids.items() if wanted is None or uuid in wanted
        }
        if mig_parents:
            self._watch_instances(lib, session, mig_parents)
        if not self._current(connection):
            raise _Abandoned  # a hung call returned after its session was given up
        missing = sorted((wanted or frozenset()) - set(uuids))
        if missing:
            self.errors.add(SOURCE, "gpus", "UnknownGpu")
            log.warning(
                "DCGM does not know GPU(s) %s: their activity stays absent", ", ".join(missing)
            )
        if session.gpu_ids or session.instances:
            # Unique per host engine: every exporter pod is PID 1, and two may share one
            # host engine during a rolling update.
            name = f"gpu-exporter-{uuid4().hex[:16]}"
            entities = sorted(session.entities())
            session.group = lib.group_create(handle, name, entities)
            session.field_group = lib.field_group_create(handle, name, settings.fields)
            keep = max(2 * self.interval, 1.0)
            lib.watch(handle, session.group, session.field_group, self.interval, keep)
        with self._lock:
            if not self._current_locked(connection):
                raise _Abandoned
            self._state.freshness.clear()
        where = "the embedded host engine" if is_embedded else settings.address
        log.info(
            "DCGM: watching fields %s on %d GPU(s) and %d MIG GPU instance(s) at %s",
            ",".join(map(str, settings.fields)),
            len(session.gpu_ids),
            len(session.instances),
            where,
        )
        return session

    def _watch_instances(
        self, lib: api.Library, session: _Session, mig_parents: frozenset[str]
    ) -> None:
        """Which GPU instances of the MIG GPUs `session` watches, from DCGM's hierarchy; a
        MIG GPU DCGM lists no GPU instance of is said once per session (and counted)."""
        hierarchy = self._hierarchy(lib, session.handle)
        if hierarchy is None:
            return
        session.instances = dcgm_mig.watched_instances(hierarchy, mig_parents)
        session.hierarchy_read = True
        unlisted = sorted(mig_parents - dcgm_mig.listed_parents(hierarchy))
        if unlisted:
            self.errors.add(SOURCE, "gpu_instances", "NotListed")
            log.warning(
                "DCGM lists no GPU instance of MIG GPU(s) %s: their instances' activity stays "
                "absent (a host engine reads MIG only when it runs as root)",
                ", ".join(unlisted),
            )

    def _succeeded(self, connection: _Connection, session: _Session, blank: int) -> None:
        """A good read: up, and the back-off starts over (only now, not at connect: a
        session that connects and then fails must keep backing off)."""
        session.good_reads += 1
        with self._lock:
            if not self._current_locked(connection):
                return
            state = self._state
            recovered, state.last_problem = state.last_problem, ""
            state.backoff = self.settings.reconnect_initial_backoff_seconds
            state.up, state.blank = True, blank
        if recovered:
            log.info("DCGM: reading again (after: %s)", recovered)

    def _failed(self, connection: _Connection, exc: Exception, connecting: bool) -> None:
        """Count the failure, say it once (again when it changes), and back off. An exception
        that is no DcgmError (a bug, or a library answering what the headers do not say) is
        handled alike, with its traceback logged once."""
        if isinstance(exc, _Abandoned) or not self._current(connection):
            return
        if isinstance(exc, api.DcgmError):
            # `auto` asks for a host engine only where one runs: none answering is no error.
            absent = exc.code == api.ST_CONNECTION_NOT_VALID and exc.function == "dcgmConnect_v2"
            quiet = self.settings.mode == "auto" and absent
            if not quiet:
                self.errors.add(SOURCE, exc.function, exc.name)
            message = f"{exc}: {_problem_hint(exc, self.settings)}"
        else:
            quiet = False
            self.errors.add(SOURCE, "read", "exception")
            message = f"unexpected {type(exc).__name__}: {exc}"
        with self._lock:
            if not self._current_locked(connection):
                return
            state = self._state
            state.up, state.blank = False, 0
            repeated = message == state.last_problem
            state.last_problem = message
            delay = state.backoff if connecting else 0.0
            state.next_attempt = self._clock() + delay
            if connecting:
                state.backoff = min(state.backoff * 2, self.settings.reconnect_max_backoff_seconds)
        if repeated:
            return
        if isinstance(exc, api.DcgmError):
            log.log(logging.INFO if quiet else logging.WARNING, "DCGM: %s", message)
        else:
            log.error("DCGM: %s", message, exc_info=exc)

    def _teardown(self, connection: _Connection) -> None:
        """Undo the session, best effort (after a host-engine restart its handles are gone):
        its watch and groups, and a standalone connection; the embedded engine stays."""
        lib, session = self._lib, connection.session
        connection.session = None
        if lib is None or session is None:
            return
        handle = session.handle
        steps: list[tuple[Callable[..., None], tuple[int, ...]]] = []
        if session.group is not None and session.field_group is not None:
            steps.append((lib.unwatch, (handle, session.group, session.field_group)))
        if session.field_group is not None:
            steps.append((lib.field_group_destroy, (handle, session.field_group)))
        if session.group is not None:
            steps.append((lib.group_destroy, (handle, session.group)))
        if not session.embedded:
            steps.append((lib.disconnect, (handle,)))
        for step, args in steps:
            try:
                step(*args)
            except api.DcgmError as exc:
                log.debug("DCGM teardown: %s", exc)

    def _close_all(self, connection: _Connection, others_in_libdcgm: bool) -> None:
        self._teardown(connection)
        lib = self._lib
        if lib is None or others_in_libdcgm:
            return
        with self._lock:
            embedded, initialised = self._embedded_handle, self._initialised
            self._embedded_handle, self._initialised = None, False
        steps: list[tuple[Callable[..., None], tuple[int, ...]]] = []
        if embedded is not None:
            steps.append((lib.stop_embedded, (embedded,)))
        if initialised:
            steps.append((lib.shutdown, ()))
        for step, args in steps:
            try:
                step(*args)
            except api.DcgmError as exc:
                log.debug("DCGM shutdown: %s", exc)

    def _readings(
        self,
        connection: _Connection,
        values: list[api.FieldValue],
        session: _Session,
        instances_checked: bool,
    ) -> tuple[DcgmReadings, int]:
        """The read's values as readings, by GPU and by GPU instance; a problem with one value
        (one field of one GPU or GPU instance) leaves that value absent, the others not. The
        GPU instances' values are used only when the hierarchy read with them still pairs
        each entity with the instance it was watched as (`instances_checked`)."""
        now = self._clock()
        stale_after = STALE_AFTER_INTERVALS * self.interval
        gpus: dict[str, list[Reading]] = {}
        instances: dict[InstanceKey, list[Reading]] = {}
        blank = 0
        uuid_of = {gpu: uuid for uuid, gpu in session.gpu_ids.items()}
        watched = session.instances if instances_checked else {}
        if not self._current(connection):
            return NO_READINGS, blank  # an abandoned read: its values and errors are not ours
        with self._lock:
            freshness = self._state.freshness
        # GPUs and GPU instances with a field not sampled yet (before the first update cycle)
        no_data: set[str] = set()
        no_data_instances: set[InstanceKey] = set()
        for value in values:
            target: list[Reading] | None = None
            if value.entity_group == api.FE_GPU and value.entity_id in uuid_of:
                target = gpus.setdefault(uuid_of[value.entity_id], [])
            elif value.entity_group == api.FE_GPU_I and value.entity_id in watched:
                target = instances.setdefault(watched[value.entity_id].key, [])
            spec = BY_ID.get(value.field_id)
            if target is None or spec is None:
                continue
            if value.value is None or isinstance(value.value, str):
                if value.problem == "Blank":
                    blank += 1
                if value.problem == "NoData" and value.entity_group == api.FE_GPU:
                    no_data.add(uuid_of[value.entity_id])
                elif value.problem == "NoData":
                    no_data_instances.add(watched[value.entity_id].key)
                if value.problem not in _QUIET:
                    self.errors.add(SOURCE, f"field_{value.field_id}", value.problem)
                continue
            key = (value.entity_group, value.entity_id, value.field_id)
            seen = freshness.get(key)
            if seen is None or seen[0] != value.timestamp_us:
                freshness[key] = (value.timestamp_us, now)
            elif now - seen[1] > stale_after:
                self.errors.add(SOURCE, f"field_{value.field_id}", "StaleData")
                continue
            ratio = value.value
            if not math.isfinite(ratio):
                self.errors.add(SOURCE, f"field_{value.field_id}", "NaN")
                continue
            if ratio > 1.0:  # DCGM issue 152: SM activity above 1.0; kept, clamped, counted
                self.errors.add(SOURCE, f"field_{value.field_id}", "AboveOne")
            target.append(Reading(spec.family, min(max(ratio, 0.0), 1.0), spec.labels))
        slices = {w.key: w.slices for w in watched.values()}
        found_gpus = {uuid: found for uuid, found in gpus.items() if found}
        found_instances = {
            key: InstanceActivity(slices[key], tuple(found))
            for key, found in instances.items()
            if found
        }
        # Before the first update cycle of a new watch: activity is awaited, not missing.
        for uuid in no_data - found_gpus.keys():
            found_gpus[uuid] = [AWAITED]
        for instance in no_data_instances - found_instances.keys():
            found_instances[instance] = InstanceActivity(slices[instance], (AWAITED,))
        return DcgmReadings(found_gpus, found_instances), blank

    def _set_state(self, connection: _Connection, up: bool, blank: int) -> None:
        if not self._current(connection):
            return
        with self._lock:
            self._state.up, self._state.blank = up, blank


def configured(
    settings: DcgmConfig,
    errors: ErrorLog,
    interval_seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> DcgmSource | None:
    """The DCGM source `settings` ask for, its library loaded; None for `off`, and for `auto`
    without libdcgm (exactly as without DCGM). SourceUnavailableError when `standalone` or
    `embedded` is asked for and libdcgm is missing: that configuration cannot work."""
    if settings.mode == "off":
        return None
    source = DcgmSource(settings, errors, interval_seconds, clock)
    try:
        source.start()
    except SourceUnavailableError as exc:
        source.close()
        if settings.mode == "auto":
            log.info("DCGM: %s; activity before Hopper stays absent", exc)
            return None
        raise SourceUnavailableError(
            f"dcgm.mode is {settings.mode}, but {exc}; {INSTALL_HINT}"
        ) from None
    return source


# Where libdcgm comes from: NVIDIA's DCGM 4 packages (the CUDA apt/yum repository), or an image
# built with them (docs/kubernetes.md, "An image with DCGM").
INSTALL_HINT = (
    "install NVIDIA's DCGM 4 from its CUDA repository (datacenter-gpu-manager-4-core, and "
    "datacenter-gpu-manager-4-proprietary for the profiling fields), or in a container use an "
    "image built with them (docs/kubernetes.md, An image with DCGM); dcgm.mode auto runs "
    "without DCGM where it is missing"
)


def with_dcgm_activity(
    samples: list[DeviceSample],
    needing: Collection[str],
    readings: DcgmReadings,
    mig_needing: Collection[str] = frozenset(),
    starting: Collection[str] = (),
) -> list[DeviceSample]:
    """The tick's samples with DCGM's activity added to the GPUs that needed it (and to the MIG
    instances of the MIG GPUs in `mig_needing`), and gpu_activity_source_info on every GPU
    whose activity (or whose MIG instances' activity) one of the two sources measured.
    `starting`: GPUs (whole or MIG-enabled) that need DCGM from the next tick on (GPM was just
    learned unsupported): their activity is awaited, as it is while DCGM has no first value."""
    merged = []
    for sample in samples:
        if sample.up and sample.mig_enabled:
            if sample.uuid in starting:
                merged.append(dcgm_mig.awaiting_activity(sample))
            else:
                merged.append(_with_mig_activity(sample, sample.uuid in mig_needing, readings))
            continue
        extra: list[Reading] = []
        found = readings.gpus.get(sample.uuid)
        if sample.up and found and sample.uuid in needing:
            extra = list(found)
            if found != [AWAITED]:
                extra.append(_source_info("dcgm"))
        elif sample.up and sample.uuid in starting:
            extra = [AWAITED]
        elif sample.up and sample.value("gpu_sm_active_ratio") is not None:
            extra = [_source_info("gpm")]
        merged.append(replace(sample, readings=(*sample.readings, *extra)) if extra else sample)
    return merged


def _with_mig_activity(sample: DeviceSample, needing: bool, readings: DcgmReadings) -> DeviceSample:
    source = ""
    if needing:
        sample, given = dcgm_mig.with_instance_activity(sample, readings.instances)
        source = "dcgm" if given else ""
    elif dcgm_mig.has_instance_activity(sample):
        source = "gpm"
    if not source:
        return sample
    return replace(sample, readings=(*sample.readings, _source_info(source)))


def _source_info(source: str) -> Reading:
    return Reading(ACTIVITY_SOURCE, 1.0, (("source", source),))


def _address(address: str) -> tuple[str, bool]:
    """dcgmConnect_v2's address and whether it is a unix socket (`unix:/path`)."""
    if address.startswith("unix:"):
        return address.removeprefix("unix:").removeprefix("//"), True
    return address, False
