"""What a scenario says (docs/scenarios.md): the models a scenario file is validated with, and
what the fake NVML, the fake libdcgm and the fake kubelet read.

Each mapping of the file is a frozen pydantic model whose fields are its keys (`from` is
`start`); a device's `pcie:` is read through `pcie_max_generation` and the like. What the file
leaves to be derived (a device's UUID from the scenario's name and the device's index, its
power limits from its model) is filled in by the model's own validator (`fields.settle`), and
every device ends up with a complete `values` table, so the fakes never guess.

What a model is checked against but cannot know by itself comes in the validation context,
which `sim.scenario.load_scenario` passes: the functions and fields the fakes implement (the
loader sits above both the models and the fakes, so nothing here imports a fake), and, since
the devices are validated before the faults, topology, pods and processes (field order), the
devices those look GPUs up in. A scenario's processes are modelled in `sim.processes`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ModelWrapValidatorHandler,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gpu_exporter.collect.nvml.device_config import COMPUTE_MODE_NAMES
from gpu_exporter.model import nvml_facts as facts
from gpu_exporter.sim import limits
from gpu_exporter.sim.dra import DRIVER, gpu_device_name, mig_device_name
from gpu_exporter.sim.fabric import FabricSpec
from gpu_exporter.sim.fields import (
    DeviceIndex,
    Flag,
    Info,
    Integer,
    OrNone,
    Seconds,
    Strict,
    Text,
    Until,
    choice,
    context_of,
    each,
    error,
    error_at,
    errors,
    int_in,
    integer,
    key_in,
    nested,
    nonempty,
    number,
    number_in,
    one_of,
    reworded,
    settle,
    string,
    until_after_from,
)
from gpu_exporter.sim.mig import MIG_PROFILES, MigSpec
from gpu_exporter.sim.processes import PID_MAX, PROC_FILES, ProcessSpec, validate_processes
from gpu_exporter.sim.values import GIB, MIB, QUANTITIES, ValueSpec, complete, value_table
from gpu_exporter.support.validation import kind_of
from gpu_exporter.support.yamlfile import Path_

__all__ = [
    "ARCHITECTURES",
    "COMPUTE_MODES",
    "DCGM_HOST_ENGINE_PORT",
    "FEATURES",
    "MAX_DEVICES",
    "NO_DEVICE",
    "TOPOLOGY_LEVELS",
    "DcgmSpec",
    "DeviceSpec",
    "DriverSpec",
    "FabricSpec",
    "FaultSpec",
    "LatencySpec",
    "PcieSpec",
    "PodSpec",
    "ProcessSpec",
    "Scenario",
    "TopologyGroup",
    "mig_capable",
    "normalize_bus_id",
    "normalize_dcgm_address",
]

# Names as the exporter reports them (gpu_info's `architecture`); values are NVML's constants.
# Defined once in `gpu_exporter.model.nvml_facts`; the fake returns these numbers, and
# tests/test_nvml_facts.py checks them against pynvml's own.
ARCHITECTURES: Mapping[str, int] = facts.ARCHITECTURES  # release order
_ARCH_RANK = {name: rank for rank, name in enumerate(ARCHITECTURES)}

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
        "process_utilization",
        "recovery_action",
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


# At most this many GPUs in one scenario: each costs the simulator about 9 KiB and 0.5 ms to build
# (and the daemon a reader thread); 1024 is 16 times the largest node benchmarked (64 GPUs).
MAX_DEVICES = 1024

# `FaultSpec.device` of a fault of the whole node (its DCGM host engine), not of one GPU.
NO_DEVICE = -1

# DCGM_HE_PORT_NUMBER (DCGM dcgm_structs.h): nv-hostengine's port when an address names none.
DCGM_HOST_ENGINE_PORT = 5555

# Mapping-valued device keys that `defaults` merges key by key instead of replacing.
_MERGED_KEYS = (
    "values", "max_clocks_mhz", "pcie", "application_clocks_mhz", "default_application_clocks_mhz"
)  # fmt: skip


def mig_capable(architecture: str) -> bool:
    """A100/A30 (Ampere) and Hopper and newer data-center GPUs have MIG; Ada and older do not."""
    return _ARCH_RANK[architecture] >= _ARCH_RANK["ampere"] and architecture != "ada"


# ---------------------------------------------------------------------------------------------
# Names checked against the context


def _nvml_function(value: Any, info: Info) -> str:
    return choice(value, context_of(info)["nvml_functions"])


def _dcgm_function(value: Any, info: Info) -> str:
    return choice(value, context_of(info)["dcgm_functions"])


def _dcgm_field(value: Any, info: Info) -> int:
    served: frozenset[int] = context_of(info)["dcgm_fields"]
    field_id = integer(value, lo=0)
    if field_id not in served:
        known = ", ".join(map(str, sorted(served)))
        raise error(f"the fake libdcgm serves no field {field_id} (served: {known})")
    return field_id


def _latency_function(value: Any, info: Info) -> str:
    known: frozenset[str] = context_of(info)["nvml_functions"]
    if value not in known:
        raise error(f"unknown key {value!r} (known: {', '.join(sorted(known))})")
    return str(value)


NvmlFunction = Annotated[str, PlainValidator(_nvml_function)]
DcgmFunction = Annotated[str, PlainValidator(_dcgm_function)]


# ---------------------------------------------------------------------------------------------
# Driver, latency, DCGM


class DriverSpec(Strict):
    version: Text = "570.124.06"
    nvml_version: Text = "12.570.124.06"
    cuda_version: Annotated[int, int_in(0, limits.C_INT)] = 12080
    missing_functions: Annotated[frozenset[NvmlFunction], OrNone] = frozenset()
    unsupported_fields: Annotated[frozenset[Annotated[int, int_in(0, limits.UINT)]], OrNone] = (
        frozenset()
    )
    # nvmlGpuFabricInfo_v<n> structs nvmlDeviceGetGpuFabricInfoV accepts (others answer
    # ARGUMENT_VERSION_MISMATCH): [2] is an older driver's, from before v3's healthSummary.
    fabric_info_versions: Annotated[frozenset[Annotated[int, int_in(2, 3)]], nonempty] = frozenset(
        {2, 3}
    )


_Milliseconds = Annotated[float, number_in(0, limits.LATENCY_MS)]


class LatencySpec(Strict):
    default_ms: _Milliseconds = 0.0
    functions: Mapping[Annotated[str, PlainValidator(_latency_function)], _Milliseconds] = Field(
        default_factory=dict
    )

    def seconds(self, function: str) -> float:
        return self.functions.get(function, self.default_ms) / 1000.0


def _either(true: str, false: str) -> PlainValidator:
    """A key written as one of two words, read as a boolean."""
    return PlainValidator(lambda value: choice(value, (true, false)) == true)


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


def _dcgm_address(value: Any) -> str:
    written = string(value)
    address = normalize_dcgm_address(written, unix_socket=written.startswith("/"))
    if address is None:
        raise error(f"expected host, host:port or a unix socket path (/...), got {written!r}")
    return address


class DcgmSpec(Strict):
    """The node's DCGM: its libdcgm and nv-hostengine (docs/scenarios.md, "DCGM")."""

    # running | absent: no nv-hostengine at all
    host_engine_running: Annotated[bool, _either("running", "absent")] = Field(
        default=True, alias="host_engine"
    )
    # normalized (normalize_dcgm_address); None: any address
    address: Annotated[str | None, PlainValidator(_dcgm_address)] = None
    profiling_module_loaded: Annotated[bool, _either("loaded", "missing")] = Field(
        default=True, alias="profiling_module"
    )
    embedded_requires_root: Annotated[bool, _either("requires_root", "allowed")] = Field(
        default=False, alias="embedded"
    )
    # visible: the host engine lists the MIG GPU instances (it runs as root); requires_root:
    # it lists none (DCGM reads MIG only as root), so none can be watched
    mig_visible: Annotated[bool, _either("visible", "requires_root")] = Field(
        default=True, alias="mig"
    )
    # dcgmConnectV2Params versions (the version's top byte) the host engine accepts
    connect_params_versions: Annotated[frozenset[Annotated[int, int_in(1, 255)]], nonempty] = (
        frozenset({1, 2})
    )
    missing_functions: Annotated[frozenset[DcgmFunction], OrNone] = frozenset()


# ---------------------------------------------------------------------------------------------
# Devices


def _length(count: int, message: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        # Not a list at all: pydantic's "expected a list".
        if isinstance(value, list) and len(value) != count:
            raise error(message)
        return value

    return BeforeValidator(check)


def _ordered(limits: tuple[float, float]) -> tuple[float, float]:
    low, high = limits
    if low > high:
        raise error(f"min ({low:g}) must not exceed max ({high:g})")
    return limits


def _uuid(value: Any) -> str:
    uuid = string(value)
    if not uuid.startswith(("GPU-", "MIG-")):
        raise error("a GPU UUID starts with 'GPU-'")
    return uuid


def normalize_bus_id(text: str) -> str | None:
    """'0000:18:00.0' / '18:00.0' / '00000000:18:00.0' -> NVML's '00000000:18:00.0'."""
    m = re.fullmatch(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])", text.lower())
    if m is None:
        return None
    domain, bus, device = (int(part or "0", 16) for part in m.groups()[:3])
    return f"{domain:08X}:{bus:02X}:{device:02X}.{m[4]}"


def _bus_id(value: Any) -> str:
    normalized = normalize_bus_id(string(value))
    if normalized is None:
        raise error("expected a PCI bus id like '00000000:18:00.0'")
    return normalized


def _cpu_list(value: Any) -> tuple[int, ...]:
    """'0-55,112-167' -> (0, ..., 55, 112, ..., 167)."""
    written = str(value) if isinstance(value, int) else string(value)
    cpus: list[int] = []
    for part in written.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise error("expected a CPU list like '0-55,112-167'") from None
        if max(first, last) > limits.CPU.value:  # checked before the range is made
            raise error(limits.CPU.problem(max(first, last)))
        cpus.extend(range(first, last + 1))
    return tuple(sorted(set(cpus)))


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


_Mhz = Annotated[int, int_in(1, limits.CLOCK_MHZ)]
_Clocks = Mapping[Annotated[str, key_in(("graphics", "sm", "memory", "video"))], _Mhz]
_ApplicationClocks = Mapping[Annotated[str, key_in(("sm", "memory"))], _Mhz]
_Watts = Annotated[float, number_in(1, limits.WATTS)]
_Bytes = Annotated[int, PlainValidator(lambda value: int(number(value, 1, limits.BYTES)))]


class PcieSpec(Strict):
    """A device's `pcie:` (read as `DeviceSpec.pcie_max_generation` and the like)."""

    max_generation: Annotated[int, int_in(1, 6)] = 0  # not given: the model's
    max_width: Annotated[int, int_in(1, 32)] = 16
    gpu_max_generation: Annotated[int, int_in(1, 6)] = 0  # not given: = max_generation


class DeviceSpec(Strict):
    """One GPU (docs/scenarios.md, "Devices"). A key marked "derived" that the file does not
    give is filled in by `_derive` from the model, the architecture or the index; the default
    written here only stands in until then."""

    label: Text = ""  # derived: gpu<index>
    # derived; validated before `model`, which an unknown model needs (_known_model)
    architecture: Annotated[str, one_of(ARCHITECTURES)] = ""
    model: Text = "NVIDIA H200"
    compute_capability: Annotated[
        tuple[Annotated[int, int_in(0, limits.C_INT)], Annotated[int, int_in(0, limits.C_INT)]],
        _length(2, "expected [major, minor]"),
    ] = (0, 0)  # derived
    uuid: Annotated[str, PlainValidator(_uuid)] = ""  # derived
    serial: Text = ""  # derived
    pci_bus_id: Annotated[str, PlainValidator(_bus_id)] = ""  # derived; "00000000:18:00.0"
    pci_device_id: Annotated[int, int_in(0, 0xFFFFFFFF)] = 0  # derived
    vbios_version: Text = "96.00.99.00.01"
    memory_total_bytes: _Bytes = 0  # derived
    memory_reserved_bytes: int = 480 * MIB
    power_limit_watts: _Watts = 0.0  # derived; enforced
    power_management_limit_watts: _Watts = 0.0  # derived; set by the administrator: >= enforced
    power_default_limit_watts: _Watts = 0.0  # derived; the board's default management limit
    power_limit_range_watts: Annotated[
        tuple[_Watts, _Watts],
        _length(2, "expected [min, max] in watts"),
        AfterValidator(_ordered),
    ] = (0.0, 0.0)  # derived; the management limit's (min, max)
    # derived: the model's, these over them; graphics, sm, memory, video
    max_clocks_mhz: _Clocks = Field(default_factory=dict)
    # derived: the max clocks' sm and memory, these over them
    application_clocks_mhz: _ApplicationClocks = Field(default_factory=dict)
    default_application_clocks_mhz: _ApplicationClocks = Field(default_factory=dict)
    pcie: PcieSpec = Field(default_factory=PcieSpec)
    nvlink_links: Annotated[int, int_in(0, 36)] = 0  # derived
    nvlink_version: Annotated[int, int_in(1, 8)] = 0  # derived
    ecc: Flag = True  # derived
    ecc_pending: Flag = True  # derived; ECC mode after the next reboot (GetEccMode's pending)
    numa_node: Annotated[int, int_in(0, limits.NUMA_NODE)] = 0  # derived
    cpus: Annotated[tuple[int, ...], PlainValidator(_cpu_list)] = ()  # derived
    persistence_mode: Flag = True
    performance_state: Annotated[int, int_in(0, 15)] = 0
    compute_mode: Annotated[str, one_of(COMPUTE_MODES)] = "default"
    unsupported: Annotated[frozenset[Annotated[str, one_of(FEATURES)]], OrNone] = frozenset()
    # derived: every quantity, these and defaults (values.complete)
    values: Annotated[Mapping[str, ValueSpec], value_table(QUANTITIES)] = Field(
        default_factory=dict
    )
    mig: MigSpec | None = None  # None: MIG disabled (on GPUs that have it)
    fabric: FabricSpec | None = None  # None: no NVLink fabric (the call answers NOT_SUPPORTED)

    if TYPE_CHECKING:  # set at validation, not written in the file
        index: int

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str, info: Info) -> str:
        # "": no architecture given (a bad one is reported where it is).
        if info.data.get("architecture") == "" and model not in _MODELS:
            raise error(f"unknown model {model!r}: give `architecture` explicitly")
        return model

    @field_validator("memory_reserved_bytes", mode="plain")
    @classmethod
    def _within_total(cls, value: Any, info: Info) -> int:
        total = info.data.get("memory_total_bytes")
        if total == 0 and "model" in info.data:
            total = _MODELS.get(info.data["model"], _GENERIC_MODEL).memory_total_bytes
        return int(number(value, lo=0, hi=total or None))

    @field_validator("mig", mode="plain")
    @classmethod
    def _mig(cls, value: Any, info: Info) -> MigSpec | None:
        model, architecture = info.data.get("model"), info.data.get("architecture")
        if model is None or architecture is None:
            return None  # a bad model or architecture is reported where it is
        architecture = architecture or _MODELS[model].architecture
        if not mig_capable(architecture):
            raise error(f"{architecture} GPUs have no MIG (Ampere data-center GPUs and newer)")
        profiles = MIG_PROFILES.get(model)
        if profiles is None:
            known = ", ".join(MIG_PROFILES)
            raise error(f"no MIG profiles known for model {model!r} (known: {known})")
        return nested(MigSpec, value, {**context_of(info), "mig_profiles": profiles})

    @field_validator("fabric", mode="plain")
    @classmethod
    def _fabric(cls, value: Any, info: Info) -> FabricSpec | None:
        if value is None:
            return None  # written empty: no fabric (a device's way out of `defaults`' one)
        model, architecture = info.data.get("model"), info.data.get("architecture")
        if model is not None and architecture is not None:  # else reported where they are
            architecture = architecture or _MODELS.get(model, _GENERIC_MODEL).architecture
            if _ARCH_RANK[architecture] < _ARCH_RANK["hopper"]:
                raise error(f"{architecture} GPUs have no fabric info (Hopper and newer)")
        return nested(FabricSpec, value, context_of(info))

    @model_validator(mode="after")
    def _derive(self, info: Info) -> DeviceSpec:
        """The keys the file leaves out, from the model, the architecture and the index."""
        context = context_of(info)
        index, name = context["index"], context["scenario"]
        given = self.model_fields_set
        known = _MODELS.get(self.model, _GENERIC_MODEL)
        arch = self.architecture or known.architecture
        clocks = {**known.max_clocks_mhz, **self.max_clocks_mhz}
        pcie_given = self.pcie.model_fields_set
        max_gen = (
            self.pcie.max_generation if "max_generation" in pcie_given else known.pcie_generation
        )
        gpu_max_gen = (
            self.pcie.gpu_max_generation if "gpu_max_generation" in pcie_given else max_gen
        )
        numa = self.numa_node if "numa_node" in given else index // 4
        ecc = self.ecc if "ecc" in given else known.ecc
        default_app = {"sm": clocks["sm"], "memory": clocks["memory"]}
        default_app |= self.default_application_clocks_mhz
        fixed = {"sm_clock_mhz": clocks["sm"], "memory_clock_mhz": clocks["memory"]}
        fixed |= {"pcie_generation": max_gen, "pcie_width": self.pcie.max_width}
        derived: dict[str, Any] = {
            "index": index,
            "label": f"gpu{index}",
            "architecture": arch,
            "compute_capability": _DEFAULT_COMPUTE_CAPABILITY[arch],
            "uuid": _default_uuid(name, index),
            "serial": _default_serial(name, index),
            "pci_bus_id": _default_bus_id(index),
            "pci_device_id": known.pci_device_id,
            "memory_total_bytes": known.memory_total_bytes,
            "nvlink_links": known.nvlink_links,
            "nvlink_version": _DEFAULT_NVLINK_VERSION.get(arch, 1),
            "ecc": ecc,
            "ecc_pending": ecc,
            "numa_node": numa,
            "cpus": tuple(range(numa * 56, numa * 56 + 56)),
        }
        settle(self, **{key: value for key, value in derived.items() if key not in given})
        settle(
            self,
            **self._power_limits(known),
            max_clocks_mhz=clocks,
            default_application_clocks_mhz=default_app,
            application_clocks_mhz={**default_app, **self.application_clocks_mhz},
            pcie=self.pcie.model_copy(
                update={"max_generation": max_gen, "gpu_max_generation": gpu_max_gen}
            ),
            values=complete(self.values, fixed),
        )
        return self

    def _power_limits(self, known: _Model) -> dict[str, Any]:
        """Each limit defaults to the other, the enforced one else to the model's. NVML enforces
        the lowest of the management limit and the other limiters, so it is never above the
        former. The default management limit is by default the one set (nothing changed), and
        the range a management limit may take by default half the default up to the larger of
        the two (the half is assumed, boards differ); the set limit must lie in the range."""
        given = self.model_fields_set
        management = (
            self.power_management_limit_watts if "power_management_limit_watts" in given else None
        )
        enforced = (
            self.power_limit_watts
            if "power_limit_watts" in given
            else (management or known.power_limit_watts)
        )
        if management is None:
            management = enforced
        elif management < enforced:
            raise error_at(
                ("power_management_limit_watts",),
                f"must be >= power_limit_watts ({enforced:g}, the enforced limit), "
                f"got {management:g}",
            )
        default = (
            self.power_default_limit_watts if "power_default_limit_watts" in given else management
        )
        if "power_limit_range_watts" in given:
            low, high = self.power_limit_range_watts
            where: str | None = "power_limit_range_watts"
        else:
            low, high = default / 2, max(default, management)
            keys = (
                "power_default_limit_watts",
                "power_management_limit_watts",
                "power_limit_watts",
            )
            where = next((key for key in keys if key in given), None)
        if not low <= management <= high:
            raise error_at(
                (where,) if where else (),
                f"the management limit {management:g} W lies outside "
                f"power_limit_range_watts [{low:g}, {high:g}]",
            )
        return {
            "power_limit_watts": enforced,
            "power_management_limit_watts": management,
            "power_default_limit_watts": default,
            "power_limit_range_watts": (low, high),
        }

    @property
    def pcie_max_generation(self) -> int:
        return self.pcie.max_generation

    @property
    def pcie_max_width(self) -> int:
        return self.pcie.max_width

    @property
    def pcie_gpu_max_generation(self) -> int:
        return self.pcie.gpu_max_generation

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
        if feature == "process_utilization":  # nvml.h: "For Maxwell or newer"
            return self.at_least("maxwell")
        if feature == "recovery_action":  # field 230: assumed Ampere and newer (not verified)
            return self.at_least("ampere")
        return True

    def value(self, quantity: str, t: float) -> float:
        return self.values[quantity].value_at(t)


# ---------------------------------------------------------------------------------------------
# Faults: one model per kind, chosen by `kind`


class FaultSpec(Strict):
    """A fault (docs/scenarios.md, "Faults"). Each kind is a subclass with the keys it takes;
    the attributes of the keys it does not take read as their defaults, so the fakes read any
    fault alike."""

    # xid | gpu_lost | hang | no_permission | gpm_nan | gpu_reset (NVML);
    # dcgm_down | dcgm_blank | dcgm_paused | dcgm_hang (DCGM);
    # proc_vanished | proc_unreadable (the fake /proc); cri_down | cri_hang | cri_garbage (CRI)
    kind: str
    at: Seconds

    if TYPE_CHECKING:  # a field of the kinds that take the key
        device: int  # NO_DEVICE for dcgm_down, dcgm_paused, dcgm_hang
        xid: int
        until: float | None
        function: str
        duration: float
        metric: int
        field: int  # dcgm_blank: the DCGM field id
        gpu_instance: int | None  # dcgm_blank: that GPU instance's value (None: the GPU's)
        pid: int  # proc_vanished, proc_unreadable: the process
        files: frozenset[str]  # proc_vanished, proc_unreadable: which of /proc/<pid>'s files

    @field_validator("until", check_fields=False)
    @classmethod
    def _after_at(cls, until: float | None, info: Info) -> float | None:
        at = info.data.get("at")
        if until is not None and at is not None:
            number(until, lo=at, hi=limits.SECONDS)
            if until <= at:
                raise error("`until` must be after `at`")
        return until

    @model_validator(mode="after")
    def _other_keys(self) -> FaultSpec:
        settle(
            self, **{k: v for k, v in _FAULT_DEFAULTS.items() if k not in type(self).model_fields}
        )
        return self

    def active(self, t: float) -> bool:
        """Inside [at, until) (or [at, at + duration) for hang and dcgm_hang)."""
        end = self.at + self.duration if self.kind in _TIMED_KINDS else self.until
        return t >= self.at and (end is None or t < end)


_FAULT_DEFAULTS: dict[str, Any] = {
    "device": NO_DEVICE, "xid": 0, "until": None, "function": "", "duration": 0.0, "metric": 0,
    "field": 0, "pid": 0, "files": frozenset(), "gpu_instance": None,
}  # fmt: skip
_TIMED_KINDS = frozenset({"hang", "dcgm_hang", "cri_hang"})


def _positive(value: Any) -> float:
    duration = number(value, lo=0, hi=limits.SECONDS)
    if duration <= 0:
        raise error("must be > 0")
    return duration


_Until = Annotated[float | None, number_in(hi=limits.SECONDS)]  # >= `at`: _after_at
_Duration = Annotated[float, PlainValidator(_positive)]
_DcgmField = Annotated[int, PlainValidator(_dcgm_field)]


class _Xid(FaultSpec):
    kind: Literal["xid"]
    device: DeviceIndex
    xid: Annotated[int, int_in(0, limits.EVENT_DATA)]


class _GpuLost(FaultSpec):
    kind: Literal["gpu_lost"]
    device: DeviceIndex
    until: _Until = None


class _Hang(FaultSpec):
    kind: Literal["hang"]
    device: DeviceIndex
    function: NvmlFunction
    duration: _Duration


class _NoPermission(FaultSpec):
    kind: Literal["no_permission"]
    device: DeviceIndex
    function: NvmlFunction
    until: _Until = None


class _GpmNan(FaultSpec):
    kind: Literal["gpm_nan"]
    device: DeviceIndex
    metric: Annotated[int, int_in(1, limits.C_INT)]
    until: _Until = None


class _GpuReset(FaultSpec):
    """The GPU is reset at `at` (nvidia-smi -r): volatile ECC counts restart from 0, a pending
    row remap or page retirement is applied, the recovery action is done, and XIDs from
    before it are no longer delivered (sim/fake_nvml.py)."""

    kind: Literal["gpu_reset"]
    device: DeviceIndex


# The node's host engine's faults: no `device`.
class _DcgmDown(FaultSpec):
    kind: Literal["dcgm_down"]
    until: _Until = None


class _DcgmBlank(FaultSpec):
    kind: Literal["dcgm_blank"]
    device: DeviceIndex
    field: _DcgmField
    gpu_instance: Annotated[int | None, int_in(0, 63)] = None
    until: _Until = None


class _DcgmPaused(FaultSpec):
    kind: Literal["dcgm_paused"]
    until: _Until = None


class _DcgmHang(FaultSpec):
    kind: Literal["dcgm_hang"]
    function: DcgmFunction
    duration: _Duration


# The fake /proc's faults: a process's entry, or some of its files, gone or unreadable.
_ProcFiles = Annotated[frozenset[Annotated[str, one_of(PROC_FILES)]], nonempty]


class _ProcVanished(FaultSpec):
    kind: Literal["proc_vanished"]
    pid: Annotated[int, int_in(1, PID_MAX)]
    files: _ProcFiles = frozenset(PROC_FILES)  # all: the whole /proc/<pid> is gone
    until: _Until = None


class _ProcUnreadable(FaultSpec):
    kind: Literal["proc_unreadable"]
    pid: Annotated[int, int_in(1, PID_MAX)]
    files: _ProcFiles = frozenset(PROC_FILES)
    until: _Until = None


# The fake CRI runtime's faults: the node's, no `device`.
class _CriDown(FaultSpec):
    kind: Literal["cri_down"]
    until: _Until = None


class _CriHang(FaultSpec):
    kind: Literal["cri_hang"]
    duration: _Duration


class _CriGarbage(FaultSpec):
    kind: Literal["cri_garbage"]
    until: _Until = None


_FAULT_KINDS: dict[str, type[FaultSpec]] = {
    "xid": _Xid,
    "gpu_lost": _GpuLost,
    "hang": _Hang,
    "no_permission": _NoPermission,
    "gpm_nan": _GpmNan,
    "gpu_reset": _GpuReset,
    "dcgm_down": _DcgmDown,
    "dcgm_blank": _DcgmBlank,
    "dcgm_paused": _DcgmPaused,
    "dcgm_hang": _DcgmHang,
    "proc_vanished": _ProcVanished,
    "proc_unreadable": _ProcUnreadable,
    "cri_down": _CriDown,
    "cri_hang": _CriHang,
    "cri_garbage": _CriGarbage,
}
_DCGM_FAULTS = frozenset(kind for kind in _FAULT_KINDS if kind.startswith("dcgm_"))
_PROCESS_FAULTS = frozenset(kind for kind in _FAULT_KINDS if kind.startswith(("proc_", "cri_")))


def _fault(value: Any, info: Info) -> FaultSpec:
    """The kind's model, validated on its own: its errors are worded with its own keys."""
    if not isinstance(value, dict):
        raise error(f"expected a mapping, got {kind_of(value)}")
    if "kind" not in value:
        raise error("missing required key 'kind'")
    try:
        kind = choice(value["kind"], _FAULT_KINDS)
    except PydanticCustomError as exc:
        raise error_at(("kind",), exc.message(), value["kind"]) from None
    return nested(_FAULT_KINDS[kind], value, context_of(info))


Fault = Annotated[FaultSpec, PlainValidator(_fault)]


# ---------------------------------------------------------------------------------------------
# Topology and pods


def _level(value: Any) -> int:
    return TOPOLOGY_LEVELS[choice(value, TOPOLOGY_LEVELS)]


class TopologyGroup(Strict):
    gpus: Annotated[tuple[DeviceIndex, ...], nonempty]
    level: Annotated[int, PlainValidator(_level)]  # NVML_TOPOLOGY_*


class PodClaimSpec(Strict):
    """`claim:` of a pod entry: the device came through a DRA ResourceClaim, so the kubelet
    reports it under `dynamic_resources` (claim and driver/pool/device) instead of `devices`."""

    name: Text  # the ResourceClaim object's name (a template's generated name)
    namespace: Text | None = None  # default: the pod's
    driver: Text = DRIVER
    pool: Text | None = None  # default: the scenario's dra.node_name (NVIDIA's pool is the node)
    # default: the device's DRA name (gpu_exporter/sim/dra.py); another name is a device that
    # no ResourceSlice publishes
    device: Text | None = None

    @field_validator("name", "namespace", "driver", "pool", "device")
    @classmethod
    def _written(cls, value: str | None) -> str | None:
        """An empty name would silently mean the default, or a claim nothing matches."""
        if value == "":
            raise error("expected a non-empty string")
        return value


class DraSpec(Strict):
    """`dra:`: the node's DRA driver, publishing one ResourceSlice of every GPU and MIG device
    live at the time (the fake API server, gpu_exporter/sim/apiserver.py)."""

    node_name: Text = "sim-node"  # the slices' spec.nodeName and pool
    # When the driver replaces its slice (a restart: the old one deleted, a new one under a new
    # name and pool generation added), in scenario seconds.
    republish: tuple[Seconds, ...] = ()

    @field_validator("node_name")
    @classmethod
    def _written(cls, value: str) -> str:
        """An empty pool would match no claim's device."""
        if not value:
            raise error("expected a non-empty string")
        return value


class PodSpec(Strict):
    """One device a pod's container holds, as the kubelet's PodResources List() reports it: a
    whole GPU (`gpu`) or one MIG device of it (`gpu_instance`, and `compute_instance` on a
    split GPU instance: the first instance entry with that id)."""

    namespace: Text
    pod: Text
    container: Text = "main"
    resource: Text = ""  # nvidia.com/gpu, nvidia.com/mig-<profile> (the mixed strategy)
    gpu: DeviceIndex
    gpu_instance: Annotated[int | None, int_in(lo=0)] = None
    compute_instance: Annotated[int | None, int_in(lo=0)] = None
    replica: Annotated[int | None, int_in(lo=0)] = None  # a time-slicing share
    claim: PodClaimSpec | None = None  # through DRA, not the device plugin
    # `from`: scenario seconds at which the kubelet starts reporting it
    start: Seconds = Field(default=0.0, alias="from")
    # `until`: when it stops (None: for the rest of the run)
    until: Until = None

    if TYPE_CHECKING:  # set at validation, not written in the file
        # the device plugin's id: GPU or MIG UUID, `::<n>` for a time-slice replica
        device_id: str
        # with `claim`: the DRA device name the kubelet reports (the claim's, else derived)
        dra_device: str

    _after_start = field_validator("until")(until_after_from)

    @model_validator(mode="after")
    def _device(self, info: Info) -> PodSpec:
        devices: tuple[DeviceSpec, ...] | None = context_of(info).get("devices")
        if devices is None:
            return self  # the devices' problems are reported
        device = devices[self.gpu]
        resource = "nvidia.com/gpu"
        if self.gpu_instance is not None:
            gi, ci = self.gpu_instance, self.compute_instance or 0
            instances = device.mig.instances if device.mig else ()
            entries = [i for i in instances if i.gpu_instance == gi]
            if not entries:
                raise error_at(("gpu_instance",), f"GPU {device.index} has no GPU instance {gi}")
            if ci >= entries[0].compute_instances:
                key = "compute_instance" if self.compute_instance is not None else "gpu_instance"
                raise error_at(
                    (key,),
                    f"GPU instance {gi} has {entries[0].compute_instances} compute instances",
                )
            device_id = entries[0].mig_uuids[ci]
            resource = f"nvidia.com/mig-{entries[0].compute_profile()}"  # the mixed strategy
            dra_device = mig_device_name(device.index, entries[0], ci)
        elif self.compute_instance is not None:
            raise error_at(("compute_instance",), "`compute_instance` needs `gpu_instance`")
        else:
            device_id = device.uuid
            dra_device = gpu_device_name(device.index)
        if self.replica is not None:
            device_id += f"::{self.replica}"  # time-slicing's shares
        settle(self, device_id=device_id)
        if self.claim is not None:
            # The kubelet reports a claim's device by its DRA name alone: a device plugin's
            # resource or time-slicing replica would be silently ignored.
            for key in ("resource", "replica"):
                if key in self.model_fields_set:
                    raise error_at((key,), f"`{key}` is the device plugin's; not with `claim`")
            settle(self, dra_device=self.claim.device or dra_device)
        if "resource" not in self.model_fields_set:
            settle(self, resource=resource)
        return self

    def active(self, t: float) -> bool:
        """Inside [from, until): the kubelet reports this pod at scenario time `t`."""
        return t >= self.start and (self.until is None or t < self.until)


# ---------------------------------------------------------------------------------------------
# The scenario


def _devices(value: Any, info: Info) -> tuple[DeviceSpec, ...]:
    if isinstance(value, list) and len(value) > MAX_DEVICES:
        raise error(f"{len(value)} GPUs, more than the {MAX_DEVICES} a scenario holds")
    if isinstance(value, list) and not value:
        raise error("expected a non-empty list")
    context = context_of(info)
    name, seed = info.data.get("name", ""), info.data.get("seed", 0)

    def position(index: int) -> dict[str, Any]:
        key = f"{name}:{index}"
        return {"index": index, "scenario": name, "seed": seed, "device_key": key,
                "noise_prefix": f"{seed}:{index}"}  # fmt: skip

    devices = each(DeviceSpec, value, context, position)
    context["devices"] = devices  # for the faults, topology and pods, validated next
    return devices


def _dcgm(value: Any, info: Info) -> DcgmSpec:
    return nested(DcgmSpec, value, context_of(info))


class Scenario(Strict):
    name: Text
    description: Text = ""
    seed: Integer = 0
    driver: DriverSpec = Field(default_factory=DriverSpec)
    latency: LatencySpec = Field(default_factory=LatencySpec)
    defaults: Mapping[Any, Any] = Field(default_factory=dict)  # merged under each device
    devices: Annotated[tuple[DeviceSpec, ...], PlainValidator(_devices)]
    dcgm: Annotated[DcgmSpec | None, PlainValidator(_dcgm)] = None  # None: no DCGM (no libdcgm)
    faults: Annotated[tuple[Fault, ...], OrNone] = ()
    topology: Annotated[tuple[TopologyGroup, ...], OrNone] = ()
    pods: Annotated[tuple[PodSpec, ...], OrNone] = ()
    dra: DraSpec | None = None  # None: no DRA driver (a default one when a pod has a claim)
    processes: Annotated[tuple[ProcessSpec, ...], PlainValidator(validate_processes)] = ()

    if TYPE_CHECKING:  # set at validation, not written in the file
        source: str  # the file, "<dict>" for a mapping

    @model_validator(mode="wrap")
    @classmethod
    def _load(cls, data: Any, handler: ModelWrapValidatorHandler[Scenario], info: Info) -> Scenario:
        """`defaults` goes under each device, and a problem in what a device took from it is
        reported where `defaults` says it; then the checks across devices and sections."""
        if not isinstance(data, dict):
            return handler(data)
        merged = _under_defaults(data)
        # Faults that need a section the file lacks: found on the file as written, so that
        # they are reported beside every other problem, not after those are fixed.
        missing_sections = _faults_without_their_section(data)
        try:
            scenario = handler(merged)
        except ValidationError as exc:
            problems: dict[tuple[Path_, str], Any] = {}  # one per place and message, in order
            for loc, message, value in reworded(exc, merged, cls):
                problems.setdefault((_written_at(loc, data)[0], message), value)
            for loc, message, value in missing_sections:
                problems.setdefault((loc, message), value)
            raise errors(
                (loc, message, value) for (loc, message), value in problems.items()
            ) from None
        across = [
            *scenario._shared_ids(data),
            *missing_sections,
            *scenario._faults_on_unknown_gpu_instances(),
            *scenario._faults_on_unknown_processes(),
        ]
        if across:
            raise errors(across)
        if scenario.dra is None and any(p.claim is not None for p in scenario.pods):
            settle(scenario, dra=DraSpec())
        settle(scenario, source=context_of(info).get("source", "<dict>"))
        return scenario

    def _shared_ids(self, data: dict[str, Any]) -> list[tuple[Path_, str, Any]]:
        """Two GPUs with one UUID or bus id: NVML lookups by either would find only the first."""
        problems: list[tuple[Path_, str, Any]] = []
        for key, what in (("uuid", "UUID"), ("pci_bus_id", "PCI bus id")):
            first: dict[str, int] = {}
            for device in self.devices:
                value = getattr(device, key)
                if value in first:
                    loc, from_defaults = _written_at(("devices", device.index, key), data)
                    message = f"{what} {value!r} is also GPU {first[value]}'s"
                    if from_defaults:
                        message += " (set in defaults, so every GPU shares it)"
                    problems.append((loc, message, value))
                    if from_defaults:
                        break  # one line for the one place that says it
                    continue
                first[value] = device.index
        return problems

    def _faults_on_unknown_gpu_instances(self) -> list[tuple[Path_, str, Any]]:
        """A fault on a GPU instance its GPU never has would silently do nothing."""
        problems: list[tuple[Path_, str, Any]] = []
        for i, fault in enumerate(self.faults):
            if fault.gpu_instance is None or fault.device == NO_DEVICE:
                continue
            mig = self.devices[fault.device].mig if fault.device < len(self.devices) else None
            if mig is None or all(g.gpu_instance != fault.gpu_instance for g in mig.instances):
                problems.append(
                    (
                        ("faults", i, "gpu_instance"),
                        f"GPU {fault.device} has no GPU instance {fault.gpu_instance}",
                        fault.gpu_instance,
                    )
                )
        return problems

    def _faults_on_unknown_processes(self) -> list[tuple[Path_, str, Any]]:
        """A /proc fault names one of the scenario's processes by PID."""
        if not self.processes:
            return []  # `processes:` missing: _faults_without_their_section says so
        pids = {proc.pid for proc in self.processes}
        return [
            (("faults", i, "pid"), f"no process has PID {fault.pid}", fault.pid)
            for i, fault in enumerate(self.faults)
            if fault.kind.startswith("proc_") and fault.pid not in pids
        ]

    def topology_level(self, a: int, b: int) -> int:
        """PCIe common-ancestor level of two GPUs: explicit groups, else by NUMA node."""
        if a == b:
            return TOPOLOGY_LEVELS["internal"]
        for group in self.topology:
            if a in group.gpus and b in group.gpus:
                return group.level
        same_node = self.devices[a].numa_node == self.devices[b].numa_node
        return TOPOLOGY_LEVELS["node" if same_node else "system"]


def _faults_without_their_section(data: dict[str, Any]) -> list[tuple[Path_, str, Any]]:
    """Faults that would silently do nothing: a DCGM fault on a node without `dcgm:`, a /proc
    or CRI fault without `processes:` (the fake /proc and CRI runtime run for those)."""
    faults = data.get("faults")
    if not isinstance(faults, list):
        return []
    has_dcgm = data.get("dcgm") is not None
    has_processes = bool(data.get("processes"))
    problems: list[tuple[Path_, str, Any]] = []
    for i, fault in enumerate(faults):
        kind = fault.get("kind") if isinstance(fault, dict) else None
        if kind in _DCGM_FAULTS and not has_dcgm:
            problems.append(
                (("faults", i, "kind"), f"{kind} needs a top-level `dcgm:` section", kind)
            )
        elif kind in _PROCESS_FAULTS and not has_processes:
            problems.append((("faults", i, "kind"), f"{kind} needs `processes:`", kind))
    return problems


def _under_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """Each device entry over `defaults`: the mapping-valued keys merge key by key, every other
    key is the device's if it writes one."""
    defaults, devices = data.get("defaults"), data.get("devices")
    if not isinstance(defaults, dict) or not defaults or not isinstance(devices, list):
        return data
    for key in _MERGED_KEYS:
        if key in defaults and not isinstance(defaults[key], dict):
            # Refused here: a device writing the key itself would hide it.
            raise error_at(("defaults", key), f"expected a mapping, got {kind_of(defaults[key])}")

    def under(entry: Any) -> Any:
        if not isinstance(entry, dict):
            return entry
        merged = {**defaults, **entry}
        for key in _MERGED_KEYS:
            if key in defaults and isinstance(entry.get(key), dict):
                merged[key] = {**defaults[key], **entry[key]}
        return merged

    return {**data, "devices": [under(entry) for entry in devices]}


def _written_at(path: Path_, data: dict[str, Any]) -> tuple[Path_, bool]:
    """Where the file writes the value at `path` of the merged data (`_under_defaults`): the
    same path, or its place under `defaults` (then True). A device key written nowhere (a
    derived default): the device."""
    defaults, devices = data.get("defaults"), data.get("devices")
    if len(path) < 3 or path[0] != "devices" or not isinstance(devices, list):
        return path, False
    index, key, rest = path[1], path[2], path[3:]
    entry = devices[index] if isinstance(index, int) and index < len(devices) else None
    if not isinstance(entry, dict):
        return path, False
    defaults = defaults if isinstance(defaults, dict) else {}
    if key in entry:
        own = entry[key]
        inherited = (
            key in _MERGED_KEYS
            and rest
            and isinstance(own, dict)
            and rest[0] not in own
            and rest[0] in defaults.get(key, {})
        )
        return (("defaults", key, *rest), True) if inherited else (path, False)
    if key in defaults:
        return ("defaults", key, *rest), True
    if not rest:
        return ("devices", index), False
    return path, False
