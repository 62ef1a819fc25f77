"""/metrics/dcgm: dcgm-exporter 4.8's names, labels (in its order), units and number formats,
computed from the same tick's series as the native exposition.

The facts checked here were read in dcgm-exporter itself (NVIDIA/dcgm-exporter at d5e5f51, 4.8.2
plus the `Hostname` -> `hostname` rename): the HELP and TYPE lines of its counter files
(etc/dcp-metrics-included.csv), the label order of its renderer
(internal/pkg/rendermetrics/render_metrics.go) and a real output line from its issue tracker.
The expected values are written out here, not taken from the code under test.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.config.load import ConfigError, load_config
from gpu_exporter.model.series import Series, SeriesSet, series
from gpu_exporter.pipeline.assembly import compat_hostname
from gpu_exporter.web.dcgm_compat.endpoint import DcgmCompat
from gpu_exporter.web.dcgm_compat.fields import BY_NAME, DEFAULT_FIELDS, FIELDS, markdown_table
from gpu_exporter.web.dcgm_compat.render import Counters, dcgm_bus_id, render
from gpu_exporter.web.dcgm_compat.xid_messages import message
from tests.golden_exposition import COMPAT_HOSTNAME, COMPAT_PATH, running_compat
from tests.shared_node import shared_node

HOSTNAME = COMPAT_HOSTNAME  # hostname="node-a"

# dcgm-exporter's counter file, active rows and the commented-out rows users enable:
# name -> (TYPE, HELP), verbatim.
COUNTER_FILE = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_ENC_UTIL": ("gauge", "Encoder utilization (in %)."),
    "DCGM_FI_DEV_DEC_UTIL": ("gauge", "Decoder utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_POWER_VIOLATION": (
        "counter",
        "Throttling duration due to power constraints (in ns).",
    ),
    "DCGM_FI_DEV_THERMAL_VIOLATION": (
        "counter",
        "Throttling duration due to thermal constraints (in ns).",
    ),
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": (
        "counter",
        "Throttling duration due to sync-boost constraints (in ns).",
    ),
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": (
        "counter",
        "Throttling duration due to board limit constraints (in ns).",
    ),
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": (
        "counter",
        "Throttling duration due to low utilization (in ns).",
    ),
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": (
        "counter",
        "Throttling duration due to reliability constraints (in ns).",
    ),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": (
        "counter",
        "Total number of single-bit persistent ECC errors.",
    ),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": (
        "counter",
        "Total number of double-bit persistent ECC errors.",
    ),
    "DCGM_FI_DEV_RETIRED_SBE": (
        "counter",
        "Total number of retired pages due to single-bit errors.",
    ),
    "DCGM_FI_DEV_RETIRED_DBE": (
        "counter",
        "Total number of retired pages due to double-bit errors.",
    ),
    "DCGM_FI_DEV_RETIRED_PENDING": ("counter", "Total number of pages pending retirement."),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink flow-control CRC errors.",
    ),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink data CRC errors.",
    ),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink retries."),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink recovery errors.",
    ),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gauge", "The ratio of number of warps resident on an SM."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    "DCGM_FI_PROF_DRAM_ACTIVE": (
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("gauge", "Ratio of cycles the fp64 pipes are active."),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("gauge", "Ratio of cycles the fp32 pipes are active."),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("gauge", "Ratio of cycles the fp16 pipes are active."),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
    ),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
    ),
}
# DCGM field ids (dcgm_fields.h), spot checks of the table's order key.
FIELD_IDS = {
    "DCGM_FI_DEV_SM_CLOCK": 100,
    "DCGM_FI_DEV_GPU_TEMP": 150,
    "DCGM_FI_DEV_POWER_USAGE": 155,
    "DCGM_FI_DEV_GPU_UTIL": 203,
    "DCGM_FI_DEV_XID_ERRORS": 230,
    "DCGM_FI_DEV_FB_TOTAL": 250,
    "DCGM_FI_DEV_FB_USED": 252,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 313,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 395,
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 449,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 1004,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 1010,
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": 1014,
}
# A real DCGM_FI_DEV_XID_ERRORS line (dcgm-exporter issue tracker), its label names in order;
# pod_uid (opt-in there) is not emitted here.
REAL_XID_LABELS = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "container",
    "err_code",
    "err_msg",
    "namespace",
    "pod",
]
FIXED_ORDER = ["gpu", "UUID", "pci_bus_id", "device", "modelName"]
TAIL_ORDER = ["container", "err_code", "err_msg", "namespace", "pod"]
_LINE = re.compile(r"^([A-Z][A-Z0-9_]*)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse(text: str) -> list[tuple[str, list[tuple[str, str]], str]]:
    """Sample lines as (name, labels in written order, value text)."""
    samples = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = _LINE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        pairs = _LABEL.findall(labels)
        assert ",".join(f'{k}="{v}"' for k, v in pairs) == labels, line
        samples.append((name, pairs, value))
    return samples


@pytest.fixture(scope="module")
def labelled() -> Iterator[tuple[SeriesSet, str]]:
    """The mixed scenario after six ticks, pods in labels mode: its series and compat text."""
    with running_compat("labels") as (published, text):
        yield published, text


def test_every_line_has_dcgm_exporters_shape(labelled: tuple[SeriesSet, str]) -> None:
    _, text = labelled
    families = {f.name: f for f in text_string_to_metric_families(text)}  # parses, or raises
    assert "DCGM_FI_DEV_GPU_TEMP" in families
    typed: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            typed[name] = kind
    for name, labels, value in parse(text):
        assert name in typed, f"{name} has no TYPE line before it"
        names = [label for label, _ in labels]
        assert names[:5] == FIXED_ORDER, names
        rest = names[5:]
        if rest[:2] == ["GPU_I_PROFILE", "GPU_I_ID"]:
            rest = rest[2:]
        assert rest[:2] == ["hostname", "DCGM_FI_DRIVER_VERSION"], names
        assert rest[2:] == sorted(rest[2:]) and set(rest[2:]) <= set(TAIL_ORDER), names
        values = dict(labels)
        assert values["device"] == f"nvidia{values['gpu']}"
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]", values["pci_bus_id"])
        assert values["hostname"] == "node-a"
        if BY_NAME[name].integer:
            assert re.fullmatch(r"-?\d+", value), (name, value)
        else:
            assert re.fullmatch(r"-?\d+\.\d{6}", value), (name, value)  # Go's %f
        assert not name.endswith("_total") or name.endswith("_COUNT_TOTAL") or "_VOL_" in name


def test_help_and_type_are_dcgm_exporters(labelled: tuple[SeriesSet, str]) -> None:
    _, text = labelled
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name, (kind, help_text) in COUNTER_FILE.items():
        assert BY_NAME[name].type == kind and BY_NAME[name].help == help_text, name
        if name in helps:
            assert (types[name], helps[name]) == (kind, help_text), name
    # Families in DCGM field-id order, as dcgm-exporter's renderer writes them.
    for name, field_id in FIELD_IDS.items():
        assert BY_NAME[name].field_id == field_id
    ids = [field.field_id for field in FIELDS]
    assert ids == sorted(ids)
    written = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert written == [field.name for field in FIELDS if field.name in written]


def test_every_quantity_nvml_gives_is_there(labelled: tuple[SeriesSet, str]) -> None:
    """The mixed scenario's Hopper GPUs give every mapped quantity (VGPU_LICENSE_STATUS and
    per-link bandwidth are not mapped: docs/migrating-from-dcgm-exporter.md)."""
    _, text = labelled
    written = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    missing = [field.name for field in DEFAULT_FIELDS if field.name not in written]
    # The thermal fallback counter exists only on drivers without the per-reason fields.
    assert missing == [], missing
    assert set(COUNTER_FILE) <= written
    # Rows added after the default output was fixed appear only when a counters file names
    # them (tests/test_dcgm_counters_file.py): without one, the output stays as it was.
    file_only = {field.name for field in FIELDS} - {field.name for field in DEFAULT_FIELDS}
    assert file_only and not file_only & written, file_only & written


def _native(published: SeriesSet, family: str, gpu: str, labels: dict[str, str]) -> float | None:
    for row in published.of(family):
        mine = dict(row.labels)
        own = all(mine.get(k) == v for k, v in labels.items())
        if mine.get("gpu") == gpu and "mig_uuid" not in mine and own:
            return row.value
    return None


def test_values_equal_the_native_ones_after_conversion(labelled: tuple[SeriesSet, str]) -> None:
    published, text = labelled
    checked = 0
    for name, labels, value in parse(text):
        field = BY_NAME[name]
        if field.derive is not None or field.rate:
            continue
        native = _native(published, field.native, dict(labels)["gpu"], dict(field.labels))
        assert native is not None, (name, labels)
        expected = native * field.scale
        if field.integer:
            want = math.floor(expected) if field.floor else round(expected)
            assert int(value) == want, (name, labels, value, native)
        else:
            assert float(value) == pytest.approx(expected, abs=5e-7), (name, value, native)
        checked += 1
    assert checked > 8 * 30


def test_unit_conversions_spelled_out() -> None:
    """The conversions of the reference mapping, on one GPU's numbers."""
    up = series("gpu_up", 1.0, _gpu(0))
    rows = [
        series("gpu_clock_hertz", 1_980_000_000.0, (*_gpu(0), ("clock", "sm"))),
        series("gpu_memory_used_bytes", 3 * 1024 * 1024 * 1024 + 1023, _gpu(0)),
        series("gpu_energy_joules_total", 1234.567, _gpu(0)),
        series("gpu_utilization_ratio", 0.57, _gpu(0)),
        series("gpu_power_watts", 640.58, _gpu(0)),
        series("gpu_tensor_active_ratio", 0.25, _gpu(0)),
        series("gpu_clock_event_seconds_total", 1.5, (*_gpu(0), ("reason", "sw_power_cap"))),
    ]
    text = render(_set(1.0, up, _info(0), *rows), None, HOSTNAME).decode()
    values = {name: value for name, _, value in parse(text)}
    assert values["DCGM_FI_DEV_SM_CLOCK"] == "1980"
    assert values["DCGM_FI_DEV_FB_USED"] == "3072"  # MiB, rounded down as DCGM divides
    assert values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "1234567"  # mJ
    assert values["DCGM_FI_DEV_GPU_UTIL"] == "57"  # 0.57 * 100 is 56.99999999999999
    assert values["DCGM_FI_DEV_POWER_USAGE"] == "640.580000"
    assert values["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == "0.250000"
    assert values["DCGM_FI_DEV_POWER_VIOLATION"] == "1500000000"
    assert values["DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS"] == "1500000000"
    assert values["DCGM_FI_DEV_XID_ERRORS"] == "0"
    assert "DCGM_FI_PROF_SM_ACTIVE" not in values  # absent natively: absent, not 0


def test_xid_is_the_newest_one_with_dcgm_exporters_text() -> None:
    up = series("gpu_up", 1.0, _gpu(0))
    xids = [
        series("gpu_xid_last_timestamp_seconds", 100.0, (*_gpu(0), ("xid", "79"))),
        series("gpu_xid_last_timestamp_seconds", 250.0, (*_gpu(0), ("xid", "48"))),
        series("gpu_xid_last_timestamp_seconds", 50.0, (*_gpu(0), ("xid", "13"))),
    ]
    pods = [series("gpu_pod_info", 1.0, (*_gpu(0), *_pod("ml", "train-0", "main")))]
    hostname = ("Hostname", "node-a")
    text = render(_set(1.0, up, _info(0), *xids, *pods), None, hostname).decode()
    (line,) = [sample for sample in parse(text) if sample[0] == "DCGM_FI_DEV_XID_ERRORS"]
    _, labels, value = line
    assert value == "48"
    assert [name for name, _ in labels] == REAL_XID_LABELS
    assert dict(labels)["err_code"] == "48"
    assert dict(labels)["err_msg"] == message(48) == "Double Bit ECC Error"
    assert message(172) == "Uncorrectable SRAM Error" and message(173) == "Unknown Error"


def test_clock_event_bitmask_and_thermal_violation() -> None:
    up = series("gpu_up", 1.0, _gpu(0))
    rows = [
        series("gpu_clock_event_active", 1.0, (*_gpu(0), ("reason", "sw_power_cap"))),
        series("gpu_clock_event_active", 1.0, (*_gpu(0), ("reason", "hw_thermal_slowdown"))),
        series("gpu_clock_event_active", 0.0, (*_gpu(0), ("reason", "gpu_idle"))),
        series("gpu_clock_event_seconds_total", 2.0, (*_gpu(0), ("reason", "sw_thermal_slowdown"))),
        series("gpu_clock_event_seconds_total", 0.5, (*_gpu(0), ("reason", "hw_thermal_slowdown"))),
    ]
    values = {
        n: v for n, _, v in parse(render(_set(1.0, up, _info(0), *rows), None, HOSTNAME).decode())
    }
    assert values["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == str(0x04 | 0x40)
    assert values["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] == str(0x04 | 0x40)
    assert values["DCGM_FI_DEV_THERMAL_VIOLATION"] == "2500000000"


def test_rates_come_from_two_ticks_and_are_absent_before() -> None:
    def tick(t: float, pcie_tx: float, nvlink: tuple[float, float]) -> SeriesSet:
        return _set(
            t,
            series("gpu_up", 1.0, _gpu(0)),
            _info(0),
            series("gpu_pcie_bytes_total", pcie_tx, (*_gpu(0), ("direction", "tx"))),
            series("gpu_nvlink_bytes_total", nvlink[0], (*_gpu(0), ("direction", "tx"))),
            series("gpu_nvlink_bytes_total", nvlink[1], (*_gpu(0), ("direction", "rx"))),
        )

    first = tick(10.0, 1_000.0, (0.0, 0.0))
    second = tick(12.0, 5_001_000.0, (2_048_000_000.0, 1_024_000_000.0))
    alone = {n: v for n, _, v in parse(render(first, None, HOSTNAME).decode())}
    assert not {"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"} & set(alone)
    values = {n: v for n, _, v in parse(render(second, Counters.of(first), HOSTNAME).decode())}
    assert values["DCGM_FI_PROF_PCIE_TX_BYTES"] == "2500000"  # bytes/s
    assert values["DCGM_FI_PROF_NVLINK_TX_BYTES"] == "1024000000"
    assert values["DCGM_FI_PROF_NVLINK_RX_BYTES"] == "512000000"
    # DCGM's NVLINK_BANDWIDTH_TOTAL: both directions, KiB/s / 1000.
    assert values["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == "1500"
    reset = tick(13.0, 10.0, (3_000_000_000.0, 1_024_000_000.0))
    after_reset = {n: v for n, _, v in parse(render(reset, Counters.of(second), HOSTNAME).decode())}
    assert "DCGM_FI_PROF_PCIE_TX_BYTES" not in after_reset  # a counter reset is no rate
    assert after_reset["DCGM_FI_PROF_NVLINK_TX_BYTES"] == "952000000"


def test_mig_gpu_instances_carry_the_parents_identity() -> None:
    """Per GPU instance: the parent's gpu/UUID/bus id/model plus GPU_I_PROFILE and GPU_I_ID;
    parent state repeated on each; power once per GPU, on a series without GPU_I_*; a GPU
    instance split into compute instances has no memory or activity of its own here."""
    parent = _gpu(1)
    rows = [
        series("gpu_up", 1.0, parent),
        _info(1),
        series("gpu_power_watts", 300.0, parent),
        series("gpu_temperature_celsius", 61.0, (*parent, ("sensor", "gpu"))),
        *_instance(1, 3, None, "MIG-a", "3g.71gb", used=1024 * 1024 * 1024),
        *_instance(1, 5, 0, "MIG-b", "1c.2g.35gb", used=2 * 1024 * 1024 * 1024),
        *_instance(1, 5, 1, "MIG-c", "1c.2g.35gb", used=3 * 1024 * 1024 * 1024),
        series(
            "gpu_pod_info", 1.0, (*parent, *_mig(3, None, "MIG-a", "3g.71gb"), *_pod("a", "p", "c"))
        ),
    ]
    samples = parse(render(_set(1.0, *rows), None, HOSTNAME).decode())
    by_name: dict[str, list[dict[str, str]]] = {}
    for name, labels, value in samples:
        by_name.setdefault(name, []).append({**dict(labels), "value": value})
    temps = by_name["DCGM_FI_DEV_GPU_TEMP"]
    assert [(t["GPU_I_ID"], t["GPU_I_PROFILE"], t["value"]) for t in temps] == [
        ("3", "3g.71gb", "61"),
        ("5", "2g.35gb", "61"),
    ]
    assert all(t["UUID"] == "GPU-1" and t["gpu"] == "1" for t in temps)
    (power,) = by_name["DCGM_FI_DEV_POWER_USAGE"]
    assert "GPU_I_ID" not in power and power["value"] == "300.000000"
    (memory,) = by_name["DCGM_FI_DEV_FB_USED"]
    assert (memory["GPU_I_ID"], memory["value"]) == ("3", "1024")
    assert (memory["namespace"], memory["pod"], memory["container"]) == ("a", "p", "c")
    assert "DCGM_FI_DEV_GPU_UTIL" not in by_name


def test_a_shared_gpu_gives_one_series_per_pod() -> None:
    rows = [
        series("gpu_up", 1.0, _gpu(0)),
        _info(0),
        series("gpu_utilization_ratio", 0.5, _gpu(0)),
        series("gpu_pod_info", 1.0, (*_gpu(0), *_pod("batch", "job-a", "work"))),
        series("gpu_pod_info", 1.0, (*_gpu(0), *_pod("batch", "job-b", "work"))),
    ]
    samples = parse(render(_set(1.0, *rows), None, HOSTNAME).decode())
    utils = [dict(labels)["pod"] for name, labels, _ in samples if name == "DCGM_FI_DEV_GPU_UTIL"]
    assert utils == ["job-a", "job-b"]


def test_a_lost_gpu_has_no_values() -> None:
    text = render(_set(1.0, series("gpu_up", 0.0, _gpu(0)), _info(0)), None, HOSTNAME).decode()
    assert parse(text) == []


def test_bus_id_is_nvmls_busid_form() -> None:
    assert dcgm_bus_id("0000:3b:00.0") == "00000000:3B:00.0"
    assert dcgm_bus_id("00000000:0d:00.0") == "00000000:0D:00.0"
    assert dcgm_bus_id("") == ""


def test_the_hostname_label_is_configurable() -> None:
    rows = (series("gpu_up", 1.0, _gpu(0)), _info(0), series("gpu_power_watts", 1.0, _gpu(0)))
    for label, expect in (("Hostname", ["Hostname"]), ("hostname", ["hostname"]), ("", [])):
        text = render(_set(1.0, *rows), None, (label, "n1") if label else None).decode()
        (line,) = [sample for sample in parse(text) if sample[0] == "DCGM_FI_DEV_POWER_USAGE"]
        names = [name for name, _ in line[1]]
        assert [n for n in names if n.lower() == "hostname"] == expect


def test_cached_per_tick_and_the_previous_tick_gives_rates() -> None:
    compat = DcgmCompat(HOSTNAME)
    sets = [
        _set(t, series("gpu_up", 1.0, _gpu(0)), _info(0),
             series("gpu_pcie_bytes_total", 1000.0 * t * t, (*_gpu(0), ("direction", "rx"))))
        for t in (1.0, 2.0, 3.0)
    ]  # fmt: skip
    compat.on_series(sets[0])
    assert b"PCIE_RX_BYTES" not in compat.body(sets[0])
    compat.on_series(sets[1])
    body = compat.body(sets[1])
    assert b"DCGM_FI_PROF_PCIE_RX_BYTES{" in body and body.endswith(b"} 3000\n")
    assert compat.body(sets[1]) is body  # written once per tick
    compat.on_series(sets[2])
    assert compat.body(sets[2]) != body and compat.body(sets[2]).endswith(b"} 5000\n")
    assert compat.body(sets[1]) == body  # a tick scraped late: the same text again


# -- synthetic series --------------------------------------------------------------------------


def _gpu(index: int) -> tuple[tuple[str, str], ...]:
    return (("gpu", str(index)), ("uuid", f"GPU-{index}"))


def _info(index: int) -> Series:
    return series(
        "gpu_info",
        1.0,
        (
            *_gpu(index),
            ("model", "NVIDIA H200"),
            ("pci_bus_id", f"0000:{0x18 + index:02x}:00.0"),
            ("driver_version", "570.124.06"),
        ),
    )


def _pod(namespace: str, pod: str, container: str) -> tuple[tuple[str, str], ...]:
    return (("namespace", namespace), ("pod", pod), ("container", container))


def _mig(gi: int, ci: int | None, uuid: str, profile: str) -> tuple[tuple[str, str], ...]:
    shared = (("compute_instance", str(ci)),) if ci is not None else ()
    return (("gpu_instance", str(gi)), *shared, ("mig_uuid", uuid), ("mig_profile", profile))


def _instance(
    gpu: int, gi: int, ci: int | None, uuid: str, profile: str, used: float
) -> list[Series]:
    labels = (*_gpu(gpu), *_mig(gi, ci, uuid, profile))
    return [
        series("gpu_memory_used_bytes", used, labels),
        series("gpu_sm_active_ratio", 0.5, labels),
        series("gpu_mig_instance_slices", 3.0, labels),
    ]


def _set(timestamp: float, *rows: Series) -> SeriesSet:
    families: dict[str, tuple[Series, ...]] = {}
    for row in rows:
        families[row.family] = (*families.get(row.family, ()), row)
    return SeriesSet(timestamp, families)


def test_pcie_rate_falls_back_to_nvmls_throughput_sample() -> None:
    """Drivers without PCIe byte counters: the native 20 ms throughput gauge, as bytes/s."""
    rows = (
        series("gpu_up", 1.0, _gpu(0)),
        _info(0),
        series("gpu_pcie_throughput_bytes_per_second", 3.5e9, (*_gpu(0), ("direction", "rx"))),
    )
    values = {
        n: v
        for n, _, v in parse(
            render(_set(2.0, *rows), Counters.of(_set(1.0, *rows)), HOSTNAME).decode()
        )
    }
    assert values["DCGM_FI_PROF_PCIE_RX_BYTES"] == "3500000000"
    assert "DCGM_FI_PROF_PCIE_TX_BYTES" not in values


def test_migration_guide_mapping_is_the_code() -> None:
    guide = (
        Path(__file__).resolve().parent.parent / "docs/migrating-from-dcgm-exporter.md"
    ).read_text()
    begin, end = "<!-- dcgm-mapping:begin -->\n", "\n<!-- dcgm-mapping:end -->"
    embedded = guide[guide.index(begin) + len(begin) : guide.index(end)]
    assert embedded == markdown_table(), (
        "the migration guide's mapping is stale: regenerate it from "
        "`python -m gpu_exporter.web.dcgm_compat.fields`"
    )
    for field in FIELDS:
        assert f"| `{field.name}` |" in embedded


# -- configuration ------------------------------------------------------------------------------


def test_configuration_names_the_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("dcgm_compat:\n  enabled: true\n  hostname_label: HostName\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert f"{path}:3" in str(caught.value) and "dcgm_compat.hostname_label" in str(caught.value)
    path.write_text("listen_address: 127.0.0.1:9449\ndcgm_compat:\n  enabled: true\n"
                    "  listen_address: '[::1]:9449'\n")  # fmt: skip
    with pytest.raises(ConfigError, match="must use another port than listen_address"):
        load_config(path, environ={})
    path.write_text("dcgm_compat:\n  enabled: true\n  listen_address: nowhere\n")
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        load_config(path, environ={})


def test_environment_and_node_name() -> None:
    env = {"GPU_EXPORTER_DCGM_COMPAT__ENABLED": "true", "NODE_NAME": "gpu-node-7"}
    config = load_config(None, environ=env)
    assert config.dcgm_compat.enabled
    assert compat_hostname(config.dcgm_compat, env) == ("hostname", "gpu-node-7")
    hidden = config.dcgm_compat.model_copy(update={"hostname_label": "none"})
    assert compat_hostname(hidden, env) is None
    assert load_config(None, environ={}).dcgm_compat.enabled is False  # off unless asked


def test_rates_survive_pods_coming_and_going() -> None:
    """In labels mode a counter's series gains the pod's labels when a pod starts: still the
    same counter, so the rate is there in that tick."""
    before = _set(1.0, series("gpu_pcie_bytes_total", 0.0, (*_gpu(0), ("direction", "tx"))))
    held = (*_gpu(0), ("direction", "tx"), *_pod("ml", "train-0", "main"))
    now = _set(
        2.0,
        series("gpu_up", 1.0, (*_gpu(0), *_pod("ml", "train-0", "main"))),
        _info(0),
        series("gpu_pcie_bytes_total", 4096.0, held),
    )
    values = {n: v for n, _, v in parse(render(now, Counters.of(before), HOSTNAME).decode())}
    assert values["DCGM_FI_PROF_PCIE_TX_BYTES"] == "4096"


def test_a_pod_holding_two_compute_instances_of_a_gpu_instance_is_one_series() -> None:
    parent = _gpu(1)
    rows = [
        series("gpu_up", 1.0, parent),
        _info(1),
        series("gpu_temperature_celsius", 61.0, (*parent, ("sensor", "gpu"))),
        *_instance(1, 5, 0, "MIG-b", "1c.2g.35gb", used=1.0),
        *_instance(1, 5, 1, "MIG-c", "1c.2g.35gb", used=1.0),
        series(
            "gpu_pod_info", 1.0, (*parent, *_mig(5, 0, "MIG-b", "1c.2g.35gb"), *_pod("a", "p", "c"))
        ),
        series(
            "gpu_pod_info", 1.0, (*parent, *_mig(5, 1, "MIG-c", "1c.2g.35gb"), *_pod("a", "p", "c"))
        ),
    ]
    samples = parse(render(_set(1.0, *rows), None, HOSTNAME).decode())
    temps = [dict(labels) for name, labels, _ in samples if name == "DCGM_FI_DEV_GPU_TEMP"]
    assert [(t["GPU_I_ID"], t["pod"]) for t in temps] == [("5", "p")]


# -- shared GPUs with per-pod use (dcgm-exporter's --kubernetes-virtual-gpus) ---------------------


def _lines(text: str, name: str) -> list[tuple[dict[str, str], str]]:
    return [(dict(labels), value) for n, labels, value in parse(text) if n == name]


def _pod_of(labels: dict[str, str]) -> str | None:
    return labels.get("pod")


def test_a_shared_gpu_with_per_pod_use_gives_the_device_then_each_pods_processes() -> None:
    """GPU 0 of the shared node: ml/train-0 (two processes), research/notebook-0 (none) and a
    host process. As dcgm-exporter with --kubernetes-virtual-gpus: the device's own series
    without pod labels, then one per pod holding it, the sum over its processes (0 for none;
    the host process is no pod's); no pod_uid (the kubelet does not say it) and no vgpu (the
    replica number is not kept)."""
    _, series = shared_node()
    text = render(series, None, HOSTNAME).decode()
    gpu0 = [(labels, value) for labels, value in _lines(text, "DCGM_FI_DEV_GPU_UTIL")
            if labels["gpu"] == "0"]  # fmt: skip
    assert [(_pod_of(labels), value) for labels, value in gpu0] == [
        (None, "60"),
        ("train-0", "55"),
        ("notebook-0", "0"),
    ]
    assert [sorted(labels) for labels, _ in gpu0][1] == sorted(
        [*FIXED_ORDER, "hostname", "DCGM_FI_DRIVER_VERSION", "container", "namespace", "pod"]
    )
    memory = [(_pod_of(labels), value) for labels, value in _lines(text, "DCGM_FI_DEV_FB_USED")
              if labels["gpu"] == "0"]  # fmt: skip
    assert memory == [(None, "40960"), ("train-0", "30720"), ("notebook-0", "0")]
    # Every other field stays copied per pod, as before.
    power = [_pod_of(labels) for labels, _ in _lines(text, "DCGM_FI_DEV_POWER_USAGE")
             if labels["gpu"] == "0"]  # fmt: skip
    assert power == ["train-0", "notebook-0"]
    assert "pod_uid" not in text and "vgpu" not in text


def test_one_pod_alone_keeps_the_devices_value_and_a_gpu_instance_shares_like_a_gpu() -> None:
    _, series = shared_node()
    text = render(series, None, HOSTNAME).decode()
    gpu1 = [(_pod_of(labels), value) for labels, value in _lines(text, "DCGM_FI_DEV_GPU_UTIL")
            if labels["gpu"] == "1"]  # fmt: skip
    assert gpu1 == [("infer-0", "80")]  # exclusive: one series, the device's value, as before
    by_gi: dict[str, list[tuple[str | None, str]]] = {}
    for labels, value in _lines(text, "DCGM_FI_DEV_FB_USED"):
        if "GPU_I_ID" in labels:
            by_gi.setdefault(labels["GPU_I_ID"], []).append((_pod_of(labels), value))
    assert by_gi == {
        "7": [("embed-0", "6144")],
        "9": [(None, "6144"), ("chat-0", "4096"), ("chat-1", "0")],
    }


def test_a_pods_containers_add_up_and_memory_is_rounded_down_once() -> None:
    """dcgm-exporter maps processes to pods by pod UID: two containers of one pod on a shared
    GPU each carry the pod's total. MiB are the sum's, rounded down (dcgm-exporter rounds each
    process down first: it can be lower by under 1 MiB per process)."""
    mib = 1024.0 * 1024.0
    rows = [
        series("gpu_up", 1.0, _gpu(0)),
        _info(0),
        series("gpu_utilization_ratio", 0.9, _gpu(0)),
        series("gpu_memory_used_bytes", 100 * mib, _gpu(0)),
        *(
            series("gpu_pod_info", 1.0, (*_gpu(0), *_pod("ml", pod, container)))
            for pod, container in (("a", "main"), ("a", "side"), ("b", "main"))
        ),
        series("gpu_pod_memory_used_bytes", 10.6 * mib, (*_gpu(0), *_pod("ml", "a", "main"))),
        series("gpu_pod_memory_used_bytes", 20.6 * mib, (*_gpu(0), *_pod("ml", "a", "side"))),
        series("gpu_pod_memory_used_bytes", 5.0 * mib, (*_gpu(0), *_pod("ml", "b", "main"))),
        series("gpu_pod_utilization_ratio", 0.304, (*_gpu(0), *_pod("ml", "a", "main"))),
        series("gpu_pod_utilization_ratio", 0.2, (*_gpu(0), *_pod("ml", "a", "side"))),
    ]
    text = render(_set(1.0, *rows), None, HOSTNAME).decode()
    memory = [(labels.get("container"), value) for labels, value in
              _lines(text, "DCGM_FI_DEV_FB_USED")]  # fmt: skip
    assert memory == [(None, "100"), ("main", "31"), ("side", "31"), ("main", "5")]
    util = [(labels.get("pod"), value) for labels, value in _lines(text, "DCGM_FI_DEV_GPU_UTIL")]
    assert util == [(None, "90"), ("a", "50"), ("a", "50"), ("b", "0")]  # b: no kernel, 0


def test_golden_compat_output_has_no_per_pod_use_yet() -> None:
    """The golden node's GPU 5 is time-sliced, without per-process attribution: one copy per
    pod, no device-level series (nothing changed until the per-pod families are emitted)."""
    golden = COMPAT_PATH.read_text()
    gpu5 = [labels for labels, _ in _lines(golden, "DCGM_FI_DEV_GPU_UTIL") if labels["gpu"] == "5"]
    assert [labels.get("pod") for labels in gpu5] == ["job-a", "job-b"]
