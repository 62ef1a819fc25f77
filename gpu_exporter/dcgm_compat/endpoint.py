"""The compat exposition of the published tick, written on its first scrape and kept for the
rest of the tick: nothing is rendered while nobody scrapes /metrics/dcgm.

Per tick the sampler only hands over its series list (`on_series`, a reference kept): the
last few are needed for the rates (PCIe, NVLink), which DCGM computes from two consecutive
reads as well.
"""

from __future__ import annotations

import gzip
import threading
from collections import deque

from gpu_exporter.dcgm_compat.render import CompatSettings, render
from gpu_exporter.series import SeriesSet

# The text format dcgm-exporter serves, whatever the scraper asks for (it has no OpenMetrics).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DcgmCompat:
    """A sampler listener (`SeriesListener`) that renders /metrics/dcgm on demand."""

    name = "dcgm_compat"

    def __init__(self, settings: CompatSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        # The ticks' series lists, newest last: the published one and the one before it are
        # among them (the sampler hands over a tick's list before it publishes the tick).
        self._recent: deque[SeriesSet] = deque(maxlen=3)
        self._cached: tuple[float, dict[bool, bytes]] | None = None

    def on_series(self, series: SeriesSet) -> None:
        self._recent.append(series)

    def on_late_series(self, series: SeriesSet) -> None:
        """Rule and notifier families: not part of dcgm-exporter's output."""

    def body(self, published: SeriesSet, gzipped: bool = False) -> bytes:
        """The exposition of the tick `published` belongs to (gzip-compressed if asked)."""
        with self._lock:  # concurrent first scrapes render it once
            cached = self._cached
            if cached is None or cached[0] != published.timestamp:
                current, previous = self._tick_of(published)
                cached = (published.timestamp, {False: render(current, previous, self.settings)})
                self._cached = cached
            bodies = cached[1]
            if gzipped and True not in bodies:
                bodies[True] = gzip.compress(bodies[False], compresslevel=6)
            return bodies[gzipped]

    def _tick_of(self, published: SeriesSet) -> tuple[SeriesSet, SeriesSet | None]:
        recent = list(self._recent)
        for position, series in enumerate(recent):
            if series.timestamp == published.timestamp:
                return series, recent[position - 1] if position else None
        return published, None  # not handed over (a listener that failed): no rates
