"""What the topology matrix means for multi-GPU work: whether the GPUs form a full NVLink mesh
(directly or through NVSwitch), which GPU reaches the others only over PCIe, which pairs cross
the CPU interconnect (SYS), and which GPU has no NUMA affinity to pin its data loaders to.

A note only where it changes what to do: a node with one GPU has no pairs to talk about, and
a full mesh needs no note. Notes are context, not faults: they never change the exit status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_exporter.collect.nvml.topology import ABBREVIATIONS, LEVELS, Topology


@dataclass(frozen=True)
class TopologyNote:
    gpus: tuple[int, ...]
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": list(self.gpus), "text": self.text}


@dataclass(frozen=True)
class Interpretation:
    nvlink: str  # nvswitch | full_mesh | partial | none | single_gpu | unknown
    summary: str
    notes: tuple[TopologyNote, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "nvlink": self.nvlink,
            "summary": self.summary,
            "notes": [n.to_dict() for n in self.notes],
        }


def interpret(topology: Topology) -> Interpretation:
    gpus = sorted(topology.gpus, key=lambda g: g.index)
    notes = [
        TopologyNote(
            (g.index,),
            f"GPU {g.index} has no NUMA affinity reported (NVML gives no CPU or memory "
            "affinity): pin its data loaders and host buffers by hand "
            f"(`cat /sys/bus/pci/devices/{g.pci_bus_id or '<bus id>'}/numa_node`)",
        )
        for g in gpus
        if g.cpu_affinity is None and g.numa_node is None
    ]
    if len(gpus) < 2:
        return Interpretation("single_gpu", f"{len(gpus)} GPU: no GPU-to-GPU links", tuple(notes))
    if any(p.nvlink_links is None for p in topology.peers) or not topology.peers:
        return Interpretation(
            "unknown", "the NVLink state of some GPUs could not be read", tuple(notes)
        )
    links = {(p.index, p.peer_index): p for p in topology.peers}
    linked = {i for (i, _), p in links.items() if p.nvlink_links}
    counts = sorted({p.nvlink_links or 0 for p in topology.peers if p.nvlink_links})
    width = f"NV{counts[0]}" if len(counts) == 1 else f"NV{counts[0]} to NV{counts[-1]}"
    everyone = len(gpus)
    if all(p.nvlink_links for p in topology.peers):
        switched = all(g.nvlink_switch_links for g in gpus)
        how = "through NVSwitch" if switched else "directly"
        kind = "nvswitch" if switched else "full_mesh"
        summary = f"full NVLink mesh: all {everyone} GPUs reach each other {how} ({width})"
        return Interpretation(kind, summary, tuple(notes))
    if not linked:
        worst = max((p.pcie_level or "" for p in topology.peers), key=_rank, default="")
        summary = f"no NVLink: the {everyone} GPUs talk over PCIe (at worst {_abbrev(worst)})"
        notes += _sys_pairs(topology)
        return Interpretation("none", summary, tuple(notes))
    isolated = [g.index for g in gpus if g.index not in linked]
    for index in isolated:
        levels = {_abbrev(p.pcie_level) for p in topology.peers_of(_uuid(topology, index))}
        notes.append(
            TopologyNote(
                (index,),
                f"GPU {index} reaches the other GPUs only over PCIe ({', '.join(sorted(levels))})"
                ": a job spanning it and the NVLink GPUs runs its collectives at PCIe speed; "
                "give multi-GPU jobs GPUs of the NVLink group",
            )
        )
    missing = sorted(
        (a, b)
        for (a, b), p in links.items()
        if a < b and a in linked and b in linked and not p.nvlink_links
    )
    for a, b in missing:
        level = _abbrev(links[a, b].pcie_level)
        notes.append(
            TopologyNote((a, b), f"GPU {a} and GPU {b} have no NVLink between them ({level})")
        )
    group = ", ".join(map(str, sorted(linked)))
    gaps = [f"GPU {i} only over PCIe" for i in isolated]
    gaps += [f"no NVLink between GPU {a} and GPU {b}" for a, b in missing]
    summary = f"partial NVLink: GPUs {group} are linked ({width}); {'; '.join(gaps)}"
    return Interpretation("partial", summary, tuple(notes))


def _sys_pairs(topology: Topology) -> list[TopologyNote]:
    pairs = sorted((p.index, p.peer_index) for p in topology.peers if p.pcie_level == "system")
    pairs = [(a, b) for a, b in pairs if a < b]
    if not pairs:
        return []
    named = ", ".join(f"{a}-{b}" for a, b in pairs)
    return [
        TopologyNote(
            tuple(sorted({i for pair in pairs for i in pair})),
            f"GPU pairs {named} cross the CPU interconnect (SYS): peer traffic between them "
            "goes through both sockets; keep communicating GPUs on one NUMA node",
        )
    ]


_ORDER = tuple(label for _, (label, _) in sorted(LEVELS.items()))  # nearest first


def _rank(level: str) -> int:
    return _ORDER.index(level) if level in _ORDER else -1


def _abbrev(level: str | None) -> str:
    return ABBREVIATIONS.get(level or "", "N/A")


def _uuid(topology: Topology, index: int) -> str:
    return next(g.uuid for g in topology.gpus if g.index == index)
