"""What a collector is, and what it sees of its GPU.

A collector reads one area of one GPU (memory, power, clocks, ...) on that GPU's worker thread.
Each subclass declares, right next to its code:

- `name`: its `collector` label in gpu_exporter_collector_success / _duration_seconds;
- `families`: the catalog families it emits. Emitting any other fails it on that GPU for that
  tick, as does a reading whose label names are not its family's catalog labels, whose label
  values are not `str`, or whose value is not an `int` or `float` (`collect/nvml/device.py`);
  `instance_families`: those of the MIG instances it reports (the mig collector's), checked
  the same way when reported; `mig_dependent`: its keys whose answer changes with MIG mode;
- `calls`: the pynvml functions it calls (tests/test_collectors.py checks it calls no others);
- `fields`: its entries in the tick's one `nvmlDeviceGetFieldValues` batch. The batch's time
  is split over the collectors with entries in it, by their number of entries, in
  gpu_exporter_collector_duration_seconds (not charged to whichever asked first);
- `setting`: the `NvmlConfig` flag that turns it on and off (None: always on), and
  `options`: other flags that change what it reads;

and implements `read` (every tick) and, for slow-changing data, `refresh` (every
`slow_refresh_seconds`; its readings are repeated in between). Every NVML call goes through the
`Device` it is handed, whose `call` is the choke point (`collect/nvml/device.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from gpu_exporter.collect.settings import NvmlConfig
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.model.snapshot import InstanceSample, Labels, ProcessSample, Reading

if TYPE_CHECKING:
    import pynvml as N

    from gpu_exporter.collect.nvml.topology import Topology
    from gpu_exporter.collect.nvml.xid import XidCounts

NEVER = float("-inf")


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One entry of the per-tick `nvmlDeviceGetFieldValues` batch."""

    field_id: int
    family: str
    labels: Labels = ()
    scale: float = 1.0
    scope: int = 0

    @property
    def key(self) -> str:
        """The choke-point key: what is learned unsupported and counted in errors_total."""
        return f"field_{self.field_id}"


class Device(Protocol):
    """One GPU as a collector sees it: its handle and settings, and the choke point."""

    # Read-only to collectors (properties, so any object with these attributes qualifies).
    @property
    def handle(self) -> Any: ...

    @property
    def uuid(self) -> str: ...

    @property
    def settings(self) -> NvmlConfig: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def driver_version(self) -> str: ...

    @property
    def topology(self) -> Topology | None: ...

    @property
    def xid_counts(self) -> XidCounts: ...

    @property
    def errors(self) -> ErrorLog:
        """Where NVML failures are counted (for calls made outside the tick, such as frees)."""

    @property
    def mig_enabled(self) -> bool:
        """MIG mode as the mig collector last read it (it runs before gpm)."""

    def call(
        self,
        key: str,
        fn: Callable[..., Any] | None,
        *args: Any,
        gone: tuple[type[N.NVMLError], ...] = (),
        retry_when_answered: bool = False,
    ) -> Any:
        """One NVML call; None when unsupported, quarantined or failed (already counted); an
        error in `gone` (the thing asked about is not there) raises GoneError, not counted.
        `retry_when_answered`: after a hang, asked again as soon as the hung call returned
        rather than after the quarantine."""

    def first(self, *attempts: tuple[Any, ...]) -> Any:
        """(key, fn, *args) alternatives, newest first, moving on only past unsupported ones."""

    def field_readings(self, specs: Sequence[FieldSpec]) -> list[Reading]:
        """These fields' readings from the tick's one batch (made on the first request)."""

    def fields_gone(self, *field_ids: int) -> bool:
        """True when none of these fields can be read: time for the older call."""

    def is_unsupported(self, key: str) -> bool: ...

    def is_quarantined(self, key: str) -> bool:
        """Whether the call is skipped because it hung (see `call`)."""

    def learn_unsupported(self, key: str) -> None: ...

    def count_error(self, source: str, key: str, error: str) -> None:
        """A failure NVML reported inside a successful call (a GPM metric, a field)."""

    def identify(self, uuid: str | None, info: Mapping[str, str]) -> None:
        """The identity collector's result: the UUID (None: keep) and the gpu_info labels."""

    def report_mig(
        self,
        enabled: bool,
        instances: tuple[InstanceSample, ...] = (),
        handles: Mapping[str, Any] | None = None,
        unknown: str = "",
    ) -> None:
        """The mig collector's result: MIG mode, this tick's MIG instances and their device
        handles by MIG UUID (for the collectors after it that read per instance); `unknown`:
        why the layout could not be read (the last known instances are then reported down)."""

    @property
    def mig_handles(self) -> Mapping[str, Any]:
        """This tick's MIG device handles by MIG UUID, as the mig collector reported them."""

    def report_processes(
        self,
        processes: tuple[ProcessSample, ...] | None,
        by_instance: Mapping[str, tuple[ProcessSample, ...]] | None = None,
    ) -> None:
        """The processes collector's result: the GPU's processes (None on a MIG GPU or when
        the lists could not be read) and each MIG instance's, by MIG UUID."""


class Collector:
    """Base of the per-GPU collectors; one instance per GPU holds that GPU's state."""

    name: ClassVar[str]
    families: ClassVar[tuple[str, ...]]
    # Families of the MIG instances it reports (`Device.report_mig`), not its own readings.
    instance_families: ClassVar[tuple[str, ...]] = ()
    # Choke-point keys whose answer depends on the MIG mode (NOT_SUPPORTED or NO_PERMISSION
    # with MIG on): what the GPU learned about them is forgotten when the mode changes.
    mig_dependent: ClassVar[tuple[str, ...]] = ()
    calls: ClassVar[tuple[str, ...]] = ()
    fields: ClassVar[tuple[FieldSpec, ...]] = ()
    setting: ClassVar[str | None] = None
    options: ClassVar[tuple[str, ...]] = ()
    refreshes: ClassVar[bool] = False  # has slow-changing data, read by `refresh`
    works_offline: ClassVar[bool] = False  # needs no NVML call: reported while the GPU is down

    def __init__(self) -> None:
        self.static: list[Reading] = []  # the last refresh's readings, repeated every tick
        self.static_at = NEVER

    @classmethod
    def enabled(cls, settings: NvmlConfig, *, topology: bool) -> bool:
        """On by its setting; `topology`: the source was given a topology reader."""
        return cls.setting is None or bool(getattr(settings, cls.setting))

    def refresh_due(self, now: float, every: float) -> bool:
        return self.refreshes and now - self.static_at >= every

    def refresh(self, nvml: Device) -> list[Reading]:
        """Slow-changing data (maxima, modes, link states)."""
        return []

    def read(self, nvml: Device) -> list[Reading]:
        """What changes tick to tick."""
        return []

    def wanted_fields(self) -> Sequence[FieldSpec]:
        """The fields to put in this tick's batch."""
        return self.fields

    def reset(self) -> None:
        """After a re-bind (new handle): read everything again from scratch."""
        self.static, self.static_at = [], NEVER

    def abandon(self, stuck_tick: Future[Any]) -> None:
        """The tick running on `stuck_tick` missed its deadline and may still use our state."""

    def free_orphans(self) -> None:
        """Release what abandoned ticks held once they have finished (sampler thread)."""

    def close(self) -> None:
        """Release NVML resources."""
