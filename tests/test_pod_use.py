"""Per-pod use of shared GPUs from the processes NVML lists (collect/k8s/pod_use.py): what is
measured, what is apportioned, and what is not known (absent, never 0). The shares arrive
bounded by the device (tests/test_process_shares.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import pytest

from gpu_exporter.collect.k8s.attribution import PodRef
from gpu_exporter.collect.k8s.pod_use import (
    ENERGY_RETENTION_SECONDS,
    HOST,
    UNKNOWN,
    Owner,
    PodUse,
)
from gpu_exporter.model.snapshot import DeviceSample, InstanceSample, ProcessSample, Reading

BUSY = PodRef("ml", "trainer", "main")
LIGHT = PodRef("ml", "eval", "main")
IDLE = PodRef("lab", "notebook", "jupyter")
GIB = float(1 << 30)

OWNERS = {
    101: Owner(BUSY),
    102: Owner(BUSY),
    201: Owner(LIGHT),
    301: Owner(reason=HOST),
}


def owner_of(pids: Iterable[int]) -> Mapping[int, Owner]:
    return {pid: OWNERS[pid] for pid in pids if pid in OWNERS}  # others: unknown


def gpu(
    processes: tuple[ProcessSample, ...] | None,
    utilization: float = 0.9,
    energy: float | None = None,
    uuid: str = "GPU-a",
) -> DeviceSample:
    readings = [Reading("gpu_utilization_ratio", utilization)]
    if energy is not None:
        readings.append(Reading("gpu_energy_joules_total", energy))
    return DeviceSample(0, uuid, {}, True, tuple(readings), processes=processes)


def proc(pid: int, memory: float, sm: float | None = None) -> ProcessSample:
    return ProcessSample(pid, memory, {} if sm is None else {"sm": sm})


def values(device: DeviceSample, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {r.labels: r.value for r in device.readings if r.family == family}


def pod(ref: PodRef, **extra: str) -> tuple[tuple[str, str], ...]:
    return (
        ("namespace", ref.namespace),
        ("pod", ref.pod),
        ("container", ref.container),
        *extra.items(),
    )


SHARED = (
    proc(101, 4 * GIB, 0.5),
    proc(102, 2 * GIB, 0.1),
    proc(201, GIB, 0.2),
    proc(301, GIB, 0.05),
)


def test_each_container_gets_its_processes_memory_and_shares_and_the_rest_is_unattributed() -> None:
    use = PodUse(owner_of, holders=lambda: {"GPU-a": (BUSY, IDLE, LIGHT)})
    (device,) = use.process([gpu(SHARED)], 0.0)
    assert values(device, "gpu_pod_processes") == {pod(BUSY): 2, pod(LIGHT): 1, pod(IDLE): 0}
    assert values(device, "gpu_pod_memory_used_bytes") == {
        pod(BUSY): 6 * GIB,
        pod(LIGHT): GIB,
        pod(IDLE): 0.0,
    }
    assert values(device, "gpu_pod_utilization_ratio") == pytest.approx(
        {pod(BUSY): 0.6, pod(LIGHT): 0.2, pod(IDLE): 0.0}
    )
    # An idle holder is measured at zero: NVML lists no process of it.
    assert values(device, "gpu_pod_encoder_utilization_ratio")[pod(IDLE)] == 0.0
    reason = lambda r: (("reason", r),)  # noqa: E731
    assert values(device, "gpu_unattributed_processes") == {reason(HOST): 1}
    assert values(device, "gpu_unattributed_memory_used_bytes") == {reason(HOST): GIB}


def test_with_a_process_of_no_known_container_an_idle_holders_use_is_not_known() -> None:
    use = PodUse(owner_of, holders=lambda: {"GPU-a": (BUSY, IDLE)})
    (device,) = use.process([gpu((*SHARED, proc(999, GIB, 0.0)))], 0.0)
    reason = lambda r: (("reason", r),)  # noqa: E731
    assert values(device, "gpu_unattributed_processes") == {reason(HOST): 1, reason(UNKNOWN): 1}
    # PID 999 may be IDLE's: its zero would be a guess, so it has no figure at all.
    assert pod(IDLE) not in values(device, "gpu_pod_processes")
    assert pod(IDLE) not in values(device, "gpu_pod_utilization_ratio")
    assert values(device, "gpu_pod_processes")[pod(BUSY)] == 2


def test_mps_clients_unsampled_while_the_server_is_busy_have_no_utilization() -> None:
    # That the driver samples each MPS client under its own PID is assumed: where only the
    # server (not a client) has samples, the clients' use is not known rather than 0.
    server = ProcessSample(301, GIB, {"sm": 0.7})
    clients = (
        ProcessSample(101, GIB, {}, mps=True),
        ProcessSample(201, GIB, {}, mps=True),
    )
    (device,) = PodUse(owner_of).process([gpu((server, *clients))], 0.0)
    assert values(device, "gpu_pod_memory_used_bytes") == {pod(BUSY): GIB, pod(LIGHT): GIB}
    assert not values(device, "gpu_pod_utilization_ratio")
    # A client sampled busy: the clients are sampled under their PIDs, the idle one is 0.
    busy = (server, replace(clients[0], utilization={"sm": 0.4}), clients[1])
    (device,) = PodUse(owner_of).process([gpu(busy)], 0.0)
    assert values(device, "gpu_pod_utilization_ratio") == pytest.approx(
        {pod(BUSY): 0.4, pod(LIGHT): 0.0}
    )


def test_unmeasured_utilization_is_absent_never_zero() -> None:
    use = PodUse(owner_of)
    unmeasured = (ProcessSample(101, GIB, None),)
    (device,) = use.process([gpu(unmeasured)], 0.0)
    assert values(device, "gpu_pod_memory_used_bytes") == {pod(BUSY): GIB}
    assert not values(device, "gpu_pod_utilization_ratio")
    (device,) = PodUse(owner_of).process([gpu(None)], 0.0)  # processes not read at all
    assert not [r for r in device.readings if r.family.startswith(("gpu_pod", "gpu_unattr"))]


def test_a_container_alone_gets_all_the_energy_sharing_ones_their_share_of_sm_time() -> None:
    use = PodUse(owner_of)
    use.process([gpu((proc(101, GIB, 0.9),), energy=1000.0)], 0.0)
    (device,) = use.process([gpu((proc(101, GIB, 0.9),), energy=1100.0)], 1.0)
    assert values(device, "gpu_pod_energy_joules_total") == {
        pod(BUSY, attribution="exclusive"): 100.0
    }
    # Then LIGHT and a host process share it: 300 J, SM time 0.5 : 0.25 : 0.25.
    shared = (proc(101, GIB, 0.5), proc(201, GIB, 0.25), proc(301, GIB, 0.25))
    (device,) = use.process([gpu(shared, utilization=1.0, energy=1400.0)], 2.0)
    energy = values(device, "gpu_pod_energy_joules_total")
    assert energy == pytest.approx(
        {
            pod(BUSY, attribution="exclusive"): 100.0,
            pod(BUSY, attribution="apportioned"): 150.0,
            pod(LIGHT, attribution="apportioned"): 75.0,
        }
    )
    assert sum(energy.values()) <= 1400.0 - 1000.0  # the host process's share is nobody's


def test_energy_of_an_idle_or_unread_tick_is_charged_to_nobody() -> None:
    use = PodUse(owner_of, holders=lambda: {"GPU-a": (BUSY, LIGHT)})
    idle = (proc(101, GIB), proc(201, GIB))  # listed, never sampled busy
    use.process([gpu(idle, energy=0.0)], 0.0)
    (device,) = use.process([gpu(idle, energy=500.0)], 1.0)
    assert not values(device, "gpu_pod_energy_joules_total")
    use.process([gpu(None, energy=900.0)], 2.0)  # processes not read: its 400 J go nowhere
    busy = (proc(101, GIB, 0.4), proc(201, GIB, 0.4))
    (device,) = use.process([gpu(busy, utilization=0.8, energy=1000.0)], 3.0)
    charged = {
        pod(BUSY, attribution="apportioned"): 50.0,
        pod(LIGHT, attribution="apportioned"): 50.0,
    }
    assert values(device, "gpu_pod_energy_joules_total") == pytest.approx(charged)
    # The counter went back (a driver reload): the tick's energy is not known, nobody is charged.
    (device,) = use.process([gpu(busy, utilization=0.8, energy=10.0)], 4.0)
    assert values(device, "gpu_pod_energy_joules_total") == pytest.approx(charged)
    (device,) = use.process([gpu(busy, utilization=0.8)], 5.0)  # energy not read
    assert values(device, "gpu_pod_energy_joules_total") == pytest.approx(charged)


def test_an_ended_containers_energy_counter_ends_after_the_retention() -> None:
    use = PodUse(owner_of)
    use.process([gpu((proc(101, GIB, 0.9),), energy=0.0)], 0.0)
    use.process([gpu((proc(101, GIB, 0.9),), energy=10.0)], 1.0)
    (device,) = use.process([gpu((), energy=20.0)], 2.0)  # it ended
    assert not values(device, "gpu_pod_energy_joules_total")  # not shown while gone
    (device,) = use.process([gpu((proc(101, GIB, 0.9),), energy=30.0)], 3.0)  # back: continues
    assert values(device, "gpu_pod_energy_joules_total") == {
        pod(BUSY, attribution="exclusive"): 20.0
    }
    later = 4.0 + ENERGY_RETENTION_SECONDS
    use.process([gpu((), energy=40.0)], later)
    (device,) = use.process([gpu((proc(101, GIB, 0.9),), energy=50.0)], later + 1.0)
    assert values(device, "gpu_pod_energy_joules_total") == {
        pod(BUSY, attribution="exclusive"): 10.0
    }


def test_mig_instances_get_counts_and_memory_but_no_utilization_or_energy() -> None:
    instance = InstanceSample(1, 0, "MIG-x", "1g.18gb", processes=(ProcessSample(101, GIB, None),))
    device = DeviceSample(0, "GPU-m", {}, True, (), instances=(instance,), mig_enabled=True)
    use = PodUse(owner_of, holders=lambda: {"MIG-x": (BUSY, IDLE)})
    (device,) = use.process([device], 0.0)
    (instance,) = device.instances
    families = {r.family for r in instance.readings}
    assert families == {"gpu_pod_processes", "gpu_pod_memory_used_bytes"}
    assert {r.labels: r.value for r in instance.readings if r.family == "gpu_pod_processes"} == {
        pod(BUSY): 1,
        pod(IDLE): 0,
    }
