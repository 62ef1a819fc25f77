"""Where the time goes: the profile's seconds per bottleneck class (the classifier's
`gpu_bottleneck_seconds_total{class}` over the profile, gpu_exporter/collect/classify.py) as
shares of each GPU's profiled time, grouped into the categories a diagnosis reads in order:

1. idle gaps            `idle`: no kernel ran (data loading, checkpoints, host work);
2. copy-dominated       `link_bound` seconds whose busier link was PCIe (H2D / D2H copies);
3. collective-dominated `link_bound` seconds whose busier link was NVLink, SMs waiting;
4. launch bound         `launch_bound`;
5. memory bound         `memory_bound`;
6. compute bound        `tensor_bound` and `compute_bound`;

then what is no category of the workload's: `throttled` (a protective limit held the clocks
down, so the shares above understate the GPU) and `unknown` (activity data missing).

The classifier counts one class per GPU per tick; which link a link-bound tick waited on is its
verdict's (`LinkSplit`, fed each tick), as the class's reason names it. Each category says what
the GPU's counters cannot tell apart inside it, and NOT_MEASURED what they do not see at all
(a NIC's traffic above all): said, never filled in. A GPU that is down or has a health finding
is not counted: its numbers describe a GPU that is not healthy (health first).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_exporter.collect.classify import CLASSES, Classifier
from gpu_exporter.model.snapshot import DeviceSample
from gpu_exporter.model.verdict import Verdict, WindowStats

PCIE, NVLINK = "pcie", "nvlink"
LINK_BOUND = "link_bound"


@dataclass(frozen=True)
class Category:
    """`classes` whose seconds it takes (`link`: only link-bound seconds on that link), what to
    look at when it holds the time, and what the counters cannot tell apart inside it."""

    key: str
    title: str
    classes: tuple[str, ...]
    look_at: str
    cannot_tell_apart: str
    link: str | None = None


CATEGORIES: tuple[Category, ...] = (
    Category(
        "idle_gaps",
        "idle gaps (data loading, checkpoints, host work)",
        ("idle",),
        "No kernel ran. Find what the step waits on: the input pipeline (DataLoader workers, "
        "pin_memory, prefetching), checkpoint writes, host work between steps, or a job that "
        "is not running at all; an Nsight Systems timeline shows the gaps and what the CPU "
        "does in them.",
        "Data loading, checkpointing, host work and no job at all look the same to the GPU: no "
        "kernel. Gaps shorter than a sample are not idle time: they lower a busy GPU's kernel "
        "share (NVML utilization) instead.",
    ),
    Category(
        "copy",
        "copy-dominated (PCIe: H2D / D2H)",
        (LINK_BOUND,),
        "The SMs wait on PCIe. Keep data on the GPU between steps, copy from pinned memory "
        "with non_blocking=True so copies overlap compute, batch small copies, and check that "
        "the link runs at its full generation and width.",
        "PCIe byte counters count every byte on the GPU's link: host copies, peer-to-peer over "
        "PCIe and GPUDirect RDMA to a NIC are not told apart, nor H2D from D2H (the busier "
        "direction counts).",
        PCIE,
    ),
    Category(
        "collective",
        "collective-dominated (NVLink traffic, SMs waiting)",
        (LINK_BOUND,),
        "The SMs wait on NVLink: collectives (all-reduce, all-gather) or peer copies. Overlap "
        "communication with compute (DDP bucket sizes, FSDP prefetching), check the transport "
        "NCCL chose (NCCL_DEBUG=INFO) against the topology, and that GPUs that talk share "
        "NVLink rather than PCIe or SYS.",
        "NVLink bytes count NCCL collectives and peer-to-peer copies alike. A NIC's traffic is "
        "not read (see not measured).",
        NVLINK,
    ),
    Category(
        "launch_bound",
        "launch bound",
        ("launch_bound",),
        "Kernels ran but kept few SMs busy: tiny kernels, launch overhead, host syncs. Look for "
        "many short kernels and synchronisations in an Nsight Systems or PyTorch Profiler "
        "trace; CUDA Graphs, torch.compile and larger batches cut them.",
        "A collective waiting on a slow peer or on the network can look the same: its kernels "
        "run while few SMs work.",
    ),
    Category(
        "memory_bound",
        "memory bound",
        ("memory_bound",),
        "DRAM bandwidth is the nearer roof: fuse elementwise ops, raise arithmetic intensity "
        "(larger decode batches, lower precision for activations and KV cache); Nsight "
        "Compute's memory workload analysis confirms it per kernel.",
        "A whole-GPU average over each sample: which kernels are memory-bound needs a "
        "per-kernel profiler.",
    ),
    Category(
        "compute_bound",
        "compute bound (Tensor Cores or SM pipes)",
        ("tensor_bound", "compute_bound"),
        "The Tensor Cores or SM pipes are the limit: cheaper FLOPs (bf16, FP8, TF32 for FP32 "
        "matmuls), Tensor-Core-friendly shapes, or more GPUs.",
        "A whole-GPU average over each sample: which kernels are compute-bound needs a "
        "per-kernel profiler.",
    ),
    Category(
        "throttled",
        "clocks held down (throttled)",
        ("throttled",),
        "Not the workload's: a thermal or power protection held the clocks down, so every "
        "share above understates the GPU; see the clocks under steady and comparable, and the "
        "health verdicts.",
        "What the workload was limited by underneath is not classified while the clocks are "
        "held down.",
    ),
    Category(
        "unknown",
        "not classified (activity data missing)",
        ("unknown",),
        "SM, Tensor and DRAM activity were missing (no GPM before Hopper without DCGM, GPM not "
        "ready, a stuck source): these seconds belong to no category above.",
        "Everything: without activity data no category is guessed.",
    ),
)
CATEGORY_KEYS: tuple[str, ...] = tuple(c.key for c in CATEGORIES)
# The classes in the order their categories are read (for advice listed by class).
CLASS_ORDER: tuple[str, ...] = tuple(dict.fromkeys(c for cat in CATEGORIES for c in cat.classes))

# What the GPU's counters do not see at all: said, so no share is read into it.
NOT_MEASURED: tuple[dict[str, str], ...] = (
    {
        "what": "NIC traffic (InfiniBand, RoCE, Ethernet)",
        "why": "NVML counts the GPU's PCIe and NVLink bytes, not a NIC's: a collective across "
        "nodes shows only as the GPU's PCIe bytes where GPUDirect RDMA carries it, or as SMs "
        "waiting (launch bound) or idle time; the NIC's own port counters measure it",
    },
    {
        "what": "host CPU, data loading and checkpoint I/O",
        "why": "outside the GPU: they show only as idle gaps, not told apart",
    },
    {
        "what": "per-kernel time (which kernels are the hot spots)",
        "why": "the counters are whole-GPU averages over each sample; a timeline (Nsight "
        "Systems, PyTorch Profiler) and a per-kernel roofline (Nsight Compute) show them",
    },
)


def busier_link(stats: WindowStats | None) -> str | None:
    """PCIE or NVLINK, whichever ran nearer its capacity in the window (as the classifier's
    reason orders them); None when neither is known."""
    if stats is None:
        return None
    pcie, nvlink = stats.pcie_utilization, stats.nvlink_utilization
    if nvlink is not None and (pcie is None or nvlink > pcie):
        return NVLINK
    return PCIE if pcie is not None else None


class LinkSplit:
    """The link-bound seconds of each GPU and MIG instance by the link its verdict named at the
    tick that counted them (`observe` each tick's classified samples)."""

    def __init__(self) -> None:
        self._counted: dict[tuple[str, str], float] = {}
        self._seconds: dict[tuple[str, str], dict[str, float]] = {}

    def observe(self, devices: Iterable[DeviceSample], classifier: Classifier) -> None:
        for device in devices:
            if device.mig_enabled:
                for instance in device.instances:
                    self._count(device.uuid, instance.mig_uuid, instance.verdict, classifier)
            else:
                self._count(device.uuid, "", device.verdict, classifier)

    def _count(
        self, uuid: str, mig_uuid: str, verdict: Verdict | None, classifier: Classifier
    ) -> None:
        key = (uuid, mig_uuid)
        total = classifier.seconds(uuid, mig_uuid)[LINK_BOUND]
        step = total - self._counted.get(key, 0.0)
        self._counted[key] = total
        link = busier_link(verdict.stats if verdict else None)
        if step > 0 and link is not None:
            split = self._seconds.setdefault(key, {PCIE: 0.0, NVLINK: 0.0})
            split[link] += step

    def of(self, uuid: str, mig_uuid: str = "") -> dict[str, float]:
        return dict(self._seconds.get((uuid, mig_uuid), {}))


@dataclass(frozen=True)
class Entry:
    """One GPU or MIG instance: its seconds per class over the profile, its link-bound seconds
    by link (`fallback_link` for any not split tick by tick), its kernel share (mean
    utilization) and, when it is not counted, why."""

    where: str
    gpu: int
    gpu_instance: int | None
    compute_instance: int | None
    class_seconds: Mapping[str, float]
    link_seconds: Mapping[str, float]
    fallback_link: str | None
    kernel_share: float | None
    not_judged: str | None


def category_seconds(entry: Entry) -> dict[str, float]:
    """The entry's seconds per category; link-bound seconds of no known link go to `unknown`."""
    out = dict.fromkeys(CATEGORY_KEYS, 0.0)
    link_bound = entry.class_seconds.get(LINK_BOUND, 0.0)
    split = {PCIE: entry.link_seconds.get(PCIE, 0.0), NVLINK: entry.link_seconds.get(NVLINK, 0.0)}
    rest = max(link_bound - split[PCIE] - split[NVLINK], 0.0)
    if rest and entry.fallback_link is not None:
        split[entry.fallback_link] += rest
        rest = 0.0
    for category in CATEGORIES:
        if category.link is not None:
            out[category.key] += split[category.link]
            continue
        out[category.key] += sum(entry.class_seconds.get(c, 0.0) for c in category.classes)
    out["unknown"] += rest
    return out


def category_of(cls: str, entry: Entry) -> str:
    """The category a class falls in for this entry (link-bound: the link that held most of
    its link-bound time)."""
    if cls == LINK_BOUND:
        seconds = category_seconds(entry)
        return "collective" if seconds["collective"] > seconds["copy"] else "copy"
    return next(c.key for c in CATEGORIES if cls in c.classes)


def _share(part: float, whole: float) -> float | None:
    return round(part / whole, 4) if whole > 0 else None


def time_report(entries: Sequence[Entry]) -> dict[str, Any]:
    """The report's `time` section: per category the node's seconds and share over the GPUs
    counted, who holds it, what to look at and what cannot be told apart; per GPU its shares;
    what is not measured."""
    gpus = []
    totals = dict.fromkeys(CATEGORY_KEYS, 0.0)
    holders: dict[str, list[str]] = {key: [] for key in CATEGORY_KEYS}
    for entry in entries:
        seconds = category_seconds(entry)
        whole = sum(seconds.values())
        judged = entry.not_judged is None
        if judged:
            for key, value in seconds.items():
                totals[key] += value
                if value > 0:
                    holders[key].append(entry.where)
        gpus.append(
            {
                "where": entry.where,
                "gpu": entry.gpu,
                "gpu_instance": entry.gpu_instance,
                "compute_instance": entry.compute_instance,
                "counted": judged,
                "not_counted": entry.not_judged,
                "seconds": round(whole, 3),
                "kernel_time_share": entry.kernel_share,
                "shares": {key: _share(value, whole) for key, value in seconds.items()},
            }
        )
    total = sum(totals.values())
    categories = [
        {
            "category": c.key,
            "title": c.title,
            "classes": list(c.classes),
            "link": c.link,
            "seconds": round(totals[c.key], 3),
            "share": _share(totals[c.key], total),
            "held_by": holders[c.key],
            "look_at": c.look_at,
            "cannot_tell_apart": c.cannot_tell_apart,
        }
        for c in CATEGORIES
    ]
    return {
        "source": "gpu_bottleneck_seconds_total over the profile (the classifier's seconds per "
        f"class: {', '.join(CLASSES)}), as shares of the GPUs counted",
        "total_seconds": round(total, 3),
        "categories": categories,
        "gpus": gpus,
        "not_measured": [dict(item) for item in NOT_MEASURED],
    }
