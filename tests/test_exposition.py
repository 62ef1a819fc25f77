"""Exposition: valid Prometheus/OpenMetrics text from a snapshot, negotiated and cached."""

from __future__ import annotations

import gzip

import pytest

from gpu_exporter.model.catalog import BY_NAME, FAMILIES, Kind
from gpu_exporter.model.series import SeriesBuilder
from gpu_exporter.model.snapshot import DeviceSample, ErrorCount, Reading, Snapshot, TickStats
from gpu_exporter.web.exposition import (
    CONTENT_TYPE_TEXT,
    RenderedMetrics,
    wants_gzip,
    wants_openmetrics,
)
from tests.support import promtool_check_metrics

INFO = {
    "model": 'NVIDIA "H200"\nSXM',  # quotes and newlines must be escaped, not break the format
    "pci_bus_id": "0000:18:00.0",
    "architecture": "hopper",
    "compute_capability": "9.0",
    "driver_version": "570.124.06",
}


def snapshot() -> Snapshot:
    busy = DeviceSample(
        0,
        "GPU-aaaa",
        INFO,
        True,
        (
            Reading("gpu_utilization_ratio", 0.97),
            Reading("gpu_sm_active_ratio", 0.12),
            Reading("gpu_power_watts", 190.5),
            Reading("gpu_energy_joules_total", 12345.0),
            Reading("gpu_clock_hertz", 1.98e9, (("clock", "sm"),)),
            Reading("gpu_clock_event_active", 1.0, (("reason", "hw_slowdown"),)),
            Reading("gpu_clock_event_seconds_total", 3.5, (("reason", "hw_thermal_slowdown"),)),
            Reading("gpu_xid_errors_total", 2, (("xid", "79"),)),
        ),
    )
    lost = DeviceSample(1, "GPU-bbbb", INFO, False, (), "GPU lost")
    return Snapshot(
        timestamp=1_700_000_000.0,
        devices=(busy, lost),
        errors=(ErrorCount("nvml", "power_usage", "Timeout", 3),),
        stats=TickStats((0.01, 0.1), (4, 5), 0.2, 5, 1_700_000_000.0),
    )


def render(snap: Snapshot) -> RenderedMetrics:
    return RenderedMetrics(SeriesBuilder().build(snap))


def test_text_passes_promtool_and_has_expected_series() -> None:
    rendered = render(snapshot())
    result = promtool_check_metrics(rendered.text)
    assert result.returncode == 0, result.stdout + result.stderr
    text = rendered.text.decode()
    assert 'gpu_up{gpu="0",uuid="GPU-aaaa"} 1.0' in text
    assert 'gpu_up{gpu="1",uuid="GPU-bbbb"} 0.0' in text
    assert 'gpu_sm_active_ratio{gpu="0",uuid="GPU-aaaa"} 0.12' in text
    assert 'gpu_energy_joules_total{gpu="0",uuid="GPU-aaaa"} 12345.0' in text
    assert 'gpu_xid_errors_total{gpu="0",uuid="GPU-aaaa",xid="79"} 2.0' in text
    assert 'model="NVIDIA \\"H200\\"\\nSXM"' in text
    assert (
        'gpu_exporter_errors_total{error="Timeout",field="power_usage",source="nvml"} 3.0' in text
    )
    assert 'gpu_exporter_tick_duration_seconds_bucket{le="0.01"} 4.0' in text
    # The lost GPU has no readings at all: nothing is exported as 0 for it.
    assert 'gpu_power_watts{gpu="1"' not in text


def test_openmetrics_and_gzip_forms() -> None:
    rendered = render(snapshot())
    om = rendered.body(openmetrics_format=True, gzipped=False)
    assert om.endswith(b"# EOF\n")
    assert b"# UNIT gpu_power_watts watts" in om
    assert gzip.decompress(rendered.body(False, True)) == rendered.text
    assert gzip.decompress(rendered.body(True, True)) == om
    assert rendered.body(True, False) is om  # rendered once, then cached


def test_content_negotiation() -> None:
    assert wants_openmetrics("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
    assert not wants_openmetrics("text/plain;version=0.0.4")
    assert not wants_openmetrics(None)
    assert wants_gzip("gzip, deflate")
    assert wants_gzip("br;q=1.0, gzip;q=0.8")
    assert not wants_gzip("gzip;q=0")
    assert not wants_gzip("identity")
    assert not wants_gzip(None)


PROMETHEUS_2_ACCEPT = (  # what Prometheus 2.42 sends (scrape/scrape.go acceptHeader)
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        (PROMETHEUS_2_ACCEPT, True),
        ("text/plain;version=0.0.4;q=0.5,*/*;q=0.1", False),
        # q=0 refuses OpenMetrics, wherever it stands.
        ("application/openmetrics-text;q=0,text/plain", False),
        ("application/openmetrics-text; version=1.0.0; q=0.0", False),
        ("application/openmetrics-text;q=0", False),
        # The higher q wins, whatever the order.
        ("text/plain;q=0.4, application/openmetrics-text;version=1.0.0;q=0.9", True),
        ("application/openmetrics-text;q=0.3, text/plain;version=0.0.4;q=0.8", False),
        # Equal q: the order of the header.
        ("text/plain, application/openmetrics-text", False),
        ("application/openmetrics-text, text/plain", True),
        # Versions we do not write are passed over.
        ("application/openmetrics-text;version=2.0.0, text/plain", False),
        ("text/plain;version=1.0.0, application/openmetrics-text;q=0.2", True),
        ('APPLICATION/OpenMetrics-Text; Version="1.0.0"', True),
        ("application/openmetrics-text;q=banana, text/plain;q=0.1", False),
        ("*/*", False),
        ("", False),
    ],
)
def test_content_negotiation_honours_q_values(accept: str, openmetrics: bool) -> None:
    assert wants_openmetrics(accept) is openmetrics


def test_text_content_type_is_the_0_0_4_format() -> None:
    # prometheus/common expfmt FmtText; the body is the 0.0.4 text format.
    assert CONTENT_TYPE_TEXT == "text/plain; version=0.0.4; charset=utf-8"


def test_catalog_names_follow_prometheus_conventions() -> None:
    for fam in FAMILIES:
        assert fam.name.startswith("gpu_"), fam.name
        assert (fam.kind is Kind.COUNTER) == fam.name.endswith("_total"), fam.name
        if fam.unit:
            assert fam.base_name.endswith("_" + fam.unit), fam.name
    assert BY_NAME["gpu_utilization_ratio"].unit == "ratio"


def test_pod_labels_on_some_gpus_keep_every_label_in_its_place() -> None:
    snap = snapshot()
    gpu1 = DeviceSample(
        1, "GPU-bbbb", INFO, True, (Reading("gpu_temperature_celsius", 40, (("sensor", "gpu"),)),)
    )
    gpu0 = DeviceSample(
        0, "GPU-aaaa", INFO, True, (Reading("gpu_temperature_celsius", 50, (("sensor", "gpu"),)),)
    )
    pods = {"GPU-bbbb": (("namespace", "ml"), ("pod", "trainer-0"))}
    snap = Snapshot(snap.timestamp, (gpu0, gpu1), stats=snap.stats, device_labels=pods)
    text = render(snap).text.decode()
    assert (
        'gpu_temperature_celsius{gpu="1",namespace="ml",pod="trainer-0",sensor="gpu",'
        'uuid="GPU-bbbb"} 40.0'
    ) in text
    # An unallocated GPU's series have no pod labels at all (not empty ones).
    assert 'gpu_temperature_celsius{gpu="0",sensor="gpu",uuid="GPU-aaaa"} 50.0' in text
    # gpu_up and gpu_info carry the pod labels too: the rule store sees the same series.
    assert 'gpu_up{gpu="1",namespace="ml",pod="trainer-0",uuid="GPU-bbbb"} 1.0' in text
    assert 'gpu_up{gpu="0",uuid="GPU-aaaa"} 1.0' in text
    assert promtool_check_metrics(text.encode()).returncode == 0
