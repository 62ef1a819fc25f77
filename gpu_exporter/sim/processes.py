"""Processes on the simulated GPUs: a scenario's `processes:` (docs/scenarios.md, "Processes").

Each entry is one process's context on one GPU (or MIG device) for a while: what the fake NVML
lists per GPU and samples per process, what the fake /proc shows under the host PID
(`sim/procfs.py`) and, for a process in a pod, whose container the fake CRI runtime reports
(`sim/cri.py`). The identities all three show are derived here, once: a pod's UID, a
container's id, a sandbox's id, a cgroup path and a start time (`pod_uid`, `container_id`,
`sandbox_id`, `pod_cgroup`, `host_cgroup`, `start_ticks`).

The derivations follow what a node running Kubernetes with containerd shows (the kubelet's
systemd cgroup driver on cgroup v2, burstable QoS): a process's /proc/<pid>/cgroup is
`0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, - as _>.slice/
cri-containerd-<container id>.scope` (cgroups(7): one `0::<path>` line on v2; the slice names
are the kubelet's, pkg/kubelet/cm/cgroup_manager_linux.go, and the scope containerd's). A pod's
UID is UUID-shaped (version 4, as the API server's), a container id 64 hex digits, as
containerd's. /proc/<pid>/stat's start time (field 22, proc(5)) counts clock ticks since boot,
USER_HZ = 100 on Linux.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, PlainValidator, field_validator, model_validator

from gpu_exporter.sim.fields import (
    DeviceIndex,
    Info,
    Seconds,
    Strict,
    Text,
    Until,
    context_of,
    each,
    error,
    error_at,
    errors,
    int_in,
    one_of,
    settle,
    string,
    until_after_from,
)
from gpu_exporter.sim.mig import MigSpec
from gpu_exporter.sim.values import ValueSpec, constant, value_spec
from gpu_exporter.support.yamlfile import Path_

__all__ = [
    "COMM_MAX",
    "KINDS",
    "PID_MAX",
    "PROC_FILES",
    "UPTIME_AT_START_S",
    "USER_HZ",
    "UTILIZATION",
    "ProcessPod",
    "ProcessSpec",
    "ProcessUtilization",
    "by_gpu",
    "container_id",
    "host_cgroup",
    "pod_cgroup",
    "pod_uid",
    "sandbox_id",
    "start_ticks",
    "validate_processes",
]

# proc(5): /proc/<pid>/stat's times are in clock ticks, sysconf(_SC_CLK_TCK) = USER_HZ = 100.
USER_HZ = 100
# The simulated node booted this long before scenario time 0 (3 days, 4 h, 5 min, 6 s: a node
# that has been up a while), so start times look like a real node's.
UPTIME_AT_START_S = 273_906.0
# PID_MAX_LIMIT on 64-bit Linux (2^22): the highest /proc/sys/kernel/pid_max.
PID_MAX = 4_194_304
# TASK_COMM_LEN - 1: the kernel keeps at most 15 bytes of a command name (stat's field 2).
COMM_MAX = 15
# The files of /proc/<pid> the simulator writes (and the proc faults name).
PROC_FILES = ("cgroup", "stat")

# compute: a CUDA context (nvmlDeviceGetComputeRunningProcesses); graphics: a graphics context
# (nvmlDeviceGetGraphicsRunningProcesses); mps: an MPS client (nvmlDeviceGetMPSComputeRunning
# Processes); mps_server: the MPS control daemon's server, listed with the compute processes.
KINDS = ("compute", "graphics", "mps", "mps_server")
# nvmlProcessUtilizationInfo_v1_t's smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil.
UTILIZATION = ("sm", "memory", "encoder", "decoder", "jpeg", "ofa")

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


# ---------------------------------------------------------------------------------------------
# Identities: one definition for the fake NVML, /proc and CRI runtime


def pod_uid(namespace: str, pod: str) -> str:
    """A pod's UID (a version 4 UUID, as the API server gives), from its namespace and name."""
    h = hashlib.sha256(f"pod-uid:{namespace}/{pod}".encode()).hexdigest()
    variant = "89ab"[int(h[16], 16) % 4]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:32]}"


def container_id(uid: str, container: str) -> str:
    """A container's id (64 hex digits, as containerd's) from its pod's UID and its name: a pod
    recreated under a new UID gets new container ids."""
    return hashlib.sha256(f"container:{uid}/{container}".encode()).hexdigest()


def sandbox_id(uid: str) -> str:
    """A pod's sandbox id (64 hex digits, as containerd's) from its UID."""
    return hashlib.sha256(f"sandbox:{uid}".encode()).hexdigest()


def pod_cgroup(uid: str, container: str) -> str:
    """/proc/<pid>/cgroup of a process in a burstable pod's container (cgroup v2, the kubelet's
    systemd driver, containerd): systemd slice names cannot hold '-' but as a separator, so the
    kubelet writes the UID's dashes as underscores."""
    slice_ = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{container}.scope\n"
    )


def host_cgroup(name: str) -> str:
    """/proc/<pid>/cgroup of a host process outside Kubernetes: a systemd service of its name."""
    unit = re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "unknown"
    return f"0::/system.slice/{unit}.service\n"


def start_ticks(start_s: float) -> int:
    """/proc/<pid>/stat's starttime of a process that starts at scenario second `start_s`."""
    return round((UPTIME_AT_START_S + start_s) * USER_HZ)


# ---------------------------------------------------------------------------------------------
# The models


def _uid(value: Any) -> str:
    uid = string(value)
    if not _UUID.fullmatch(uid):
        raise error("expected a pod UID like '3f2a7c1e-8d4b-4e6f-9a0c-1b2d3e4f5a6b' (lower case)")
    return uid


def _container_id(value: Any) -> str:
    cid = string(value)
    if not _CONTAINER_ID.fullmatch(cid):
        raise error("expected a container id of 64 lower-case hex digits")
    return cid


def _comm(value: Any) -> str:
    name = string(value)
    if not name or "\n" in name or "\0" in name:
        raise error("expected a command name: not empty, no newline or NUL")
    if len(name.encode()) > COMM_MAX:
        raise error(f"a command name is at most {COMM_MAX} bytes (the kernel's TASK_COMM_LEN)")
    return name


def _cgroup(value: Any) -> str:
    text = string(value)
    if not text.strip():
        raise error("expected the text of /proc/<pid>/cgroup, got an empty string")
    return text if text.endswith("\n") else text + "\n"


class ProcessPod(Strict):
    """The pod and container a process runs in (what the CRI runtime names its container)."""

    namespace: Text
    pod: Text
    container: Text = "main"
    uid: Annotated[str, PlainValidator(_uid)] = ""  # derived: pod_uid(namespace, pod)
    container_id: Annotated[str, PlainValidator(_container_id)] = ""  # derived: container_id()

    @model_validator(mode="after")
    def _derive(self) -> ProcessPod:
        if "uid" not in self.model_fields_set:
            settle(self, uid=pod_uid(self.namespace, self.pod))
        if "container_id" not in self.model_fields_set:
            settle(self, container_id=container_id(self.uid, self.container))
        return self


_ZERO_RATIO = constant(0.0, "process_ratio")


class ProcessUtilization(Strict):
    """A process's share of each engine over time (ratios 0-1, NVML's per-process percent)."""

    sm: Annotated[ValueSpec, value_spec("process_ratio", "sm")] = _ZERO_RATIO
    memory: Annotated[ValueSpec, value_spec("process_ratio", "memory")] = _ZERO_RATIO
    encoder: Annotated[ValueSpec, value_spec("process_ratio", "encoder")] = _ZERO_RATIO
    decoder: Annotated[ValueSpec, value_spec("process_ratio", "decoder")] = _ZERO_RATIO
    jpeg: Annotated[ValueSpec, value_spec("process_ratio", "jpeg")] = _ZERO_RATIO
    ofa: Annotated[ValueSpec, value_spec("process_ratio", "ofa")] = _ZERO_RATIO

    def percents(self, t: float) -> tuple[int, ...]:
        """Each engine's percent at `t`, in UTILIZATION's order (unsigned ints, as NVML's)."""
        return tuple(
            max(0, min(100, round(getattr(self, name).value_at(t) * 100))) for name in UTILIZATION
        )


class ProcessSpec(Strict):
    """One process's context on one GPU or MIG device (docs/scenarios.md, "Processes"). The
    same process on two GPUs, or with a compute and a graphics context, is two entries with
    the same `pid` (and the same identity: pod, name, cgroup, start time)."""

    pid: Annotated[int, int_in(1, PID_MAX)]
    gpu: DeviceIndex
    gpu_instance: Annotated[int | None, int_in(lo=0)] = None  # MIG: required, else refused
    compute_instance: Annotated[int | None, int_in(lo=0)] = None  # MIG: default 0
    kind: Annotated[str, one_of(KINDS)] = "compute"
    # stat's comm; derived: nvidia-cuda-mps (the server's 15 bytes), else python3
    name: Annotated[str, PlainValidator(_comm)] = ""
    pod: ProcessPod | None = None  # None: a host process outside Kubernetes
    cgroup: Annotated[str, PlainValidator(_cgroup)] = ""  # derived: pod_cgroup / host_cgroup
    memory_bytes: Annotated[ValueSpec, value_spec("process_bytes", "memory_bytes")] = constant(
        0.0, "process_bytes"
    )
    utilization: ProcessUtilization = Field(default_factory=ProcessUtilization)
    start: Seconds = Field(default=0.0, alias="from")
    until: Until = None
    start_time: Annotated[int, int_in(lo=0)] = 0  # derived: start_ticks(from)

    if TYPE_CHECKING:  # set at validation, not written in the file
        position: int  # in the scenario's list

    _after_start = field_validator("until")(until_after_from)

    @model_validator(mode="after")
    def _derive(self, info: Info) -> ProcessSpec:
        given = self.model_fields_set
        name = self.name if "name" in given else _default_name(self.kind)
        derived: dict[str, Any] = {"position": context_of(info)["position"], "name": name}
        if "cgroup" not in given:
            pod = self.pod
            derived["cgroup"] = (
                pod_cgroup(pod.uid, pod.container_id) if pod is not None else host_cgroup(name)
            )
        latest = start_ticks(self.start)
        if "start_time" not in given:
            derived["start_time"] = latest
        elif self.start_time > latest:
            raise error_at(
                ("start_time",),
                f"a process that runs from {self.start:g} s started by tick {latest} "
                f"(the node booted {UPTIME_AT_START_S:g} s before scenario time 0, "
                f"{USER_HZ} ticks a second)",
                self.start_time,
            )
        settle(self, **derived)
        self._check_instance(context_of(info).get("devices"))
        return self

    def _check_instance(self, devices: Sequence[Any] | None) -> None:
        """`gpu_instance` names a GPU instance that lives as long as the process on a GPU with
        MIG on, and is refused on one with MIG off (a process there has no instance ids)."""
        if devices is None:
            return  # the devices' problems are reported
        device = devices[self.gpu]
        mig: MigSpec | None = device.mig
        if mig is None or not mig.enabled:
            for key in ("gpu_instance", "compute_instance"):
                if getattr(self, key) is not None:
                    raise error_at((key,), f"GPU {self.gpu} has MIG off: no `{key}`")
            return
        if self.gpu_instance is None:
            raise error(
                f"GPU {self.gpu} has MIG on: give `gpu_instance` (and `compute_instance`, "
                "default 0) of the MIG device the process runs on"
            )
        ci = self.compute_instance or 0
        end = float("inf") if self.until is None else self.until
        for inst in mig.instances:
            inst_end = float("inf") if inst.until is None else inst.until
            if inst.gpu_instance == self.gpu_instance and inst.start <= self.start < inst_end:
                if end > inst_end:
                    raise error_at(
                        ("until",),
                        f"GPU instance {self.gpu_instance} ends at {inst_end:g} s, "
                        "before the process does",
                    )
                if ci >= inst.compute_instances:
                    key = (
                        "compute_instance" if self.compute_instance is not None else "gpu_instance"
                    )
                    raise error_at(
                        (key,),
                        f"GPU instance {self.gpu_instance} has "
                        f"{inst.compute_instances} compute instances",
                    )
                return
        raise error_at(
            ("gpu_instance",),
            f"GPU {self.gpu} has no GPU instance {self.gpu_instance} at {self.start:g} s",
        )

    def running(self, t: float) -> bool:
        """Inside [from, until): the process runs (and holds its context) at scenario time t."""
        return t >= self.start and (self.until is None or t < self.until)

    @property
    def end(self) -> float:
        return float("inf") if self.until is None else self.until

    @property
    def identity(self) -> tuple[Any, ...]:
        """What /proc shows of it: two entries with one PID at one time must agree on it."""
        pod = self.pod
        where = (pod.uid, pod.container, pod.container_id) if pod is not None else None
        return (where, self.name, self.cgroup, self.start_time)


def _default_name(kind: str) -> str:
    return "nvidia-cuda-mps" if kind == "mps_server" else "python3"


# ---------------------------------------------------------------------------------------------
# The list and its checks across entries


def validate_processes(value: Any, info: Info) -> tuple[ProcessSpec, ...]:
    """The scenario's `processes:`: each entry, then the checks across them."""
    if value is None:
        return ()
    seed = info.data.get("seed", 0)

    def position(i: int) -> dict[str, Any]:
        return {"position": i, "noise_prefix": f"{seed}:process{i}"}

    processes = each(ProcessSpec, value, context_of(info), position)
    problems = [*_pid_clashes(processes), *_mps_without_server(processes), *_shared_ids(processes)]
    if problems:
        raise errors(problems)
    return processes


def _overlap(a: ProcessSpec, b: ProcessSpec) -> bool:
    return a.start < b.end and b.start < a.end


def _pid_clashes(processes: Sequence[ProcessSpec]) -> list[tuple[Path_, str, Any]]:
    """A PID names one process at a time: entries with one PID that run at the same time must
    be the same process (one identity) and its contexts on different GPUs or of different
    kinds."""
    problems: list[tuple[Path_, str, Any]] = []
    for i, proc in enumerate(processes):
        for j, other in enumerate(processes[:i]):
            if other.pid != proc.pid or not _overlap(proc, other):
                continue
            if other.identity != proc.identity:
                message = (
                    f"PID {proc.pid} is processes[{j}]'s at the same time, and that is another "
                    "process (a different pod, name, cgroup or start_time): a PID names one "
                    "process at a time"
                )
            elif (other.gpu, other.kind) == (proc.gpu, proc.kind):
                message = f"PID {proc.pid} already has a {proc.kind} context on GPU {proc.gpu} "
                message += f"at the same time (processes[{j}])"
            else:
                continue
            problems.append(((i, "pid"), message, proc.pid))
            break
    return problems


def _mps_without_server(processes: Sequence[ProcessSpec]) -> list[tuple[Path_, str, Any]]:
    """An MPS client runs only while its GPU (or MIG device) has an MPS server."""
    problems: list[tuple[Path_, str, Any]] = []
    for i, proc in enumerate(processes):
        if proc.kind != "mps":
            continue
        where = (proc.gpu, proc.gpu_instance, proc.compute_instance)
        served = any(
            server.kind == "mps_server"
            and (server.gpu, server.gpu_instance, server.compute_instance) == where
            and server.start <= proc.start
            and server.end >= proc.end
            for server in processes
        )
        if not served:
            problems.append(
                (
                    (i, "kind"),
                    f"an MPS client needs an `mps_server` process on GPU {proc.gpu} "
                    "(the same MIG device, if any) for as long as it runs",
                    proc.kind,
                )
            )
    return problems


def _shared_ids(processes: Sequence[ProcessSpec]) -> list[tuple[Path_, str, Any]]:
    """A UID names one pod and a container id one container (ids given in the file)."""
    problems: list[tuple[Path_, str, Any]] = []
    pods: dict[str, tuple[str, str]] = {}
    containers: dict[str, tuple[str, str]] = {}
    for i, proc in enumerate(processes):
        pod = proc.pod
        if pod is None:
            continue
        owner = pods.setdefault(pod.uid, (pod.namespace, pod.pod))
        if owner != (pod.namespace, pod.pod):
            problems.append(
                ((i, "pod", "uid"), f"UID {pod.uid} is also pod {owner[0]}/{owner[1]}'s", pod.uid)
            )
        holder = containers.setdefault(pod.container_id, (pod.uid, pod.container))
        if holder != (pod.uid, pod.container):
            problems.append(
                (
                    (i, "pod", "container_id"),
                    "the container id is also another container's",
                    pod.container_id,
                )
            )
    return problems


def by_gpu(processes: Sequence[ProcessSpec]) -> Mapping[int, tuple[ProcessSpec, ...]]:
    """The processes of each GPU index, in the scenario's order."""
    out: dict[int, list[ProcessSpec]] = {}
    for proc in processes:
        out.setdefault(proc.gpu, []).append(proc)
    return {gpu: tuple(procs) for gpu, procs in out.items()}
