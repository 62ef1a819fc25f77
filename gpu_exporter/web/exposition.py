"""SeriesSet -> Prometheus text format 0.0.4 / OpenMetrics 1.0, written on the first scrape.

A scrape returns bytes prepared here; nothing on the scrape path reads NVML. The series come
from `gpu_exporter/model/series.py` (the one place a snapshot becomes series); this module only
writes them out. Prometheus scrapes every 15-60 s while the daemon ticks every second, so a
tick's exposition is written only when someone asks for it (then cached for the rest of the
tick, in every form asked for), never on the tick itself.

The writer is our own rather than `prometheus_client.generate_latest`, for cost: it keeps, from
one exposition to the next, the line of every series that is the same object again (topology
and static readings: most series of a large node) and the label text of the label sets it
wrote last time, so a line costs a dictionary lookup and a number. Its output is byte-for-byte what
prometheus_client 0.2x writes for the same samples — names and labels sorted as there,
escaping, Go-style numbers via prometheus_client's own `floatToGoString` — which
`tests/test_exposition_writer.py` checks against prometheus_client itself.
"""

from __future__ import annotations

import functools
import gzip
import threading
from collections.abc import Iterable, Mapping

from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.utils import floatToGoString

from gpu_exporter.model.catalog import FAMILIES, Family, Kind
from gpu_exporter.model.series import Series, SeriesSet
from gpu_exporter.model.snapshot import Labels

# The text format this module writes is 0.0.4 (prometheus/common expfmt FmtText); newer
# prometheus_client's CONTENT_TYPE_LATEST says version=1.0.0, which Prometheus 2.x does not know.
CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = openmetrics.CONTENT_TYPE_LATEST
# One compression level for every exposition served gzipped (gzip.compress defaults to 9).
GZIP_LEVEL = 6
# Info families are exposed as gauges with value 1 (what Prometheus' text format knows).
_EXPOSED_TYPE = {
    Kind.GAUGE: "gauge",
    Kind.INFO: "gauge",
    Kind.COUNTER: "counter",
    Kind.HISTOGRAM: "histogram",
}


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _text_header(fam: Family) -> str:
    # The text format names a counter family by its sample name (`..._total`).
    name = fam.name
    help_text = fam.help.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {_EXPOSED_TYPE[fam.kind]}\n"


def _openmetrics_header(fam: Family) -> str:
    name = fam.base_name
    help_text = _escape(fam.help)
    unit = f"# UNIT {name} {fam.unit}\n" if fam.unit else ""
    return f"# HELP {name} {help_text}\n# TYPE {name} {_EXPOSED_TYPE[fam.kind]}\n{unit}"


_TEXT_HEADERS = {fam.name: _text_header(fam) for fam in FAMILIES}
_OPENMETRICS_HEADERS = {fam.name: _openmetrics_header(fam) for fam in FAMILIES}


def _label_text(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels)) + "}"


def _value_text(value: float) -> str:
    text = repr(value)
    dot = text.find(".")
    # repr already is Go's form for a finite number with a short integer part; the rest
    # (exponents, infinities, NaN, long integer parts) goes to prometheus_client's rules.
    if 0 < dot <= 6:
        return text
    return floatToGoString(value)


class ExpositionWriter:
    """Writes the sample lines of a tick, reusing what earlier expositions already wrote.

    One per sampler; thread-safe (scrapes of two ticks may overlap). Its caches hold only the
    series and label sets of the latest exposition, so they cannot grow past one tick's size.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: dict[int, tuple[Series, str]] = {}  # id(series) -> (series, its line)
        self._prefixes: dict[tuple[str, Labels], str] = {}  # (name, labels) -> "name{...} "

    def sample_lines(self, series_set: SeriesSet) -> list[tuple[str, list[str]]]:
        """(family, its sample lines) in exposition order."""
        with self._lock:
            old_lines, old_prefixes = self._lines, self._prefixes
            lines: dict[int, tuple[Series, str]] = {}
            prefixes: dict[tuple[str, Labels], str] = {}
            out = []
            for family, rows in series_set.families.items():
                written = []
                for row in rows:
                    hit = old_lines.get(id(row))
                    if hit is not None and hit[0] is row:
                        line = hit[1]
                    else:
                        key = (row.name, row.labels)
                        prefix = prefixes.get(key) or old_prefixes.get(key)
                        if prefix is None:
                            prefix = f"{row.name}{_label_text(row.labels)} "
                        prefixes[key] = prefix
                        line = f"{prefix}{_value_text(row.value)}\n"
                    lines[id(row)] = (row, line)
                    written.append(line)
                out.append((family, written))
            self._lines, self._prefixes = lines, prefixes
            return out


def text_exposition(families: Iterable[tuple[str, list[str]]]) -> bytes:
    """The Prometheus text format 0.0.4 of `sample_lines`' output."""
    return _joined(families, _TEXT_HEADERS, "")


def openmetrics_exposition(families: Iterable[tuple[str, list[str]]]) -> bytes:
    """The OpenMetrics 1.0 text of `sample_lines`' output (sample lines are the same)."""
    return _joined(families, _OPENMETRICS_HEADERS, "# EOF\n")


def _joined(
    families: Iterable[tuple[str, list[str]]], headers: Mapping[str, str], end: str
) -> bytes:
    parts = []
    for family, lines in families:
        parts.append(headers[family])
        parts.extend(lines)
    parts.append(end)
    return "".join(parts).encode()


class RenderedMetrics:
    """The exposition of one snapshot in every form a scraper may ask for, each written on its
    first request and kept for the rest of the tick."""

    def __init__(self, series_set: SeriesSet, writer: ExpositionWriter | None = None):
        self._series_set = series_set
        self._writer = writer or ExpositionWriter()
        self._lock = threading.Lock()
        self._lines: list[tuple[str, list[str]]] | None = None
        self._cache: dict[tuple[bool, bool], bytes] = {}

    @property
    def text(self) -> bytes:
        return self.body(False, False)

    def body(self, openmetrics_format: bool, gzipped: bool) -> bytes:
        key = (openmetrics_format, gzipped)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        with self._lock:  # concurrent first scrapes write it once
            if key not in self._cache:
                plain = self._cache.get((openmetrics_format, False))
                if plain is None:
                    if self._lines is None:
                        self._lines = self._writer.sample_lines(self._series_set)
                    write = openmetrics_exposition if openmetrics_format else text_exposition
                    plain = self._cache[(openmetrics_format, False)] = write(self._lines)
                body = gzip.compress(plain, compresslevel=GZIP_LEVEL) if gzipped else plain
                self._cache[key] = body
            return self._cache[key]


@functools.lru_cache(maxsize=64)  # scrapers send one Accept each; a bounded cache of them
def wants_openmetrics(accept: str | None) -> bool:
    """Content negotiation as Prometheus' client libraries do it (prometheus/common expfmt
    NegotiateIncludingOpenMetrics): the media ranges by q, highest first (the more specific
    first among equals); the first that is the text format (version 0.0.4 or none) or
    OpenMetrics (version 0.0.1, 1.0.0 or none) wins; text when none is. A range with q=0 is
    refused (RFC 9110 12.4.2), so it never counts."""
    if not accept:
        return False
    ranges = []
    for position, part in enumerate(accept.split(",")):
        media, *params = (item.strip() for item in part.split(";"))
        options = dict(_parameter(item) for item in params)
        quality = _quality(options.get("q", "1"))
        if quality > 0:
            ranges.append((-quality, "*" in media, position, media.lower(), options))
    for *_, media, options in sorted(ranges):
        version = options.get("version", "")
        if media == "text/plain" and version in ("", "0.0.4"):
            return False
        if media == "application/openmetrics-text" and version in ("", "0.0.1", "1.0.0"):
            return True
    return False


def _parameter(item: str) -> tuple[str, str]:
    name, _, value = item.partition("=")
    return name.strip().lower(), value.strip().strip('"')


def _quality(text: str) -> float:
    try:
        quality = float(text)
    except ValueError:
        return 0.0  # goautoneg's ParseFloat error leaves q at 0 too
    return quality if 0.0 <= quality <= 1.0 else 0.0


def wants_gzip(accept_encoding: str | None) -> bool:
    if not accept_encoding:
        return False
    for part in accept_encoding.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() == "gzip":
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False
