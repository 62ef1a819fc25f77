"""GPU-to-GPU topology, P2P capabilities, CPU and NUMA affinity: `nvidia-smi topo -m` as data.

"Topology before GPU count" (seed): whether two GPUs talk over NVLink or cross PCIe switches,
host bridges or sockets decides multi-GPU speed; the CPU/NUMA affinity decides where data
loaders should run. Read once at start-up and after every full NVML re-init (indices can change
then), never per tick: a pair query can take hundreds of milliseconds on real drivers
(k8s-device-plugin#774).

Bounded: with a `deadline` (the source passes its per-GPU deadline) each call runs on a helper
thread and one that does not answer in time is counted (error `Timeout`), noted, and left
behind: that item is unknown, and that call is not asked again of that GPU in this read; after
`max_hung_per_gpu` hung calls nothing more is asked of that GPU. So a hung
`nvmlDeviceGetP2PStatus` leaves that GPU's P2P unknown instead of the read stuck. Pairs are
read only for up to `MAX_PAIR_GPUS` GPUs (what is kept per pair grows with the square of the
GPU count: the PeerLinks, the calls, the exceptions to the usual values); past that only
the per-GPU facts are read and `errors` says why.

Every NVML call goes through the choke point (`NvmlCalls`), which counts failures in
gpu_exporter_errors_total (source `topology`) as it does for every other call: NotSupported /
FunctionNotFound make that item absent, any other error is also noted in `Topology.errors`
(naming the GPUs) and the item is absent; nothing here raises. The `topology` collector
(`collect/nvml/collectors/topology.py`) exports the result with every GPU's tick.

NVLink: each active link's far end is asked for (`nvmlDeviceGetNvLinkRemoteDeviceType`).
A link to a GPU is attributed to that GPU by its PCI bus id
(`nvmlDeviceGetNvLinkRemotePciInfo`). A link to an NVSwitch reaches every GPU on the switch
fabric, so two GPUs that both have links to switches are connected by NVLink with
min(links of one, links of the other) links: what `nvidia-smi topo -m` shows as NV18 on an
HGX H100/H200 board, and the smaller count shows a pair slowed by a link that is down.
"""

from __future__ import annotations

import concurrent.futures as futures
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml.calls import NvmlCalls
from gpu_exporter.collect.nvml.values import binding, field_value, normalise_bus_id
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.collect.worker import Worker
from gpu_exporter.model.snapshot import Labels, Reading

# NVML_TOPOLOGY_* -> (metric label, nvidia-smi topo -m abbreviation)
LEVELS: Mapping[int, tuple[str, str]] = {
    N.NVML_TOPOLOGY_INTERNAL: ("internal", "INT"),
    N.NVML_TOPOLOGY_SINGLE: ("single", "PIX"),
    N.NVML_TOPOLOGY_MULTIPLE: ("multiple", "PXB"),
    N.NVML_TOPOLOGY_HOSTBRIDGE: ("hostbridge", "PHB"),
    N.NVML_TOPOLOGY_NODE: ("node", "NODE"),
    N.NVML_TOPOLOGY_SYSTEM: ("system", "SYS"),
}
ABBREVIATIONS = {label: abbrev for label, abbrev in LEVELS.values()}

# pynvml defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,) (a trailing comma): use literals.
P2P_CAPABILITIES: tuple[tuple[str, int], ...] = (
    ("read", 0),
    ("write", 1),
    ("nvlink", 2),
    ("atomics", 3),
)
P2P_STATUS: Mapping[int, str] = {
    N.NVML_P2P_STATUS_OK: "ok",
    N.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED: "chipset_not_supported",
    N.NVML_P2P_STATUS_GPU_NOT_SUPPORTED: "gpu_not_supported",
    N.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED: "ioh_topology_not_supported",
    N.NVML_P2P_STATUS_DISABLED_BY_REGKEY: "disabled_by_regkey",
    N.NVML_P2P_STATUS_NOT_SUPPORTED: "not_supported",
    N.NVML_P2P_STATUS_UNKNOWN: "unknown",
}

LEGEND = """\
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""  # noqa: E501 - nvidia-smi's own text
EXTRA_LEGEND = {
    "INT": "  INT  = Both GPUs on one board (NVML_TOPOLOGY_INTERNAL)",
    "N/A": "  N/A  = Not reported by the driver",
}

# The link label of a pair whose link the driver did not report (nvidia-smi prints N/A).
UNKNOWN_LINK = "unknown"
SOURCE = "topology"  # the errors_total `source` of the calls made here
_ABSENT = ("NotSupported", "FunctionNotFound")  # the item is absent; nothing went wrong
# Pairs are read for at most this many GPUs: 4032 ordered pairs, 16128 P2P calls, a few seconds
# at start; the per-pair data grows with the square of the count. A node with more GPUs still
# gets each GPU's own facts, and the topology errors say why its pairs are missing.
MAX_PAIR_GPUS = 64
_HUNG = "Timeout"  # a call that did not answer within the deadline
_SKIPPED = "Skipped"  # not asked: that call, or too many calls, hung on that GPU before
log = logging.getLogger(__name__)
_CPU_WORDS = max(16, -(-(os.cpu_count() or 1) // 64))  # 64 CPUs per word; >= 1024 CPUs


@dataclass(frozen=True, slots=True)
class GpuNode:
    """One GPU's place on the host."""

    uuid: str
    index: int
    pci_bus_id: str = ""  # sysfs form, 0000:18:00.0
    cpu_affinity: str | None = None  # "0-55,112-167"
    numa_node: int | None = None  # host NUMA node nearest the GPU
    gpu_numa_id: int | None = None  # the GPU's memory as a NUMA node (Grace systems)
    nvlink_links: int | None = None  # links the GPU has; None = could not be read
    nvlink_active: int | None = None
    nvlink_switch_links: int = 0  # active links ending at an NVSwitch
    nvlink_gpu_links: Mapping[str, int] = field(default_factory=dict)  # remote bus id -> links


@dataclass(frozen=True, slots=True)
class PeerLink:
    """How `uuid` reaches `peer_uuid`."""

    index: int
    uuid: str
    peer_index: int
    peer_uuid: str
    pcie_level: str | None  # LEVELS label, None when not reported
    nvlink_links: int | None  # None when this GPU's NVLink state is unknown
    p2p: Mapping[str, str]  # capability -> P2P_STATUS name

    @property
    def link(self) -> str | None:
        """`nvlink` when NVLink connects them, else the PCIe level (as nvidia-smi topo -m)."""
        return "nvlink" if self.nvlink_links else self.pcie_level

    def abbreviation(self) -> str:
        if self.nvlink_links:
            return f"NV{self.nvlink_links}"
        return ABBREVIATIONS.get(self.pcie_level or "", "N/A")


@dataclass(frozen=True)
class Topology:
    gpus: tuple[GpuNode, ...]
    peers: tuple[PeerLink, ...]
    errors: tuple[str, ...] = ()

    def gpu(self, uuid: str) -> GpuNode | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def peers_of(self, uuid: str) -> list[PeerLink]:
        return sorted((p for p in self.peers if p.uuid == uuid), key=lambda p: p.peer_index)

    def readings_for(self, uuid: str) -> list[Reading]:
        """Catalog readings for one GPU: link type, NVLink count and P2P per peer, affinity.

        Built once per Topology (it is read at start and after a re-init, and asked every
        tick): the same Reading objects each tick also let the series builder reuse its
        series for them."""
        return list(self._readings.get(uuid, ()))

    @cached_property
    def _readings(self) -> dict[str, tuple[Reading, ...]]:
        by_uuid: dict[str, list[PeerLink]] = {}
        for peer in self.peers:
            by_uuid.setdefault(peer.uuid, []).append(peer)
        out = {}
        for gpu in self.gpus:
            peers = sorted(by_uuid.get(gpu.uuid, []), key=lambda p: p.peer_index)
            readings = _peer_readings(peers)
            if gpu.cpu_affinity:
                readings.append(
                    Reading("gpu_cpu_affinity_info", 1.0, (("cpus", gpu.cpu_affinity),))
                )
            if gpu.numa_node is not None:
                readings.append(Reading("gpu_numa_node", float(gpu.numa_node)))
            out[gpu.uuid] = tuple(readings)
        return out

    def matrix_text(self) -> str:
        """The matrix in the shape of `nvidia-smi topo -m`, with its legend."""
        gpus = sorted(self.gpus, key=lambda g: g.index)
        links = {(p.uuid, p.peer_uuid): p.abbreviation() for p in self.peers}
        header = ["", *(f"GPU{g.index}" for g in gpus)]
        header += ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
        rows = [header]
        for gpu in gpus:
            cells = [f"GPU{gpu.index}"]
            cells += [
                " X" if peer.uuid == gpu.uuid else links.get((gpu.uuid, peer.uuid), "N/A")
                for peer in gpus
            ]
            cells += [
                gpu.cpu_affinity or "N/A",
                _or_na(gpu.numa_node),
                _or_na(gpu.gpu_numa_id),
            ]
            rows.append(cells)
        used = {cell for row in rows[1:] for cell in row[1 : len(gpus) + 1]}
        legend = [LEGEND, *(text for key, text in EXTRA_LEGEND.items() if key in used)]
        return _columns(rows) + "\n\n" + "\n".join(legend) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (used by `diagnose --json`)."""
        return {
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "pci_bus_id": g.pci_bus_id,
                    "cpu_affinity": g.cpu_affinity,
                    "numa_node": g.numa_node,
                    "gpu_numa_id": g.gpu_numa_id,
                    "nvlink_links": g.nvlink_links,
                    "nvlink_links_active": g.nvlink_active,
                }
                for g in sorted(self.gpus, key=lambda g: g.index)
            ],
            "links": [
                {
                    "gpu": p.index,
                    "peer_gpu": p.peer_index,
                    "link": p.link,
                    "pcie_level": p.pcie_level,
                    "nvlink_links": p.nvlink_links,
                    "p2p": dict(p.p2p),
                }
                for p in sorted(self.peers, key=lambda p: (p.index, p.peer_index))
            ],
            "errors": list(self.errors),
        }


@dataclass(frozen=True)
class _PairQuantity:
    """One quantity of a GPU pair, exported as the GPU's usual value plus the exceptions."""

    pair_family: str  # the peers whose value differs from the usual one
    usual_family: str  # the GPU's usual value
    value_of: Callable[[PeerLink], str | float | None]  # None: unknown for that peer
    labels: tuple[tuple[str, str], ...] = ()  # the quantity's own fixed labels
    value_label: str | None = None  # an info family carries the value in this label


def _p2p(capability: str) -> _PairQuantity:
    def supported(peer: PeerLink) -> float | None:
        status = peer.p2p.get(capability)
        return None if status is None else float(status == "ok")

    return _PairQuantity(
        "gpu_p2p_supported", "gpu_p2p_usual_supported", supported, (("capability", capability),)
    )


_PAIR_QUANTITIES = (
    _PairQuantity(
        "gpu_topology_link_info", "gpu_topology_usual_link_info", lambda p: p.link, (), "link"
    ),
    _PairQuantity(
        "gpu_topology_nvlink_links",
        "gpu_topology_usual_nvlink_links",
        lambda p: None if p.nvlink_links is None else float(p.nvlink_links),
    ),
    *(_p2p(capability) for capability, _ in P2P_CAPABILITIES),
)


def _peer_readings(peers: Sequence[PeerLink]) -> list[Reading]:
    """Per pair quantity, the GPU's usual value (what most of its peers have; on a tie, that
    of the lowest-numbered peer) and the peers that differ from it.

    Listing every pair would grow with the square of the GPU count (88 % of a 64-GPU
    exposition) to repeat, on a uniform board, one fact n * (n - 1) times; the usual value
    plus the exceptions carries the same information: linear on a uniform NVLink/NVSwitch
    board, about half the pairs on a two-socket PCIe board (the other socket's peers). A pair
    whose value is unknown while others' are known is an exception with link `unknown` or
    value NaN, so that it does not read as usual."""
    out = []
    for quantity in _PAIR_QUANTITIES:
        values = [(peer, quantity.value_of(peer)) for peer in peers]
        known = [value for _, value in values if value is not None]
        if not known:
            continue  # unknown for every peer: absent, as any unreadable quantity
        # most_common keeps first-seen order among equal counts: a tie goes to the lowest peer.
        usual = Counter(known).most_common(1)[0][0]
        out.append(_pair_reading(quantity, quantity.usual_family, usual, ()))
        for peer, value in values:
            if value != usual:  # an unknown pair is an exception too, or it would read usual
                peer_labels = (("peer_gpu", str(peer.peer_index)), ("peer_uuid", peer.peer_uuid))
                out.append(_pair_reading(quantity, quantity.pair_family, value, peer_labels))
    return out


def _pair_reading(
    quantity: _PairQuantity, family: str, value: str | float | None, peer_labels: Labels
) -> Reading:
    labels = (*peer_labels, *quantity.labels)
    if quantity.value_label is not None:
        text = UNKNOWN_LINK if value is None else str(value)
        return Reading(family, 1.0, (*labels, (quantity.value_label, text)))
    return Reading(family, math.nan if value is None else float(value), labels)


def _or_na(value: int | None) -> str:
    return "N/A" if value is None else str(value)


def _columns(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


# -- reading ----------------------------------------------------------------------------------


class _Calls:
    """The topology's NVML calls through the choke point; notes what failed instead of raising.

    With a `deadline`, each call runs on a helper thread (see the module docstring)."""

    def __init__(
        self, errors: ErrorLog, deadline: float | None = None, max_hung_per_gpu: int = 2
    ) -> None:
        self._nvml = NvmlCalls(errors, SOURCE)
        self._deadline = deadline
        self._max_hung = max_hung_per_gpu
        self._worker: Worker | None = None
        self._hung: Counter[int] = Counter()  # id(a GPU's handle) -> its calls that hung
        self._skip: set[tuple[str, int]] = set()  # (key, id(handle)) that hung once
        self.errors: list[str] = []

    def __call__(self, key: str, what: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """The result, or None when absent (NotSupported, FunctionNotFound) or failed."""
        value, _ = self.attempt(key, what, fn, *args)
        return value

    def attempt(
        self,
        key: str,
        what: str,
        fn: Callable[..., Any] | None,
        *args: Any,
        expected: tuple[type[N.NVMLError], ...] = (),
    ) -> tuple[Any, str]:
        """(result, "") on success; (None, error name) otherwise, noting unexpected failures.

        `key` is the errors_total field; `what` names the GPUs for `Topology.errors`.
        """
        if self._deadline is None or not args or fn is None:
            value, error = self._nvml.attempt(key, fn, *args, expected=expected)
        else:
            value, error = self._bounded(key, what, fn, args, expected)
        quiet = {*_ABSENT, _SKIPPED, *(e.__name__.removeprefix("NVMLError_") for e in expected)}
        if error and error not in quiet:
            self.errors.append(f"{what}: {error}")
        return value, error

    def _bounded(
        self,
        key: str,
        what: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        expected: tuple[type[N.NVMLError], ...],
    ) -> tuple[Any, str]:
        gpu = id(args[0])  # the GPU asked: every call here takes its handle first
        if (key, gpu) in self._skip or self._hung[gpu] >= self._max_hung:
            return None, _SKIPPED
        if self._worker is None:
            self._worker = Worker("nvml-topology")
        job = self._worker.submit(partial(self._nvml.attempt, key, fn, *args, expected=expected))
        try:
            result: tuple[Any, str] = job.result(timeout=self._deadline)
        except futures.TimeoutError:
            self._worker.stop()  # left behind in the call; the next call gets a fresh thread
            self._worker = None
            self._skip.add((key, gpu))
            self._hung[gpu] += 1
            self._nvml.errors.add(SOURCE, key, _HUNG)
            log.warning("topology: %s did not answer within %.2fs", what, self._deadline)
            return None, _HUNG
        return result

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None


def read_topology(
    devices: Sequence[tuple[str, int, Any]],
    sysfs_root: Path | str = "/sys",
    *,
    errors: ErrorLog | None = None,
    deadline: float | None = None,
    max_hung_per_gpu: int = 2,
) -> Topology:
    """Read the topology of these (uuid, index, NVML handle) GPUs. Never raises NVMLError.

    NVML failures are counted in `errors` (the source's, for gpu_exporter_errors_total);
    `deadline` bounds each call (see the module docstring).
    """
    calls = _Calls(errors if errors is not None else ErrorLog(), deadline, max_hung_per_gpu)
    try:
        nodes = [
            _read_gpu(calls, uuid, index, handle, Path(sysfs_root))
            for uuid, index, handle in devices
        ]
        if len(devices) > MAX_PAIR_GPUS:
            calls.errors.append(
                f"GPU pairs not read: {len(devices)} GPUs, more than {MAX_PAIR_GPUS}"
            )
            return Topology(tuple(nodes), (), tuple(calls.errors))
        handles = {uuid: handle for uuid, _, handle in devices}
        levels = _read_levels(calls, devices)
        peers = [
            _peer(calls, a, b, handles, levels) for a in nodes for b in nodes if a.uuid != b.uuid
        ]
    finally:
        calls.close()
    return Topology(tuple(nodes), tuple(peers), tuple(calls.errors))


def _read_levels(
    calls: _Calls, devices: Sequence[tuple[str, int, Any]]
) -> dict[frozenset[str], str | None]:
    """PCIe common-ancestor level of each unordered pair (symmetric, asked once)."""
    levels: dict[frozenset[str], str | None] = {}
    for i, (uuid_a, index_a, handle_a) in enumerate(devices):
        for uuid_b, index_b, handle_b in devices[i + 1 :]:
            level = calls(
                "common_ancestor",
                f"GPU{index_a}-GPU{index_b} common ancestor",
                N.nvmlDeviceGetTopologyCommonAncestor,
                handle_a,
                handle_b,
            )
            known = LEVELS.get(level) if level is not None else None
            levels[frozenset((uuid_a, uuid_b))] = known[0] if known else None
    return levels


def _peer(
    calls: _Calls,
    a: GpuNode,
    b: GpuNode,
    handles: Mapping[str, Any],
    levels: Mapping[frozenset[str], str | None],
) -> PeerLink:
    p2p: dict[str, str] = {}
    for capability, index in P2P_CAPABILITIES:
        status = calls(
            "p2p_status",
            f"GPU{a.index}-GPU{b.index} P2P {capability}",
            N.nvmlDeviceGetP2PStatus,
            handles[a.uuid],
            handles[b.uuid],
            index,
        )
        if status is not None:
            p2p[capability] = P2P_STATUS.get(status, "unknown")
    return PeerLink(
        index=a.index,
        uuid=a.uuid,
        peer_index=b.index,
        peer_uuid=b.uuid,
        pcie_level=levels.get(frozenset((a.uuid, b.uuid))),
        nvlink_links=_nvlinks_between(a, b),
        p2p=p2p,
    )


def _nvlinks_between(a: GpuNode, b: GpuNode) -> int | None:
    if a.nvlink_active is None:
        return None
    direct = a.nvlink_gpu_links.get(b.pci_bus_id, 0) if b.pci_bus_id else 0
    switched = min(a.nvlink_switch_links, b.nvlink_switch_links)
    return direct + switched


def _read_gpu(calls: _Calls, uuid: str, index: int, handle: Any, sysfs: Path) -> GpuNode:
    pci = calls("pci_info", f"GPU{index} PCI info", N.nvmlDeviceGetPciInfo, handle)
    bus_id = normalise_bus_id(pci.busId) if pci is not None else ""
    links, active, switch_links, gpu_links = _read_nvlink(calls, index, handle)
    gpu_numa = calls("numa_id", f"GPU{index} NUMA id", N.nvmlDeviceGetNumaNodeId, handle)
    return GpuNode(
        uuid=uuid,
        index=index,
        pci_bus_id=bus_id,
        cpu_affinity=_cpu_affinity(calls, index, handle),
        numa_node=_numa_node(calls, index, handle, bus_id, sysfs),
        gpu_numa_id=gpu_numa if gpu_numa is not None and gpu_numa >= 0 else None,
        nvlink_links=links,
        nvlink_active=active,
        nvlink_switch_links=switch_links,
        nvlink_gpu_links=gpu_links,
    )


def _cpu_affinity(calls: _Calls, index: int, handle: Any) -> str | None:
    words = calls(
        "cpu_affinity", f"GPU{index} CPU affinity", N.nvmlDeviceGetCpuAffinity, handle, _CPU_WORDS
    )
    if words is None:
        return None
    return cpu_list(_bits(words)) or None


def _numa_node(calls: _Calls, index: int, handle: Any, bus_id: str, sysfs: Path) -> int | None:
    """Host NUMA node nearest the GPU: NVML memory affinity, else the PCI device in sysfs.

    Not nvmlDeviceGetNumaNodeId: that is the GPU's *own* memory node on platforms where GPU
    memory is a NUMA node (Grace), and NotSupported on ordinary x86 hosts (nvml.h).
    """
    words = calls(
        "memory_affinity",
        f"GPU{index} memory affinity",
        N.nvmlDeviceGetMemoryAffinity,
        handle,
        1,
        N.NVML_AFFINITY_SCOPE_NODE,
    )
    nodes = _bits(words) if words is not None else []
    if len(nodes) == 1:
        return nodes[0]
    return sysfs_numa_node(sysfs, bus_id)


def sysfs_numa_node(sysfs: Path, bus_id: str) -> int | None:
    """/sys/bus/pci/devices/<bdf>/numa_node; -1 (no affinity known) and absence give None."""
    if not bus_id:
        return None
    try:
        node = int((sysfs / "bus" / "pci" / "devices" / bus_id / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _bits(words: Iterable[int]) -> list[int]:
    return [i * 64 + bit for i, word in enumerate(words) for bit in range(64) if word >> bit & 1]


def cpu_list(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (the kernel's cpulist format)."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def _read_nvlink(
    calls: _Calls, index: int, handle: Any
) -> tuple[int | None, int | None, int, dict[str, int]]:
    """(links, active links, active links to a switch, {remote GPU bus id: links})."""
    count = _nvlink_count(calls, index, handle)
    if count is None:
        return None, None, 0, {}
    active = switch = 0
    gpus: Counter[str] = Counter()
    for link in range(count):
        state = calls(
            "nvlink_state",
            f"GPU{index} NVLink {link} state",
            N.nvmlDeviceGetNvLinkState,
            handle,
            link,
        )
        if state is None:
            return count, None, 0, {}  # a partial picture would understate the links
        if state != N.NVML_FEATURE_ENABLED:
            continue
        active += 1
        remote = _remote_end(calls, index, handle, link)
        if remote == "switch":
            switch += 1
        elif remote:
            gpus[remote] += 1
    return count, active, switch, dict(gpus)


def _nvlink_count(calls: _Calls, index: int, handle: Any) -> int | None:
    """Links this GPU has: field NVLINK_LINK_COUNT, else probe link 0 (None: unknown)."""
    values = calls(
        "nvlink_count",
        f"GPU{index} NVLink count",
        N.nvmlDeviceGetFieldValues,
        handle,
        [N.NVML_FI_DEV_NVLINK_LINK_COUNT],
    )
    if values is not None and values[0].nvmlReturn == N.NVML_SUCCESS:
        return int(field_value(values[0]))
    count = 0
    for link in range(N.NVML_NVLINK_MAX_LINKS):
        _, error = calls.attempt(
            "nvlink_state",
            f"GPU{index} NVLink {link} state",
            N.nvmlDeviceGetNvLinkState,
            handle,
            link,
            expected=(N.NVMLError_InvalidArgument,),  # the link after the last one
        )
        if error in ("NotSupported", "InvalidArgument", "FunctionNotFound"):
            return count  # past the last link (or no NVLink at all)
        if error:
            return None
        count += 1
    return count


def _remote_end(calls: _Calls, index: int, handle: Any, link: int) -> str:
    """ "switch", the remote GPU's bus id, or "" (CPU, unknown, unreadable)."""
    kind = calls(
        "nvlink_remote_type",
        f"GPU{index} NVLink {link} remote type",
        binding("nvmlDeviceGetNvLinkRemoteDeviceType"),
        handle,
        link,
    )
    if kind == N.NVML_NVLINK_DEVICE_TYPE_SWITCH:
        return "switch"
    if kind not in (None, N.NVML_NVLINK_DEVICE_TYPE_GPU):
        return ""  # IBM NPU (a CPU) or unknown
    pci = calls(
        "nvlink_remote_pci",
        f"GPU{index} NVLink {link} remote PCI",
        binding("nvmlDeviceGetNvLinkRemotePciInfo"),
        handle,
        link,
    )
    return normalise_bus_id(pci.busId) if pci is not None else ""
