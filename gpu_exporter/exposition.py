"""SeriesSet -> Prometheus text format 0.0.4 / OpenMetrics, rendered once per tick.

A scrape returns bytes prepared here; nothing on the scrape path reads NVML. The series come
from `gpu_exporter/series.py` (the one place a snapshot becomes series); this module only
writes them out: the text format eagerly at the end of each tick, OpenMetrics and the gzip
forms on the first request that asks for them, cached for the rest of the tick.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.samples import Sample

from gpu_exporter.catalog import BY_NAME, Kind
from gpu_exporter.series import SeriesSet

CONTENT_TYPE_TEXT = CONTENT_TYPE_LATEST  # text/plain; version=0.0.4; charset=utf-8
CONTENT_TYPE_OPENMETRICS = openmetrics.CONTENT_TYPE_LATEST
# Info families are exposed as gauges with value 1 (what Prometheus' text format knows).
_EXPOSED_TYPE = {
    Kind.GAUGE: "gauge",
    Kind.INFO: "gauge",
    Kind.COUNTER: "counter",
    Kind.HISTOGRAM: "histogram",
}


@dataclass(eq=False)  # registries key collectors by identity
class SeriesCollector:
    """A prometheus_client collector over one tick's series (it only does the escaping)."""

    series_set: SeriesSet

    def collect(self) -> Iterator[Metric]:
        for name, rows in self.series_set.families.items():
            fam = BY_NAME[name]
            metric = Metric(fam.base_name, fam.help, _EXPOSED_TYPE[fam.kind], fam.unit)
            metric.samples = [Sample(row.name, dict(row.labels), row.value) for row in rows]
            yield metric


class RenderedMetrics:
    """The exposition of one snapshot in every form a scraper may ask for, each built once."""

    def __init__(self, series_set: SeriesSet):
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(SeriesCollector(series_set))
        self.text = generate_latest(self._registry)
        self._lock = threading.Lock()
        self._cache: dict[tuple[bool, bool], bytes] = {(False, False): self.text}

    def body(self, openmetrics_format: bool, gzipped: bool) -> bytes:
        key = (openmetrics_format, gzipped)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        with self._lock:
            if key not in self._cache:
                plain = self._cache.get((openmetrics_format, False))
                if plain is None:
                    plain = openmetrics.generate_latest(self._registry)
                    self._cache[(True, False)] = plain
                self._cache[key] = gzip.compress(plain, compresslevel=6) if gzipped else plain
            return self._cache[key]


def wants_openmetrics(accept: str | None) -> bool:
    """Content negotiation as Prometheus does it: OpenMetrics only when the scraper asks."""
    return accept is not None and "application/openmetrics-text" in accept


def wants_gzip(accept_encoding: str | None) -> bool:
    if not accept_encoding:
        return False
    for part in accept_encoding.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() == "gzip":
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False
