"""PID -> container (collect/k8s/processes.py): every cgroup layout a node has, PID reuse, and
each failure ending as `unknown`, counted, never a crash or a wrong pod."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpu_exporter.collect.k8s.attribution import PodRef
from gpu_exporter.collect.k8s.pod_use import HOST, UNKNOWN, Owner
from gpu_exporter.collect.k8s.processes import (
    HOST_PID_NAMESPACE,
    CgroupOwner,
    ContainerRef,
    ProcessOwners,
    parse_cgroup,
    start_time,
)

UID = "12345678-1234-1234-1234-123456789abc"
UID_ = UID.replace("-", "_")
CID = "ab" * 32

CGROUPS = {
    "containerd, systemd, v2": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"cri-containerd-{CID}.scope\n"
    ),
    "cri-o, systemd, v2": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
        f"crio-{CID}.scope\n"
    ),
    "guaranteed, systemd, v2": (
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
    ),
    "cgroupfs, v1": (
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n"
        f"11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n"
        "1:name=systemd:/\n"
    ),
    "cgroupfs, v2": f"0::/kubepods/burstable/pod{UID}/{CID}\n",
    "docker, systemd, v1 hybrid": (
        f"5:devices:/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope\n0::/\n"
    ),
    # Read from inside a cgroup namespace: relative to the reader's cgroup, no `kubepods`.
    "cgroup namespace, systemd, v2": (
        f"0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
    ),
    # A container that makes cgroups of its own (systemd in it, a nested runtime).
    "nested, cgroupfs, v2": f"0::/kubepods/pod{UID}/{CID}/init.scope/{'ef' * 32}\n",
}
STATIC_UID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"  # a static pod's: its config's hash


@pytest.mark.parametrize("layout", sorted(CGROUPS))
def test_every_layout_names_the_pod_uid_and_container_id(layout: str) -> None:
    assert parse_cgroup(CGROUPS[layout]) == CgroupOwner(UID, CID)


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/nvidia-persistenced.service\n",  # a host daemon
        "0::/user.slice/user-1000.slice/session-3.scope\n",  # someone's shell
        f"0::/system.slice/docker-{CID}.scope\n",  # Docker outside Kubernetes
        "12:memory:/\n0::/\n",
        f"0::/system.slice/mypod{UID}.service\n",  # `pod<uid>` inside another name
        "",
    ],
)
def test_a_process_outside_kubepods_is_nobodys(text: str) -> None:
    assert parse_cgroup(text) == CgroupOwner()


def test_a_static_pods_uid_is_32_hex_digits() -> None:
    text = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/"
    text += f"cri-containerd-{CID}.scope\n"
    assert parse_cgroup(text) == CgroupOwner(STATIC_UID, CID)
    assert parse_cgroup(f"0::/kubepods/pod{STATIC_UID}/{CID}\n") == CgroupOwner(STATIC_UID, CID)


def test_the_pod_sandbox_itself_has_a_pod_but_no_container() -> None:
    assert parse_cgroup(f"0::/kubepods/burstable/pod{UID}\n") == CgroupOwner(UID, "")


def test_start_time_is_field_22_whatever_the_command_name() -> None:
    fields = " ".join(str(n) for n in range(4, 22)) + " 987654 55 66"  # fields 4-21, 22, ...
    assert start_time(f"4242 (python3) S {fields}") == 987654
    assert start_time(f"4242 (a (b) c) S {fields}") == 987654


# --- /proc and the runtime ------------------------------------------------------------------

TRAINER = PodRef("ml", "trainer", "main")


def write_process(root: Path, pid: int, cgroup: str, started: int = 1000) -> None:
    directory = root / str(pid)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cgroup").write_text(cgroup)
    fields = " ".join(["0"] * 18) + f" {started} 0"  # fields 4-21, starttime (22), vsize
    (directory / "stat").write_text(f"{pid} (python) S {fields}\n")


def enter_namespace(root: Path, link: str) -> None:
    """Make `root`/self/ns/pid name the PID namespace `link` (as readlink shows it)."""
    (root / "self" / "ns").mkdir(parents=True, exist_ok=True)
    (root / "self" / "ns" / "pid").unlink(missing_ok=True)
    (root / "self" / "ns" / "pid").symlink_to(link)


def owners(root: Path, containers: dict[str, ContainerRef], errors: list[str]) -> ProcessOwners:
    """The mapper over `root`, the host's /proc read from the host's PID namespace."""
    enter_namespace(root, HOST_PID_NAMESPACE)
    return ProcessOwners(root, containers.get, errors.append)


def test_processes_map_to_containers_hosts_and_unknowns(tmp_path: Path) -> None:
    write_process(tmp_path, 10, CGROUPS["containerd, systemd, v2"])
    write_process(tmp_path, 11, "0::/system.slice/burn-in.service\n")
    other = "cd" * 32
    write_process(tmp_path, 12, f"0::/kubepods/pod{UID}/{other}\n")  # the runtime lacks it
    errors: list[str] = []
    mapper = owners(tmp_path, {CID: ContainerRef(TRAINER, UID)}, errors)
    found = mapper.owners([10, 11, 12, 13])  # 13 has exited since NVML listed it
    assert found == {
        10: Owner(TRAINER),
        11: Owner(reason=HOST),
        12: Owner(reason=UNKNOWN),
        13: Owner(reason=UNKNOWN),
    }
    assert errors == ["runtime"]  # an exited process is not a failure


def test_a_command_name_that_is_not_utf8_is_read(tmp_path: Path) -> None:
    write_process(tmp_path, 10, CGROUPS["containerd, systemd, v2"])
    stat = (tmp_path / "10" / "stat").read_bytes()
    (tmp_path / "10" / "stat").write_bytes(stat.replace(b"(python)", b"(tr\xe4in) (x)"))
    errors: list[str] = []
    mapper = owners(tmp_path, {CID: ContainerRef(TRAINER, UID)}, errors)
    assert mapper.owners([10]) == {10: Owner(TRAINER)} and errors == []


def test_a_reused_pid_never_inherits_the_old_processes_pod(tmp_path: Path) -> None:
    write_process(tmp_path, 10, CGROUPS["containerd, systemd, v2"], started=1000)
    notebook = PodRef("lab", "notebook", "jupyter")
    other, other_uid = "ef" * 32, "87654321-4321-4321-4321-cba987654321"
    refs = {CID: ContainerRef(TRAINER, UID), other: ContainerRef(notebook, other_uid)}
    mapper = owners(tmp_path, refs, [])
    assert mapper.owners([10]) == {10: Owner(TRAINER)}
    write_process(tmp_path, 10, f"0::/kubepods/pod{other_uid}/{other}\n", started=5000)
    assert mapper.owners([10]) == {10: Owner(notebook)}


def test_a_cgroup_is_read_once_per_process(tmp_path: Path) -> None:
    write_process(tmp_path, 10, CGROUPS["containerd, systemd, v2"])
    mapper = owners(tmp_path, {CID: ContainerRef(TRAINER, UID)}, [])
    mapper.owners([10])
    (tmp_path / "10" / "cgroup").write_text("0::/system.slice/changed.service\n")
    assert mapper.owners([10]) == {10: Owner(TRAINER)}  # same PID, same start: cached
    mapper.owners([])  # gone from every GPU: forgotten
    assert mapper.owners([10]) == {10: Owner(reason=HOST)}


def test_a_container_of_another_pod_under_that_id_is_not_believed(tmp_path: Path) -> None:
    write_process(tmp_path, 10, CGROUPS["containerd, systemd, v2"])
    stranger = ContainerRef(PodRef("x", "y", "z"), "00000000-0000-0000-0000-000000000000")
    assert owners(tmp_path, {CID: stranger}, []).owners([10]) == {10: Owner(reason=UNKNOWN)}


def test_an_unreadable_entry_is_unknown_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon without the right to read another user's /proc entry (no CAP_SYS_PTRACE)."""
    write_process(tmp_path, 10, CGROUPS["containerd, systemd, v2"])
    denied = tmp_path / "10" / "cgroup"
    read_text = Path.read_text

    def refuse(path: Path, *args: object, **kwargs: object) -> str:
        if path == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return read_text(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", refuse)
    errors: list[str] = []
    assert owners(tmp_path, {}, errors).owners([10]) == {10: Owner(reason=UNKNOWN)}
    assert errors == ["proc"]


def test_a_garbled_entry_is_unknown_and_counted(tmp_path: Path) -> None:
    write_process(tmp_path, 10, CGROUPS["containerd, systemd, v2"])
    (tmp_path / "10" / "stat").write_text("garbage")
    errors: list[str] = []
    assert owners(tmp_path, {}, errors).owners([10]) == {10: Owner(reason=UNKNOWN)}
    assert errors == ["proc"]


def test_failures_are_logged_once_when_they_start_and_once_when_they_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for pid in (10, 11, 12):
        write_process(tmp_path, pid, CGROUPS["containerd, systemd, v2"])
    refs: dict[str, ContainerRef] = {}
    mapper = owners(tmp_path, refs, [])
    with caplog.at_level(logging.INFO, logger="gpu_exporter.collect.k8s.processes"):
        for _ in range(3):
            mapper.owners([10, 11, 12])
        refs[CID] = ContainerRef(TRAINER, UID)
        mapper.owners([10, 11, 12])
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "no container" in messages[0] and "work again" in messages[1]


def test_a_pid_listed_twice_without_an_entry_is_hidden_not_exited(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """hidepid: /proc has no entry for other users' processes; NVML lists them all the same."""
    errors: list[str] = []
    mapper = owners(tmp_path, {}, errors)
    with caplog.at_level(logging.WARNING, logger="gpu_exporter.collect.k8s.processes"):
        assert mapper.owners([20, 21]) == {20: Owner(reason=UNKNOWN), 21: Owner(reason=UNKNOWN)}
        assert errors == []  # the first time: they may have exited since NVML listed them
        mapper.owners([20, 21])
    assert errors == ["proc", "proc"]
    (message,) = [r.getMessage() for r in caplog.records]
    assert "no entry for PID 20 (2 such)" in message and "hidepid" in message


@pytest.mark.parametrize(
    ("namespace", "says"),
    [
        (
            "pid:[4026532451]",  # a container's: its own /proc, or the host's without hostPID
            "is the /proc of PID namespace pid:[4026532451], not the host's (pid:[4026531836])",
        ),
        (None, "/self/ns/pid (No such file or directory): is "),
    ],
)
def test_outside_the_hosts_pid_namespace_it_says_why_once_and_forgets_what_it_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, namespace: str | None, says: str
) -> None:
    """NVML numbers PIDs in the daemon's own PID namespace and hides the others' processes:
    outside the host's, NVML's PID 10 and /proc's 10 need not be one process."""
    errors: list[str] = []
    mapper = owners(tmp_path, {CID: ContainerRef(TRAINER, UID)}, errors)
    write_process(tmp_path, 10, CGROUPS["containerd, systemd, v2"])
    assert mapper.namespace_problem() == ""
    assert mapper.owners([10]) == {10: Owner(TRAINER)}
    if namespace is None:
        (tmp_path / "self" / "ns" / "pid").unlink()
    else:
        enter_namespace(tmp_path, namespace)
    with caplog.at_level(logging.WARNING, logger="gpu_exporter.collect.k8s.processes"):
        assert says in mapper.namespace_problem()
        assert says in mapper.namespace_problem()
    assert errors == ["proc", "proc"]
    (message,) = [r.getMessage() for r in caplog.records]  # logged once
    assert says in message, message
    assert mapper._cache == {}
