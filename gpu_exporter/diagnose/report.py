"""The report `gpu-exporter diagnose` prints, as one plain dict (the --json schema).

Its sections come in the order a diagnosis reads them (`SECTIONS`, also in the JSON under
`sections`, its keys in that order): health; is the workload steady and comparable (versions,
clocks, settings and their drift: comparable.py); where the time goes (per-class seconds as
shares: time_shares.py); then the hot spots' advice per GPU (advice.py). The per-GPU detail
follows them in `devices`.

Health first: a GPU's health findings (the rule pack's, gpu_exporter/diagnose/health.py) are
its first problems and its next steps; only a GPU without any gets performance advice for its
class, and only its time is counted in where the time goes. A GPU that is down at the end has
no current clocks, power or temperature: its state says why instead (values from before it
went down would describe a GPU that is gone).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpu_exporter.collect.classify import CLASSES, THROTTLE_REASONS, Classifier
from gpu_exporter.collect.health_latch import HealthLatch
from gpu_exporter.collect.nvml.device_config import DeviceConfig
from gpu_exporter.collect.nvml.topology import Topology
from gpu_exporter.diagnose.advice import (
    ATTENTION_CLASSES,
    MIG_NO_GPM_STEPS,
    MIG_SHARED_STEPS,
    NEXT_STEPS,
)
from gpu_exporter.diagnose.comparable import SettingsWatch, attention_findings, comparable_report
from gpu_exporter.diagnose.config_checks import WARNING, ConfigFinding, check_config, config_json
from gpu_exporter.diagnose.exit_status import EXIT_ATTENTION, EXIT_OK
from gpu_exporter.diagnose.health import (
    HEALTH_GROUP,
    KERNEL_LOG_HINT,
    HealthFinding,
    HealthRules,
    merged_steps,
)
from gpu_exporter.diagnose.pod_profile import (
    PodProfiles,
    idle_allocations,
    pod_use_json,
    unattributed_json,
)
from gpu_exporter.diagnose.time_shares import (
    CATEGORY_KEYS,
    Entry,
    LinkSplit,
    busier_link,
    category_of,
    time_report,
)
from gpu_exporter.diagnose.topology_notes import interpret
from gpu_exporter.diagnose.verdict import (
    ATTENTION_VERDICTS,
    NOT_JUDGED,
    gpu_verdict,
    health_validation,
    node_name,
    node_verdict,
)
from gpu_exporter.model import xids
from gpu_exporter.model.nvml_facts import ARCHITECTURES
from gpu_exporter.model.series import DeviceView, InstanceView
from gpu_exporter.model.verdict import Verdict

# 2: health findings and next steps from the rule pack, config checks, topology notes, a down
# GPU's state without stale values.
# 3: each GPU's health verdict (health_verdict), the node's (health.node_verdict), and
# health_validation (the node's verdict in NVIDIA Health Validation's shape).
# 4: keys in the diagnosis' order (`sections`), `comparable` (steady and comparable: clocks,
# settings, drift), `time` (where the time goes: per-class seconds as shares) and `hot_spots`.
SCHEMA_VERSION = 4

# The report's sections in reading order: each section's name and its top-level keys. The
# JSON document lists these keys in this order, after the run's own (schema_version ... pods)
# and before the per-GPU detail and the outcome (attention_classes ... exit_status).
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("health", ("health", "health_validation")),
    ("steady_and_comparable", ("versions", "comparable")),
    ("where_the_time_goes", ("topology", "time")),
    ("hot_spots", ("hot_spots",)),
)


@dataclass
class Profile:
    classifier: Classifier
    health: HealthRules
    # By NVML index: a GPU whose UUID could not be read has none, and two such are two GPUs.
    last: dict[int, DeviceView] = field(default_factory=dict)  # as the last tick shows it
    ticks: int = 0
    config: dict[str, DeviceConfig | str] = field(default_factory=dict)  # by UUID
    pods: PodProfiles = field(default_factory=PodProfiles)  # per-pod use, tick by tick
    # Each GPU's health verdict, as the daemon latches it; the profile feeds it every tick.
    latch: HealthLatch = field(default_factory=HealthLatch)
    # Each GPU's clocks and settings tick by tick (steady and comparable).
    watch: SettingsWatch = field(default_factory=SettingsWatch)
    # Which link each GPU's link-bound seconds waited on (where the time goes).
    links: LinkSplit = field(default_factory=LinkSplit)


@dataclass(frozen=True)
class PodsRead:
    """Where the pods came from: `socket` None when none were asked for; `read` whether the
    kubelet answered."""

    socket: str | None
    read: bool
    devices: int = 0  # device ids held by pods, as the kubelet listed them
    # Per-process attribution (--processes): the container runtime's socket (None: off) and
    # whether it answered at the start of the profile.
    runtime_socket: str | None = None
    runtime_read: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "kubelet_socket": self.socket,
            "read": self.read,
            "devices_held": self.devices,
            "runtime_socket": self.runtime_socket,
            "runtime_read": self.runtime_read,
        }


@dataclass(frozen=True)
class Run:
    """What the report says about how it was made."""

    simulated: str | None
    duration: float
    interval: float


def build_report(
    run: Run,
    versions: Mapping[str, str | None],
    topology: Topology,
    profile: Profile,
    pods: PodsRead | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """The report; `node` names the node in health_validation (default: node_name())."""
    findings = profile.health.findings()
    by_gpu: dict[int, list[HealthFinding]] = {}
    for finding in findings:
        if finding.gpu is not None:
            by_gpu.setdefault(finding.gpu, []).append(finding)
    node_findings = [f for f in findings if f.gpu is None]
    devices = [
        _device_report(view, profile, topology, by_gpu.get(view.index, []))
        for view in sorted(profile.last.values(), key=lambda v: v.index)
    ]
    verdict = node_verdict(devices)
    views = sorted(profile.last.values(), key=lambda v: v.index)
    comparable = comparable_report(profile.watch, views, profile.config)
    entries = _time_entries(views, devices, profile)
    attention = (
        bool(node_findings)
        or verdict["verdict"] in ATTENTION_VERDICTS
        or bool(attention_findings(comparable))
        or any(
            _needs_attention(d) or any(_needs_attention(i) for i in d["instances"]) for d in devices
        )
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "simulated": run.simulated,
        "profile": {
            "duration_seconds": run.duration,
            "interval_seconds": run.interval,
            "samples": profile.ticks,
        },
        "pods": (pods or PodsRead(None, False)).to_dict(),
        "sections": [{"section": name, "keys": list(keys)} for name, keys in SECTIONS],
        # 1. Health
        "health": {
            "rule_files": profile.health.files,
            "group": HEALTH_GROUP,
            "node_verdict": verdict,
            "evaluation_errors": list(profile.health.errors),
            "node_findings": [f.to_dict() for f in node_findings],
            "node_next_steps": merged_steps(node_findings),
            "earlier_xids": KERNEL_LOG_HINT,
        },
        "health_validation": health_validation(node or node_name(), verdict, devices),
        # 2. Steady and comparable
        "versions": dict(versions),
        "comparable": comparable,
        # 3. Where the time goes
        "topology": {
            **topology.to_dict(),
            "matrix": topology.matrix_text(),
            "interpretation": interpret(topology).to_dict(),
        },
        "time": time_report([entry for entry, _ in entries]),
        # 4. Hot spots
        "hot_spots": _hot_spots(entries),
        # The per-GPU detail, and the outcome
        "attention_classes": sorted(ATTENTION_CLASSES),
        "devices": devices,
        "needs_attention": attention,
        "exit_status": EXIT_ATTENTION if attention else EXIT_OK,
    }


def _healthy(device: Mapping[str, Any]) -> bool:
    """Up, without a health finding or a verdict that needs attention (as _device_report)."""
    verdict = device["health_verdict"]
    bad = verdict is not None and verdict["verdict"] in ATTENTION_VERDICTS
    return bool(device["up"]) and not device["health_findings"] and not bad


def _time_entries(
    views: list[DeviceView], devices: list[dict[str, Any]], profile: Profile
) -> list[tuple[Entry, Mapping[str, Any]]]:
    """Each GPU (or, with MIG on, each of its instances) as where the time goes counts it, with
    its report entry (for its class and advice)."""
    out: list[tuple[Entry, Mapping[str, Any]]] = []
    for view, device in zip(views, devices, strict=True):
        if not device["up"]:
            why: str | None = f"down: {device['down_reason'] or 'unknown reason'}"
        elif not _healthy(device):
            why = "health first: its numbers describe a GPU with a health problem"
        else:
            why = None
        mig = device["mig"] is not None and device["mig"]["current"] and device["up"]
        parts: list[tuple[str, Mapping[str, Any]]] = (
            [(i["mig_uuid"], i) for i in device["instances"]] if mig else [("", device)]
        )
        for mig_uuid, part in parts:
            verdict = profile.classifier.verdict(view.uuid, mig_uuid) if view.uuid else None
            instance = part if mig_uuid else None
            entry = Entry(
                where=_place(device, instance),
                gpu=device["index"],
                gpu_instance=instance["gpu_instance"] if instance else None,
                compute_instance=instance["compute_instance"] if instance else None,
                class_seconds=part["profile"]["class_seconds"],
                link_seconds=profile.links.of(view.uuid, mig_uuid),
                fallback_link=busier_link(verdict.stats if verdict else None),
                kernel_share=part["profile"]["utilization"],
                not_judged=why,
            )
            out.append((entry, part))
    return out


def _place(device: Mapping[str, Any], instance: Mapping[str, Any] | None) -> str:
    """ "GPU 0", or a MIG instance's "GPU 0 GI 9" ("GPU 3 GI 1 CI 2" in a shared GPU instance)."""
    where = f"GPU {device['index']}"
    if instance is None:
        return where
    where += f" GI {instance['gpu_instance']}"
    if instance["compute_instance"] is not None:
        where += f" CI {instance['compute_instance']}"
    return where


def _hot_spots(entries: list[tuple[Entry, Mapping[str, Any]]]) -> dict[str, Any]:
    """The advice for each counted GPU and MIG instance's class, in the order of its category
    (the diagnosis' order), and the GPUs left without it because their health comes first."""
    advised = [
        (CATEGORY_KEYS.index(category_of(part["class"], entry)), n, entry, part)
        for n, (entry, part) in enumerate(entries)
        if entry.not_judged is None and part["class"] and part["next_steps"]
    ]
    advised.sort(key=lambda item: item[:2])
    return {
        "advice": [
            {
                "where": entry.where,
                "gpu": entry.gpu,
                "gpu_instance": entry.gpu_instance,
                "compute_instance": entry.compute_instance,
                "category": category_of(part["class"], entry),
                "class": part["class"],
                "reason": part["class_reason"],
                "next_steps": list(part["next_steps"]),
            }
            for _, _, entry, part in advised
        ],
        "health_first": list(
            dict.fromkeys(
                f"GPU {entry.gpu}"
                for entry, _ in entries
                if entry.not_judged is not None and entry.not_judged.startswith("health first")
            )
        ),
    }


def _needs_attention(entry: Mapping[str, Any]) -> bool:
    """A GPU's or MIG instance's own problems, or a container idling on it."""
    return bool(entry["problems"] or entry["idle_allocations"])


def _device_report(
    last: DeviceView, profile: Profile, topology: Topology, findings: list[HealthFinding]
) -> dict[str, Any]:
    mig = _mig_mode(last)
    partitioned = bool(mig and mig["current"])
    # A GPU that is down at the end has no class: what limits it now is not known. A GPU with
    # MIG on has none either: its instances have theirs.
    up = last.up
    verdict = profile.classifier.verdict(last.uuid) if up and not partitioned else None
    cls = verdict.cls if verdict else None
    state = _state(last, topology)
    health_verdict = gpu_verdict(profile.latch, last)
    # A verdict that needs attention without a finding (the rules read the same latch, so
    # rarely) still rules out performance advice: the GPU is not known to be healthy.
    bad_verdict = health_verdict is not None and health_verdict["verdict"] in ATTENTION_VERDICTS
    healthy = not findings and up and not bad_verdict
    instances = [
        _instance_report(last, instance, profile, state, healthy)
        for instance in sorted(last.instances, key=lambda instance: instance.order_key)
        if up
    ]
    numbers = _profile_numbers(verdict, profile.classifier.seconds(last.uuid))
    reason = verdict.why if verdict else None
    if partitioned:
        numbers = _parent_numbers(last, profile, numbers)
        reason = f"MIG is on: each of its {len(instances)} MIG instances has its own class"
    config = profile.config.get(last.uuid) if last.uuid else None
    config_findings = (
        check_config(config, mig, last.index) if isinstance(config, DeviceConfig) else []
    )
    if healthy:
        steps, steps_for = (list(NEXT_STEPS[cls]), cls) if cls else ([], None)
    else:
        steps, steps_for = merged_steps(findings), "health"
    report = {
        "index": last.index,
        "uuid": last.uuid,
        "model": last.info.get("model"),
        "architecture": last.info.get("architecture"),
        "pci_bus_id": last.info.get("pci_bus_id"),
        "up": up,
        "down_reason": last.down_reason or None,
        "mig": mig,
        "pods": _pods_json(InstanceView.pods_of(last.readings)),
        "state": state,
        "health_verdict": health_verdict,
        "health_verdict_unavailable": None if health_verdict else NOT_JUDGED,
        "health_findings": [f.to_dict() for f in findings],
        "config": config_json(config, config_findings),
        "profile": numbers,
        "class": cls,
        "class_reason": reason,
        "activity_source": _activity_source(last.readings),
        "next_steps_for": steps_for if steps else None,
        "next_steps": steps,
        # Who used how much of it over the profile (per-process attribution), and who held it
        # and did nothing: health first, as for the class, so not on a broken GPU.
        "pod_use": pod_use_json(profile.pods, (last.index, "")) if up else [],
        "unattributed": unattributed_json(last.readings) if up else [],
        "idle_allocations": (
            idle_allocations(profile.pods, (last.index, ""), last, cls) if healthy else []
        ),
        "instances": instances,
    }
    report["problems"] = _problems(last, verdict, state, topology, findings, config_findings)
    if bad_verdict and not findings and health_verdict is not None:
        report["problems"].insert(0, _verdict_problem(health_verdict))
    report["notes"] = _notes(state, findings, config_findings)
    return report


def _verdict_problem(verdict: Mapping[str, Any]) -> str:
    return (
        f"health verdict {verdict['verdict']}: {verdict['meaning']} (next step: "
        f"{verdict['action']}; docs/runbook.md, Health verdicts)"
    )


def _activity_source(readings: Iterable[Any]) -> str | None:
    """`gpm` or `dcgm`: which source measured the GPU's activity in the last tick (None: neither
    did, or DCGM is not in use, which is when the series is absent)."""
    for reading in readings:
        if reading.family == "gpu_activity_source_info":
            return str(dict(reading.labels).get("source"))
    return None


def _problems(
    last: DeviceView,
    verdict: Verdict | None,
    state: Mapping[str, Any],
    topology: Topology,
    findings: list[HealthFinding],
    config: list[ConfigFinding],
) -> list[str]:
    """A GPU's own problems, health first; its MIG instances' classes are theirs. The class's
    problem only on a healthy GPU: on a broken one it would be advice about the wrong thing."""
    out = [] if last.up else [f"GPU not answering: {last.down_reason or 'unknown reason'}"]
    out += [f.text() for f in findings]
    if not last.up:
        return out
    out += _link_problems(last.uuid, state, topology)
    out += [f"{c.setting}: {c.text}" for c in config if c.level == WARNING]
    if findings:
        return out
    if verdict is not None:
        out += _class_problems(verdict, state)
    elif (mig := _mig_mode(last)) and mig["current"]:
        out += _clock_problems(state, "MIG")
    return out


def _notes(
    state: Mapping[str, Any], findings: list[HealthFinding], config: list[ConfigFinding]
) -> list[str]:
    """What is worth knowing but is no fault by the rule pack's definition."""
    out = []
    health = state["health"]
    alerted = {f.labels.get("xid") for f in findings}
    for xid, count in sorted(health["xid_errors"].items(), key=lambda kv: int(kv[0])):
        if xid in alerted:
            continue
        meaning = xids.NOT_ALERTED.get(int(xid), "not alerted by the rule pack")
        out.append(f"XID {xid} seen {count} time(s) during the profile: {meaning}")
    uncorrected = health["ecc_errors_uncorrected"]
    if uncorrected and not any(f.alert == "GpuUncorrectableEccErrors" for f in findings):
        out.append(
            f"{int(uncorrected)} uncorrectable ECC error(s) since the driver loaded, none during "
            "the profile; the row remap state says whether the memory was repaired"
        )
    out += [f"{c.setting}: {c.text}" for c in config if c.level != WARNING]
    return out


def _mig_mode(device: DeviceView) -> dict[str, bool] | None:
    """gpu_mig_mode's states; None on a GPU without MIG support."""
    current = device.value("gpu_mig_mode", state="current")
    pending = device.value("gpu_mig_mode", state="pending")
    if current is None and pending is None:
        return None
    return {"current": current == 1.0, "pending": pending == 1.0}


def _pods_json(pods: Iterable[tuple[str, str, str]]) -> list[dict[str, str]]:
    """Every pod holding the GPU or instance (its gpu_pod_info), as the report lists them."""
    return [
        {"namespace": namespace, "pod": pod, "container": container}
        for namespace, pod, container in pods
    ]


def _instance_report(
    parent: DeviceView,
    instance: InstanceView,
    profile: Profile,
    state: Mapping[str, Any],
    healthy: bool = True,
) -> dict[str, Any]:
    """One MIG instance, judged as a whole GPU is; the clocks and links are its parent's. On
    an unhealthy parent it keeps its class but gets no advice: the parent's health comes first."""
    identity = instance.identity
    verdict = profile.classifier.verdict(parent.uuid, instance.mig_uuid)
    cls = verdict.cls if verdict else None
    unavailable, steps = _activity_unavailable(parent, instance)
    reason = verdict.why if verdict else None
    if cls == "unknown" and unavailable:
        reason = unavailable
    elif cls is not None:
        steps = NEXT_STEPS[cls]
    seconds = profile.classifier.seconds(parent.uuid, instance.mig_uuid)
    device = (parent.index, instance.mig_uuid)
    return {
        "gpu_instance": instance.gpu_instance_id,
        "compute_instance": instance.compute_instance_id,
        "mig_uuid": instance.mig_uuid,
        "mig_profile": identity.get("mig_profile"),
        "size": instance.size,
        "pods": _pods_json(instance.pods()),
        "memory_used_bytes": instance.value("gpu_memory_used_bytes"),
        "memory_total_bytes": instance.value("gpu_memory_total_bytes"),
        "activity_unavailable": unavailable,
        "profile": _profile_numbers(verdict, seconds),
        "class": cls,
        "class_reason": reason,
        "next_steps": list(steps) if cls and healthy else [],
        "problems": (
            _class_problems(verdict, state, own_clocks=False) if verdict and healthy else []
        ),
        "pod_use": pod_use_json(profile.pods, device),
        "unattributed": unattributed_json(instance.readings),
        "idle_allocations": (
            idle_allocations(profile.pods, device, instance, cls) if healthy else []
        ),
    }


def _activity_unavailable(
    parent: DeviceView, instance: InstanceView
) -> tuple[str | None, tuple[str, ...]]:
    """Why NVML gives this instance no activity (and what to do instead), or (None, ())
    when it does, or may once GPM has two samples."""
    if instance.has_activity:
        return None, ()
    architecture = parent.info.get("architecture", "")
    if ARCHITECTURES.get(architecture, ARCHITECTURES["hopper"]) < ARCHITECTURES["hopper"]:
        model = parent.info.get("model") or "this GPU"
        return (
            f"activity unavailable: no GPM before Hopper ({model}, {architecture}), and NVML "
            "reads a MIG instance's activity only with GPM: memory and size only",
            MIG_NO_GPM_STEPS,
        )
    if "compute_instance" in instance.identity:
        gi = instance.identity.get("gpu_instance", "?")
        return (
            f"activity unavailable: GPU instance {gi} is split into several compute instances, "
            "and GPM measures the GPU instance as a whole",
            MIG_SHARED_STEPS,
        )
    return None, ()


def _parent_numbers(parent: DeviceView, profile: Profile, own: dict[str, Any]) -> dict[str, Any]:
    """A MIG parent's profile: no activity of its own (its instances have it), but the links
    and clocks its instances' windows saw, which are the physical GPU's."""
    for instance in parent.instances:
        verdict = profile.classifier.verdict(parent.uuid, instance.mig_uuid)
        if verdict is not None:
            shared = _profile_numbers(verdict, {})
            for key in ("pcie_bytes_per_second", "nvlink_bytes_per_second", "link_utilization"):
                own[key] = shared[key]
            own["throttle_fraction"] = shared["throttle_fraction"]
            own["samples"] = shared["samples"]
            break
    return own


def _state(view: DeviceView, topology: Topology) -> dict[str, Any]:
    """The GPU's state at the end of the profile. A GPU that is down has none to give: every
    current value is None and `unavailable` says why; its health (XIDs are known without
    NVML) and what the topology read at start stay."""
    value = view.value if view.up else (lambda family, **labels: None)
    node = topology.gpu(view.uuid) if view.uuid else None
    return {
        "unavailable": None if view.up else f"GPU not answering: {view.down_reason or 'unknown'}",
        "sm_clock_hz": value("gpu_clock_hertz", clock="sm"),
        "sm_clock_max_hz": value("gpu_clock_max_hertz", clock="sm"),
        "memory_clock_hz": value("gpu_clock_hertz", clock="memory"),
        "memory_clock_max_hz": value("gpu_clock_max_hertz", clock="memory"),
        "power_watts": value("gpu_power_watts"),
        "power_limit_watts": value("gpu_power_limit_watts"),
        "temperature_celsius": value("gpu_temperature_celsius", sensor="gpu"),
        "memory_temperature_celsius": value("gpu_temperature_celsius", sensor="memory"),
        "clock_events_active": sorted(
            dict(r.labels)["reason"]
            for r in view.readings
            if view.up and r.family == "gpu_clock_event_active" and r.value
        ),
        "pcie": {
            "generation": value("gpu_pcie_link_generation", state="current"),
            "max_generation": value("gpu_pcie_link_generation", state="max"),
            "width": value("gpu_pcie_link_width", state="current"),
            "max_width": value("gpu_pcie_link_width", state="max"),
        },
        "nvlink_links_active": value("gpu_nvlink_links_active"),
        "nvlink_links": node.nvlink_links if node else None,
        "health": _health(view),
    }


def _health(view: DeviceView) -> dict[str, Any]:
    """The health readings as the last tick shows them (`gpu_up` is the GPU's own `up`)."""
    value = view.value
    # The XIDs seen: the alerted ones are exported at 0 before the first (catalog).
    xid_counts = {
        dict(r.labels)["xid"]: int(r.value)
        for r in view.readings
        if r.family == "gpu_xid_errors_total" and r.value > 0
    }
    return {
        "gpu_up": view.up,
        "ecc_enabled": value("gpu_ecc_enabled"),
        "ecc_errors_corrected": value("gpu_ecc_errors_total", error="corrected"),
        "ecc_errors_uncorrected": value("gpu_ecc_errors_total", error="uncorrected"),
        "row_remap_pending": value("gpu_row_remap_pending"),
        "row_remap_failure": value("gpu_row_remap_failure"),
        "retired_pages_pending": value("gpu_retired_pages_pending"),
        "xid_errors": xid_counts,
    }


def _profile_numbers(verdict: Verdict | None, seconds: Mapping[str, float]) -> dict[str, Any]:
    s = verdict.stats if verdict else None
    return {
        "samples": s.samples if s else 0,
        "utilization": s.utilization if s else None,
        "sm_active": s.sm_active if s else None,
        "tensor_active": s.tensor_active if s else None,
        "dram_active": s.dram_active if s else None,
        "pcie_bytes_per_second": s.pcie_bytes_per_second if s else None,
        "nvlink_bytes_per_second": s.nvlink_bytes_per_second if s else None,
        "link_utilization": s.link_utilization if s else None,
        "throttle_fraction": s.throttle_fraction if s else None,
        "class_seconds": {c: round(seconds.get(c, 0.0), 3) for c in CLASSES},
    }


def _link_problems(uuid: str, state: Mapping[str, Any], topology: Topology) -> list[str]:
    """NVLink links down or P2P over them unavailable (a down-trained PCIe link is the rule
    pack's GpuPcieLink*Degraded, a health finding)."""
    out = []
    links, active = state["nvlink_links"], state["nvlink_links_active"]
    if links and active is not None and active < links:
        out.append(f"{links - int(active)} of {links} NVLink links are not active")
    broken = [
        f"GPU{p.peer_index}"
        for p in topology.peers_of(uuid)
        if p.nvlink_links and p.p2p.get("nvlink", "ok") != "ok"
    ]
    if broken:
        out.append(
            f"NVLink to {', '.join(broken)} but P2P over NVLink is unavailable "
            "(on NVSwitch systems: is nvidia-fabricmanager running?)"
        )
    return out


def _class_problems(
    verdict: Verdict, state: Mapping[str, Any], own_clocks: bool = True
) -> list[str]:
    """The class's problem; `own_clocks` False for a MIG instance, whose clocks are its
    parent's (reported once, on the parent)."""
    if verdict.cls in ATTENTION_CLASSES:
        return [f"{verdict.cls}: {verdict.why}"]
    return _clock_problems(state, verdict.cls) if own_clocks else []


def _clock_problems(state: Mapping[str, Any], what: str) -> list[str]:
    active = [r for r in state["clock_events_active"] if r in THROTTLE_REASONS]
    if active:  # e.g. a power brake asserted on an idle GPU
        return [f"clocks held down by {', '.join(active)} ({what})"]
    return []
