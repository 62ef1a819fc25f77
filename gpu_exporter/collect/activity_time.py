"""Activity as counters: `gpu_*_active_seconds_total`, per GPU and per MIG instance.

Each tick adds, for every activity ratio it read (`model.catalog.ACTIVITY_SECONDS`), the ratio
times the time since the previous tick to that device's counter. GPM measures each ratio over
exactly the window between its two samples, the previous tick's and this one's, so the product
is the active time of that window, and `rate()` of the counter is the exact average activity
over any range, whatever the scrape interval and after downsampling (a gauge sampled every
scrape only shows the ticks that happened to be scraped).

What is not known is never counted: a ratio absent from a tick (GPM still taking its first
sample, a metric NaN, the GPU down) adds nothing and its counter is not exported that tick; a
device that never had the ratio (pre-Hopper without DCGM) has no counter at all, not a zero.
Time between two ticks further apart than `MAX_GAP_SECONDS` (a wall-clock step, a daemon that
stalled) is not counted either: the counter continues from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpu_exporter.model.catalog import ACTIVITY_SECONDS
from gpu_exporter.model.snapshot import DeviceSample, Reading

# Longer than any sane interval (at most an hour: a GPM window that long is still one
# measurement), shorter than a clock step or a suspended host.
MAX_GAP_SECONDS = 3600.0
# A MIG instance not seen for this long was reconfigured away: its counters are forgotten.
INSTANCE_RETENTION_SECONDS = 600.0


@dataclass
class _Counters:
    seen_at: float  # the tick it was last seen in
    totals: dict[str, float] = field(default_factory=dict)  # counter family -> seconds


class ActivityTime:
    """A sampler processor (`process`): adds the activity counters to each device's readings."""

    def __init__(self) -> None:
        self._devices: dict[tuple[str, str], _Counters] = {}  # (uuid, mig uuid or "")

    def process(self, devices: list[DeviceSample], now: float) -> list[DeviceSample]:
        seen: set[tuple[str, str]] = set()
        out = []
        for device in devices:
            readings = self._count((device.uuid, ""), device.readings, now, seen)
            instances = tuple(
                replace(
                    instance,
                    readings=instance.readings
                    + self._count((device.uuid, instance.mig_uuid), instance.readings, now, seen),
                )
                for instance in device.instances
            )
            out.append(replace(device, readings=device.readings + readings, instances=instances))
        for key, counters in list(self._devices.items()):
            if key not in seen and now - counters.seen_at > INSTANCE_RETENTION_SECONDS:
                del self._devices[key]
        return out

    def _count(
        self,
        key: tuple[str, str],
        readings: tuple[Reading, ...],
        now: float,
        seen: set[tuple[str, str]],
    ) -> tuple[Reading, ...]:
        seen.add(key)
        counters = self._devices.get(key)
        if counters is None:
            counters = self._devices[key] = _Counters(seen_at=now)
        elapsed = now - counters.seen_at
        counters.seen_at = now
        window = elapsed if 0 < elapsed <= MAX_GAP_SECONDS else 0.0
        out = []
        for reading in readings:
            counter = ACTIVITY_SECONDS.get(reading.family)
            if counter is None or reading.labels:
                continue
            total = counters.totals.get(counter, 0.0) + reading.value * window
            counters.totals[counter] = total
            out.append(Reading(counter, total))
        return tuple(out)
