"""Sampling NVML GPM (GPU Performance Metrics, Hopper and newer) for the `gpm` collector.

Which metrics are read, and as which families, is the collector's (`collectors/gpm.py`). GPM
gives counters, not rates: two samples taken at least 100 ms apart are diffed by
`nvmlGpmMetricsGet`. Each read uses the previous read's sample as its baseline, so the activity
covers exactly the time between two ticks. Per-metric failures are normal (a board without
NVLink, a metric this driver lacks) and NaN happens; both leave that metric out.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml.calls import NvmlCalls
from gpu_exporter.collect.source import ErrorLog

# NVIDIA: "The interval between these two nvmlGpmSampleGet() calls should be greater than 100ms
# due to the internal sample refresh rate."
MIN_WINDOW_SECONDS = 0.1


# A percentage above 100 (DCGM issue 152 saw SM activity above 1.0) is clamped and counted.
ABOVE_100 = -2
NOT_A_NUMBER = -1


@dataclass(frozen=True, slots=True)
class GpmResult:
    values: dict[int, float]  # metric id -> ratio 0..1
    failures: dict[int, int]  # metric id -> NVML return code, NOT_A_NUMBER or ABOVE_100


def is_supported(handle: object) -> bool:
    """True on GPUs with GPM. Raises NVMLError on a failing call (the caller learns from it)."""
    return bool(N.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)


class GpmWindow:
    """Rolling two-sample GPM reader for one device handle, or for one GPU instance of it
    (`gpu_instance`: its id; nvmlGpmMigSampleGet on the parent handle).

    Its reads run inside the reader's choke point (`DeviceReader.call`); freeing the samples
    happens outside a tick, through `NvmlCalls` on `errors` when given.
    """

    def __init__(
        self,
        handle: object,
        clock: Callable[[], float],
        metric_ids: Sequence[int],
        errors: ErrorLog | None = None,
        gpu_instance: int | None = None,
    ) -> None:
        self._handle = handle
        self._gpu_instance = gpu_instance
        self._clock = clock
        self._metric_ids = tuple(metric_ids)
        self._calls = NvmlCalls(errors) if errors is not None else None
        self._skip: set[int] = set()  # metric ids the device answered NOT_SUPPORTED for
        self._baseline = N.nvmlGpmSampleAlloc()
        self._current = N.nvmlGpmSampleAlloc()
        self._baseline_time: float | None = None
        try:
            self._take(self._baseline)
        except N.NVMLError:
            self.close()
            raise

    def _take(self, sample: object) -> None:
        self._sample(sample)
        self._baseline_time = self._clock()

    def _sample(self, sample: object) -> None:
        if self._gpu_instance is None:
            N.nvmlGpmSampleGet(self._handle, sample)
        else:
            N.nvmlGpmMigSampleGet(self._handle, self._gpu_instance, sample)

    def ready(self) -> bool:
        """True once the window is long enough to be read (100 ms since its baseline)."""
        started = self._baseline_time
        return started is not None and self._clock() - started >= MIN_WINDOW_SECONDS

    def read(self) -> GpmResult | None:
        """Activity since the previous read, or None while the window is under 100 ms."""
        if not self.ready():
            return None
        wanted = [metric_id for metric_id in self._metric_ids if metric_id not in self._skip]
        self._sample(self._current)
        now = self._clock()
        request = N.c_nvmlGpmMetricsGet_t()
        request.version = N.NVML_GPM_METRICS_GET_VERSION  # pynvml does not set it
        request.numMetrics = len(wanted)
        request.sample1 = self._baseline
        request.sample2 = self._current
        for slot, metric_id in zip(request.metrics, wanted, strict=False):
            slot.metricId = metric_id
        N.nvmlGpmMetricsGet(request)
        values: dict[int, float] = {}
        failures: dict[int, int] = {}
        for slot, metric_id in zip(request.metrics, wanted, strict=False):
            if slot.nvmlReturn != N.NVML_SUCCESS:
                failures[metric_id] = slot.nvmlReturn
                if slot.nvmlReturn == N.NVML_ERROR_NOT_SUPPORTED:
                    self._skip.add(metric_id)
            elif not math.isfinite(slot.value):
                failures[metric_id] = NOT_A_NUMBER
            else:
                if slot.value > 100.0:
                    failures[metric_id] = ABOVE_100  # kept, clamped to 1
                values[metric_id] = min(max(slot.value / 100.0, 0.0), 1.0)
        # The newest sample becomes the next baseline; the old buffer is reused.
        self._baseline, self._current = self._current, self._baseline
        self._baseline_time = now
        return GpmResult(values, failures)

    def close(self) -> None:
        for sample in (self._baseline, self._current):
            if sample is None:
                continue
            # The device may be gone; the buffer is then released with the library.
            if self._calls is not None:
                self._calls.call("gpm_sample_free", N.nvmlGpmSampleFree, sample)
            else:
                with contextlib.suppress(N.NVMLError):
                    N.nvmlGpmSampleFree(sample)
        self._baseline = self._current = None


class AbandonedWindows:
    """Windows set aside when a tick missed its deadline: its stuck thread may still be inside
    one, so each is freed only once that tick has finished (on the sampler thread)."""

    def __init__(self) -> None:
        self._held: list[tuple[GpmWindow, Future[Any]]] = []

    def add(self, windows: Iterable[GpmWindow], stuck_tick: Future[Any]) -> None:
        self._held += [(window, stuck_tick) for window in windows]

    def free_finished(self) -> None:
        keep = []
        for window, tick in self._held:
            if tick.done():
                window.close()
            else:
                keep.append((window, tick))
        self._held = keep
