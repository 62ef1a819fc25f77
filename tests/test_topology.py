"""Topology on the fake NVML: the matrix, the readings, NVLink vs PCIe, errors per pair."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml as N
import pytest

from gpu_exporter.collect.nvml.collectors import Topology as TopologyCollector
from gpu_exporter.collect.nvml.source import NvmlConfig, NvmlSource
from gpu_exporter.collect.nvml.topology import P2P_CAPABILITIES, Topology, cpu_list, read_topology
from gpu_exporter.collect.source import ErrorLog
from tests.conftest import ManualClock
from tests.support import wait_for

Devices = list[tuple[str, int, Any]]
TOPOLOGY_FAMILIES = TopologyCollector.families

PCIE_ONLY = {
    "name": "pcie-only",
    "defaults": {"model": "NVIDIA H200", "nvlink_links": 0},
    "devices": [
        {"numa_node": 0},
        {"numa_node": 0},
        {"numa_node": 0},
        {"numa_node": 1, "cpus": "56-111,168-223"},
    ],
    "topology": [{"gpus": [0, 1], "level": "single"}, {"gpus": [0, 2], "level": "hostbridge"}],
}


@pytest.fixture
def devices(fake_nvml, clock: ManualClock) -> Iterator[Callable[[Any], Devices]]:
    """Install a scenario and return its GPUs as (uuid, index, handle)."""
    initialised = []

    def _devices(scenario: Any) -> Devices:
        fake_nvml.install(scenario, clock=clock)
        N.nvmlInit()
        initialised.append(True)
        found = []
        for index in range(N.nvmlDeviceGetCount()):
            handle = N.nvmlDeviceGetHandleByIndex(index)
            found.append((N.nvmlDeviceGetUUID(handle), index, handle))
        return found

    yield _devices
    for _ in initialised:
        N.nvmlShutdown()


def readings(topology: Topology, uuid: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(r.family, r.labels): r.value for r in topology.readings_for(uuid)}


PairView = dict[tuple[str, int], "str | float"]


def pair_view(topology: Topology, uuid: str) -> PairView:
    """Every peer's link, NVLink count and P2P capabilities as a reader of the series rebuilds
    them: the GPU's usual value, overridden by the per-peer exceptions."""
    peers = [p.peer_index for p in topology.peers_of(uuid)]
    view: PairView = {}
    rows = topology.readings_for(uuid)
    for exceptions in (False, True):
        for r in rows:
            labels = dict(r.labels)
            if ("peer_gpu" in labels) != exceptions:
                continue
            targets = [int(labels["peer_gpu"])] if exceptions else peers
            if r.family in ("gpu_topology_usual_link_info", "gpu_topology_link_info"):
                item: tuple[str, str | float] = ("link", labels["link"])
            elif r.family in ("gpu_topology_usual_nvlink_links", "gpu_topology_nvlink_links"):
                item = ("nvlink_links", r.value)
            elif r.family in ("gpu_p2p_usual_supported", "gpu_p2p_supported"):
                item = (labels["capability"], r.value)
            else:
                continue
            for peer in targets:
                view[(item[0], peer)] = item[1]
    return view


def direct_view(topology: Topology, uuid: str) -> PairView:
    """The same, straight from the pairs that were read (unknown: link "unknown", NaN)."""
    view: PairView = {}
    for p in topology.peers_of(uuid):
        view[("link", p.peer_index)] = p.link or "unknown"
        view[("nvlink_links", p.peer_index)] = (
            float("nan") if p.nvlink_links is None else float(p.nvlink_links)
        )
        for capability, _ in P2P_CAPABILITIES:
            status = p.p2p.get(capability)
            value = float("nan") if status is None else float(status == "ok")
            view[(capability, p.peer_index)] = value
    return view


def assert_lossless(topology: Topology) -> None:
    """The usual values plus the exceptions say exactly what the pairs say."""
    for gpu in topology.gpus:
        rebuilt, direct = pair_view(topology, gpu.uuid), direct_view(topology, gpu.uuid)
        # A quantity unknown for every peer is absent, not NaN or "unknown" for each.
        for key in list(direct):
            quantity = key[0]
            peers_known = [
                v for (q, _), v in direct.items() if q == quantity and v == v and v != "unknown"
            ]
            if not peers_known:
                del direct[key]
        assert repr(sorted(rebuilt.items())) == repr(sorted(direct.items())), gpu.index


def _settings(**overrides: Any) -> NvmlConfig:
    """No XID thread (it waits in real time); quick recovery."""
    return NvmlConfig(**{"xid_events": False, "recovery_initial_backoff_seconds": 0.5, **overrides})


def matrix_rows(text: str) -> dict[str, list[str]]:
    lines = text.split("\n\n")[0].splitlines()
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


def test_mixed_is_an_nvswitch_board(devices) -> None:
    found = devices("mixed")
    topology = read_topology(found, sysfs_root="/nonexistent")
    assert topology.errors == ()
    text = topology.matrix_text()
    header = text.splitlines()[0].split()
    assert header[:8] == [f"GPU{i}" for i in range(8)]
    assert text.splitlines()[0].rstrip().endswith("CPU Affinity  NUMA Affinity  GPU NUMA ID")
    rows = matrix_rows(text)
    assert rows["GPU0"][:8] == ["X", *["NV18"] * 7]
    assert rows["GPU5"][5] == "X"
    assert rows["GPU0"][8:] == ["0-55", "0", "0"]
    assert rows["GPU4"][8:] == ["56-111", "1", "1"]
    assert "Legend:" in text and "NV#  = Connection traversing a bonded set of # NVLinks" in text
    assert "N/A  =" not in text  # only explained when used

    uuid0 = found[0][0]
    got = readings(topology, uuid0)
    view = pair_view(topology, uuid0)
    assert view[("link", 3)] == "nvlink" and view[("nvlink_links", 3)] == 18.0
    for capability in ("read", "write", "nvlink", "atomics"):
        assert view[(capability, 3)] == 1.0
    # A uniform board: the usual values say it all, no pair is listed.
    assert got[("gpu_topology_usual_link_info", (("link", "nvlink"),))] == 1.0
    assert got[("gpu_topology_usual_nvlink_links", ())] == 18.0
    assert got[("gpu_p2p_usual_supported", (("capability", "atomics"),))] == 1.0
    assert not any("peer_gpu" in dict(labels) for _, labels in got)
    assert got[("gpu_cpu_affinity_info", (("cpus", "0-55"),))] == 1.0
    assert got[("gpu_numa_node", ())] == 0.0
    assert len(topology.readings_for(uuid0)) == 8
    assert topology.readings_for("GPU-not-here") == []
    assert_lossless(topology)


def test_pre_hopper_a100_has_twelve_links(devices) -> None:
    topology = read_topology(devices("pre-hopper"), sysfs_root="/nonexistent")
    rows = matrix_rows(topology.matrix_text())
    assert rows["GPU1"][:4] == ["NV12", "X", "NV12", "NV12"]
    assert {g.nvlink_links for g in topology.gpus} == {12}
    assert {g.nvlink_active for g in topology.gpus} == {12}


def test_pcie_only_levels_and_p2p(devices) -> None:
    found = devices(PCIE_ONLY)
    topology = read_topology(found, sysfs_root="/nonexistent")
    rows = matrix_rows(topology.matrix_text())
    assert rows["GPU0"][:4] == ["X", "PIX", "PHB", "SYS"]
    assert rows["GPU1"][:4] == ["PIX", "X", "NODE", "SYS"]
    assert rows["GPU3"][4:] == ["56-111,168-223", "1", "1"]
    uuid0, uuid3 = found[0][0], found[3][0]
    got = readings(topology, uuid0)
    view = pair_view(topology, uuid0)
    assert view[("link", 1)] == "single" and view[("link", 3)] == "system"
    assert view[("nvlink_links", 1)] == 0.0  # known: no NVLink
    assert view[("read", 1)] == 1.0 and view[("nvlink", 1)] == 0.0
    assert view[("read", 3)] == 0.0  # across sockets
    # Three peers, three links: the tie goes to the lowest peer, the others are listed.
    peer3 = (("peer_gpu", "3"), ("peer_uuid", uuid3))
    assert got[("gpu_topology_usual_link_info", (("link", "single"),))] == 1.0
    assert got[("gpu_topology_link_info", (*peer3, ("link", "system")))] == 1.0
    assert not any(f == "gpu_topology_link_info" and ("peer_gpu", "1") in k for f, k in got)
    assert_lossless(topology)
    link = next(p for p in topology.peers_of(uuid0) if p.peer_index == 3)
    assert link.p2p["read"] == "chipset_not_supported" and link.link == "system"
    assert topology.gpu(uuid0).nvlink_links == 0  # type: ignore[union-attr]


def test_unsupported_topology_is_absent_not_an_error(devices) -> None:
    scenario = {**PCIE_ONLY, "topology": []}
    scenario["devices"] = [*PCIE_ONLY["devices"][:3], {"numa_node": 1, "unsupported": ["topology"]}]
    found = devices(scenario)
    errors = ErrorLog()
    topology = read_topology(found, sysfs_root="/nonexistent", errors=errors)
    assert topology.errors == ()
    assert errors.snapshot() == (), "NotSupported is not counted as an error"
    rows = matrix_rows(topology.matrix_text())
    assert rows["GPU0"][3] == "N/A" and rows["GPU3"][0] == "N/A"
    assert rows["GPU0"][1] == "NODE"
    assert "N/A  = Not reported by the driver" in topology.matrix_text()
    got = readings(topology, found[0][0])
    peer3 = (("peer_gpu", "3"), ("peer_uuid", found[3][0]))
    # Not reported for this pair: listed as unknown, not left to read as the usual link.
    assert got[("gpu_topology_link_info", (*peer3, ("link", "unknown")))] == 1.0
    assert (3, "write") in {(k[1], k[0]) for k in pair_view(topology, found[0][0])}
    assert_lossless(topology)


def test_a_lost_gpu_costs_only_its_own_pairs(devices, clock: ManualClock) -> None:
    scenario = {**PCIE_ONLY, "faults": [{"at": 5, "device": 2, "kind": "gpu_lost"}]}
    found = devices(scenario)
    clock.advance(6)  # handles were taken before the loss
    errors = ErrorLog()
    topology = read_topology(found, sysfs_root="/nonexistent", errors=errors)
    assert topology.errors, "the failing calls are reported"
    # ... and counted through the choke point like every other NVML failure.
    counted = {(e.source, e.field, e.error) for e in errors.snapshot()}
    assert ("topology", "pci_info", "GpuIsLost") in counted
    assert ("topology", "p2p_status", "GpuIsLost") in counted
    assert {error for _, _, error in counted} == {"GpuIsLost"}
    assert all("GpuIsLost" in error for error in topology.errors)
    assert all("GPU2" in error for error in topology.errors)
    rows = matrix_rows(topology.matrix_text())
    assert rows["GPU0"][:4] == ["X", "PIX", "N/A", "SYS"]
    assert rows["GPU2"][:4] == ["N/A", "N/A", "X", "N/A"]
    assert rows["GPU2"][4:] == ["N/A", "N/A", "N/A"]
    assert topology.readings_for(found[2][0]) == []
    assert pair_view(topology, found[0][0])[("link", 2)] == "unknown"
    assert_lossless(topology)


def test_numa_node_from_sysfs_when_nvml_cannot_say(devices, tmp_path: Path) -> None:
    scenario = {
        "name": "no-numa",
        "defaults": {"model": "NVIDIA H200", "nvlink_links": 0, "unsupported": ["numa"]},
        "devices": [{}, {}, {}],
    }
    for bus_id, node in (("0000:18:00.0", "1\n"), ("0000:2a:00.0", "-1\n")):
        folder = tmp_path / "bus" / "pci" / "devices" / bus_id
        folder.mkdir(parents=True)
        (folder / "numa_node").write_text(node)
    found = devices(scenario)
    topology = read_topology(found, sysfs_root=tmp_path)
    nodes = {g.index: g.numa_node for g in topology.gpus}
    assert nodes == {0: 1, 1: None, 2: None}  # -1 = unknown; no file = unknown
    assert readings(topology, found[0][0])[("gpu_numa_node", ())] == 1.0
    assert not any(f == "gpu_numa_node" for f, _ in readings(topology, found[1][0]))
    assert not any(f == "gpu_cpu_affinity_info" for f, _ in readings(topology, found[0][0]))
    rows = matrix_rows(topology.matrix_text())
    assert rows["GPU0"][3:] == ["N/A", "1", "N/A"]


def test_direct_gpu_to_gpu_nvlinks_are_counted_per_peer(devices, monkeypatch) -> None:
    scenario = {"name": "bridged", "defaults": {"model": "NVIDIA H200", "nvlink_links": 4}}
    scenario["devices"] = [{}, {}, {}, {}]
    found = devices(scenario)
    bus = {index: N.nvmlDeviceGetPciInfo(handle).busId for _, index, handle in found}

    def remote_pci(handle: Any, link: int) -> Any:
        # Links 0-1 go to the GPU index ^ 1, links 2-3 to index ^ 2: 0-1 and 0-2 have NV2.
        index = N.nvmlDeviceGetIndex(handle)
        return SimpleNamespace(busId=bus[index ^ (1 if link < 2 else 2)])

    monkeypatch.setattr(
        N, "nvmlDeviceGetNvLinkRemoteDeviceType", lambda h, link: N.NVML_NVLINK_DEVICE_TYPE_GPU
    )
    monkeypatch.setattr(N, "nvmlDeviceGetNvLinkRemotePciInfo", remote_pci)
    topology = read_topology(found, sysfs_root="/nonexistent")
    rows = matrix_rows(topology.matrix_text())
    assert rows["GPU0"][:4] == ["X", "NV2", "NV2", "NODE"]
    assert rows["GPU3"][:4] == ["NODE", "NV2", "NV2", "X"]
    view = pair_view(topology, found[0][0])
    assert view[("nvlink_links", 3)] == 0.0 and view[("link", 3)] == "node"
    assert view[("nvlink_links", 1)] == 2.0 and view[("link", 1)] == "nvlink"
    assert_lossless(topology)


def test_a_down_nvlink_shows_in_the_pair_count(devices, monkeypatch) -> None:
    found = devices("mixed")
    real_state = N.nvmlDeviceGetNvLinkState
    lost = found[1][2]

    def state(handle: Any, link: int) -> int:
        if handle is lost and link == 17:
            return N.NVML_FEATURE_DISABLED
        return real_state(handle, link)

    monkeypatch.setattr(N, "nvmlDeviceGetNvLinkState", state)
    topology = read_topology(found, sysfs_root="/nonexistent")
    rows = matrix_rows(topology.matrix_text())
    assert rows["GPU0"][:3] == ["X", "NV17", "NV18"]
    assert rows["GPU1"][:3] == ["NV17", "X", "NV17"]
    assert topology.gpu(found[1][0]).nvlink_active == 17  # type: ignore[union-attr]
    # GPU 0's usual count is 18; the pair with GPU 1 is listed with its 17.
    got = readings(topology, found[0][0])
    assert got[("gpu_topology_usual_nvlink_links", ())] == 18.0
    assert (
        got[("gpu_topology_nvlink_links", (("peer_gpu", "1"), ("peer_uuid", found[1][0])))] == 17.0
    )
    assert_lossless(topology)


def test_nvml_source_attaches_topology_readings(fake_nvml, clock: ManualClock) -> None:
    fake_nvml.install("mixed", clock=clock)
    source = NvmlSource(errors=ErrorLog(), clock=clock, topology_reader=read_topology)
    source.start()
    try:
        assert isinstance(source.topology, Topology)
        device = source.sample()[2]
        assert device.value("gpu_topology_usual_link_info", link="nvlink") == 1.0
        assert not [r for r in device.readings if r.family == "gpu_topology_link_info"]
        assert device.value("gpu_cpu_affinity_info", cpus="0-55") == 1.0
    finally:
        source.close()


def test_cpu_list() -> None:
    assert cpu_list([]) == ""
    assert cpu_list([3]) == "3"
    assert cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert cpu_list([*range(64, 96), *range(0, 32)]) == "0-31,64-95"


class _FlakyTopology:
    """A topology reader that raises while `failing` is set."""

    def __init__(self, failing: bool) -> None:
        self.failing = failing
        self.reads = 0

    def __call__(
        self, devices: Devices, *, errors: ErrorLog, deadline: float | None = None, **_: Any
    ) -> Topology:
        self.reads += 1
        if self.failing:
            raise RuntimeError("no topology today")
        return read_topology(devices, sysfs_root="/nonexistent", errors=errors, deadline=deadline)


def _topology_status(source: NvmlSource) -> bool:
    statuses = {s.collector: s.success for s in source.collector_status()}
    assert all(ok for name, ok in statuses.items() if name != "topology"), statuses
    return statuses["topology"]


def _replace_driver_once(source: NvmlSource, fake: Any) -> None:
    """The next power read answers LibRmVersionMismatch: the source re-initialises NVML."""
    real = fake.nvmlDeviceGetPowerUsage
    state = {"left": 1}

    def power(*args: Any) -> int:
        if state["left"]:
            state["left"] -= 1
            return N.NVML_ERROR_LIB_RM_VERSION_MISMATCH
        return real(*args)

    fake.nvmlDeviceGetPowerUsage = power
    N._nvmlGetFunctionPointer_cache.pop("nvmlDeviceGetPowerUsage", None)


def test_a_failed_topology_read_fails_the_topology_collector(fake_nvml, clock: ManualClock) -> None:
    fake = fake_nvml.install(PCIE_ONLY, clock=clock)
    reader = _FlakyTopology(failing=True)
    source = NvmlSource(
        errors=ErrorLog(), clock=clock, topology_reader=reader, settings=_settings()
    )
    source.start()
    try:
        assert source.topology is None
        counted = {(e.source, e.field, e.error) for e in source.errors.snapshot()}
        assert counted == {("nvml", "topology", "exception")}
        for _ in range(2):  # nothing to repeat: failed on every tick until a read succeeds
            clock.advance(1)
            devices = source.sample()
            assert all(d.up for d in devices)
            assert not any(d.families() & set(TOPOLOGY_FAMILIES) for d in devices)
            assert _topology_status(source) is False
        reader.failing = False
        _replace_driver_once(source, fake)
        for _ in range(4):  # the driver "replaced", then NVML re-initialised
            clock.advance(1)
            devices = source.sample()
        assert reader.reads == 2 and isinstance(source.topology, Topology)
        assert all(d.up for d in devices)
        assert all(d.value("gpu_numa_node") is not None for d in devices)
        assert _topology_status(source) is True
    finally:
        source.close()


def test_a_failed_topology_re_read_keeps_the_last_and_says_so(
    fake_nvml, clock: ManualClock
) -> None:
    fake = fake_nvml.install(PCIE_ONLY, clock=clock)
    reader = _FlakyTopology(failing=False)
    source = NvmlSource(
        errors=ErrorLog(), clock=clock, topology_reader=reader, settings=_settings()
    )
    source.start()
    try:
        clock.advance(1)
        source.sample()
        assert _topology_status(source) is True
        reader.failing = True
        _replace_driver_once(source, fake)
        for _ in range(4):
            clock.advance(1)
            devices = source.sample()
        assert reader.reads == 2
        assert all(d.up and d.value("gpu_numa_node") is not None for d in devices)  # the last
        assert _topology_status(source) is False, "the latest read failed"
    finally:
        source.close()


def test_collector_names_are_the_enabled_collectors_in_order(fake_nvml, clock: ManualClock) -> None:
    from gpu_exporter.collect.nvml import collectors

    fake_nvml.install(PCIE_ONLY, clock=clock)
    with_topology = NvmlSource(errors=ErrorLog(), clock=clock, topology_reader=read_topology)
    plain = NvmlSource(errors=ErrorLog(), clock=clock, settings=_settings(gpm=False))
    assert with_topology.collector_names() == tuple(
        c.name
        for c in collectors.COLLECTORS
        if c.name != "processes"  # off by default
    )
    names = plain.collector_names()
    assert "topology" not in names and "gpm" not in names and "xid" not in names
    assert names == tuple(c.name for c in collectors.COLLECTORS if c.name in names)
    # Before any sample, and whatever `sample()` does: the names of the statuses it reports.
    plain.start()
    try:
        clock.advance(1)
        plain.sample()
        assert sorted(names) == [s.collector for s in plain.collector_status()]
    finally:
        plain.close()


def test_a_hung_pair_call_leaves_that_gpus_p2p_unknown_and_one_thread_behind(devices) -> None:
    hang = {"at": 0, "device": 1, "kind": "hang", "function": "nvmlDeviceGetP2PStatus"}
    found = devices({**PCIE_ONLY, "faults": [{**hang, "duration": 600}]})
    uuids = [uuid for uuid, _, _ in found]
    errors = ErrorLog()
    before = _topology_threads()
    topology = read_topology(found, "/nonexistent", errors=errors, deadline=0.2)
    # The first hung P2P call of GPU 1 is left behind on its thread; GPU 1 is not asked again
    # (the helper thread of the other calls ends once the read is done).
    wait_for(lambda: _topology_threads() - before == 1, 5, "one thread left behind")
    assert errors.count("topology", "p2p_status") == 1
    assert all(peer.p2p == {} for peer in topology.peers_of(uuids[1]))
    for uuid in (uuids[0], uuids[2], uuids[3]):
        assert all(len(peer.p2p) == len(P2P_CAPABILITIES) for peer in topology.peers_of(uuid))
    assert any("GPU1-GPU0 P2P read: Timeout" in error for error in topology.errors)
    # The link levels of GPU 1 are still read; its P2P families are absent, not guessed.
    assert {p.pcie_level for p in topology.peers_of(uuids[1])} == {"single", "node", "system"}
    families = {r.family for r in topology.readings_for(uuids[1])}
    assert "gpu_topology_usual_link_info" in families
    assert not families & {"gpu_p2p_usual_supported", "gpu_p2p_supported"}


def _topology_threads() -> int:
    return sum(thread.name == "nvml-topology" for thread in threading.enumerate())


def test_pairs_are_read_only_up_to_the_bound(devices, monkeypatch) -> None:
    from gpu_exporter.collect.nvml import topology as module

    monkeypatch.setattr(module, "MAX_PAIR_GPUS", 3)
    found = devices(PCIE_ONLY)  # 4 GPUs
    topology = read_topology(found, "/nonexistent", errors=ErrorLog())
    assert topology.peers == ()
    assert topology.errors == ("GPU pairs not read: 4 GPUs, more than 3",)
    assert [g.numa_node for g in topology.gpus] == [0, 0, 0, 1]  # each GPU's own facts
