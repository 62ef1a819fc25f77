"""The compat exposition of the published tick, written on its first scrape and kept for the
rest of the tick: nothing is rendered while nobody scrapes /metrics/dcgm.

Per tick the sampler hands over its series list (`on_series`), of which only the byte
counters' rows are kept, by reference: the rates (PCIe, NVLink) need the tick before the one
scraped, which DCGM computes from two consecutive reads as well. The text itself is written
from the published tick's series (`body`).
"""

from __future__ import annotations

import gzip
import threading
from collections import deque

from gpu_exporter.model.series import SeriesSet
from gpu_exporter.web.dcgm_compat.render import Counters, render
from gpu_exporter.web.dcgm_compat.selection import DEFAULT, Selection
from gpu_exporter.web.exposition import GZIP_LEVEL


class DcgmCompat:
    """A sampler listener (`SeriesListener`) that renders /metrics/dcgm on demand."""

    name = "dcgm_compat"

    def __init__(self, hostname: tuple[str, str] | None, selection: Selection = DEFAULT) -> None:
        self.hostname = hostname  # the node's label (name, value); None: none (render)
        self.selection = selection  # the families and label rows written
        self._lock = threading.Lock()
        # The last ticks' counters, newest last: the published tick's and the one before it
        # are among them (the sampler hands over a tick's list before it publishes the tick).
        self._recent: deque[Counters] = deque(maxlen=3)
        self._cached: tuple[float, dict[bool, bytes]] | None = None

    def on_series(self, series: SeriesSet) -> None:
        self._recent.append(Counters.of(series))

    def on_late_series(self, series: SeriesSet) -> None:
        """Rule and notifier families: not part of dcgm-exporter's output."""

    def body(self, published: SeriesSet, gzipped: bool = False) -> bytes:
        """The exposition of the tick `published` belongs to (gzip-compressed if asked)."""
        with self._lock:  # concurrent first scrapes render it once
            cached = self._cached
            if cached is None or cached[0] != published.timestamp:
                previous = self._previous(published.timestamp)
                body = render(published, previous, self.hostname, self.selection)
                cached = (published.timestamp, {False: body})
                self._cached = cached
            bodies = cached[1]
            if gzipped and True not in bodies:
                bodies[True] = gzip.compress(bodies[False], compresslevel=GZIP_LEVEL)
            return bodies[gzipped]

    def _previous(self, timestamp: float) -> Counters | None:
        """The counters of the tick before the one at `timestamp`; None when that tick was not
        handed over (the first tick, or a listener that failed): no rates then."""
        recent = list(self._recent)
        for position, counters in enumerate(recent):
            if counters.timestamp == timestamp:
                return recent[position - 1] if position else None
        return None
