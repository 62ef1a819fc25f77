"""MIG in the fake libnvidia-ml, driven through pynvml's public wrappers as production code is.

What each call answers follows nvml.h's MIG notes (docs/mig.md lists them): MIG device handles
enumerated by index with empty slots, per-instance identity and memory, parent-only quantities
NOT_SUPPORTED on MIG handles, utilization NOT_SUPPORTED and aggregate memory NO_PERMISSION on a
MIG-enabled parent without the MIG monitor capability, stale handles after a reconfiguration,
and GPM per GPU instance on Hopper only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pynvml as N
import pytest

from gpu_exporter import sim
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.scenario import ScenarioError, load_scenario


@pytest.fixture
def mig(clock: ManualClock) -> Iterator[Callable[[Any], Any]]:
    def install(scenario: Any = "mig") -> Any:
        fake = sim.install(scenario, clock=clock)
        N.nvmlInit()
        return fake

    try:
        yield install
    finally:
        sim.uninstall()


def devices(parent: Any) -> dict[int, Any]:
    """slot -> MIG device handle, skipping empty slots as NVML's callers must."""
    out = {}
    for slot in range(N.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            out[slot] = N.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
        except (N.NVMLError_NotFound, N.NVMLError_InvalidArgument):
            continue
    return out


def test_enumeration_identity_and_sparse_slots(mig: Callable[[Any], Any]) -> None:
    mig("mig")
    seven, mixed, whole = (N.nvmlDeviceGetHandleByIndex(i) for i in range(3))
    assert N.nvmlDeviceGetMigMode(seven) == [1, 1]
    assert N.nvmlDeviceGetMigMode(whole) == [0, 0]
    assert N.nvmlDeviceGetMaxMigDeviceCount(whole) == 0  # "zero if MIG is not enabled"
    found = devices(seven)
    assert sorted(found) == list(range(7))
    names = {N.nvmlDeviceGetName(h) for h in found.values()}
    assert names == {"NVIDIA H200 MIG 1g.18gb"}
    assert [N.nvmlDeviceGetGpuInstanceId(h) for h in found.values()] == list(range(7, 14))
    uuids = [N.nvmlDeviceGetUUID(h) for h in found.values()]
    assert all(u.startswith("MIG-") for u in uuids) and len(set(uuids)) == 7
    assert sorted(devices(mixed)) == [0, 2, 4, 5]  # slots 1, 3 and 6 are empty: NOT_FOUND
    with pytest.raises(N.NVMLError_NotFound):
        N.nvmlDeviceGetMigDeviceHandleByIndex(mixed, 1)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetMigDeviceHandleByIndex(mixed, 7)
    handle = found[0]
    attrs = N.nvmlDeviceGetAttributes(handle)
    assert (attrs.gpuInstanceSliceCount, attrs.multiprocessorCount) == (1, 16)
    parent = N.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    assert N.nvmlDeviceGetUUID(parent) == N.nvmlDeviceGetUUID(seven)
    assert N.nvmlDeviceIsMigDeviceHandle(handle).value == 1
    assert N.nvmlDeviceIsMigDeviceHandle(seven).value == 0


def test_compute_instances_and_a_gpu_instance_without_one(mig: Callable[[Any], Any]) -> None:
    mig("mig")
    a100 = N.nvmlDeviceGetHandleByIndex(3)
    found = devices(a100)
    by_gi: dict[int, list[int]] = {}
    for h in found.values():
        by_gi.setdefault(N.nvmlDeviceGetGpuInstanceId(h), []).append(
            N.nvmlDeviceGetComputeInstanceId(h)
        )
    # GI 1 has three compute instances; GI 13 has none, so no MIG device shows it.
    assert by_gi == {1: [0, 1, 2], 5: [0], 14: [0]}
    shared = found[0]
    assert N.nvmlDeviceGetName(shared) == "NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb"
    assert N.nvmlDeviceGetAttributes(shared).computeInstanceSliceCount == 1


def test_parent_only_quantities_and_privileges(mig: Callable[[Any], Any]) -> None:
    mig("mig")
    parent = N.nvmlDeviceGetHandleByIndex(0)
    handle = devices(parent)[0]
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetUtilizationRates(parent)  # none under MIG
    with pytest.raises(N.NVMLError_NoPermission):
        N.nvmlDeviceGetMemoryInfo(parent, N.nvmlMemory_v2)  # aggregate: MIG monitor capability
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlDeviceGetPowerUsage(handle)  # the parent's quantity
    assert N.nvmlDeviceGetPowerUsage(parent) > 0
    memory = N.nvmlDeviceGetMemoryInfo(handle, N.nvmlMemory_v2)
    assert memory.used == 15032385536 and memory.total == 18_000_000_000 // 2**20 * 2**20


def test_parent_memory_with_the_monitor_capability(mig: Callable[[Any], Any]) -> None:
    mig(
        {
            "name": "t",
            "devices": [
                {
                    "mig": {
                        "monitor_capability": True,
                        "instances": [
                            {"profile": "3g.71gb", "values": {"memory_used_bytes": 2e9}},
                            {"profile": "4g.71gb", "values": {"memory_used_bytes": 3e9}},
                        ],
                    }
                }
            ],
        }
    )
    assert N.nvmlDeviceGetMemoryInfo(N.nvmlDeviceGetHandleByIndex(0), N.nvmlMemory_v2).used == 5e9


def test_reconfiguration_reuses_handles_and_ids(
    mig: Callable[[Any], Any], clock: ManualClock
) -> None:
    """nvml.h: a destroyed MIG device's handle "must be requested again"; "handles may be
    reused and their properties can change". The fake reuses a slot's handle for whatever
    occupies the slot next, and a GPU-instance id at once."""
    mig("mig")
    mixed = N.nvmlDeviceGetHandleByIndex(1)
    old = devices(mixed)[2]
    old_uuid = N.nvmlDeviceGetUUID(old)
    assert (N.nvmlDeviceGetGpuInstanceId(old), N.nvmlDeviceGetName(old)) == (
        5,
        "NVIDIA H200 MIG 2g.35gb",
    )
    clock.now = 95.0
    after = devices(mixed)
    assert sorted(after) == [0, 2, 4, 5, 6]
    # The old handle answers, for another device: same slot, same GI id, new UUID and profile.
    assert N.nvmlDeviceGetUUID(old) == N.nvmlDeviceGetUUID(after[2]) != old_uuid
    assert N.nvmlDeviceGetGpuInstanceId(old) == 5
    assert N.nvmlDeviceGetName(old) == "NVIDIA H200 MIG 1g.18gb"


def test_a_handle_whose_slot_emptied_is_stale(
    mig: Callable[[Any], Any], clock: ManualClock
) -> None:
    mig(
        {
            "name": "t",
            "devices": [{"mig": {"instances": [{"profile": "3g.71gb", "until": 10}]}}],
        }
    )
    handle = devices(N.nvmlDeviceGetHandleByIndex(0))[0]
    clock.now = 11.0
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlDeviceGetUUID(handle)
    assert devices(N.nvmlDeviceGetHandleByIndex(0)) == {}


def gpm_sm(parent: Any, gi: int, clock: ManualClock, t0: float, t1: float) -> float:
    """SM activity of GPU instance `gi` between two samples taken at scenario times t0, t1."""
    first, second = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    clock.now = t0
    N.nvmlGpmMigSampleGet(parent, gi, first)
    clock.now = t1
    N.nvmlGpmMigSampleGet(parent, gi, second)
    req = N.c_nvmlGpmMetricsGet_t()
    req.version, req.numMetrics = N.NVML_GPM_METRICS_GET_VERSION, 2
    req.sample1, req.sample2 = first, second
    req.metrics[0].metricId = N.NVML_GPM_METRIC_GRAPHICS_UTIL
    req.metrics[1].metricId = N.NVML_GPM_METRIC_SM_UTIL
    N.nvmlGpmMetricsGet(req)
    N.nvmlGpmSampleFree(first)
    N.nvmlGpmSampleFree(second)
    assert req.metrics[0].nvmlReturn == N.NVML_SUCCESS
    return float(req.metrics[1].value)


def test_gpm_per_gpu_instance(mig: Callable[[Any], Any], clock: ManualClock) -> None:
    mig("mig")
    seven = N.nvmlDeviceGetHandleByIndex(0)
    launch_bound = gpm_sm(seven, 9, clock, 10.0, 11.0)
    serving = gpm_sm(seven, 7, clock, 12.0, 13.0)
    assert launch_bound == pytest.approx(10, abs=3) and serving == pytest.approx(75, abs=5)
    with pytest.raises(N.NVMLError_InvalidArgument):
        N.nvmlGpmMigSampleGet(seven, 1, N.nvmlGpmSampleAlloc())  # no such GPU instance
    a100 = N.nvmlDeviceGetHandleByIndex(3)
    assert not N.nvmlGpmQueryDeviceSupport(a100).isSupportedDevice
    with pytest.raises(N.NVMLError_NotSupported):
        N.nvmlGpmMigSampleGet(a100, 5, N.nvmlGpmSampleAlloc())


def test_a_window_across_the_reconfiguration_diffs_two_instances(
    mig: Callable[[Any], Any], clock: ManualClock
) -> None:
    """Why the daemon keys GPM windows by instance, not GI id: NVML diffs whatever it is given."""
    mig("mig")
    mixed = N.nvmlDeviceGetHandleByIndex(1)
    across = gpm_sm(mixed, 5, clock, 80.0, 100.0)
    within = gpm_sm(mixed, 5, clock, 100.0, 110.0)
    assert within == pytest.approx(30, abs=1)
    assert abs(across - within) > 5


@pytest.mark.parametrize(
    ("mig_entry", "message"),
    [
        ({"instances": [{"profile": "9g.1tb"}]}, "unknown value '9g.1tb'"),
        (
            {"instances": [{"profile": "4g.71gb"}, {"profile": "4g.71gb"}]},
            "hold 8 GPU slices, more than 7",
        ),
        (
            {"instances": [{"profile": "1g.18gb", "gpu_instance": 3}] * 2},
            r"gpu_instance 3 is also instances\[0\]'s",
        ),
        ({"instances": [{"profile": "3g.71gb", "compute_instances": 2}]}, "do not split"),
        ({"instances": [{"profile": "1g.18gb", "slots": [9]}]}, "not below max_devices"),
        ({"bogus": 1}, "unknown key 'bogus'"),
    ],
)
def test_bad_mig_layouts_are_refused(mig_entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        load_scenario({"name": "t", "devices": [{"mig": mig_entry}]})


def test_mig_only_on_gpus_that_have_it() -> None:
    with pytest.raises(ScenarioError, match=r"devices\[0\]\.mig: ada GPUs have no MIG"):
        load_scenario({"name": "t", "devices": [{"model": "NVIDIA GeForce RTX 4090", "mig": {}}]})


def test_scenario_pods_name_gpus_and_mig_devices_as_the_device_plugin_does() -> None:
    spec = load_scenario(
        {
            "name": "t",
            "devices": [
                {
                    "mig": {
                        "instances": [
                            {"profile": "3g.71gb", "gpu_instance": 2, "compute_instances": 3}
                        ]
                    }
                },
                {},
            ],
            "pods": [
                {"namespace": "a", "pod": "p", "gpu": 0, "gpu_instance": 2, "compute_instance": 1},
                {"namespace": "b", "pod": "q", "gpu": 1, "replica": 3, "container": "c"},
            ],
        }
    )
    mig, whole = spec.pods
    assert mig.device_id == spec.devices[0].mig.instances[0].mig_uuids[1]  # type: ignore[union-attr]
    assert (mig.resource, mig.container) == ("nvidia.com/mig-1c.3g.71gb", "main")
    assert (whole.device_id, whole.resource) == (f"{spec.devices[1].uuid}::3", "nvidia.com/gpu")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"gpu": 0, "gpu_instance": 5}, r"pods\[0\]\.gpu_instance: GPU 0 has no GPU instance 5"),
        ({"gpu": 0, "gpu_instance": 2, "compute_instance": 3}, "has 3 compute instances"),
        ({"gpu": 1, "compute_instance": 0}, "`compute_instance` needs `gpu_instance`"),
        ({"gpu": 2}, r"pods\[0\]\.gpu: must be <= 1"),
        ({"gpu": 0, "gpu_instance": 2, "shares": 2}, "unknown key 'shares'"),
    ],
)
def test_bad_scenario_pods_are_refused(entry: dict[str, Any], message: str) -> None:
    devices = [
        {"mig": {"instances": [{"profile": "3g.71gb", "gpu_instance": 2, "compute_instances": 3}]}},
        {},
    ]
    pods = [{"namespace": "a", "pod": "p", **entry}]
    with pytest.raises(ScenarioError, match=message):
        load_scenario({"name": "t", "devices": devices, "pods": pods})
