"""A scenario's `processes:` (gpu_exporter/sim/processes.py): the keys, the identities derived
from them, and every problem reported at its file and line."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from gpu_exporter.sim.processes import (
    KINDS,
    PROC_FILES,
    UTILIZATION,
    ProcessPod,
    ProcessSpec,
    container_id,
    host_cgroup,
    pod_cgroup,
    pod_uid,
    sandbox_id,
    start_ticks,
)
from gpu_exporter.sim.scenario import ScenarioError, load_scenario
from gpu_exporter.sim.spec import _FAULT_KINDS
from tests.test_scenario import DOC, assert_names_line

MIG_GPU = {
    "mig": {
        "instances": [
            {"profile": "3g.71gb", "gpu_instance": 1, "compute_instances": 1},
            {"profile": "1g.18gb", "gpu_instance": 5, "until": 50},
        ]
    }
}


def scenario(*processes: dict, **top: object) -> dict:
    """GPUs 0 and 1 whole, GPU 2 with MIG (GI 1 always, GI 5 until 50 s)."""
    return {"name": "t", "devices": [{}, {}, MIG_GPU], "processes": list(processes), **top}


def only(process: dict) -> ProcessSpec:
    return load_scenario(scenario(process)).processes[0]


# -- keys and what is derived ---------------------------------------------------------------


def test_a_pod_process_gets_its_pods_uid_container_id_cgroup_and_start_time() -> None:
    proc = only({"pid": 4242, "gpu": 0, "from": 12.5, "pod": {"namespace": "ml", "pod": "a-0"}})
    uid = pod_uid("ml", "a-0")
    assert proc.pod is not None
    assert (proc.pod.container, proc.pod.uid) == ("main", uid)
    assert proc.pod.container_id == container_id(uid, "main")
    assert re.fullmatch(r"[0-9a-f]{64}", proc.pod.container_id)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", uid)
    assert proc.cgroup == (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{proc.pod.container_id}.scope\n"
    )
    assert proc.cgroup == pod_cgroup(uid, proc.pod.container_id)
    assert proc.start_time == start_ticks(12.5) == round((273906 + 12.5) * 100)
    assert (proc.kind, proc.name, proc.gpu_instance, proc.compute_instance) == (
        "compute",
        "python3",
        None,
        None,
    )
    assert proc.memory_bytes.value_at(3) == 0
    assert proc.utilization.percents(3) == (0,) * len(UTILIZATION)


def test_identities_are_deterministic_and_distinct() -> None:
    assert pod_uid("ml", "a-0") == pod_uid("ml", "a-0") != pod_uid("ml", "a-1")
    assert pod_uid("ml", "a-0") != pod_uid("ml2", "a-0")
    uid = pod_uid("ml", "a-0")
    assert container_id(uid, "main") != container_id(uid, "sidecar")
    assert sandbox_id(uid) not in (container_id(uid, "main"), sandbox_id(pod_uid("ml", "a-1")))


def test_a_host_process_lives_in_a_systemd_service_named_after_it() -> None:
    proc = only({"pid": 2291, "gpu": 1, "name": "ollama"})
    assert proc.pod is None
    assert proc.cgroup == host_cgroup("ollama") == "0::/system.slice/ollama.service\n"
    assert host_cgroup("Xorg (x)") == "0::/system.slice/Xorg__x_.service\n"
    server = only({"pid": 9, "gpu": 0, "kind": "mps_server"})
    assert server.name == "nvidia-cuda-mps"  # nvidia-cuda-mps-server, cut to 15 bytes


def test_given_ids_cgroup_name_and_start_time_are_kept() -> None:
    uid = "3f2a7c1e-8d4b-4e6f-9a0c-1b2d3e4f5a6b"
    cid = "ab" * 32
    proc = only(
        {
            "pid": 7,
            "gpu": 0,
            "from": 30,
            "name": "train (rank 0)",
            "start_time": 1000,
            "pod": {
                "namespace": "a",
                "pod": "b",
                "container": "c",
                "uid": uid,
                "container_id": cid,
            },
        }
    )
    assert proc.pod == ProcessPod(namespace="a", pod="b", container="c", uid=uid, container_id=cid)
    assert cid in proc.cgroup and uid.replace("-", "_") in proc.cgroup
    assert (proc.name, proc.start_time) == ("train (rank 0)", 1000)
    explicit = only({"pid": 7, "gpu": 0, "cgroup": "12:pids:/docker/abc\n0::/docker/abc"})
    assert explicit.cgroup == "12:pids:/docker/abc\n0::/docker/abc\n"  # a file ends in newline


def test_a_recreated_pod_with_a_new_uid_gets_new_container_ids() -> None:
    new_uid = "0d6f9f2e-5b1c-4a7e-8f3d-2c4b6a8e0f1d"
    old = only({"pid": 7, "gpu": 0, "pod": {"namespace": "a", "pod": "b"}})
    new = only({"pid": 7, "gpu": 0, "pod": {"namespace": "a", "pod": "b", "uid": new_uid}})
    assert old.pod is not None and new.pod is not None
    assert old.pod.container_id != new.pod.container_id == container_id(new_uid, "main")


def test_memory_and_utilization_are_value_specs() -> None:
    proc = only(
        {
            "pid": 7,
            "gpu": 0,
            "memory_bytes": {"steps": [[0, 1.0e9], [10, 2.0e9]]},
            "utilization": {
                "sm": {"ramp": [[0, 0], [10, 1]]},
                "memory": 0.25,
                "encoder": 0.004,  # rounds to 0 %
                "decoder": 0.5,
                "jpeg": 0.07,
                "ofa": {"sine": {"mean": 0.5, "amplitude": 0.1, "period": 4}, "noise": 0.01},
            },
        }
    )
    assert proc.memory_bytes.value_at(5) == 1.0e9 and proc.memory_bytes.value_at(10) == 2.0e9
    assert proc.utilization.percents(5)[:5] == (50, 25, 0, 50, 7)
    assert 38 <= proc.utilization.percents(3)[5] <= 42


def test_mig_processes_name_their_mig_device() -> None:
    proc = only({"pid": 7, "gpu": 2, "gpu_instance": 1})
    assert (proc.gpu_instance, proc.compute_instance) == (1, None)
    assert only({"pid": 7, "gpu": 2, "gpu_instance": 5, "until": 50}).until == 50


def test_one_process_may_hold_contexts_on_two_gpus_and_of_two_kinds() -> None:
    loaded = load_scenario(
        scenario(
            {"pid": 7, "gpu": 0, "pod": {"namespace": "a", "pod": "b"}},
            {"pid": 7, "gpu": 0, "kind": "graphics", "pod": {"namespace": "a", "pod": "b"}},
            {"pid": 7, "gpu": 1, "pod": {"namespace": "a", "pod": "b"}},
            # The PID reused after the first process ended: another process.
            {"pid": 8, "gpu": 0, "until": 10},
            {"pid": 8, "gpu": 0, "from": 10, "pod": {"namespace": "a", "pod": "c"}},
        )
    )
    assert len(loaded.processes) == 5
    assert loaded.processes[3].start_time != loaded.processes[4].start_time


def test_an_mps_client_under_a_server_that_covers_it_loads() -> None:
    loaded = load_scenario(
        scenario(
            {"pid": 9, "gpu": 0, "kind": "mps_server", "until": 100},
            {"pid": 10, "gpu": 0, "kind": "mps", "from": 5, "until": 100},
            {"pid": 11, "gpu": 2, "gpu_instance": 1, "kind": "mps_server"},
            {"pid": 12, "gpu": 2, "gpu_instance": 1, "kind": "mps"},
        )
    )
    assert [p.kind for p in loaded.processes] == ["mps_server", "mps", "mps_server", "mps"]


def test_a_pod_need_not_hold_an_allocation_for_its_gpu() -> None:
    """A pod that sees a GPU it was not allocated (NVIDIA_VISIBLE_DEVICES=all) is the case
    attribution exists to show: not refused."""
    loaded = load_scenario(
        scenario(
            {"pid": 7, "gpu": 1, "pod": {"namespace": "a", "pod": "b"}},
            pods=[{"namespace": "a", "pod": "b", "gpu": 0}],
        )
    )
    assert loaded.processes[0].gpu == 1


# -- problems, at their file and line ---------------------------------------------------------

_HEAD = """
name: t
devices:
  - {}
  - {}
  - mig:
      instances:
        - {profile: 3g.71gb, gpu_instance: 1}
        - {profile: 1g.18gb, gpu_instance: 5, until: 50}
"""

BAD = {
    "pid missing": (
        """
        processes:
          - {gpu: 0}  # <-
        """,
        "processes[0]: missing required key 'pid'",
    ),
    "pid zero": ("processes:\n  - {pid: 0, gpu: 0}  # <-", "processes[0].pid: must be >= 1"),
    "pid past pid_max": (
        "processes:\n  - {pid: 4194305, gpu: 0}  # <-",
        "processes[0].pid: must be <= 4.1943e+06",
    ),
    "unknown gpu": ("processes:\n  - {pid: 1, gpu: 3}  # <-", "processes[0].gpu: must be <= 2"),
    "unknown kind": (
        "processes:\n  - {pid: 1, gpu: 0, kind: daemon}  # <-",
        "processes[0].kind: unknown value 'daemon' (known: compute, graphics, mps, mps_server)",
    ),
    "unknown key": (
        "processes:\n  - {pid: 1, gpu: 0, memory: 5}  # <-",
        "processes[0].memory: unknown key 'memory'",
    ),
    "until before from": (
        "processes:\n  - {pid: 1, gpu: 0, from: 30, until: 20}  # <-",
        "processes[0].until: `until` must be after `from`",
    ),
    "long name": (
        "processes:\n  - {pid: 1, gpu: 0, name: pt_main_thread_x}  # <-",
        "processes[0].name: a command name is at most 15 bytes",
    ),
    "empty cgroup": (
        "processes:\n  - {pid: 1, gpu: 0, cgroup: ''}  # <-",
        "processes[0].cgroup: expected the text of /proc/<pid>/cgroup",
    ),
    "start time after from": (
        "processes:\n  - {pid: 1, gpu: 0, from: 10, start_time: 27391601}  # <-",
        "processes[0].start_time: a process that runs from 10 s started by tick 27391600",
    ),
    "utilization out of range": (
        """
        processes:
          - pid: 1
            gpu: 0
            utilization:
              sm: 1.2  # <-
        """,
        "processes[0].utilization.sm: must be <= 1, got 1.2",
    ),
    "unknown engine": (
        """
        processes:
          - pid: 1
            gpu: 0
            utilization:
              tensor: 0.3  # <-
        """,
        "processes[0].utilization.tensor: unknown key 'tensor' (known: decoder, encoder, jpeg, "
        "memory, ofa, sm)",
    ),
    "bad memory spec": (
        """
        processes:
          - pid: 1
            gpu: 0
            memory_bytes:
              steps: [[0, 1], [5]]  # <-
        """,
        "processes[0].memory_bytes.steps[1]: expected a [time, value] pair",
    ),
    "pod without name": (
        """
        processes:
          - pid: 1
            gpu: 0
            pod: {namespace: a}  # <-
        """,
        "processes[0].pod: missing required key 'pod'",
    ),
    "bad uid": (
        """
        processes:
          - pid: 1
            gpu: 0
            pod:
              namespace: a
              pod: b
              uid: B9F3  # <-
        """,
        "processes[0].pod.uid: expected a pod UID",
    ),
    "bad container id": (
        """
        processes:
          - pid: 1
            gpu: 0
            pod:
              namespace: a
              pod: b
              container_id: abc  # <-
        """,
        "processes[0].pod.container_id: expected a container id of 64 lower-case hex digits",
    ),
    "instance on a whole gpu": (
        "processes:\n  - {pid: 1, gpu: 0, gpu_instance: 1}  # <-",
        "processes[0].gpu_instance: GPU 0 has MIG off: no `gpu_instance`",
    ),
    "no instance on a mig gpu": (
        "processes:\n  - {pid: 1, gpu: 2}  # <-",
        "processes[0]: GPU 2 has MIG on: give `gpu_instance`",
    ),
    "unknown instance": (
        "processes:\n  - {pid: 1, gpu: 2, gpu_instance: 3}  # <-",
        "processes[0].gpu_instance: GPU 2 has no GPU instance 3 at 0 s",
    ),
    "instance ends first": (
        "processes:\n  - {pid: 1, gpu: 2, gpu_instance: 5}  # <-",
        "processes[0].until: GPU instance 5 ends at 50 s, before the process does",
    ),
    "no such compute instance": (
        "processes:\n  - {pid: 1, gpu: 2, gpu_instance: 1, compute_instance: 1}  # <-",
        "processes[0].compute_instance: GPU instance 1 has 1 compute instances",
    ),
    "a pid twice at once": (
        """
        processes:
          - {pid: 7, gpu: 0, until: 60}
          - {pid: 7, gpu: 1, from: 30, pod: {namespace: a, pod: b}}  # <-
        """,
        "processes[1].pid: PID 7 is processes[0]'s at the same time, and that is another process",
    ),
    "a context twice": (
        """
        processes:
          - {pid: 7, gpu: 0}
          - {pid: 7, gpu: 0}  # <-
        """,
        "processes[1].pid: PID 7 already has a compute context on GPU 0 at the same time",
    ),
    "mps client without server": (
        "processes:\n  - {pid: 8, gpu: 0, kind: mps}  # <-",
        "processes[0].kind: an MPS client needs an `mps_server` process on GPU 0",
    ),
    "mps client outliving its server": (
        """
        processes:
          - {pid: 9, gpu: 0, kind: mps_server, until: 20}
          - {pid: 8, gpu: 0, kind: mps}  # <-
        """,
        "processes[1].kind: an MPS client needs an `mps_server` process on GPU 0",
    ),
    "mps server on another mig device": (
        """
        processes:
          - {pid: 9, gpu: 0, kind: mps_server}
          - {pid: 8, gpu: 1, kind: mps}  # <-
        """,
        "processes[1].kind: an MPS client needs an `mps_server` process on GPU 1",
    ),
    "one uid, two pods": (
        """
        processes:
          - {pid: 1, gpu: 0, pod: {namespace: a, pod: b, uid: 3f2a7c1e-8d4b-4e6f-9a0c-1b2d3e4f5a6b}}
          - pid: 2
            gpu: 0
            pod:
              namespace: a
              pod: c
              uid: 3f2a7c1e-8d4b-4e6f-9a0c-1b2d3e4f5a6b  # <-
        """,
        "processes[1].pod.uid: UID 3f2a7c1e-8d4b-4e6f-9a0c-1b2d3e4f5a6b is also pod a/b's",
    ),
    "proc fault for no process": (
        """
        processes:
          - {pid: 1, gpu: 0}
        faults:
          - {kind: proc_vanished, at: 5, pid: 2}  # <-
        """,
        "faults[0].pid: no process has PID 2",
    ),
    "proc fault for an unknown file": (
        """
        processes:
          - {pid: 1, gpu: 0}
        faults:
          - {kind: proc_unreadable, at: 5, pid: 1, files: [environ]}  # <-
        """,
        "faults[0].files[0]: unknown value 'environ' (known: cgroup, stat)",
    ),
    "cri hang without duration": (
        """
        processes:
          - {pid: 1, gpu: 0}
        faults:
          - {kind: cri_hang, at: 5}  # <-
        """,
        "faults[0]: missing required key 'duration'",
    ),
    "cri fault without processes": (
        """
        faults:
          - {kind: cri_down, at: 5}  # <-
        """,
        "faults[0].kind: cri_down needs `processes:`",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_problems_name_file_line_and_field(tmp_path: Path, case: str) -> None:
    text, expected = BAD[case]
    assert_names_line(tmp_path, _HEAD + textwrap.dedent(text).lstrip("\n"), expected)


def test_every_problem_of_the_list_is_reported() -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(
            scenario(
                {"pid": 0, "gpu": 0},
                {"pid": 5, "gpu": 0, "kind": "mps"},
                {"pid": 6, "gpu": 2},
            )
        )
    problems = str(err.value).splitlines()
    assert [p.split(": ")[1] for p in problems] == ["processes[0].pid", "processes[2]"]
    # The checks across entries run once every entry is valid.
    with pytest.raises(ScenarioError) as err:
        load_scenario(scenario({"pid": 5, "gpu": 0, "kind": "mps"}, {"pid": 5, "gpu": 0}))
    assert [p.split(": ")[1] for p in str(err.value).splitlines()] == ["processes[0].kind"]


# -- the doc ------------------------------------------------------------------------------------


def test_the_doc_names_every_process_key_kind_engine_and_fault() -> None:
    text = DOC.read_text()
    keys = [field.alias or name for name, field in ProcessSpec.model_fields.items()]
    pod_keys = list(ProcessPod.model_fields)
    for name in (*keys, *pod_keys, *KINDS, *UTILIZATION, *PROC_FILES, *_FAULT_KINDS):
        assert f"`{name}`" in text, name
