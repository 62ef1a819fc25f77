"""Bottleneck class per GPU: what limits it right now, by ordered checks over a short window.

Each call of `Classifier.process` (one per sampler tick) adds a window of the tick's inputs per
GPU and applies these checks in order; the first that matches is the class:

1. `idle`          mean utilization below `idle_utilization`: no kernel ran.
2. `throttled`     a HW slowdown / HW thermal / power brake / SW thermal reason held the clocks
                   down for at least `throttle_fraction` of the window.
3. `launch_bound`  SM activity below `sm_active_low` and nothing on the device explains it
                   (DRAM and links not busy): tiny kernels, launch overhead, syncs, host stalls.
4. `link_bound`    SM activity low while PCIe or NVLink runs at `link_utilization_high` of
                   capacity or more: the SMs wait on transfers.
5. `memory_bound`  DRAM bandwidth at `dram_active_high` of peak or more and no less busy than
                   the tensor pipes (the memory roof of the roofline is the nearer one).
6. `tensor_bound`  Tensor pipes active at least `tensor_active_high` of the cycles.
7. `compute_bound` SMs busy (activity at or above `sm_active_low`) on non-tensor work.
8. `unknown`       activity data absent (pre-Hopper without DCGM, GPM not ready) or stuck at
                   exactly 0 while utilization says kernels ran (dcgm-exporter #662), or a check
                   needs link data that is absent. Never a guess.

The classifier is pure: no NVML calls, no clock of its own; the same inputs give the same
classes. Down GPUs get no class; their time is not attributed to any class.

MIG: a GPU with MIG enabled gets no class of its own; each of its MIG instances gets one, from
its own activity (NVML utilization does not exist under MIG: its graphics-engine activity,
the share of time any kernel ran on it, stands in) and its parent's clock events and links,
which all of the parent's instances share. An instance whose GPU instance is split into
several compute instances has no activity of its own (it is the GPU instance's): `unknown`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from types import MappingProxyType

from gpu_exporter.collect.settings import MIN_WINDOW_SECONDS, ClassifierConfig
from gpu_exporter.model.nvml_facts import (
    COMBINED_THERMAL_REASON,
    HW_POWER_BRAKE_SLOWDOWN,
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    SW_THERMAL_SLOWDOWN,
)
from gpu_exporter.model.snapshot import DeviceSample, Reading
from gpu_exporter.model.verdict import Verdict, WindowStats

CLASSES: tuple[str, ...] = (
    "idle",
    "throttled",
    "launch_bound",
    "link_bound",
    "memory_bound",
    "tensor_bound",
    "compute_bound",
    "unknown",
)
OUTPUT_FAMILIES = frozenset({"gpu_bottleneck", "gpu_bottleneck_seconds_total"})

# What each class means for whoever pays for the GPU (the status page colours its chip by it):
#   waste:   the GPU is held but does far less than it could, for a reason that can be fixed:
#            launch overhead or host stalls, transfers, or clocks cut by a protective limit;
#   fine:    the GPU is busy at one of its hardware roofs (tensor pipes, SMs, or DRAM
#            bandwidth). memory_bound is fine: a bandwidth-bound kernel (LLM decode, embedding
#            lookups) at its DRAM roof is doing what the hardware allows, and no setting moves
#            that roof; only a different algorithm would;
#   spare:   idle, and no pod is known to hold it: free capacity, not waste;
#   unknown: the activity data needed to tell is missing.
# idle is waste only while a pod holds the GPU (see `class_kind`).
WASTE, FINE, SPARE, UNKNOWN = "waste", "fine", "spare", "unknown"
CLASS_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "idle": SPARE,
        "throttled": WASTE,
        "launch_bound": WASTE,
        "link_bound": WASTE,
        "memory_bound": FINE,
        "tensor_bound": FINE,
        "compute_bound": FINE,
        "unknown": UNKNOWN,
    }
)


def class_kind(cls: str, held: bool) -> str:
    """The kind of class `cls` on a GPU (or MIG instance) that a pod holds (`held`) or not: an
    idle GPU a pod holds is waste (allocated, doing nothing), one nobody holds is spare."""
    if cls == "idle" and held:
        return WASTE
    return CLASS_KINDS.get(cls, UNKNOWN)


# Clock-event reasons that mean the hardware slowed the GPU down against the workload's will
# (nvml.h: HW slowdown halves the clocks or more; HW thermal, power brake and SW thermal are
# protective limits). SW power cap is normal operation at the power limit and only informative;
# gpu_idle, sync boost, application/display clocks are not limits on a busy GPU.
# These are the documented reasons with Effect.PROTECTIVE (nvml_facts), in this order.
THROTTLE_REASONS: tuple[str, ...] = tuple(
    reason.name
    for reason in (HW_SLOWDOWN, HW_THERMAL_SLOWDOWN, HW_POWER_BRAKE_SLOWDOWN, SW_THERMAL_SLOWDOWN)
)
# Cumulative throttle-time counters for those reasons; "thermal" is the pre-R535 fallback
# (nvmlDeviceGetViolationStatus THERMAL = SW or HW thermal). HW slowdown has no counter.
THROTTLE_COUNTERS: tuple[str, ...] = (
    HW_THERMAL_SLOWDOWN.name,
    HW_POWER_BRAKE_SLOWDOWN.name,
    SW_THERMAL_SLOWDOWN.name,
    COMBINED_THERMAL_REASON,
)

# PCIe payload rate per lane and direction, bytes/s: transfer rate x line-code efficiency / 8.
# Gen1-2 use 8b/10b, Gen3-5 128b/130b (PCI-SIG: 2.5, 5, 8, 16, 32 GT/s), Gen6 64 GT/s PAM4 with
# 242 of 256 FLIT bytes as payload, Gen7 128 GT/s likewise. x16 Gen5 = 63 GB/s per direction.
PCIE_LANE_BYTES_PER_SECOND: Mapping[int, float] = {
    1: 2.5e9 * 8 / 10 / 8,
    2: 5.0e9 * 8 / 10 / 8,
    3: 8.0e9 * 128 / 130 / 8,
    4: 16.0e9 * 128 / 130 / 8,
    5: 32.0e9 * 128 / 130 / 8,
    6: 64.0e9 * 242 / 256 / 8,
    7: 128.0e9 * 242 / 256 / 8,
}
# NVLink data rate per link and direction, bytes/s, by GPU architecture (NVIDIA data sheets):
# NVLink 1 (P100, 4 links, 160 GB/s total) 20 GB/s; NVLink 2 (V100 6 links 300 GB/s, Turing
# bridges), NVLink 3 (A100 12 links 600 GB/s) and NVLink 4 (H100/H200 18 links 900 GB/s) 25 GB/s;
# NVLink 5 (Blackwell 18 links 1.8 TB/s) 50 GB/s.
NVLINK_LINK_BYTES_PER_SECOND: Mapping[str, float] = {
    "pascal": 20e9,
    "volta": 25e9,
    "turing": 25e9,
    "ampere": 25e9,
    "hopper": 25e9,
    "blackwell": 50e9,
}


@dataclass(slots=True)
class _Point:
    """The classifier's inputs from one DeviceSample."""

    t: float
    utilization: float | None
    sm: float | None
    tensor: float | None
    dram: float | None
    reasons_active: tuple[str, ...] | None  # None: no clock-event readings at all
    throttle_seconds: dict[str, float]
    pcie_bytes: dict[str, float]
    pcie_rate: dict[str, float]  # 20 ms throughput fallback, bytes/s
    nvlink_bytes: dict[str, float]
    pcie_capacity: float | None
    nvlink_capacity: float | None
    has_nvlink: bool


@dataclass
class _DeviceState:
    window: deque[_Point] = field(default_factory=deque)
    seen_at: float = 0.0  # the last call that classified it
    last_call: float | None = None
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.0))
    verdict: Verdict | None = None


class Classifier:
    """Adds `gpu_bottleneck{class}` and `gpu_bottleneck_seconds_total{class}` to each sample.

    `settings` holds the thresholds. `window_seconds` is how far back the checks look (the
    settings' own, or their default for the sampling interval: ClassifierConfig.window;
    diagnose looks at its whole profile); it also caps the seconds attributed at one call,
    since nothing is known about a longer gap. Keep it at least two sampling intervals, so
    that counter rates have two points.
    """

    def __init__(
        self, settings: ClassifierConfig | None = None, window_seconds: float = MIN_WINDOW_SECONDS
    ) -> None:
        if not window_seconds > 0:
            raise ValueError(f"window_seconds must be > 0, got {window_seconds}")
        self.settings = settings or ClassifierConfig()
        self.window_seconds = window_seconds
        self._devices: dict[str, _DeviceState] = {}

    def process(self, devices: list[DeviceSample], now: float) -> list[DeviceSample]:
        seen: set[str] = set()
        out = [self._process_one(device, now, seen) for device in devices]
        for key, state in list(self._devices.items()):
            if _INSTANCE_KEY not in key or key in seen:
                continue
            # A MIG instance missing from this tick: its windows mean nothing across the gap
            # (as for a GPU that is down), but its seconds are kept, unless it has been gone
            # long enough to have been reconfigured away.
            self._forget(key)
            if now - state.seen_at > INSTANCE_RETENTION_SECONDS:
                del self._devices[key]
        return out

    def verdict(self, uuid: str, mig_uuid: str = "") -> Verdict | None:
        """The latest class of this GPU (or of its MIG instance) with its window statistics
        (for `diagnose`)."""
        state = self._devices.get(_key(uuid, mig_uuid))
        return state.verdict if state else None

    def seconds(self, uuid: str, mig_uuid: str = "") -> dict[str, float]:
        state = self._devices.get(_key(uuid, mig_uuid))
        return dict(state.seconds) if state else dict.fromkeys(CLASSES, 0.0)

    def _process_one(self, device: DeviceSample, now: float, seen: set[str]) -> DeviceSample:
        mig = device.mig_enabled
        if mig:
            self._devices.pop(device.uuid, None)  # a MIG parent's classes are its instances'
        if not device.up:
            # Rates across an outage mean nothing (counters may reset on a driver reload), and
            # the time it was down belongs to no class.
            self._forget(device.uuid)
            return device
        parent = _index(device.readings)
        architecture = device.info.get("architecture", "")
        if mig:
            instances = []
            for instance in device.instances:
                if not instance.up:  # not read: missing from this tick, as below
                    instances.append(instance)
                    continue
                key = _key(device.uuid, instance.mig_uuid)
                seen.add(key)
                point = _point(_index(instance.readings), parent, architecture, now)
                readings = _with_classes(instance.readings, self._classify(key, point, now))
                verdict = self._devices[key].verdict
                instances.append(dataclasses.replace(instance, readings=readings, verdict=verdict))
            return dataclasses.replace(
                device, readings=_with_classes(device.readings), instances=tuple(instances)
            )
        classes = self._classify(device.uuid, _point(parent, parent, architecture, now), now)
        return dataclasses.replace(
            device,
            readings=_with_classes(device.readings, classes),
            verdict=self._devices[device.uuid].verdict,
        )

    def _forget(self, key: str) -> None:
        state = self._devices.get(key)
        if state is not None:
            state.window.clear()
            state.last_call = None
            state.verdict = None

    def _classify(self, key: str, point: _Point, now: float) -> list[Reading]:
        state = self._devices.setdefault(key, _DeviceState())
        state.seen_at = now
        state.window.append(point)
        self._trim(state.window, now)
        stats = window_stats(state.window, now, self.window_seconds)
        cls, why = decide(stats, self.settings)
        state.verdict = Verdict(cls, why, stats)
        if state.last_call is not None:
            step = min(max(now - state.last_call, 0.0), self.window_seconds)
            state.seconds[cls] += step
        state.last_call = now
        return _class_readings(cls, state.seconds)

    def _trim(self, window: deque[_Point], now: float) -> None:
        # Keep one point at or before the window start, so rates cover the whole window.
        start = now - self.window_seconds
        while len(window) >= 2 and window[1].t <= start:
            window.popleft()


_INSTANCE_KEY = "/"  # in a MIG instance's state key: "<parent uuid>/<mig uuid>"
# How long a MIG instance missing from the ticks keeps its seconds counters: a failed read or
# a GPU outage brings it back with them; a reconfiguration that destroyed it does not.
INSTANCE_RETENTION_SECONDS = 600.0


def _key(uuid: str, mig_uuid: str = "") -> str:
    return f"{uuid}{_INSTANCE_KEY}{mig_uuid}" if mig_uuid else uuid


def _with_classes(
    readings: tuple[Reading, ...], classes: list[Reading] | None = None
) -> tuple[Reading, ...]:
    """`readings` without earlier class readings, plus `classes`."""
    out = [r for r in readings if r.family not in OUTPUT_FAMILIES]
    if classes:
        out += classes
    return tuple(out)


def _class_readings(current: str, seconds: Mapping[str, float]) -> list[Reading]:
    out = [Reading("gpu_bottleneck", float(c == current), (("class", c),)) for c in CLASSES]
    out += [Reading("gpu_bottleneck_seconds_total", seconds[c], (("class", c),)) for c in CLASSES]
    return out


# -- inputs -----------------------------------------------------------------------------------


_Values = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _index(readings: Iterable[Reading]) -> _Values:
    return {(r.family, tuple(sorted(r.labels))): r.value for r in readings}


def _point(own: _Values, parent: _Values, architecture: str, now: float) -> _Point:
    """The inputs of one GPU (`own` is `parent`) or MIG instance: activity from `own`; clock
    events and links, which are the physical GPU's, from `parent`."""

    def get(family: str, **labels: str) -> float | None:
        value = parent.get((family, tuple(sorted(labels.items()))))
        return None if value is None or math.isnan(value) else value

    def own_get(family: str) -> float | None:
        value = own.get((family, ()))
        return None if value is None or math.isnan(value) else value

    def by_direction(family: str) -> dict[str, float]:
        found = {d: get(family, direction=d) for d in ("tx", "rx")}
        return {d: v for d, v in found.items() if v is not None}

    reasons = {
        labels[0][1]: value
        for (family, labels), value in parent.items()
        if family == "gpu_clock_event_active" and labels and labels[0][0] == "reason"
    }
    utilization = own_get("gpu_utilization_ratio")
    if utilization is None:  # MIG instances: GR engine activity is the closest analogue
        utilization = own_get("gpu_graphics_engine_active_ratio")
    links_active = get("gpu_nvlink_links_active")
    nvlink_bytes = by_direction("gpu_nvlink_bytes_total")
    return _Point(
        t=now,
        utilization=utilization,
        sm=own_get("gpu_sm_active_ratio"),
        tensor=own_get("gpu_tensor_active_ratio"),
        dram=own_get("gpu_dram_active_ratio"),
        reasons_active=(tuple(r for r in THROTTLE_REASONS if reasons.get(r)) if reasons else None),
        throttle_seconds={
            r: v
            for r in THROTTLE_COUNTERS
            if (v := get("gpu_clock_event_seconds_total", reason=r)) is not None
        },
        pcie_bytes=by_direction("gpu_pcie_bytes_total"),
        pcie_rate=by_direction("gpu_pcie_throughput_bytes_per_second"),
        nvlink_bytes=nvlink_bytes,
        pcie_capacity=pcie_capacity(
            get("gpu_pcie_link_generation", state="current"),
            get("gpu_pcie_link_width", state="current"),
        ),
        nvlink_capacity=nvlink_capacity(architecture, links_active),
        # No active link carries nothing; traffic with an unknown link count cannot be judged.
        has_nvlink=bool(links_active) or (links_active is None and bool(nvlink_bytes)),
    )


def pcie_capacity(generation: float | None, width: float | None) -> float | None:
    """Payload bytes/s per direction of a PCIe link in its current state, None if unknown."""
    if generation is None or width is None or width <= 0:
        return None
    lane = PCIE_LANE_BYTES_PER_SECOND.get(int(generation))
    return None if lane is None else lane * width


def nvlink_capacity(architecture: str, links_active: float | None) -> float | None:
    """Data bytes/s per direction over all active NVLinks, None if unknown."""
    per_link = NVLINK_LINK_BYTES_PER_SECOND.get(architecture)
    if per_link is None or not links_active:
        return None
    return per_link * links_active


# -- window statistics ------------------------------------------------------------------------


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _counter_rate(points: Sequence[_Point], pick: str, key: str) -> float | None:
    """Rate of a cumulative counter over consecutive pairs; resets and gaps are skipped."""
    delta = elapsed = 0.0
    for older, newer in pairwise(points):
        a, b = getattr(older, pick).get(key), getattr(newer, pick).get(key)
        dt = newer.t - older.t
        if a is None or b is None or dt <= 0 or b < a:
            continue
        delta += b - a
        elapsed += dt
    return delta / elapsed if elapsed > 0 else None


def _busier(rates: Iterable[float | None]) -> float | None:
    present = [r for r in rates if r is not None]
    return max(present) if present else None


def _pcie_rate(points: Sequence[_Point], recent: Sequence[_Point]) -> float | None:
    counted = _busier(_counter_rate(points, "pcie_bytes", d) for d in ("tx", "rx"))
    if counted is not None:
        return counted
    return _busier(_mean(p.pcie_rate.get(d) for p in recent) for d in ("tx", "rx"))


def _throttle_fraction(points: Sequence[_Point], recent: Sequence[_Point]) -> float | None:
    # Counters see events shorter than a tick; the decoded bits cover HW slowdown, which has
    # no counter. Reasons overlap, so the largest share is a lower bound of their union.
    shares = [_counter_rate(points, "throttle_seconds", r) for r in THROTTLE_COUNTERS]
    flagged = [p.reasons_active for p in recent if p.reasons_active is not None]
    if flagged:
        shares.append(sum(1 for reasons in flagged if reasons) / len(flagged))
    present = [min(s, 1.0) for s in shares if s is not None]
    return max(present) if present else None


def _ratio(rate: float | None, capacity: float | None) -> float | None:
    if rate is None or capacity is None:
        return None
    return rate / capacity


def window_stats(points: Sequence[_Point], now: float, window_seconds: float) -> WindowStats:
    """Means over the points inside the window; rates over all kept points."""
    points = list(points)
    recent = [p for p in points if p.t >= now - window_seconds] or points[-1:]
    latest = points[-1]
    utilization = _mean(p.utilization for p in recent)
    sm_values = [p.sm for p in recent if p.sm is not None]
    pcie_rate = _pcie_rate(points, recent)
    nvlink_rate = _busier(_counter_rate(points, "nvlink_bytes", d) for d in ("tx", "rx"))
    pcie_util = _ratio(pcie_rate, latest.pcie_capacity)
    nvlink_util = _ratio(nvlink_rate, latest.nvlink_capacity)
    if pcie_util is None or (latest.has_nvlink and nvlink_util is None):
        link_util = None  # a link we cannot judge could be the one that is full
    else:
        link_util = max(pcie_util, nvlink_util or 0.0)
    return WindowStats(
        samples=len(recent),
        utilization=utilization,
        sm_active=_mean(sm_values),
        tensor_active=_mean(p.tensor for p in recent),
        dram_active=_mean(p.dram for p in recent),
        # A GPU running kernels always has some SM activity: exactly 0 throughout while
        # utilization is not 0 (or unknown) is a broken source (dcgm-exporter #662).
        sm_stuck=bool(sm_values) and max(sm_values) == 0.0 and utilization != 0.0,
        throttle_fraction=_throttle_fraction(points, recent),
        throttle_reasons=tuple(
            r for r in THROTTLE_REASONS if any(r in (p.reasons_active or ()) for p in recent)
        ),
        pcie_bytes_per_second=pcie_rate,
        nvlink_bytes_per_second=nvlink_rate,
        pcie_utilization=pcie_util,
        nvlink_utilization=nvlink_util,
        link_utilization=link_util,
        pcie_capacity=latest.pcie_capacity,
        nvlink_capacity=latest.nvlink_capacity,
    )


# -- the checks -------------------------------------------------------------------------------


def decide(s: WindowStats, t: ClassifierConfig) -> tuple[str, str]:
    """The ordered checks; returns (class, why). `why` is one line for people (the status page,
    `diagnose`): the conclusion first, then the measured numbers it rests on."""
    if s.utilization is not None and s.utilization < t.idle_utilization:
        return "idle", (
            f"no kernel running: utilization {s.utilization:.0%} "
            f"(idle under {t.idle_utilization:.0%})"
        )
    if s.throttle_fraction is not None and s.throttle_fraction >= t.throttle_fraction:
        reasons = ", ".join(s.throttle_reasons) or "thermal/power limits"
        return "throttled", f"clocks held down: {reasons}, {s.throttle_fraction:.0%} of the time"
    missing = _missing_activity(s)
    if missing:
        return "unknown", missing
    assert s.sm_active is not None and s.dram_active is not None and s.tensor_active is not None
    sm_low = s.sm_active < t.sm_active_low
    link = s.link_utilization
    units = f"SM {s.sm_active:.0%}, tensor {s.tensor_active:.0%}, DRAM {s.dram_active:.0%}"
    at = f" at {s.utilization:.0%} utilization" if s.utilization is not None else ""
    empty = f"SMs mostly empty: SM {s.sm_active:.0%}{at}"
    if sm_low and s.dram_active < t.dram_active_high and link is not None:
        if link < t.link_utilization_high:
            return "launch_bound", (
                f"{empty}, links at {_links(s)} (small kernels, launch gaps or host stalls)"
            )
        return "link_bound", (
            f"SMs wait on transfers: {_links(s)}; SM {s.sm_active:.0%}{at}, "
            f"DRAM {s.dram_active:.0%}"
        )
    if s.dram_active >= t.dram_active_high and s.dram_active >= s.tensor_active:
        return "memory_bound", f"DRAM bandwidth near its peak: {units}"
    if s.tensor_active >= t.tensor_active_high:
        return "tensor_bound", f"Tensor Cores are the busiest unit: {units}"
    if not sm_low:
        return "compute_bound", f"SMs busy on non-tensor work: {units}"
    return "unknown", f"{empty}, link throughput unknown (launch- or link-bound)"


def _links(s: WindowStats) -> str:
    """The busier link first: "NVLink 72% of capacity, PCIe 40%"."""
    found = [
        (share, name)
        for name, share in (("NVLink", s.nvlink_utilization), ("PCIe", s.pcie_utilization))
        if share is not None
    ]
    found.sort(reverse=True)
    return ", ".join(
        f"{name} {share:.0%}" + (" of capacity" if i == 0 else "")
        for i, (share, name) in enumerate(found)
    )


def _missing_activity(s: WindowStats) -> str:
    if s.sm_active is None or s.tensor_active is None or s.dram_active is None:
        return (
            "no SM/Tensor/DRAM activity: NVML reads it with GPM, on Hopper or newer and from "
            "the second sample; older GPUs need DCGM"
        )
    if s.sm_stuck:
        busy = "unknown" if s.utilization is None else f"{s.utilization:.0%}"
        return f"SM activity stuck at 0 while utilization is {busy}"
    return ""
