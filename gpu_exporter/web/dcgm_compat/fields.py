"""Every family of the dcgm-exporter compatible output, and where its value comes from.

One row per DCGM field: its name, the `# TYPE` and `# HELP` dcgm-exporter 4.8 writes for it,
whether DCGM stores it as an integer (printed `%d`) or a double (`%f`), and the native family
(plus labels, scale or rate) it is computed from. The field's id comes from the name
(model/dcgm_fields.py), and an activity field's native family from the activity table
(model/activity.py), which pairs it with its GPM metric. The renderer, the migration guide's
mapping table (`python -m gpu_exporter.web.dcgm_compat.fields`) and the tests read this table,
so a DCGM name is mapped in exactly one place.

Sources of the facts: names and units from DCGM's `dcgm_fields.h` (NVIDIA/DCGM, mirrored in
NVIDIA/go-dcgm `pkg/dcgm/const_fields.go`); integer or double from DCGM's
`dcgmlib/src/dcgm_fields.cpp`; types and help texts from dcgm-exporter's counter files
(`etc/default-counters.csv`, `etc/dcp-metrics-included.csv`, their commented-out rows
included). Families no dcgm-exporter counter file names (the memory total, the clock-event
bitmask and durations, the NVLink byte rates, the tensor sub-pipes, the maximum clocks and the
power limits) get a help text in the same style (dcgm_fields.h's description), and the type
DCGM's unit implies.

A counters file (selection.py) picks families by DCGM field: its name is resolved to the
field's id, and the row of that id here computes the value, written under the file's name,
type and help. Without one, the output is every row marked `default` (the static limits were
added later and appear only when a file names them, so the default output stays as it was).
LABEL_FIELDS are the string fields a file may turn into labels (its `label` rows).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from gpu_exporter.model.activity import BY_DCGM_NAME
from gpu_exporter.model.dcgm_fields import FIELD_IDS
from gpu_exporter.model.nvml_facts import CLOCK_EVENT_REASONS, COMBINED_THERMAL_REASON
from gpu_exporter.model.snapshot import Labels, Reading


class Of(Enum):
    """Whose quantity a field is, which decides where it appears on a MIG GPU.

    dcgm-exporter watches a MIG GPU only through its GPU instances and repeats the parent's
    values on each of them; sums over instances then count the parent several times. Here
    the parent's state (clocks, temperatures, errors) is repeated on each instance as there,
    but its additive quantities (power, energy, power limits, PCIe and NVLink traffic) appear
    once, on a series with the parent's labels and no GPU_I_* labels — the one deliberate
    difference.
    """

    ENTITY = "entity"  # the GPU's own, or the GPU instance's own
    PARENT = "parent"  # the physical GPU's, repeated on each of its GPU instances
    PARENT_ONCE = "parent once"  # the physical GPU's, once per GPU even with MIG on


# A GPU's (or instance's) readings by family and labels (sorted by name): one pass over them,
# instead of one scan per compat family.
Index = Mapping[tuple[str, Labels], float]


def index(readings: Iterable[Reading]) -> dict[tuple[str, Labels], float]:
    """The readings of the families compat output reads (FIELDS' natives), indexed."""
    return {
        (r.family, r.labels if len(r.labels) < 2 else tuple(sorted(r.labels))): r.value
        for r in readings
        if r.family in NATIVE_FAMILIES
    }


@dataclass(frozen=True)
class Entity:
    """What one compat series set is computed from: a whole GPU, a GPU instance of a MIG GPU,
    or (`parent_only`) a MIG GPU's own additive quantities.

    `own` indexes the entity's readings (a GPU instance's: empty when it has several compute
    instances, whose memory and activity belong to none alone); `parent` the physical GPU's;
    `rates` the per-second rate of the GPU's counters between the last two ticks, by family
    and labels.
    """

    own: Index
    parent: Index
    rates: Index
    instance: bool = False
    parent_only: bool = False

    def shows(self, of: Of) -> bool:
        if self.parent_only:
            return of is Of.PARENT_ONCE
        return not (self.instance and of is Of.PARENT_ONCE)

    def value(self, of: Of, family: str, labels: Labels = ()) -> float | None:
        """The reading of `family` with exactly `labels` (sorted by name), of the entity or
        of its parent GPU as `of` says; None when absent."""
        return (self.own if of is Of.ENTITY else self.parent).get((family, labels))

    def rate(self, family: str, labels: Labels = ()) -> float | None:
        return self.rates.get((family, labels))


@dataclass(frozen=True)
class CompatField:
    """One dcgm-exporter family. The value is `native{labels}` times `scale` (or its rate per
    second between the last two ticks, with `rate`), unless `derive` computes it (from the
    rates of `native`, with `rate`); `source` says how, for the migration guide, when
    `derive` does."""

    name: str
    field_id: int
    type: str  # the `# TYPE` dcgm-exporter writes: "gauge" or "counter"
    help: str
    integer: bool  # DCGM_FT_INT64, printed "%d"; else DCGM_FT_DOUBLE, printed "%f"
    native: str
    labels: Labels = ()
    scale: float = 1.0
    rate: bool = False
    of: Of = Of.ENTITY
    derive: Callable[[Entity], float | None] | None = None
    source: str = ""
    # DCGM divides integers (bytes to MiB, byte counts over time): the value rounds down.
    # Elsewhere the native value is DCGM's integer times a factor, and rounding recovers it.
    floor: bool = False
    # In the output without a counters file; False: only when a counters file names it.
    default: bool = True

    def value(self, entity: Entity) -> float | None:
        if self.derive is not None:
            return self.derive(entity)
        if self.rate:
            value = entity.rate(self.native, self.labels)
        else:
            value = entity.value(self.of, self.native, self.labels)
        return None if value is None else value * self.scale

    def mapping(self) -> str:
        """Where the value comes from, in words (the migration guide's mapping column)."""
        if self.source:
            return self.source
        selector = ",".join(f'{k}="{v}"' for k, v in self.labels)
        native = f"`{self.native}{{{selector}}}`" if selector else f"`{self.native}`"
        if self.rate:
            native = f"rate of {native} over the last tick, bytes/s"
        if self.scale > 1.0:
            native += f" * {self.scale:,.0f}"
        elif self.scale < 1.0:
            native += f" / {1 / self.scale:,.0f}"
        return native


MIB = 1.0 / (1024 * 1024)
NS = 1e9
MHZ = 1e-6
PERCENT = 100.0


def _xid(entity: Entity) -> float | None:
    """The XID with the newest timestamp (DCGM's DCGM_FI_DEV_XID_ERRORS is the last XID), 0
    when there was none since the daemon started; absent for a GPU that is not answering."""
    if not entity.parent:
        return None
    newest: tuple[float, int] = (float("-inf"), 0)
    for (family, labels), value in entity.parent.items():
        if family == "gpu_xid_last_timestamp_seconds":
            xid = dict(labels).get("xid", "")
            if xid.isdecimal():
                newest = max(newest, (value, int(xid)))
    return float(newest[1])


def _clock_event_bits(entity: Entity) -> float | None:
    """NVML's clock-event reason bitmask, re-encoded from gpu_clock_event_active{reason}."""
    bits, seen = 0, False
    for reason in CLOCK_EVENT_REASONS:
        active = entity.value(Of.PARENT, "gpu_clock_event_active", (("reason", reason.name),))
        if active is not None:
            seen = True
            if active >= 1.0:
                bits |= reason.bit
    return float(bits) if seen else None


def _thermal_violation_ns(entity: Entity) -> float | None:
    """NVML's thermal violation time: the combined counter where the driver has only that,
    else software plus hardware thermal slowdown (equal when the two never overlap)."""
    family = "gpu_clock_event_seconds_total"
    combined = entity.value(Of.PARENT, family, (("reason", COMBINED_THERMAL_REASON),))
    if combined is not None:
        return combined * NS
    parts = [
        entity.value(Of.PARENT, family, (("reason", reason),))
        for reason in ("sw_thermal_slowdown", "hw_thermal_slowdown")
    ]
    present = [part for part in parts if part is not None]
    return sum(present) * NS if present else None


def _nvlink_bandwidth(entity: Entity) -> float | None:
    """DCGM's DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL: a rate despite its counter type, the KiB
    counters' change per second divided by 1000 (DCGM's cache manager), so bytes/s / 1.024e6."""
    rates = [entity.rate("gpu_nvlink_bytes_total", (("direction", d),)) for d in ("tx", "rx")]
    present = [rate for rate in rates if rate is not None]
    return sum(present) / 1.024e6 if present else None


def _pcie_rate(direction: str) -> Callable[[Entity], float | None]:
    def rate(entity: Entity) -> float | None:
        counted = entity.rate("gpu_pcie_bytes_total", (("direction", direction),))
        if counted is not None:
            return counted
        # Drivers without PCIe byte counters: NVML's 20 ms throughput sample (KB/s -> B/s).
        return entity.value(
            Of.PARENT, "gpu_pcie_throughput_bytes_per_second", (("direction", direction),)
        )

    return rate


def _f(
    name: str,
    type_: str,
    help_: str,
    integer: bool,
    native: str,
    labels: Mapping[str, str] | None = None,
    **options: object,
) -> CompatField:
    """A row for DCGM field `name`; its id is the one DCGM gives it (model/dcgm_fields.py)."""
    return CompatField(
        name,
        FIELD_IDS[name],
        type_,
        help_,
        integer,
        native,
        tuple(sorted((labels or {}).items())),
        **options,  # type: ignore[arg-type]
    )


def _activity(name: str, help_: str) -> CompatField:
    """A row for an activity field: a ratio gauge of the family GPM fills for the same quantity
    (model/activity.py), read as it is."""
    activity = BY_DCGM_NAME[name]
    return _f(name, "gauge", help_, DOUBLE, activity.family, dict(activity.labels))


INT, DOUBLE = True, False
P, ONCE = Of.PARENT, Of.PARENT_ONCE
_CLOCK_NS = "gpu_clock_event_seconds_total"
_VIOLATION = "gpu_violation_seconds_total"

# In DCGM field-id order, the order dcgm-exporter writes its families in (its renderer ranges
# over a map keyed by counter, and Go's templates visit such keys sorted, field id first).
FIELDS: tuple[CompatField, ...] = (
    _f("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", INT,
       "gpu_clock_hertz", {"clock": "sm"}, scale=MHZ, of=P),
    _f("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", INT,
       "gpu_clock_hertz", {"clock": "memory"}, scale=MHZ, of=P),
    _f("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge",
       "Current clock event reasons (bitmask of NVML clocks event reasons).", INT,
       "gpu_clock_event_active", of=P, derive=_clock_event_bits,
       source="bitmask of `gpu_clock_event_active{reason}` (NVML's bits)"),
    _f("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge",
       "Current clock throttle reasons (bitmask; the field's name before DCGM 3.2).", INT,
       "gpu_clock_event_active", of=P, derive=_clock_event_bits,
       source="as DCGM_FI_DEV_CLOCKS_EVENT_REASONS (its older name)"),
    _f("DCGM_FI_DEV_MAX_SM_CLOCK", "gauge", "Maximum supported SM clock (in MHz).", INT,
       "gpu_clock_max_hertz", {"clock": "sm"}, scale=MHZ, of=P, default=False),
    _f("DCGM_FI_DEV_MAX_MEM_CLOCK", "gauge", "Maximum supported memory clock (in MHz).", INT,
       "gpu_clock_max_hertz", {"clock": "memory"}, scale=MHZ, of=P, default=False),
    _f("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", INT,
       "gpu_temperature_celsius", {"sensor": "memory"}, of=P),
    _f("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", INT,
       "gpu_temperature_celsius", {"sensor": "gpu"}, of=P),
    _f("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", DOUBLE,
       "gpu_power_watts", of=ONCE),
    _f("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
       "Total energy consumption since boot (in mJ).", INT,
       "gpu_energy_joules_total", scale=1000.0, of=ONCE),
    _f("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).", DOUBLE,
       "gpu_power_management_limit_watts", of=ONCE),
    _f("DCGM_FI_DEV_POWER_MGMT_LIMIT_MIN", "gauge", "Minimum power management limit (in W).",
       DOUBLE, "gpu_power_management_limit_min_watts", of=ONCE, default=False),
    _f("DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX", "gauge", "Maximum power management limit (in W).",
       DOUBLE, "gpu_power_management_limit_max_watts", of=ONCE, default=False),
    _f("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", "gauge", "Default power management limit (in W).",
       DOUBLE, "gpu_power_management_limit_default_watts", of=ONCE, default=False),
    _f("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "Enforced power limit (in W).", DOUBLE,
       "gpu_power_limit_watts", of=ONCE),
    _f("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", INT,
       "gpu_pcie_replay_total", of=P),
    _f("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", INT,
       "gpu_utilization_ratio", scale=PERCENT),
    _f("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", INT,
       "gpu_memory_utilization_ratio", scale=PERCENT),
    _f("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", INT,
       "gpu_encoder_utilization_ratio", scale=PERCENT),
    _f("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", INT,
       "gpu_decoder_utilization_ratio", scale=PERCENT),
    _f("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", INT,
       "gpu_xid_last_timestamp_seconds", of=P, derive=_xid,
       source="the `xid` of the newest `gpu_xid_last_timestamp_seconds`, 0 when none; "
       "`err_code` and `err_msg` labels"),
    _f("DCGM_FI_DEV_POWER_VIOLATION", "counter",
       "Throttling duration due to power constraints (in ns).", INT,
       _CLOCK_NS, {"reason": "sw_power_cap"}, scale=NS, of=P),
    _f("DCGM_FI_DEV_THERMAL_VIOLATION", "counter",
       "Throttling duration due to thermal constraints (in ns).", INT,
       _CLOCK_NS, of=P, derive=_thermal_violation_ns,
       source='`gpu_clock_event_seconds_total{reason="thermal"}` * 1,000,000,000 (older '
       "drivers), else the sum of its `sw_thermal_slowdown` and `hw_thermal_slowdown` series"),
    _f("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "counter",
       "Throttling duration due to sync-boost constraints (in ns).", INT,
       _CLOCK_NS, {"reason": "sync_boost"}, scale=NS, of=P),
    _f("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "counter",
       "Throttling duration due to board limit constraints (in ns).", INT,
       _VIOLATION, {"policy": "board_limit"}, scale=NS, of=P),
    _f("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "counter",
       "Throttling duration due to low utilization (in ns).", INT,
       _VIOLATION, {"policy": "low_utilization"}, scale=NS, of=P),
    _f("DCGM_FI_DEV_RELIABILITY_VIOLATION", "counter",
       "Throttling duration due to reliability constraints (in ns).", INT,
       _VIOLATION, {"policy": "reliability"}, scale=NS, of=P),
    _f("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (in MiB).", INT,
       "gpu_memory_total_bytes", scale=MIB, floor=True),
    _f("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", INT,
       "gpu_memory_free_bytes", scale=MIB, floor=True),
    _f("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", INT,
       "gpu_memory_used_bytes", scale=MIB, floor=True),
    _f("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", INT,
       "gpu_memory_reserved_bytes", scale=MIB, floor=True),
    _f("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter",
       "Total number of single-bit volatile ECC errors.", INT,
       "gpu_ecc_errors_total", {"error": "corrected"}, of=P),
    _f("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
       "Total number of double-bit volatile ECC errors.", INT,
       "gpu_ecc_errors_total", {"error": "uncorrected"}, of=P),
    _f("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter",
       "Total number of single-bit persistent ECC errors.", INT,
       "gpu_ecc_aggregate_errors_total", {"error": "corrected"}, of=P),
    _f("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter",
       "Total number of double-bit persistent ECC errors.", INT,
       "gpu_ecc_aggregate_errors_total", {"error": "uncorrected"}, of=P),
    _f("DCGM_FI_DEV_RETIRED_SBE", "counter",
       "Total number of retired pages due to single-bit errors.", INT,
       "gpu_retired_pages_total", {"cause": "single_bit_ecc"}, of=P),
    _f("DCGM_FI_DEV_RETIRED_DBE", "counter",
       "Total number of retired pages due to double-bit errors.", INT,
       "gpu_retired_pages_total", {"cause": "double_bit_ecc"}, of=P),
    _f("DCGM_FI_DEV_RETIRED_PENDING", "counter",
       "Total number of pages pending retirement.", INT,
       "gpu_retired_pages_pending", of=P),
    _f("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
       "Number of remapped rows for uncorrectable errors", INT,
       "gpu_remapped_rows_total", {"severity": "uncorrectable"}, of=P),
    _f("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
       "Number of remapped rows for correctable errors", INT,
       "gpu_remapped_rows_total", {"severity": "correctable"}, of=P),
    _f("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
       INT, "gpu_row_remap_failure", of=P),
    _f("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink flow-control CRC errors.", INT,
       "gpu_nvlink_errors_total", {"error": "crc_flit"}, of=P),
    _f("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink data CRC errors.", INT,
       "gpu_nvlink_errors_total", {"error": "crc_data"}, of=P),
    _f("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink retries.", INT,
       "gpu_nvlink_errors_total", {"error": "replay"}, of=P),
    _f("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink recovery errors.", INT,
       "gpu_nvlink_errors_total", {"error": "recovery"}, of=P),
    _f("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
       "Total number of NVLink bandwidth counters for all lanes.", INT,
       "gpu_nvlink_bytes_total", of=ONCE, derive=_nvlink_bandwidth, floor=True, rate=True,
       source="rate of `gpu_nvlink_bytes_total` over the last tick, both directions, "
       "÷ 1.024e6 (DCGM's ≈ MiB/s; typed counter as in dcgm-exporter)"),
    _activity("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active."),
    _activity("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned."),
    _activity("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM."),
    _activity("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
              "Ratio of cycles the tensor (HMMA) pipe is active."),
    _activity("DCGM_FI_PROF_DRAM_ACTIVE",
              "Ratio of cycles the device memory interface is active sending or receiving data."),
    _activity("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the fp64 pipes are active."),
    _activity("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the fp32 pipes are active."),
    _activity("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the fp16 pipes are active."),
    _f("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
       "The rate of data transmitted over the PCIe bus - including both protocol headers and "
       "data payloads - in bytes per second.", INT,
       "gpu_pcie_bytes_total", {"direction": "tx"}, of=ONCE, derive=_pcie_rate("tx"),
       floor=True, rate=True,
       source='rate of `gpu_pcie_bytes_total{direction="tx"}` over the last tick, bytes/s '
       "(`gpu_pcie_throughput_bytes_per_second` on drivers without byte counters)"),
    _f("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
       "The rate of data received over the PCIe bus - including both protocol headers and "
       "data payloads - in bytes per second.", INT,
       "gpu_pcie_bytes_total", {"direction": "rx"}, of=ONCE, derive=_pcie_rate("rx"),
       floor=True, rate=True,
       source='rate of `gpu_pcie_bytes_total{direction="rx"}` over the last tick, bytes/s '
       "(`gpu_pcie_throughput_bytes_per_second` on drivers without byte counters)"),
    _f("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge",
       "The rate of data transmitted over NVLink, in bytes per second.", INT,
       "gpu_nvlink_bytes_total", {"direction": "tx"}, rate=True, of=ONCE, floor=True),
    _f("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge",
       "The rate of data received over NVLink, in bytes per second.", INT,
       "gpu_nvlink_bytes_total", {"direction": "rx"}, rate=True, of=ONCE, floor=True),
    _activity("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
              "Ratio of cycles the tensor (IMMA) pipe is active."),
    _activity("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
              "Ratio of cycles the tensor (HMMA) pipe is active."),
    _activity("DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
              "Ratio of cycles the tensor (DFMA) pipe is active."),
    _f("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP_NS", "counter",
       "Throttling to not exceed currently set power limits (in ns).", INT,
       _CLOCK_NS, {"reason": "sw_power_cap"}, scale=NS, of=P),
    _f("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST_NS", "counter",
       "Throttling to match minimum possible clock across Sync Boost Group (in ns).", INT,
       _CLOCK_NS, {"reason": "sync_boost"}, scale=NS, of=P),
    _f("DCGM_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN_NS", "counter",
       "Throttling to keep GPU and memory temperatures under their maximum (in ns).", INT,
       _CLOCK_NS, {"reason": "sw_thermal_slowdown"}, scale=NS, of=P),
    _f("DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS", "counter",
       "Throttling due to temperature being too high (in ns).", INT,
       _CLOCK_NS, {"reason": "hw_thermal_slowdown"}, scale=NS, of=P),
    _f("DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN_NS", "counter",
       "Throttling due to external power brake assertion trigger (in ns).", INT,
       _CLOCK_NS, {"reason": "hw_power_brake_slowdown"}, scale=NS, of=P),
)  # fmt: skip

BY_NAME: Mapping[str, CompatField] = {field.name: field for field in FIELDS}
# By DCGM field id, what a counters file's name resolves to (the clock-event bitmask's two
# names compute the same value; the first row of an id is the one named in messages).
BY_ID: Mapping[int, CompatField] = {field.field_id: field for field in reversed(FIELDS)}
# The output without a counters file.
DEFAULT_FIELDS = tuple(field for field in FIELDS if field.default)
# The native counters whose per-second rates compat families carry (DCGM's own rates).
RATE_FAMILIES = tuple(dict.fromkeys(field.native for field in FIELDS if field.rate))
# Every native family a compat value is computed from (a derived field names its own).
NATIVE_FAMILIES = frozenset(
    {field.native for field in FIELDS}
    | {"gpu_clock_event_active", "gpu_pcie_throughput_bytes_per_second"}
)

# dcgm-exporter's default counter files name these; what this output cannot give, and why.
NOT_CARRIED: Mapping[str, str] = {
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "vGPU guests only; the daemon reads no vGPU state",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0": "per-link byte counters are not read (totals are)",
    "DCGM_FI_PROF_PIPE_TENSOR_DMMA_ACTIVE": "reserved in DCGM's fields; no counter file has it",
    "DCGM_EXP_XID_ERRORS_COUNT": "dcgm-exporter's own windowed count: "
    "`increase(gpu_xid_errors_total[5m])` gives it",
    "DCGM_EXP_CLOCK_EVENTS_COUNT": "dcgm-exporter's own count of samples per bit: "
    "`gpu_clock_event_seconds_total` measures the time instead",
    "DCGM_EXP_GPU_HEALTH_STATUS": "dcgm-exporter's health-check status; `gpu_up` and the "
    "shipped health alerts answer it",
    "DCGM_EXP_P2P_STATUS": "its status enum has no NVML equivalent; `gpu_p2p_supported` "
    "carries the capability",
}


@dataclass(frozen=True)
class LabelField:
    """A DCGM string field a counters file's `label` row turns into a label on every series
    (dcgm-exporter's "Labels"), copied from the GPU's `gpu_info` label `info`."""

    name: str
    field_id: int
    info: str
    default: bool = True  # a label without a counters file too


def _label(name: str, info: str, default: bool = True) -> LabelField:
    return LabelField(name, FIELD_IDS[name], info, default)


LABEL_FIELDS: tuple[LabelField, ...] = (
    _label("DCGM_FI_DRIVER_VERSION", "driver_version"),
    _label("DCGM_FI_DEV_NAME", "model", default=False),
)
LABELS_BY_ID: Mapping[int, LabelField] = {label.field_id: label for label in LABEL_FIELDS}
DEFAULT_LABELS = tuple(label for label in LABEL_FIELDS if label.default)


_ON_MIG = {
    Of.ENTITY: "each GPU instance's own",
    Of.PARENT: "the GPU's, on each GPU instance",
    Of.PARENT_ONCE: "the GPU's, once (no `GPU_I_*`)",
}


def markdown_table() -> str:
    """The migration guide's mapping (docs/migrating-from-dcgm-exporter.md, drift-tested)."""
    rows = [
        "| dcgm-exporter family | DCGM id | type | printed | without a file | on a MIG GPU "
        "| computed from | other names a file may use |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for field in FIELDS:
        printed = "`%d`" if field.integer else "`%f`"
        rows.append(
            f"| `{field.name}` | {field.field_id} | {field.type} | {printed} "
            f"| {'yes' if field.default else 'no'} | {_ON_MIG[field.of]} | {field.mapping()} "
            f"| {_other_names(field.name, field.field_id)} |"
        )
    rows += [
        "",
        "| label row | DCGM id | without a file | value |",
        "|---|---|---|---|",
    ]
    rows += [
        f"| `{label.name}` | {label.field_id} | {'yes' if label.default else 'no'} "
        f"| `gpu_info{{{label.info}}}` |"
        for label in LABEL_FIELDS
    ]
    rows += ["", "| not carried | why |", "|---|---|"]
    rows += [f"| `{name}` | {why} |" for name, why in NOT_CARRIED.items()]
    return "\n".join(rows)


def _other_names(name: str, field_id: int) -> str:
    """The names dcgm-exporter 4.8 also accepts for the field (older aliases, 1.x names)
    that are not rows of their own here."""
    from gpu_exporter.model.dcgm_field_names import DCGM_EXPORTER_4_8

    others = [
        f"`{other}`"
        for other, number in DCGM_EXPORTER_4_8.items()
        if number == field_id and other != name and other not in BY_NAME
    ]
    return ", ".join(sorted(others)) or "—"


if __name__ == "__main__":  # pragma: no cover - regenerates the migration guide's table
    sys.stdout.write(markdown_table() + "\n")
