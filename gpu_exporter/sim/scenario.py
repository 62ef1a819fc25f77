"""Scenario files for the fake NVML and libdcgm: load, validate, evaluate (docs/scenarios.md).

A scenario is parsed into frozen dataclasses. Every device ends up with a complete
`values` table (one `ValueSpec` per quantity, defaults filled in), so the fake never has to
guess. Validation errors name the file, the field path and the YAML line.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypedDict

from gpu_exporter.collect.nvml.device_config import COMPUTE_MODE_NAMES
from gpu_exporter.model import nvml_facts as facts
from gpu_exporter.sim.mig import MigSpec, parse_mig
from gpu_exporter.support.yamlfile import YamlFileError, format_path, load_yaml, load_yaml_file

__all__ = [
    "ARCHITECTURES",
    "CLOCK_EVENT_REASONS",
    "DCGM_HOST_ENGINE_PORT",
    "FEATURES",
    "MAX_DEVICES",
    "NO_DEVICE",
    "QUANTITIES",
    "DcgmSpec",
    "DeviceSpec",
    "DriverSpec",
    "FaultSpec",
    "LatencySpec",
    "PodSpec",
    "Scenario",
    "ScenarioError",
    "TopologyGroup",
    "ValueSpec",
    "builtin_path",
    "builtin_scenarios",
    "load_scenario",
    "normalize_bus_id",
    "normalize_dcgm_address",
]

GIB = 1024**3
MIB = 1024**2

# Names as the exporter reports them (gpu_info's `architecture`, the `reason` label); values
# are NVML's constants. Defined once in `gpu_exporter.model.nvml_facts`; the fake returns these
# numbers, and tests/test_nvml_facts.py checks them against pynvml's own.
ARCHITECTURES: Mapping[str, int] = facts.ARCHITECTURES  # release order
_ARCH_RANK = {name: rank for rank, name in enumerate(ARCHITECTURES)}

# Every reason pynvml knows, the two it alone defines included (a scenario may set them).
CLOCK_EVENT_REASONS: Mapping[str, int] = MappingProxyType(
    {reason.name: reason.bit for reason in facts.ALL_CLOCK_EVENT_REASONS}
)

FEATURES: frozenset[str] = frozenset(
    {
        "utilization",
        "encoder",
        "decoder",
        "memory_v2",
        "power",
        "power_limit",
        "energy",
        "temperature",
        "memory_temperature",
        "clocks",
        "clock_event_reasons",
        "throttle_time",
        "pcie_throughput",
        "pcie_counters",
        "pcie_link",
        "pcie_replay",
        "nvlink",
        "ecc",
        "retired_pages",
        "remapped_rows",
        "gpm",
        "events",
        "numa",
        "topology",
        "applications_clocks",
    }
)

# nvmlComputeMode_t (nvml.h): the scenario's names for NVML_COMPUTEMODE_*, the reader's names.
COMPUTE_MODES: Mapping[str, int] = MappingProxyType(
    {name: mode for mode, name in COMPUTE_MODE_NAMES.items()}
)

TOPOLOGY_LEVELS: dict[str, int] = {
    "internal": 0,
    "single": 10,
    "multiple": 20,
    "hostbridge": 30,
    "node": 40,
    "system": 50,
}

_DEFAULT_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "kepler": (3, 5),
    "maxwell": (5, 2),
    "pascal": (6, 0),
    "volta": (7, 0),
    "turing": (7, 5),
    "ampere": (8, 0),
    "ada": (8, 9),
    "hopper": (9, 0),
    "blackwell": (10, 0),
}

# NVML_NVLINK_VERSION_* per architecture (no NVLink before pascal).
_DEFAULT_NVLINK_VERSION: dict[str, int] = {
    "pascal": 1,
    "volta": 2,
    "turing": 3,
    "ampere": 4,
    "ada": 4,
    "hopper": 6,
    "blackwell": 7,
}


@dataclass(frozen=True)
class _Model:
    architecture: str
    pci_device_id: int
    memory_total_bytes: int
    power_limit_watts: float
    max_clocks_mhz: dict[str, int]
    pcie_generation: int
    nvlink_links: int
    ecc: bool = True


# Known boards: picked so that `model:` alone gives a realistic device.
_MODELS: dict[str, _Model] = {
    "NVIDIA H200": _Model(
        "hopper", 0x233510DE, 150754820096, 700,
        {"graphics": 1980, "sm": 1980, "memory": 3201, "video": 1965}, 5, 18,
    ),
    "NVIDIA H100 80GB HBM3": _Model(
        "hopper", 0x233010DE, 85520809984, 700,
        {"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1755}, 5, 18,
    ),
    "NVIDIA A100-SXM4-80GB": _Model(
        "ampere", 0x20B210DE, 85899345920, 400,
        {"graphics": 1410, "sm": 1410, "memory": 1593, "video": 1290}, 4, 12,
    ),
    "NVIDIA GeForce RTX 4090": _Model(
        "ada", 0x268410DE, 25757220864, 450,
        {"graphics": 3105, "sm": 3105, "memory": 10501, "video": 2415}, 4, 0, ecc=False,
    ),
}  # fmt: skip

_GENERIC_MODEL = _Model(
    "hopper",
    0x000010DE,
    80 * GIB,
    300,
    {"graphics": 1500, "sm": 1500, "memory": 1500, "video": 1400},
    4,
    0,
)

# Bus numbers of an 8-GPU HGX board; more devices continue past the last one.
_DEFAULT_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


@dataclass(frozen=True)
class _Quantity:
    lo: float | None  # clamp bounds applied after noise
    hi: float | None
    fallback: str | None = None  # quantity whose spec is reused when this one is absent


_RATIO = _Quantity(0.0, 1.0)
_NONNEG = _Quantity(0.0, None)
_TEMP = _Quantity(-40.0, 150.0)

QUANTITIES: dict[str, _Quantity] = {
    "utilization": _RATIO,
    "memory_utilization": _Quantity(0.0, 1.0, fallback="dram_active"),
    "encoder_utilization": _RATIO,
    "decoder_utilization": _RATIO,
    "memory_used_bytes": _NONNEG,
    "power_watts": _NONNEG,
    "temperature_celsius": _TEMP,
    "memory_temperature_celsius": _Quantity(-40.0, 150.0, fallback="temperature_celsius"),
    "sm_clock_mhz": _NONNEG,
    "memory_clock_mhz": _NONNEG,
    "graphics_clock_mhz": _Quantity(0.0, None, fallback="sm_clock_mhz"),
    "clock_event_reasons": _NONNEG,
    "sm_active": _RATIO,
    "sm_occupancy": _RATIO,
    "tensor_active": _RATIO,
    # The IMMA and DFMA tensor pipes' share of it (GPM); HMMA is the rest of tensor_active.
    "tensor_imma_active": _RATIO,
    "tensor_dfma_active": _RATIO,
    "dram_active": _RATIO,
    "graphics_active": _Quantity(0.0, 1.0, fallback="utilization"),
    "fp64_active": _RATIO,
    "fp32_active": _RATIO,
    "fp16_active": _RATIO,
    "int_active": _RATIO,
    "pcie_tx_bytes_per_second": _NONNEG,
    "pcie_rx_bytes_per_second": _NONNEG,
    "nvlink_tx_bytes_per_second": _NONNEG,
    "nvlink_rx_bytes_per_second": _NONNEG,
    "pcie_generation": _NONNEG,
    "pcie_width": _NONNEG,
    "ecc_corrected_total": _NONNEG,
    "ecc_uncorrected_total": _NONNEG,
    # Lifetime (InfoROM) counts; unset: the same as since the driver loaded.
    "ecc_corrected_aggregate_total": _Quantity(0.0, None, fallback="ecc_corrected_total"),
    "ecc_uncorrected_aggregate_total": _Quantity(0.0, None, fallback="ecc_uncorrected_total"),
    "pcie_replay_total": _NONNEG,
    "nvlink_crc_flit_errors_total": _NONNEG,  # summed over links, as NVML's *_TOTAL fields
    "nvlink_crc_data_errors_total": _NONNEG,
    "nvlink_replay_errors_total": _NONNEG,
    "nvlink_recovery_errors_total": _NONNEG,
    "remapped_rows_correctable": _NONNEG,
    "remapped_rows_uncorrectable": _NONNEG,
    "row_remap_pending": _Quantity(0.0, 1.0),
    "row_remap_failure": _Quantity(0.0, 1.0),
    "retired_pages_sbe": _NONNEG,
    "retired_pages_dbe": _NONNEG,
    "retired_pages_pending": _Quantity(0.0, 1.0),
}


# At most this many GPUs in one scenario: each costs the simulator about 9 KiB and 0.5 ms to build
# (and the daemon a reader thread); 1024 is 16 times the largest node benchmarked (64 GPUs).
MAX_DEVICES = 1024


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message names file, field path and line."""


# ---------------------------------------------------------------------------------------------
# Value specs


@dataclass(frozen=True)
class ValueSpec:
    """One time-varying quantity. `value_at(t)` is pure: same t, same value."""

    kind: str  # constant | steps | ramp | pattern | sine
    constant: float = 0.0
    points: tuple[tuple[float, float], ...] = ()  # (time or duration, value)
    sine: tuple[float, float, float] = (0.0, 0.0, 1.0)  # mean, amplitude, period
    noise: float = 0.0
    lo: float | None = None
    hi: float | None = None
    noise_key: str = ""  # "seed:device:quantity", so noise differs per series

    @property
    def is_constant(self) -> bool:
        """True when the value never changes, so integrals are exact products."""
        return self.kind == "constant" and self.noise == 0.0

    def value_at(self, t: float) -> float:
        v = self._base(t)
        if self.noise:
            v += self.noise * _unit_noise(self.noise_key, t)
        if self.lo is not None:
            v = max(self.lo, v)
        if self.hi is not None:
            v = min(self.hi, v)
        return v

    def _base(self, t: float) -> float:
        if self.kind == "constant":
            return self.constant
        if self.kind == "steps":
            return _steps_at(self.points, t)
        if self.kind == "ramp":
            return _ramp_at(self.points, t)
        if self.kind == "pattern":
            return _pattern_at(self.points, t)
        mean, amplitude, period = self.sine
        return mean + amplitude * math.sin(2.0 * math.pi * t / period)


def _unit_noise(key: str, t: float) -> float:
    """Deterministic uniform noise in [-1, 1), constant over 100 ms slots."""
    digest = hashlib.blake2b(f"{key}:{math.floor(t * 10)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**63 - 1.0


def _steps_at(points: tuple[tuple[float, float], ...], t: float) -> float:
    value = points[0][1]
    for start, v in points:
        if t < start:
            break
        value = v
    return value


def _ramp_at(points: tuple[tuple[float, float], ...], t: float) -> float:
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t < t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def _pattern_at(points: tuple[tuple[float, float], ...], t: float) -> float:
    total = sum(d for d, _ in points)
    offset = t % total
    for duration, v in points:
        if offset < duration:
            return v
        offset -= duration
    return points[-1][1]


# ---------------------------------------------------------------------------------------------
# Scenario objects


def mig_capable(architecture: str) -> bool:
    """A100/A30 (Ampere) and Hopper and newer data-center GPUs have MIG; Ada and older do not."""
    return _ARCH_RANK[architecture] >= _ARCH_RANK["ampere"] and architecture != "ada"


@dataclass(frozen=True)
class DriverSpec:
    version: str = "570.124.06"
    nvml_version: str = "12.570.124.06"
    cuda_version: int = 12080
    missing_functions: frozenset[str] = frozenset()
    unsupported_fields: frozenset[int] = frozenset()


@dataclass(frozen=True)
class LatencySpec:
    default_ms: float = 0.0
    functions: Mapping[str, float] = field(default_factory=dict)

    def seconds(self, function: str) -> float:
        return self.functions.get(function, self.default_ms) / 1000.0


@dataclass(frozen=True)
class DeviceSpec:
    index: int
    label: str
    model: str
    architecture: str
    compute_capability: tuple[int, int]
    uuid: str
    serial: str
    pci_bus_id: str  # "00000000:18:00.0"
    pci_device_id: int
    vbios_version: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    power_limit_watts: float  # enforced
    power_management_limit_watts: float  # set by the administrator: >= the enforced one
    power_default_limit_watts: float  # the board's default management limit
    power_limit_range_watts: tuple[float, float]  # the management limit's (min, max)
    max_clocks_mhz: Mapping[str, int]  # graphics, sm, memory, video
    pcie_max_generation: int
    pcie_max_width: int
    pcie_gpu_max_generation: int
    nvlink_links: int
    nvlink_version: int
    ecc: bool
    ecc_pending: bool  # ECC mode after the next reboot (nvmlDeviceGetEccMode's pending)
    numa_node: int
    cpus: tuple[int, ...]
    persistence_mode: bool
    performance_state: int
    application_clocks_mhz: Mapping[str, int]  # sm, memory
    default_application_clocks_mhz: Mapping[str, int]  # sm, memory
    compute_mode: str  # a COMPUTE_MODES name
    unsupported: frozenset[str]
    values: Mapping[str, ValueSpec]
    mig: MigSpec | None = None  # None: MIG disabled (on GPUs that have it)

    @property
    def mig_capable(self) -> bool:
        return mig_capable(self.architecture)

    @property
    def mig_enabled(self) -> bool:
        return self.mig is not None and self.mig.enabled

    @property
    def arch_code(self) -> int:
        return ARCHITECTURES[self.architecture]

    def at_least(self, architecture: str) -> bool:
        return _ARCH_RANK[self.architecture] >= _ARCH_RANK[architecture]

    def supports(self, feature: str) -> bool:
        """Feature support after the architecture rules (docs/scenarios.md)."""
        if feature in self.unsupported:
            return False
        if feature == "gpm":
            return self.at_least("hopper")
        if feature == "remapped_rows":
            return self.at_least("ampere")
        if feature == "nvlink":
            return self.nvlink_links > 0
        return True

    def value(self, quantity: str, t: float) -> float:
        return self.values[quantity].value_at(t)


# `FaultSpec.device` of a fault of the whole node (its DCGM host engine), not of one GPU.
NO_DEVICE = -1


@dataclass(frozen=True)
class FaultSpec:
    # xid | gpu_lost | hang | no_permission | gpm_nan (NVML);
    # dcgm_down | dcgm_blank | dcgm_paused | dcgm_hang (DCGM)
    kind: str
    at: float
    device: int  # NO_DEVICE for dcgm_down, dcgm_paused, dcgm_hang
    xid: int = 0
    until: float | None = None
    function: str = ""
    duration: float = 0.0
    metric: int = 0
    field: int = 0  # dcgm_blank: the DCGM field id

    def active(self, t: float) -> bool:
        """Inside [at, until) (or [at, at + duration) for hang and dcgm_hang)."""
        end = self.at + self.duration if self.kind in _TIMED_KINDS else self.until
        return t >= self.at and (end is None or t < end)


_TIMED_KINDS = frozenset({"hang", "dcgm_hang"})

# DCGM_HE_PORT_NUMBER (DCGM dcgm_structs.h): nv-hostengine's port when an address names none.
DCGM_HOST_ENGINE_PORT = 5555


@dataclass(frozen=True)
class DcgmSpec:
    """The node's DCGM: its libdcgm and nv-hostengine (docs/scenarios.md, "DCGM")."""

    host_engine_running: bool = True  # False: no nv-hostengine at all
    address: str | None = None  # normalized (normalize_dcgm_address); None: any address
    profiling_module_loaded: bool = True
    embedded_requires_root: bool = False
    connect_params_versions: frozenset[int] = frozenset({1, 2})
    missing_functions: frozenset[str] = frozenset()


def normalize_dcgm_address(text: str, unix_socket: bool = False) -> str | None:
    """A dcgmConnect_v2 address as compared: 'host' -> 'host:5555', 'host:port' as is, a unix
    socket path as is; None when it is none of these."""
    if unix_socket:
        return text or None
    host, colon, port = text.rpartition(":")
    if not colon:
        host, port = text, str(DCGM_HOST_ENGINE_PORT)
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535 or ":" in host:
        return None
    return f"{host}:{int(port)}"


@dataclass(frozen=True)
class TopologyGroup:
    gpus: tuple[int, ...]
    level: int  # NVML_TOPOLOGY_*


@dataclass(frozen=True)
class PodSpec:
    """One device a pod's container holds, as the kubelet's PodResources List() reports it."""

    namespace: str
    pod: str
    container: str
    resource: str  # nvidia.com/gpu, nvidia.com/mig-<profile>
    device_id: str  # the device plugin's id: GPU or MIG UUID, `::<n>` for a time-slice replica
    start: float = 0.0  # `from`: scenario seconds at which the kubelet starts reporting it
    until: float | None = None  # `until`: when it stops (None: for the rest of the run)

    def active(self, t: float) -> bool:
        """Inside [from, until): the kubelet reports this pod at scenario time `t`."""
        return t >= self.start and (self.until is None or t < self.until)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    source: str
    seed: int
    driver: DriverSpec
    latency: LatencySpec
    devices: tuple[DeviceSpec, ...]
    faults: tuple[FaultSpec, ...]
    topology: tuple[TopologyGroup, ...]
    pods: tuple[PodSpec, ...] = ()
    dcgm: DcgmSpec | None = None  # None: no DCGM on this node (no libdcgm)

    def topology_level(self, a: int, b: int) -> int:
        """PCIe common-ancestor level of two GPUs: explicit groups, else by NUMA node."""
        if a == b:
            return TOPOLOGY_LEVELS["internal"]
        for group in self.topology:
            if a in group.gpus and b in group.gpus:
                return group.level
        same_node = self.devices[a].numa_node == self.devices[b].numa_node
        return TOPOLOGY_LEVELS["node" if same_node else "system"]


# ---------------------------------------------------------------------------------------------
# Loading: YAML nodes -> plain data + line table -> validated objects

_Path = tuple[str | int, ...]


class _Ctx:
    def __init__(self, source: str, lines: dict[_Path, int]) -> None:
        self.source = source
        self.lines = lines

    def error(self, path: _Path, message: str) -> ScenarioError:
        line = self.lines.get(path)
        where = f"{self.source}:{line}" if line else self.source
        return ScenarioError(f"{where}: {format_path(path)}: {message}")


_YAML12_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


class _Node:
    """A value from the scenario with the path it came from, for precise errors."""

    def __init__(self, ctx: _Ctx, value: Any, path: _Path) -> None:
        self.ctx, self.value, self.path = ctx, value, path

    def error(self, message: str) -> ScenarioError:
        return self.ctx.error(self.path, message)

    def child(self, key: str | int) -> _Node:
        return _Node(self.ctx, self.value[key], (*self.path, key))

    def mapping(
        self, allowed: frozenset[str] | set[str], required: tuple[str, ...] = ()
    ) -> dict[str, _Node]:
        if not isinstance(self.value, dict):
            raise self.error(f"expected a mapping, got {_kind(self.value)}")
        for key in self.value:
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                raise self.ctx.error((*self.path, key), f"unknown key {key!r} (known: {known})")
        for key in required:
            if key not in self.value:
                raise self.error(f"missing required key {key!r}")
        return {key: self.child(key) for key in self.value}

    def seq(self, *, nonempty: bool = False) -> list[_Node]:
        if not isinstance(self.value, list):
            raise self.error(f"expected a list, got {_kind(self.value)}")
        if nonempty and not self.value:
            raise self.error("expected a non-empty list")
        return [self.child(i) for i in range(len(self.value))]

    def number(self, *, lo: float | None = None, hi: float | None = None) -> float:
        v = self.value
        if isinstance(v, str) and _YAML12_FLOAT.fullmatch(v):
            v = float(v)  # PyYAML (YAML 1.1) reads `1.0e9` as a string; YAML 1.2 does not
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise self.error(f"expected a number, got {_kind(v)}")
        if lo is not None and v < lo:
            raise self.error(f"must be >= {lo:g}, got {v:g}")
        if hi is not None and v > hi:
            raise self.error(f"must be <= {hi:g}, got {v:g}")
        return float(v)

    def integer(self, *, lo: int | None = None, hi: int | None = None) -> int:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise self.error(f"expected an integer, got {_kind(self.value)}")
        self.number(lo=lo, hi=hi)
        return self.value

    def string(self) -> str:
        if not isinstance(self.value, str):
            raise self.error(f"expected a string, got {_kind(self.value)}")
        return self.value

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            raise self.error(f"expected true or false, got {_kind(self.value)}")
        return self.value

    def choice(self, options: Mapping[str, Any] | frozenset[str]) -> str:
        v = self.string()
        if v not in options:
            raise self.error(f"unknown value {v!r} (known: {', '.join(sorted(options))})")
        return v


def _kind(v: Any) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, bool):
        return f"boolean {v}"
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return f"{type(v).__name__} {v!r}"


_TOP_KEYS = frozenset(
    {
        "name",
        "description",
        "seed",
        "driver",
        "latency",
        "defaults",
        "devices",
        "faults",
        "topology",
        "pods",
        "dcgm",
    }
)
_DEVICE_KEYS = frozenset(
    {
        "label", "model", "architecture", "compute_capability", "uuid", "serial", "pci_bus_id",
        "pci_device_id", "vbios_version", "memory_total_bytes", "memory_reserved_bytes",
        "power_limit_watts", "power_management_limit_watts", "max_clocks_mhz", "pcie",
        "nvlink_links", "nvlink_version", "ecc", "numa_node", "cpus", "persistence_mode",
        "performance_state", "unsupported", "values", "mig", "power_default_limit_watts",
        "power_limit_range_watts", "ecc_pending", "application_clocks_mhz",
        "default_application_clocks_mhz", "compute_mode",
    }
)  # fmt: skip
# Mapping-valued device keys that `defaults` merges key by key instead of replacing.
_MERGED_KEYS = (
    "values", "max_clocks_mhz", "pcie", "application_clocks_mhz", "default_application_clocks_mhz"
)  # fmt: skip
_FAULT_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # kind: (required, optional) besides at/device/kind
    "xid": (("xid",), ()),
    "gpu_lost": ((), ("until",)),
    "hang": (("function", "duration"), ()),
    "no_permission": (("function",), ("until",)),
    "gpm_nan": (("metric",), ("until",)),
    "dcgm_down": ((), ("until",)),
    "dcgm_blank": (("field",), ("until",)),
    "dcgm_paused": ((), ("until",)),
    "dcgm_hang": (("function", "duration"), ()),
}
# Faults of the node's host engine: no `device`.
_NODE_FAULTS = frozenset({"dcgm_down", "dcgm_paused", "dcgm_hang"})
_DCGM_FAULTS = frozenset(kind for kind in _FAULT_FIELDS if kind.startswith("dcgm_"))
_DCGM_KEYS = frozenset(
    {"host_engine", "address", "profiling_module", "embedded", "connect_params_versions",
     "missing_functions"}
)  # fmt: skip


def _known_functions() -> frozenset[str]:
    # Imported here because fake_nvml imports this module.
    from gpu_exporter.sim.fake_nvml import implemented_functions

    return implemented_functions()


def _known_dcgm_functions() -> frozenset[str]:
    # Imported here because fake_dcgm imports this module.
    from gpu_exporter.sim.fake_dcgm import implemented_functions

    return implemented_functions()


def _served_dcgm_fields() -> frozenset[int]:
    from gpu_exporter.sim.fake_dcgm import served_fields

    return served_fields()


def _parse(data: Any, ctx: _Ctx) -> Scenario:
    root = _Node(ctx, data, ())
    top = root.mapping(_TOP_KEYS, required=("name", "devices"))
    name = top["name"].string()
    seed = top["seed"].integer() if "seed" in top else 0
    driver = _parse_driver(top.get("driver"))
    latency = _parse_latency(top.get("latency"))
    defaults = top["defaults"].mapping(_DEVICE_KEYS) if "defaults" in top else {}
    if isinstance(top["devices"].value, list) and len(top["devices"].value) > MAX_DEVICES:
        count = len(top["devices"].value)
        raise top["devices"].error(f"{count} GPUs, more than the {MAX_DEVICES} a scenario holds")
    entries = [_merge(defaults, node) for node in top["devices"].seq(nonempty=True)]
    devices = tuple(_parse_device(i, entry, name, seed) for i, entry in enumerate(entries))
    _refuse_shared_ids(devices, entries, top["devices"])
    dcgm = _parse_dcgm(top["dcgm"]) if "dcgm" in top else None
    fault_nodes = _opt_seq(top.get("faults"))
    faults = tuple(_parse_fault(n, len(devices)) for n in fault_nodes)
    _refuse_dcgm_faults_without_dcgm(faults, fault_nodes, dcgm)
    topology = tuple(_parse_topology(n, len(devices)) for n in _opt_seq(top.get("topology")))
    description = top["description"].string() if "description" in top else ""
    pods = tuple(_parse_pod(n, devices) for n in _opt_seq(top.get("pods")))
    return Scenario(
        name, description, ctx.source, seed, driver, latency, devices, faults, topology, pods, dcgm
    )


def _refuse_shared_ids(
    devices: tuple[DeviceSpec, ...], entries: list[dict[str, Any]], devices_node: _Node
) -> None:
    """Two GPUs with one UUID or bus id: NVML lookups by either would find only the first."""
    for key, what in (("uuid", "UUID"), ("pci_bus_id", "PCI bus id")):
        first: dict[str, int] = {}
        for device, entry in zip(devices, entries, strict=True):
            value = getattr(device, key)
            if value in first:
                node = entry.get(key) or devices_node.child(device.index)
                message = f"{what} {value!r} is also GPU {first[value]}'s"
                if node.path[0] == "defaults":
                    message += " (set in defaults, so every GPU shares it)"
                raise node.error(message)
            first[value] = device.index


def _opt_seq(node: _Node | None) -> list[_Node]:
    return [] if node is None or node.value is None else node.seq()


def _parse_driver(node: _Node | None) -> DriverSpec:
    if node is None:
        return DriverSpec()
    keys = node.mapping(
        {"version", "nvml_version", "cuda_version", "missing_functions", "unsupported_fields"}
    )
    known = _known_functions()
    missing = frozenset(n.choice(known) for n in _opt_seq(keys.get("missing_functions")))
    fields = frozenset(n.integer(lo=0) for n in _opt_seq(keys.get("unsupported_fields")))
    given: dict[str, Any] = {k: keys[k].string() for k in ("version", "nvml_version") if k in keys}
    if "cuda_version" in keys:
        given["cuda_version"] = keys["cuda_version"].integer(lo=0)
    return DriverSpec(missing_functions=missing, unsupported_fields=fields, **given)


def _parse_dcgm(node: _Node) -> DcgmSpec:
    keys = node.mapping(_DCGM_KEYS)

    def pick(key: str, options: tuple[str, str]) -> bool:
        """True for the first option (the default), False for the second."""
        return key not in keys or keys[key].choice(frozenset(options)) == options[0]

    address = None
    if "address" in keys:
        text = keys["address"].string()
        address = normalize_dcgm_address(text, unix_socket=text.startswith("/"))
        if address is None:
            raise keys["address"].error(
                f"expected host, host:port or a unix socket path (/...), got {text!r}"
            )
    versions = frozenset({1, 2})
    if "connect_params_versions" in keys:
        items = keys["connect_params_versions"].seq(nonempty=True)
        versions = frozenset(n.integer(lo=1, hi=255) for n in items)  # the version's top byte
    known = _known_dcgm_functions()
    missing = frozenset(n.choice(known) for n in _opt_seq(keys.get("missing_functions")))
    return DcgmSpec(
        host_engine_running=pick("host_engine", ("running", "absent")),
        address=address,
        profiling_module_loaded=pick("profiling_module", ("loaded", "missing")),
        embedded_requires_root=not pick("embedded", ("allowed", "requires_root")),
        connect_params_versions=versions,
        missing_functions=missing,
    )


def _refuse_dcgm_faults_without_dcgm(
    faults: tuple[FaultSpec, ...], nodes: list[_Node], dcgm: DcgmSpec | None
) -> None:
    """A DCGM fault on a node without DCGM would silently do nothing."""
    if dcgm is not None:
        return
    for fault, node in zip(faults, nodes, strict=True):
        if fault.kind in _DCGM_FAULTS:
            raise node.child("kind").error(f"{fault.kind} needs a top-level `dcgm:` section")


def _parse_latency(node: _Node | None) -> LatencySpec:
    if node is None:
        return LatencySpec()
    keys = node.mapping({"default_ms", "functions"})
    default_ms = keys["default_ms"].number(lo=0) if "default_ms" in keys else 0.0
    functions: dict[str, float] = {}
    if "functions" in keys:
        known = _known_functions()
        for fname, fnode in keys["functions"].mapping(known).items():
            functions[fname] = fnode.number(lo=0)
    return LatencySpec(default_ms, functions)


def _merge(defaults: dict[str, _Node], node: _Node) -> dict[str, _Node | dict[str, _Node]]:
    """Device entry over `defaults`; `values`, `max_clocks_mhz`, `pcie` merge key by key."""
    entry = node.mapping(_DEVICE_KEYS)
    merged: dict[str, _Node | dict[str, _Node]] = dict(defaults)
    merged.update(entry)
    for key in _MERGED_KEYS:
        parts = [d[key] for d in (defaults, entry) if key in d]
        if parts:
            merged[key] = {k: v for part in parts for k, v in _submapping(part, key).items()}
    return merged


def _submapping(node: _Node, key: str) -> dict[str, _Node]:
    if key == "values":
        return node.mapping(frozenset(QUANTITIES))
    if key == "pcie":
        return node.mapping({"max_generation", "max_width", "gpu_max_generation"})
    if key in ("application_clocks_mhz", "default_application_clocks_mhz"):
        return node.mapping({"sm", "memory"})
    return node.mapping({"graphics", "sm", "memory", "video"})


def _int_in(lo: int, hi: int | None = None) -> Callable[[_Node], int]:
    return lambda node: node.integer(lo=lo, hi=hi)


def _num_in(lo: float, hi: float | None = None) -> Callable[[_Node], float]:
    return lambda node: node.number(lo=lo, hi=hi)


def _parse_device(index: int, d: dict[str, Any], scenario_name: str, seed: int) -> DeviceSpec:
    def get(key: str, parse: Callable[[_Node], Any], default: Any) -> Any:
        return parse(d[key]) if key in d else default

    model = get("model", _Node.string, "NVIDIA H200")
    if "architecture" not in d and model not in _MODELS:
        raise d["model"].error(f"unknown model {model!r}: give `architecture` explicitly")
    known = _MODELS.get(model, _GENERIC_MODEL)
    arch = get("architecture", lambda n: n.choice(ARCHITECTURES), known.architecture)
    clocks = dict(known.max_clocks_mhz)
    clocks.update({name: node.integer(lo=1) for name, node in d.get("max_clocks_mhz", {}).items()})
    pcie = d.get("pcie", {})

    def pcie_get(key: str, parse: Callable[[_Node], int], default: int) -> int:
        return parse(pcie[key]) if key in pcie else default

    max_gen = pcie_get("max_generation", _int_in(1, 6), known.pcie_generation)
    max_width = pcie_get("max_width", _int_in(1, 32), 16)
    numa = get("numa_node", _int_in(0), index // 4)
    total = int(get("memory_total_bytes", _num_in(1), known.memory_total_bytes))
    fixed = {"sm_clock_mhz": clocks["sm"], "memory_clock_mhz": clocks["memory"]}
    fixed |= {"pcie_generation": max_gen, "pcie_width": max_width}
    # Each limit defaults to the other, the enforced one else to the model's. NVML enforces the
    # lowest of the management limit and the other limiters, so it is never above the former.
    management_limit = get("power_management_limit_watts", _num_in(1), None)
    power_limit = get("power_limit_watts", _num_in(1), management_limit or known.power_limit_watts)
    if management_limit is None:
        management_limit = power_limit
    elif management_limit < power_limit:
        raise d["power_management_limit_watts"].error(
            f"must be >= power_limit_watts ({power_limit:g}, the enforced limit), "
            f"got {management_limit:g}"
        )
    default_limit, limit_range = _power_limit_settings(d, management_limit)
    default_app = {"sm": clocks["sm"], "memory": clocks["memory"]}
    default_app |= _clock_pair(d.get("default_application_clocks_mhz", {}))
    app = default_app | _clock_pair(d.get("application_clocks_mhz", {}))
    ecc = get("ecc", _Node.boolean, known.ecc)
    mig = None
    if "mig" in d:
        if not mig_capable(arch):
            raise d["mig"].error(f"{arch} GPUs have no MIG (Ampere data-center GPUs and newer)")
        mig = parse_mig(
            d["mig"],
            model,
            f"{scenario_name}:{index}",
            lambda nodes, key: _parse_values(nodes, {}, f"{seed}:{key}"),
        )
    return DeviceSpec(
        index=index,
        label=get("label", _Node.string, f"gpu{index}"),
        model=model,
        architecture=arch,
        compute_capability=get("compute_capability", _pair, _DEFAULT_COMPUTE_CAPABILITY[arch]),
        uuid=get("uuid", _uuid_string, _default_uuid(scenario_name, index)),
        serial=get("serial", _Node.string, _default_serial(scenario_name, index)),
        pci_bus_id=get("pci_bus_id", _bus_id, _default_bus_id(index)),
        pci_device_id=get("pci_device_id", _int_in(0, 0xFFFFFFFF), known.pci_device_id),
        vbios_version=get("vbios_version", _Node.string, "96.00.99.00.01"),
        memory_total_bytes=total,
        memory_reserved_bytes=int(get("memory_reserved_bytes", _num_in(0, total), 480 * MIB)),
        power_limit_watts=power_limit,
        power_management_limit_watts=management_limit,
        power_default_limit_watts=default_limit,
        power_limit_range_watts=limit_range,
        max_clocks_mhz=clocks,
        pcie_max_generation=max_gen,
        pcie_max_width=max_width,
        pcie_gpu_max_generation=pcie_get("gpu_max_generation", _int_in(1, 6), max_gen),
        nvlink_links=get("nvlink_links", _int_in(0, 36), known.nvlink_links),
        nvlink_version=get("nvlink_version", _int_in(1, 8), _DEFAULT_NVLINK_VERSION.get(arch, 1)),
        ecc=ecc,
        ecc_pending=get("ecc_pending", _Node.boolean, ecc),
        numa_node=numa,
        cpus=get("cpus", _cpu_list, tuple(range(numa * 56, numa * 56 + 56))),
        persistence_mode=get("persistence_mode", _Node.boolean, True),
        performance_state=get("performance_state", _int_in(0, 15), 0),
        application_clocks_mhz=app,
        default_application_clocks_mhz=default_app,
        compute_mode=get("compute_mode", lambda n: n.choice(COMPUTE_MODES), "default"),
        unsupported=frozenset(n.choice(FEATURES) for n in _opt_seq(d.get("unsupported"))),
        values=_parse_values(d.get("values", {}), fixed, f"{seed}:{index}"),
        mig=mig,
    )


def _clock_pair(nodes: Mapping[str, _Node]) -> dict[str, int]:
    return {name: node.integer(lo=1) for name, node in nodes.items()}


def _power_limit_settings(
    d: dict[str, Any], management_limit: float
) -> tuple[float, tuple[float, float]]:
    """The default management limit (by default the one set: nothing changed) and the range
    a management limit may take (by default half the default up to the larger of the two;
    the half is assumed, boards differ). The set limit must lie in the range."""
    default = management_limit
    if "power_default_limit_watts" in d:
        default = d["power_default_limit_watts"].number(lo=1)
    if "power_limit_range_watts" in d:
        node = d["power_limit_range_watts"]
        items = node.seq()
        if len(items) != 2:
            raise node.error("expected [min, max] in watts")
        low, high = items[0].number(lo=1), items[1].number(lo=1)
        if low > high:
            raise node.error(f"min ({low:g}) must not exceed max ({high:g})")
    else:
        node, low, high = None, default / 2, max(default, management_limit)
    if not low <= management_limit <= high:
        keys = ("power_default_limit_watts", "power_management_limit_watts", "power_limit_watts")
        where = node or next((d[k] for k in keys if k in d), None)
        message = (
            f"the management limit {management_limit:g} W lies outside "
            f"power_limit_range_watts [{low:g}, {high:g}]"
        )
        if where is None:
            raise ValueError(message)
        raise where.error(message)
    return default, (low, high)


def _pair(node: _Node) -> tuple[int, int]:
    items = node.seq()
    if len(items) != 2:
        raise node.error("expected [major, minor]")
    return items[0].integer(lo=0), items[1].integer(lo=0)


def _uuid_string(node: _Node) -> str:
    v = node.string()
    if not v.startswith(("GPU-", "MIG-")):
        raise node.error("a GPU UUID starts with 'GPU-'")
    return v


def _default_uuid(scenario_name: str, index: int) -> str:
    h = hashlib.sha256(f"{scenario_name}:{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _default_serial(scenario_name: str, index: int) -> str:
    h = int(hashlib.sha256(f"serial:{scenario_name}:{index}".encode()).hexdigest(), 16)
    return f"165{h % 10**10:010d}"


def _default_bus_id(index: int) -> str:
    """The HGX buses, then bus 0xDC + index, carrying into the PCI domain past 0xFF (unique)."""
    domain, bus = divmod(
        _DEFAULT_BUSES[index] if index < len(_DEFAULT_BUSES) else 0xDC + index, 256
    )
    return f"{domain:08X}:{bus:02X}:00.0"


def normalize_bus_id(text: str) -> str | None:
    """'0000:18:00.0' / '18:00.0' / '00000000:18:00.0' -> NVML's '00000000:18:00.0'."""
    m = re.fullmatch(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])", text.lower())
    if m is None:
        return None
    domain, bus, device = (int(part or "0", 16) for part in m.groups()[:3])
    return f"{domain:08X}:{bus:02X}:{device:02X}.{m[4]}"


def _bus_id(node: _Node) -> str:
    normalized = normalize_bus_id(node.string())
    if normalized is None:
        raise node.error("expected a PCI bus id like '00000000:18:00.0'")
    return normalized


def _cpu_list(node: _Node) -> tuple[int, ...]:
    """'0-55,112-167' -> (0, ..., 55, 112, ..., 167)."""
    text = str(node.value) if isinstance(node.value, int) else node.string()
    cpus: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise node.error("expected a CPU list like '0-55,112-167'") from None
    return tuple(sorted(set(cpus)))


def _parse_values(
    nodes: dict[str, _Node], fixed: Mapping[str, float], key_prefix: str
) -> dict[str, ValueSpec]:
    specs = {name: _parse_spec(node, name, f"{key_prefix}:{name}") for name, node in nodes.items()}
    defaults = {"memory_used_bytes": 512 * MIB, "power_watts": 60.0, "temperature_celsius": 35.0}
    defaults |= fixed  # clocks at max, PCIe link at its maximum
    for name, q in QUANTITIES.items():
        if name in specs or q.fallback:
            continue
        specs[name] = ValueSpec("constant", constant=float(defaults.get(name, 0.0)))
    for name, q in QUANTITIES.items():
        if name not in specs and q.fallback:
            specs[name] = specs[q.fallback]
    return specs


_SPEC_KEYS = frozenset({"steps", "ramp", "pattern", "sine", "noise", "min", "max"})


class _SpecCommon(TypedDict):
    """The `ValueSpec` fields every non-constant form shares."""

    noise: float
    lo: float | None
    hi: float | None
    noise_key: str


def _parse_spec(node: _Node, quantity: str, noise_key: str) -> ValueSpec:
    q = QUANTITIES[quantity]
    reasons = quantity == "clock_event_reasons"
    point_value = _reason_mask if reasons else (lambda n: n.number(lo=q.lo, hi=q.hi))
    if not isinstance(node.value, dict):
        if reasons and not isinstance(node.value, list):
            raise node.error("expected a list of reason names or a steps/pattern mapping")
        return ValueSpec("constant", constant=point_value(node), lo=q.lo, hi=q.hi)
    keys = node.mapping(_SPEC_KEYS)
    forms = [k for k in ("steps", "ramp", "pattern", "sine") if k in keys]
    if len(forms) != 1:
        raise node.error("expected exactly one of steps, ramp, pattern, sine")
    form = forms[0]
    if reasons and (form not in ("steps", "pattern") or len(keys) > 1):
        raise node.error("clock_event_reasons takes only steps or pattern (no noise/min/max)")
    lo, hi = q.lo, q.hi
    if "min" in keys:
        lo = keys["min"].number() if lo is None else max(lo, keys["min"].number())
    if "max" in keys:
        hi = keys["max"].number() if hi is None else min(hi, keys["max"].number())
    noise = keys["noise"].number(lo=0) if "noise" in keys else 0.0
    common = _SpecCommon(noise=noise, lo=lo, hi=hi, noise_key=noise_key)
    if form == "sine":
        sine = keys["sine"].mapping(
            {"mean", "amplitude", "period"}, required=("mean", "amplitude", "period")
        )
        params = (sine["mean"].number(), sine["amplitude"].number(), sine["period"].number(lo=1e-3))
        return ValueSpec("sine", sine=params, **common)
    points = tuple(_point(n, point_value, form) for n in keys[form].seq(nonempty=True))
    if form != "pattern":
        for i, (prev, cur) in enumerate(itertools.pairwise(points), start=1):
            if cur[0] <= prev[0]:
                message = f"times must increase ({cur[0]:g} after {prev[0]:g})"
                raise keys[form].child(i).error(message)
    return ValueSpec(form, points=points, **common)


def _point(node: _Node, value: Callable[[_Node], float], form: str) -> tuple[float, float]:
    items = node.seq()
    first = "duration" if form == "pattern" else "time"
    if len(items) != 2:
        raise node.error(f"expected a [{first}, value] pair")
    t = items[0].number(lo=0)
    if form == "pattern" and t <= 0:
        raise items[0].error("a pattern duration must be > 0")
    return t, value(items[1])


def _reason_mask(node: _Node) -> float:
    mask = 0
    for item in node.seq():
        mask |= CLOCK_EVENT_REASONS[item.choice(CLOCK_EVENT_REASONS)]
    return float(mask)


def _parse_fault(node: _Node, count: int) -> FaultSpec:
    every = {"kind", "at", "device"} | {k for r, o in _FAULT_FIELDS.values() for k in (*r, *o)}
    kind = node.mapping(every, required=("kind",))["kind"].choice(frozenset(_FAULT_FIELDS))
    required, optional = _FAULT_FIELDS[kind]
    if kind not in _NODE_FAULTS:
        required = ("device", *required)
    keys = node.mapping({"kind", "at", *required, *optional}, required=("at", *required))
    at = keys["at"].number(lo=0)
    until = keys["until"].number(lo=at) if "until" in keys else None
    if until is not None and until <= at:
        raise keys["until"].error("`until` must be after `at`")
    duration = keys["duration"].number(lo=0) if "duration" in keys else 0.0
    if "duration" in keys and duration <= 0:
        raise keys["duration"].error("must be > 0")
    function = ""
    if "function" in keys:
        known = _known_dcgm_functions() if kind == "dcgm_hang" else _known_functions()
        function = keys["function"].choice(known)
    return FaultSpec(
        kind=kind,
        at=at,
        device=keys["device"].integer(lo=0, hi=count - 1) if "device" in keys else NO_DEVICE,
        xid=keys["xid"].integer(lo=0) if "xid" in keys else 0,
        until=until,
        function=function,
        duration=duration,
        metric=keys["metric"].integer(lo=1) if "metric" in keys else 0,
        field=_dcgm_field(keys["field"]) if "field" in keys else 0,
    )


def _dcgm_field(node: _Node) -> int:
    served = _served_dcgm_fields()
    field_id = node.integer(lo=0)
    if field_id not in served:
        known = ", ".join(map(str, sorted(served)))
        raise node.error(f"the fake libdcgm serves no field {field_id} (served: {known})")
    return field_id


_POD_KEYS = frozenset(
    {"namespace", "pod", "container", "resource", "gpu", "gpu_instance", "compute_instance",
     "replica", "from", "until"}
)  # fmt: skip


def _parse_pod(node: _Node, devices: tuple[DeviceSpec, ...]) -> PodSpec:
    """A pod holding a whole GPU (`gpu`) or one MIG device of it (`gpu_instance`, and
    `compute_instance` on a split GPU instance: the first instance entry with that id)."""
    keys = node.mapping(_POD_KEYS, required=("namespace", "pod", "gpu"))
    device = devices[keys["gpu"].integer(lo=0, hi=len(devices) - 1)]
    resource = "nvidia.com/gpu"
    if "gpu_instance" in keys:
        gi = keys["gpu_instance"].integer(lo=0)
        ci = keys["compute_instance"].integer(lo=0) if "compute_instance" in keys else 0
        entries = [i for i in (device.mig.instances if device.mig else ()) if i.gpu_instance == gi]
        if not entries:
            raise keys["gpu_instance"].error(f"GPU {device.index} has no GPU instance {gi}")
        if ci >= entries[0].compute_instances:
            raise keys["compute_instance" if "compute_instance" in keys else "gpu_instance"].error(
                f"GPU instance {gi} has {entries[0].compute_instances} compute instances"
            )
        device_id = entries[0].mig_uuids[ci]
        resource = f"nvidia.com/mig-{entries[0].compute_profile()}"  # the mixed strategy
    elif "compute_instance" in keys:
        raise keys["compute_instance"].error("`compute_instance` needs `gpu_instance`")
    else:
        device_id = device.uuid
    if "replica" in keys:
        device_id += f"::{keys['replica'].integer(lo=0)}"  # time-slicing's shares
    start = keys["from"].number(lo=0) if "from" in keys else 0.0
    until = keys["until"].number(lo=0) if "until" in keys else None
    if until is not None and until <= start:
        raise keys["until"].error("`until` must be after `from`")
    return PodSpec(
        namespace=keys["namespace"].string(),
        pod=keys["pod"].string(),
        container=keys["container"].string() if "container" in keys else "main",
        resource=keys["resource"].string() if "resource" in keys else resource,
        device_id=device_id,
        start=start,
        until=until,
    )


def _parse_topology(node: _Node, count: int) -> TopologyGroup:
    keys = node.mapping({"gpus", "level"}, required=("gpus", "level"))
    gpus = tuple(n.integer(lo=0, hi=count - 1) for n in keys["gpus"].seq(nonempty=True))
    return TopologyGroup(gpus, TOPOLOGY_LEVELS[keys["level"].choice(TOPOLOGY_LEVELS)])


# ---------------------------------------------------------------------------------------------
# Public entry points


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped in gpu_exporter/sim/scenarios/."""
    folder = resources.files("gpu_exporter.sim") / "scenarios"
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def builtin_path(name: str) -> Path:
    """The file of a built-in scenario (for tools and tests that derive their own from it)."""
    return Path(str(resources.files("gpu_exporter.sim") / "scenarios" / f"{name}.yaml"))


def load_scenario(name_or_path: str | Path | Mapping[str, Any]) -> Scenario:
    """Load a scenario from a mapping, a YAML file path, or a built-in name."""
    if isinstance(name_or_path, Mapping):
        return _parse(dict(name_or_path), _Ctx("<dict>", {}))
    path = Path(name_or_path)
    if isinstance(name_or_path, str) and not path.suffix and not path.exists():
        if name_or_path not in builtin_scenarios():
            known = ", ".join(builtin_scenarios())
            raise ScenarioError(
                f"{name_or_path}: no such scenario file or built-in (built-ins: {known})"
            )
        resource = resources.files("gpu_exporter.sim") / "scenarios" / f"{name_or_path}.yaml"
        return _load_text(resource.read_text(encoding="utf-8"), str(resource))
    try:
        located = load_yaml_file(
            path
        )  # bounded: size, depth, aliases (gpu_exporter.support.yamlfile)
    except YamlFileError as exc:
        raise ScenarioError(str(exc)) from None
    return _parse(located.data, _Ctx(located.filename, located.lines))


def _load_text(text: str, source: str) -> Scenario:
    try:
        located = load_yaml(text, source)
    except YamlFileError as exc:
        raise ScenarioError(str(exc)) from None
    return _parse(located.data, _Ctx(source, located.lines))
