"""mig: MIG mode, and each MIG device's identity, size, memory and (Hopper+) GPM activity.

Enumeration (nvml.h): the parent's MIG devices are at indices 0..nvmlDeviceGetMaxMigDeviceCount;
empty slots answer NOT_FOUND or INVALID_ARGUMENT and are skipped. Each MIG device (one compute
instance, CI, of one GPU instance, GI) gives its MIG UUID, its name ("<parent> MIG <profile>"),
its GI and CI ids and its size (nvmlDeviceGetAttributes).

A reconfiguration destroys MIG devices, and nvml.h warns that a destroyed device's handle "must
be requested again" and that "handles may be reused and their properties can change". So every
tick first reads each cached handle's UUID: a handle that answers INVALID_ARGUMENT/NOT_FOUND,
or answers with another UUID, means "enumerate again" (not "GPU lost", not an error), before
anything is read through it. The layout is also read again on every slow refresh and at the
tick after a MIG configuration-change event (`collect/nvml/xid.py`).

Per tick, each MIG device's memory is read through its own handle, and GPM activity per GPU
instance with nvmlGpmMigSampleGet(parent, GI id) over the tick's window. A GI's memory and
activity belong to the GI: on a GI split into several CIs they would be repeated on each CI's
series (the double count dcgm-exporter users complain of with parent power), so they are left
absent there. GI ids are reused at once after a reconfiguration, so GPM windows are keyed by
the instance's MIG UUID, profile, GI and CI ids, never by GI id alone: a window is never diffed
across two instances that shared an id. A vanished instance's window is freed at the
enumeration that misses it.

A MIG mode read that fails (rather than NOT_SUPPORTED: no MIG on this GPU) keeps what was
known: one failed read must not turn a partitioned GPU into a whole one for a refresh period.

A layout is replaced only by a complete enumeration. When one of its identity calls (count,
handle, GI and CI ids, UUID, name) fails or is skipped after a hang, the layout is unknown: the
last known instances are reported down (`Device.report_mig`'s `unknown`, with the reason; their
series say so and keep their pods), nothing is read through their unverified handles, and the
enumeration is tried again every tick. A hung identity call is asked again as soon as it has
returned (`retry_when_answered`), not after the quarantine, so the instances are back at the
first tick after the driver answers.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml import gpm
from gpu_exporter.collect.nvml.calls import GoneError
from gpu_exporter.collect.nvml.collectors.base import Collector, Device
from gpu_exporter.collect.nvml.collectors.gpm import AWAITED, open_window, window_readings
from gpu_exporter.collect.nvml.collectors.gpm import FAMILIES as GPM_FAMILIES
from gpu_exporter.collect.nvml.collectors.memory import MEMORY_FAMILIES, memory_readings
from gpu_exporter.model.snapshot import InstanceSample, Reading

# Learned unsupported on a MIG GPU without GPM (A100, A30): its instances' activity is then
# DCGM's to give, where a DCGM source is configured (collect/dcgm_mig.py).
MIG_GPM = "mig_gpm"

# An empty slot, or a handle a reconfiguration destroyed.
_GONE = (N.NVMLError_NotFound, N.NVMLError_InvalidArgument)
_MIB = 1024 * 1024

WindowKey = tuple[int, int, str, str]


class _LayoutUnread(Exception):
    """An identity call of the enumeration did not answer: the layout is unknown (why)."""


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device as enumerated: its handle and identity, fixed until re-enumeration."""

    handle: Any
    gpu_instance: int
    compute_instance: int
    mig_uuid: str
    profile: str
    shared: bool  # its GPU instance has other compute instances
    static: tuple[Reading, ...]  # gpu_mig_instance_info, gpu_mig_instance_slices

    @property
    def window_key(self) -> WindowKey:
        """What a GPM window belongs to: never the GI id alone (ids are reused at once)."""
        return (self.gpu_instance, self.compute_instance, self.mig_uuid, self.profile)


def profile_of(name: str) -> str:
    """The MIG profile from a MIG device's name: "NVIDIA H200 MIG 1g.18gb" -> "1g.18gb"."""
    _, sep, profile = name.partition(" MIG ")
    return profile.strip() if sep else ""


class Mig(Collector):
    name = "mig"
    families = ("gpu_mig_mode",)
    instance_families = (
        "gpu_mig_instance_info",
        "gpu_mig_instance_slices",
        *MEMORY_FAMILIES,
        *GPM_FAMILIES,
    )
    calls = (
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceGetAttributes_v2",
        "nvmlDeviceGetMemoryInfo",
        "nvmlGpmQueryDeviceSupport",
        "nvmlGpmSampleAlloc",
        "nvmlGpmMigSampleGet",
        "nvmlGpmMetricsGet",
        "nvmlGpmSampleFree",
    )
    refreshes = True

    def __init__(self) -> None:
        super().__init__()
        self.mig_on = False  # MIG mode, as last read
        self.devices: tuple[MigDevice, ...] = ()
        self.windows: dict[WindowKey, gpm.GpmWindow] = {}
        self.abandoned = gpm.AbandonedWindows()
        self.gpm_supported: bool | None = None  # None: not asked yet
        self.changes_seen = 0  # MIG configuration-change events enumerated for
        self.unknown = ""  # why the layout could not be read ("": `devices` is the layout)

    # -- slow: mode and layout ---------------------------------------------------------------

    def refresh(self, nvml: Device) -> list[Reading]:
        mode = nvml.call("mig_mode", N.nvmlDeviceGetMigMode, nvml.handle)
        if mode is None:
            if nvml.is_unsupported("mig_mode"):  # no MIG on this GPU: a whole GPU only
                self.mig_on = False
                self._forget()
                return []
            return list(self.static)  # a failed read: keep what was known
        current, pending = (int(value) for value in mode)
        if current == 1:
            self.changes_seen = nvml.xid_counts.mig_changes(nvml.uuid)
            self._read_layout(nvml)
        else:
            self._forget()
        self.mig_on = current == 1
        return [
            Reading("gpu_mig_mode", float(current == 1), (("state", "current"),)),
            Reading("gpu_mig_mode", float(pending == 1), (("state", "pending"),)),
        ]

    def _read_layout(self, nvml: Device) -> None:
        """Enumerate; on an identity call that did not answer, keep the last layout, unknown."""
        try:
            self.devices, self.unknown = self._enumerate(nvml), ""
        except _LayoutUnread as exc:
            self.unknown = str(exc)

    def _enumerate(self, nvml: Device) -> tuple[MigDevice, ...]:
        parent = nvml.handle
        count = _identity(nvml, "mig_device_count", N.nvmlDeviceGetMaxMigDeviceCount, parent) or 0
        found: list[tuple[Any, int, int, str, str, Any]] = []
        for slot in range(count):
            try:
                handle = _identity(
                    nvml, "mig_device_handle", N.nvmlDeviceGetMigDeviceHandleByIndex, parent, slot
                )
                if handle is None:
                    continue
                gi = _identity(nvml, "mig_gpu_instance_id", N.nvmlDeviceGetGpuInstanceId, handle)
                ci = _identity(
                    nvml, "mig_compute_instance_id", N.nvmlDeviceGetComputeInstanceId, handle
                )
                uuid = _identity(nvml, "mig_uuid", N.nvmlDeviceGetUUID, handle)
                name = _identity(nvml, "mig_name", N.nvmlDeviceGetName, handle) or ""
                attrs = nvml.call(
                    "mig_attributes", N.nvmlDeviceGetAttributes_v2, handle, gone=_GONE
                )
            except GoneError:
                continue  # an empty slot, or destroyed while we looked
            if gi is None or ci is None or not uuid:
                continue  # learned unsupported: without identity it cannot be a series
            found.append((handle, int(gi), int(ci), str(uuid), profile_of(str(name)), attrs))
        per_gi: dict[int, int] = {}
        for _, gi, *_rest in found:
            per_gi[gi] = per_gi.get(gi, 0) + 1
        devices = tuple(
            MigDevice(handle, gi, ci, uuid, profile, per_gi[gi] > 1, _size_readings(attrs))
            for handle, gi, ci, uuid, profile, attrs in found
        )
        self._free_windows_except({d.window_key for d in devices if not d.shared})
        return devices

    def _forget(self) -> None:
        self.devices, self.unknown = (), ""
        self._free_windows_except(set())

    # -- every tick: memory and activity -----------------------------------------------------

    def read(self, nvml: Device) -> list[Reading]:
        if not self.mig_on:
            nvml.report_mig(False)
            return []
        changes = nvml.xid_counts.mig_changes(nvml.uuid)
        if self.unknown or changes != self.changes_seen or not self._layout_holds(nvml):
            # Unknown, nvmlEventMigConfigChange, or a handle gone, reused or not answering.
            self.changes_seen = changes
            self._read_layout(nvml)
        if self.unknown:
            nvml.report_mig(True, unknown=self.unknown)
            return []
        nvml.report_mig(
            True,
            tuple(self._instance(nvml, device) for device in self.devices),
            {device.mig_uuid: device.handle for device in self.devices},
        )
        return []

    def _layout_holds(self, nvml: Device) -> bool:
        """Whether every cached handle still names the MIG device it was enumerated as."""
        for device in self.devices:
            try:
                uuid = _identity(nvml, "mig_uuid", N.nvmlDeviceGetUUID, device.handle)
            except (GoneError, _LayoutUnread):
                return False
            if uuid != device.mig_uuid:  # reused for another device
                return False
        return True

    def _instance(self, nvml: Device, device: MigDevice) -> InstanceSample:
        readings = list(device.static)
        if not device.shared:  # a shared GI's memory and activity are none of its CIs'
            readings += self._memory(nvml, device)
            readings += self._activity(nvml, device)
        return InstanceSample(
            device.gpu_instance,
            device.compute_instance,
            device.mig_uuid,
            device.profile,
            device.shared,
            tuple(readings),
        )

    @staticmethod
    def _memory(nvml: Device, device: MigDevice) -> list[Reading]:
        mem = nvml.first(
            ("mig_memory_info_v2", N.nvmlDeviceGetMemoryInfo, device.handle, N.nvmlMemory_v2),
            ("mig_memory_info", N.nvmlDeviceGetMemoryInfo, device.handle),
        )
        return [] if mem is None else memory_readings(mem)

    def _activity(self, nvml: Device, device: MigDevice) -> list[Reading]:
        if not nvml.settings.gpm:
            return []
        if self.gpm_supported is None:
            supported = nvml.call("mig_gpm_support", gpm.is_supported, nvml.handle)
            if supported is not None or nvml.is_unsupported("mig_gpm_support"):
                self.gpm_supported = bool(supported)  # A100/A30: MIG without GPM
                if not supported:
                    nvml.learn_unsupported(MIG_GPM)
        if not self.gpm_supported:
            return []
        window = self.windows.get(device.window_key)
        if window is None:
            window = open_window(nvml, "mig_gpm_sample", device.gpu_instance)
            if window is None:
                return []
            self.windows[device.window_key] = window
            return [AWAITED]  # the first window needs a second sample: activity comes next tick
        return window_readings(nvml, "mig_gpm_metrics", window)

    # -- lifecycle ---------------------------------------------------------------------------

    def _free_windows_except(self, keep: set[WindowKey]) -> None:
        for key in [key for key in self.windows if key not in keep]:
            self.windows.pop(key).close()

    def abandon(self, stuck_tick: Future[Any]) -> None:
        self.abandoned.add(self.windows.values(), stuck_tick)
        self.windows = {}

    def free_orphans(self) -> None:
        self.abandoned.free_finished()

    def reset(self) -> None:
        super().reset()
        self.close()
        self.mig_on, self.gpm_supported = False, None

    def close(self) -> None:
        """Free every GPM sample (before any NVML shutdown: the source closes readers first)."""
        self._forget()
        self.free_orphans()


def _identity(nvml: Device, key: str, fn: Any, *args: Any) -> Any:
    """One identity call of the enumeration: its answer; None when learned unsupported;
    GoneError for an empty slot or a destroyed device; _LayoutUnread when it failed or is
    skipped after a hang (asked again as soon as the hung call returned)."""
    value = nvml.call(key, fn, *args, gone=_GONE, retry_when_answered=True)
    if value is None and not nvml.is_unsupported(key):
        if nvml.is_quarantined(key):
            raise _LayoutUnread(f"NVML call {key} hung (asked again once it answers)")
        raise _LayoutUnread(f"NVML call {key} failed")
    return value


def _size_readings(attrs: Any) -> tuple[Reading, ...]:
    if attrs is None:
        return ()
    slices = int(attrs.gpuInstanceSliceCount)
    info = (
        ("gpu_slices", str(slices)),
        ("compute_slices", str(int(attrs.computeInstanceSliceCount))),
        ("multiprocessors", str(int(attrs.multiprocessorCount))),
        ("memory_bytes", str(int(attrs.memorySizeMB) * _MIB)),
    )
    return (
        Reading("gpu_mig_instance_info", 1.0, info),
        Reading("gpu_mig_instance_slices", float(slices)),
    )
