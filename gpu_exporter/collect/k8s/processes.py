"""Which container a GPU process runs in: its host PID -> pod UID and container id -> pod.

NVML lists processes by PID, as the host numbers them (see the end). `<proc root>/<pid>/cgroup`
names the process's cgroups (cgroups(7): `hierarchy-ID:controllers:path` lines under cgroup v1,
the single `0::path` under v2); the kubelet puts every pod in a cgroup named `pod<UID>` and the
runtime every container in one named by its id (kubernetes pkg/kubelet/cm):

    systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, - as _>.slice
              /cri-containerd-<id>.scope  (CRI-O: crio-<id>.scope; Docker: docker-<id>.scope)
    cgroupfs: /kubepods/burstable/pod<uid>/<id>  (Guaranteed pods: no QoS level)

The pod is the path's component holding `pod<UID>` (a 36-character UID; a static pod's is 32 hex
digits without dashes), wherever it is: a reader in a cgroup namespace sees paths relative to
its own cgroup (`/../../kubepods-...-pod<uid>.slice/...`), and nested cgroups may follow the
container's. The container is the first component after the pod's that names a 64-hex id.
A process in no pod's cgroup runs outside Kubernetes (a host job, a burn-in, an MPS
daemon started on the host): reason `host`. The container id then becomes namespace/pod/container
through the container runtime (`containers`, the CRI client of `cri.py`).

Each PID is read once per process: the result is cached by (PID, start time) from
`<proc root>/<pid>/stat` (field 22, clock ticks since boot), so a PID the kernel reuses for a
new process is read again and never inherits the old one's pod; entries of PIDs no longer on
any GPU are dropped. A process that cannot be read (the daemon may not read its /proc entry)
or whose container the runtime does not know (yet) is `unknown` this tick, counted in
`gpu_exporter_process_attribution_errors_total`, and read again next tick. A process with no
entry at all has exited since NVML listed it (no error), unless NVML lists it again the next
tick: then the proc root does not show it (a `hidepid` mount hides other users' processes from
a reader without CAP_SYS_PTRACE), which is counted.

The daemon must run in the host's PID namespace, and the proc root must be that namespace's
/proc. NVML gives PIDs as the caller's PID namespace numbers them and leaves out the processes
that namespace cannot see (the open GPU kernel modules translate each PID with `os_find_ns_pid`
and skip those without one): in a container's own namespace it lists no other container's
process at all, and every pod sharing the GPU would look idle. The check: `<proc root>/self/ns/pid`
names the PID namespace of the reader as that /proc sees it, and the host's (initial) namespace
is inode 0xEFFFFFFC, `PROC_PID_INIT_INO` (linux include/linux/proc_ns.h), so the link reads
`pid:[4026531836]`. A container's /proc shows the container's namespace; the host's /proc
mounted into a container without hostPID shows the container's too (the reader's own entry), so
both are refused. While it is not the host's, `namespace_problem` says why and per-pod use is
not measured at all (collect/k8s/process_attribution.py), rather than measured wrong. (A node
that is itself a container, as under kind, runs pods in a namespace below the initial one: it
is refused too.)
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter.collect.k8s.attribution import PodRef
from gpu_exporter.collect.k8s.pod_use import HOST, UNKNOWN, Owner

log = logging.getLogger(__name__)

# readlink(/proc/self/ns/pid) in the initial PID namespace: PROC_PID_INIT_INO = 0xEFFFFFFC.
HOST_PID_NAMESPACE = "pid:[4026531836]"

# `pod<uid>` as a whole cgroup path component (cgroupfs) or its end (systemd: `...-pod<uid>.slice`,
# the UID's dashes written as `_`); a static pod's UID is its config hash, 32 hex digits.
_POD = re.compile(
    r"(?:^|[-_])pod("
    r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
    r")(?:\.slice)?$"
)
# The container's leaf: a 64-hex id, bare (cgroupfs) or in a runtime's scope (systemd).
_NO_ENTRY = "no entry"  # _cgroup_owner's answer for a PID /proc has no entry for
_CONTAINER = re.compile(
    r"^(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)


@dataclass(frozen=True)
class CgroupOwner:
    """What a process's cgroup says: the pod UID and container id, or neither (a host process)."""

    pod_uid: str = ""
    container_id: str = ""


def parse_cgroup(text: str) -> CgroupOwner:
    """The pod UID and container id a `/proc/<pid>/cgroup` names (cgroup v1, v2 or hybrid;
    systemd or cgroupfs driver; containerd, CRI-O or Docker naming); empty for a process in no
    pod. The unified (v2) line wins over v1 lines where both are there."""
    unified: list[str] = []
    per_controller: list[str] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        _, _, path = rest.partition(":")
        if path:
            (unified if hierarchy == "0" else per_controller).append(path)
    for path in unified + per_controller:
        parts = path.strip("/").split("/")
        for at, part in enumerate(parts):
            pod = _POD.search(part)
            if pod is None:
                continue
            uid = pod.group(1).replace("_", "-")
            below = (_CONTAINER.match(p) for p in parts[at + 1 :])
            container = next((m.group(1) for m in below if m), "")
            return CgroupOwner(uid, container)
    return CgroupOwner()


def start_time(stat: str) -> int:
    """Field 22 of `/proc/<pid>/stat` (starttime); the command, field 2, may hold spaces and
    parentheses, so fields are counted after its last `)`."""
    after = stat[stat.rindex(")") + 2 :].split()
    return int(after[19])  # fields 3.. follow: starttime is field 22


@dataclass(frozen=True)
class ContainerRef:
    """A container as the runtime knows it."""

    pod: PodRef
    pod_uid: str


class ProcessOwners:
    """`owners(pids)` for `PodUse`: each PID's container, read from /proc and the runtime."""

    def __init__(
        self,
        proc_root: str | Path,
        containers: Callable[[str], ContainerRef | None],
        errors: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.proc_root = Path(proc_root)
        self.containers = containers  # container id -> its ref (None: unknown to the runtime)
        self.errors = errors  # counts a failure by reason ("proc", "runtime")
        self._cache: dict[tuple[int, int], CgroupOwner] = {}  # (pid, start time)
        self._failing: dict[str, str] = {}  # reason -> message, this tick
        self._failed_before: set[str] = set()  # reasons that failed last tick
        self._missing: set[int] = set()  # listed PIDs without an entry, last tick

    def owners(self, pids: Iterable[int]) -> Mapping[int, Owner]:
        out: dict[int, Owner] = {}
        kept: dict[tuple[int, int], CgroupOwner] = {}
        missing: set[int] = set()
        for pid in pids:
            found = self._cgroup_owner(pid)
            if found is None:
                out[pid] = Owner(reason=UNKNOWN)
                continue
            if isinstance(found, str):  # _NO_ENTRY
                missing.add(pid)
                out[pid] = Owner(reason=UNKNOWN)
                continue
            key, cgroup = found
            kept[key] = cgroup
            out[pid] = self._owner(cgroup)
        hidden = missing & self._missing  # listed twice, never there: not an exit
        if hidden:
            self._failed(
                "proc",
                f"{self.proc_root} shows no entry for PID {min(hidden)} ({len(hidden)} such) "
                "that NVML still lists: is it the host's /proc, mounted without hidepid?",
            )
            for _ in range(len(hidden) - 1):
                self.errors("proc")
        self._cache, self._missing = kept, missing  # PIDs gone from every GPU drop out here
        self._log_changes()
        return out

    def namespace_problem(self) -> str:
        """Why per-process attribution cannot work here ("" when it can): the reader is not in
        the host's PID namespace, or the proc root is not its /proc. Counted and logged once
        while it lasts; what was cached is dropped (the numbers were not the host's)."""
        link = self.proc_root / "self" / "ns" / "pid"
        try:
            namespace = os.readlink(link)
        except OSError as exc:
            problem = f"cannot read {link} ({exc.strerror or exc}): is {self.proc_root} a /proc?"
        else:
            problem = "" if namespace == HOST_PID_NAMESPACE else (
                f"{self.proc_root} is the /proc of PID namespace {namespace}, not the host's "
                f"({HOST_PID_NAMESPACE}), and NVML lists only the processes of the daemon's own "
                "PID namespace: run the daemon with hostPID (the chart's processAttribution does); "
                "per-pod use is not measured until then"
            )  # fmt: skip
        if problem:
            self._failed("proc", problem, unknown=False)
            self._cache, self._missing = {}, set()
            self._log_changes()
        return problem

    def _log_changes(self) -> None:
        """One log line when a kind of failure starts, one when it stops: never one per PID."""
        failing, self._failing = self._failing, {}
        for reason in sorted(failing.keys() - self._failed_before):
            log.warning("process attribution: %s", failing[reason])
        for reason in sorted(self._failed_before - failing.keys()):
            log.info("process attribution: the %s lookups work again", reason)
        self._failed_before = set(failing)

    def _cgroup_owner(self, pid: int) -> tuple[tuple[int, int], CgroupOwner] | str | None:
        """(cache key, what its cgroup says); _NO_ENTRY when /proc has no entry for it (it
        exited, or the proc root hides it); None when the entry could not be read."""
        directory = self.proc_root / str(pid)
        try:
            # The command name in stat is whatever bytes the process chose, UTF-8 or not.
            stat = (directory / "stat").read_text(encoding="utf-8", errors="replace")
            started = start_time(stat)
            key = (pid, started)
            cached = self._cache.get(key)
            if cached is None:
                cgroup = (directory / "cgroup").read_text(encoding="utf-8", errors="replace")
                cached = parse_cgroup(cgroup)
        except FileNotFoundError:
            return _NO_ENTRY  # exited since NVML listed it, unless it stays so (owners)
        except (OSError, ValueError, IndexError) as exc:
            self._failed("proc", f"cannot read {directory}: {exc}")
            return None
        return key, cached

    def _owner(self, cgroup: CgroupOwner) -> Owner:
        if not cgroup.pod_uid:
            return Owner(reason=HOST)
        ref = self.containers(cgroup.container_id) if cgroup.container_id else None
        if ref is None or ref.pod_uid != cgroup.pod_uid:
            self._failed("runtime", f"no container {cgroup.container_id or '(none)'} of pod "
                         f"{cgroup.pod_uid} in the container runtime")  # fmt: skip
            return Owner(reason=UNKNOWN)
        return Owner(ref.pod)

    def _failed(self, reason: str, message: str, unknown: bool = True) -> None:
        """Count a failure; `unknown`: the process it concerns is counted unattributed."""
        self.errors(reason)
        suffix = " (counted unattributed, reason unknown)" if unknown else ""
        self._failing.setdefault(reason, message + suffix)
