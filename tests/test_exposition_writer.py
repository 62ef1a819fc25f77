"""The exposition writer against prometheus_client itself: byte-for-byte the same output.

The reference renders the same series through prometheus_client's `generate_latest` (text and
OpenMetrics) with a collector written here, the way the daemon did before it had its own writer.
"""

from __future__ import annotations

import gzip
import math
import random
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client import generate_latest as text_reference
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_reference
from prometheus_client.samples import Sample

from gpu_exporter.model.catalog import BY_NAME, Kind
from gpu_exporter.model.series import Series, SeriesBuilder, SeriesSet, histogram_series
from gpu_exporter.model.snapshot import DeviceSample, Reading, Snapshot, TickStats
from gpu_exporter.web.exposition import ExpositionWriter, RenderedMetrics

TYPES = {
    Kind.GAUGE: "gauge",
    Kind.INFO: "gauge",
    Kind.COUNTER: "counter",
    Kind.HISTOGRAM: "histogram",
}

# Numbers whose text differs between Python's repr and Go's formatting, and the ordinary ones.
AWKWARD_VALUES = (
    0.0,
    -0.0,
    1.0,
    0.1,
    0.99,
    -3.5,
    123456.7,
    1234567.0,
    -1234567.5,
    98765432.1,
    1e15,
    1e16,
    1.5e21,
    2.0**53,
    5e-324,
    1e-05,
    -1e-07,
    1.98e9,
    math.inf,
    -math.inf,
    math.nan,
)
AWKWARD_TEXT = ("plain", 'quote " inside', "back\\slash", "new\nline", "ünïcode ✓", "")


class _Reference:
    def __init__(self, series_set: SeriesSet) -> None:
        self.series_set = series_set

    def collect(self) -> Iterator[Metric]:
        for name, rows in self.series_set.families.items():
            fam = BY_NAME[name]
            metric = Metric(fam.base_name, fam.help, TYPES[fam.kind], fam.unit)
            metric.samples = [Sample(r.name, dict(r.labels), r.value) for r in rows]
            yield metric


def reference(series_set: SeriesSet) -> tuple[bytes, bytes]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Reference(series_set))  # type: ignore[arg-type]
    return text_reference(registry), openmetrics_reference(registry)


def device(index: int, rng: random.Random) -> DeviceSample:
    info = {
        "model": rng.choice(AWKWARD_TEXT) or "NVIDIA H200",
        "pci_bus_id": f"0000:{index:02x}:00.0",
        "architecture": "hopper",
        "compute_capability": "9.0",
        "driver_version": "570.124.06",
    }
    readings = (
        Reading("gpu_utilization_ratio", rng.choice(AWKWARD_VALUES)),
        Reading("gpu_power_watts", rng.uniform(0, 1000)),
        Reading("gpu_energy_joules_total", rng.choice(AWKWARD_VALUES)),
        Reading("gpu_clock_hertz", rng.choice(AWKWARD_VALUES), (("clock", "sm"),)),
        Reading("gpu_clock_hertz", rng.uniform(0, 3e9), (("clock", "mem"),)),
        Reading("gpu_xid_errors_total", rng.randint(0, 10**18), (("xid", "79"),)),
    )
    return DeviceSample(index, f"GPU-{index:04d}", info, rng.random() > 0.2, readings)


def random_set(seed: int) -> SeriesSet:
    rng = random.Random(seed)
    devices = tuple(device(i, rng) for i in range(rng.randint(1, 4)))
    pods = {
        d.uuid: (("namespace", "ml"), ("pod", rng.choice(AWKWARD_TEXT) or "p"))
        for d in devices
        if rng.random() > 0.5
    }
    snap = Snapshot(
        timestamp=1_700_000_000.0,
        devices=devices,
        stats=TickStats((0.01, 0.1), (4, 5), rng.choice(AWKWARD_VALUES), 5, 1_700_000_000.0),
        device_labels=pods,
    )
    return SeriesBuilder().build(snap)


def test_text_and_openmetrics_match_prometheus_client_exactly() -> None:
    for seed in range(200):
        series_set = random_set(seed)
        text, openmetrics = reference(series_set)
        rendered = RenderedMetrics(series_set)
        assert rendered.body(False, False) == text, f"seed {seed}"
        assert rendered.body(True, False) == openmetrics, f"seed {seed}"


def test_every_awkward_value_is_written_as_prometheus_client_writes_it() -> None:
    rows = tuple(
        Series("gpu_exporter_devices", "gpu_exporter_devices", (("x", str(i)),), value)
        for i, value in enumerate(AWKWARD_VALUES)
    )
    series_set = SeriesSet(0.0, {"gpu_exporter_devices": rows})
    text, _ = reference(series_set)
    assert RenderedMetrics(series_set).text == text
    assert b"+Inf" in text and b"NaN" in text and b"e+16" in text  # the cases are exercised


def test_a_writer_reused_across_ticks_writes_what_a_fresh_one_writes() -> None:
    """Its caches (lines of reused series objects, label texts) never leak a stale value."""
    writer = ExpositionWriter()
    builder = SeriesBuilder()
    static = Reading("gpu_numa_node", 1.0)  # the same object every tick: its line is reused
    for tick in range(5):
        readings = (static, Reading("gpu_power_watts", 100.0 + tick))
        dev = DeviceSample(0, "GPU-a", {"model": "m"}, True, readings)
        pods = {"GPU-a": (("namespace", "ml"), ("pod", f"p{tick % 2}"))}
        snap = Snapshot(timestamp=float(tick), devices=(dev,), device_labels=pods)
        series_set = builder.build(snap)
        assert RenderedMetrics(series_set, writer).text == RenderedMetrics(series_set).text
        text = RenderedMetrics(series_set, writer).text.decode()
        assert f'gpu_power_watts{{gpu="0",namespace="ml",pod="p{tick % 2}",uuid="GPU-a"}} ' in text
        assert f"{100.0 + tick}\n" in text


def test_histograms_and_forms() -> None:
    rows = tuple(
        histogram_series("gpu_exporter_tick_duration_seconds", (0.01, 0.1), (1, 2), 3, 0.5)
    )
    series_set = SeriesSet(0.0, {"gpu_exporter_tick_duration_seconds": rows})
    rendered = RenderedMetrics(series_set)
    text, openmetrics = reference(series_set)
    assert rendered.text == text
    assert gzip.decompress(rendered.body(True, True)) == openmetrics
    assert rendered.body(True, True) is rendered.body(True, True)  # written once per tick


def test_the_line_of_a_series_object_seen_before_is_reused_not_rewritten() -> None:
    writer = ExpositionWriter()
    static = Series("gpu_numa_node", "gpu_numa_node", (("gpu", "0"), ("uuid", "GPU-a")), 1.0)
    fresh = Series("gpu_power_watts", "gpu_power_watts", (("gpu", "0"), ("uuid", "GPU-a")), 5.0)
    first = dict(writer.sample_lines(SeriesSet(0.0, {"gpu_numa_node": (static,)})))
    second = dict(
        writer.sample_lines(
            SeriesSet(1.0, {"gpu_numa_node": (static,), "gpu_power_watts": (fresh,)})
        )
    )
    assert second["gpu_numa_node"][0] is first["gpu_numa_node"][0]  # a cache hit
    equal_but_new = Series(*static)  # equal, another object: written again, same text
    third = dict(writer.sample_lines(SeriesSet(2.0, {"gpu_numa_node": (equal_but_new,)})))
    assert third["gpu_numa_node"][0] == first["gpu_numa_node"][0]
    assert third["gpu_numa_node"][0] is not first["gpu_numa_node"][0]


def test_concurrent_scrapes_of_interleaved_ticks_share_one_writer() -> None:
    import threading

    writer = ExpositionWriter()
    sets = [random_set(seed) for seed in range(6)]
    expected = [reference(series_set) for series_set in sets]
    problems: list[int] = []

    def scrape(worker: int) -> None:
        for i in range(30):
            index = (worker + i) % len(sets)
            rendered = RenderedMetrics(sets[index], writer)
            if (rendered.body(False, False), rendered.body(True, False)) != expected[index]:
                problems.append(index)

    threads = [threading.Thread(target=scrape, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []
