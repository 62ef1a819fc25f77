"""Reading the node's DRA ResourceSlices (gpu_exporter/collect/k8s/resource_slices.py) from a
real HTTPS API server speaking the list and watch protocol: the fake of
gpu_exporter/sim/apiserver.py."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.collect.k8s import resource_slices
from gpu_exporter.collect.k8s.dra import DraDevice, SliceDevice
from gpu_exporter.collect.k8s.resource_slices import (
    DEVICES,
    ERRORS,
    LAST_SUCCESS,
    LISTS,
    REASONS,
    UP,
    ResourceSliceError,
    ResourceSlices,
    api_server_url,
    map_devices,
    parse_slice,
)
from gpu_exporter.sim.apiserver import TLS_DIR, FakeApiServer, device, resource_slice, start_for
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.dra import DRIVER, gpu_device_name, mig_device_name
from gpu_exporter.sim.scenario import load_scenario

LOGGER = "gpu_exporter.collect.k8s.resource_slices"

# GPU 0 whole; GPU 1 with MIG: a 3g.71gb until 20 s, then a 1g.18gb; the driver republishes
# its slice at 30 s.
SCENARIO = load_scenario(
    {
        "name": "dra-client",
        "devices": [
            {},
            {
                "mig": {
                    "instances": [
                        {"profile": "3g.71gb", "until": 20},
                        {"profile": "1g.18gb", "from": 20},
                    ]
                }
            },
        ],
        "dra": {"node_name": "node-a", "republish": [30]},
    }
)


class Monotonic:
    """time.monotonic, shifted on demand: the grace passes without waiting for it."""

    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.shift


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer("node-a", bookmark_seconds=0.2) as server:
        yield server


@pytest.fixture
def readers() -> Iterator[list[ResourceSlices]]:
    started: list[ResourceSlices] = []
    yield started
    for reader in started:
        reader.stop()


@pytest.fixture
def make(
    readers: list[ResourceSlices],
) -> Callable[..., ResourceSlices]:
    def make(
        fake: FakeApiServer,
        grace: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
        watch_seconds: float = 1.0,
        start: bool = True,
        backoff: tuple[float, float] = (0.05, 0.2),
        **settings: Any,
    ) -> ResourceSlices:
        settings.setdefault("timeout_seconds", 1.0)
        reader = ResourceSlices(
            fake.settings(**settings),
            grace,
            monotonic=monotonic,
            watch_seconds=watch_seconds,
            backoff_seconds=backoff,
        )
        readers.append(reader)
        if start:
            reader.start()
        return reader

    return make


def wait_until(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def sample(reader: ResourceSlices, name: str, **labels: str) -> float:
    (value,) = [s.value for s in reader.series() if s.name == name and dict(s.labels) == labels]
    return value


def errors(reader: ResourceSlices) -> dict[str, float]:
    return {dict(s.labels)["reason"]: s.value for s in reader.series() if s.name == ERRORS}


def start_within(reader: ResourceSlices, seconds: float) -> float:
    """How long `start()` took; inf when it had not returned `seconds` + 2 s later (it is left
    to end when the fake closes)."""
    took: list[float] = []

    def start() -> None:
        began = time.monotonic()
        reader.start()
        took.append(time.monotonic() - began)

    threading.Thread(target=start, daemon=True).start()
    wait_until(lambda: bool(took), seconds + 2.0)
    return took[0] if took else float("inf")


def pools(count: int, devices_each: int = 1) -> list[dict[str, Any]]:
    """`count` slices, each its own pool of `devices_each` GPUs."""
    out = []
    for i in range(count):
        gpus = [
            device(f"gpu-{j}", {"uuid": {"string": f"GPU-{i}-{j}"}}) for j in range(devices_each)
        ]
        out.append(resource_slice(f"s-{i}", "node-a", gpus, pool=f"pool-{i}"))
    return out


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= 30]


def one_gpu(name: str, uuid: str, generation: int = 0) -> dict[str, Any]:
    return resource_slice(name, "node-a", [device("gpu-0", {"uuid": {"string": uuid}})],
                          generation=generation)  # fmt: skip


def scenario_devices(t: float) -> dict[DraDevice, SliceDevice]:
    """What the scenario's slice says at `t`, from the scenario itself."""
    gpu0, gpu1 = SCENARIO.devices
    assert gpu1.mig is not None
    out = {
        DraDevice(DRIVER, "node-a", gpu_device_name(0)): SliceDevice(gpu0.uuid, "gpu"),
        DraDevice(DRIVER, "node-a", gpu_device_name(1)): SliceDevice(gpu1.uuid, "gpu"),
    }
    for instance in gpu1.mig.live(t):
        name = mig_device_name(1, instance, 0)
        out[DraDevice(DRIVER, "node-a", name)] = SliceDevice(
            instance.mig_uuids[0], "mig", gpu1.uuid, instance.profile.name
        )
    return out


# Reading ------------------------------------------------------------------------------------


def test_the_first_list_maps_gpus_and_mig_devices_to_their_uuids(make: Callable[..., Any]) -> None:
    clock = ManualClock()
    fake = start_for(SCENARIO, clock)
    assert fake is not None
    try:
        reader = make(fake)
        devices = reader.devices()  # right after start(): it waits for the first list
        assert dict(devices) == scenario_devices(0.0)
        assert any(d.kind == "mig" for d in devices.values())
        with pytest.raises(TypeError):
            devices[DraDevice(DRIVER, "node-a", "x")] = SliceDevice("GPU-x")  # type: ignore[index]
        assert reader.api_version == "v1"
        assert sample(reader, UP) == 1
        assert sample(reader, LISTS) == 1
        assert sample(reader, DEVICES) == len(devices)
        assert sample(reader, LAST_SUCCESS) == pytest.approx(time.time(), abs=5)
        assert set(errors(reader)) == set(REASONS) and not any(errors(reader).values())
        assert reader.producer().sources == frozenset({"dra"})
    finally:
        fake.close()


def test_a_mig_change_and_a_republish_are_followed_without_a_relist(
    make: Callable[..., Any],
) -> None:
    clock = ManualClock()
    fake = start_for(SCENARIO, clock)
    assert fake is not None
    try:
        reader = make(fake)
        clock.advance(25)  # the 3g gone, a 1g in its place: MODIFIED
        assert wait_until(lambda: dict(reader.devices()) == scenario_devices(25))
        assert scenario_devices(25) != scenario_devices(0)
        clock.advance(10)  # republished: DELETED, then ADDED under a new name and generation
        assert wait_until(lambda: reader.resource_version == str(fake.sync()))
        assert dict(reader.devices()) == scenario_devices(35)
        assert fake.list_calls == 1 and sample(reader, LISTS) == 1
    finally:
        fake.close()


def test_only_the_newest_generation_of_a_pool_counts(
    fake: FakeApiServer, make: Callable[..., Any]
) -> None:
    """A driver that publishes its new slice before deleting the old one."""
    fake.set_slices([one_gpu("old", "GPU-old", generation=1)])
    reader = make(fake)
    key = DraDevice(DRIVER, "node-a", "gpu-0")
    fake.set_slices([one_gpu("old", "GPU-old", 1), one_gpu("new", "GPU-new", 2)])
    assert wait_until(lambda: reader.devices().get(key) == SliceDevice("GPU-new"))
    fake.set_slices([one_gpu("new", "GPU-new", 2)])
    assert wait_until(lambda: reader.resource_version == str(fake.resource_version))
    assert dict(reader.devices()) == {key: SliceDevice("GPU-new")}


def test_only_the_configured_drivers_count(fake: FakeApiServer, make: Callable[..., Any]) -> None:
    other = resource_slice("net", "node-a", [device("nic-0", {"uuid": {"string": "x"}})],
                           driver="net.example.com")  # fmt: skip
    fake.set_slices([one_gpu("gpus", "GPU-a"), other])
    reader = make(fake)
    assert set(reader.devices()) == {DraDevice(DRIVER, "node-a", "gpu-0")}
    reader = make(fake, drivers=["net.example.com", DRIVER])
    assert len(reader.devices()) == 2


def test_a_slice_without_devices_or_attributes_is_read_as_such(
    fake: FakeApiServer, make: Callable[..., Any]
) -> None:
    bare = resource_slice("bare", "node-a", [device("gpu-9")])  # no attributes: uuid ""
    empty = one_gpu("empty", "unused")
    del empty["spec"]["devices"]
    fake.set_slices([bare, empty])
    reader = make(fake)
    assert dict(reader.devices()) == {DraDevice(DRIVER, "node-a", "gpu-9"): SliceDevice("")}
    assert sample(reader, UP) == 1


@pytest.mark.parametrize("versions", [("v1beta1",), ("v1beta2", "v1beta1")])
def test_an_older_api_server_is_read_through_its_beta_version(
    make: Callable[..., Any], versions: tuple[str, ...]
) -> None:
    with FakeApiServer("node-a", versions=versions, bookmark_seconds=0.2) as fake:
        mig = {"uuid": {"string": "MIG-a"}, "type": {"string": "mig"},
               "parentUUID": {"string": "GPU-a"}, "profile": {"string": "1g.18gb"}}  # fmt: skip
        fake.set_slices([resource_slice("s", "node-a", [device("gpu-0-mig-1g18gb-1-0", mig)])])
        reader = make(fake)
        assert reader.api_version == versions[0]
        assert dict(reader.devices()) == {
            DraDevice(DRIVER, "node-a", "gpu-0-mig-1g18gb-1-0"): SliceDevice(
                "MIG-a", "mig", "GPU-a", "1g.18gb"
            )
        }
        fake.set_slices([one_gpu("s", "GPU-b")])  # the watch uses the version found
        key = DraDevice(DRIVER, "node-a", "gpu-0")
        assert wait_until(lambda: reader.devices().get(key) == SliceDevice("GPU-b"))
        assert fake.list_calls == 1


def test_an_api_server_without_resource_slices_is_said_so(
    make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    with FakeApiServer("node-a", versions=()) as fake:
        reader = make(fake)
    assert errors(reader)["not_found"] == 1 and sample(reader, UP) == 0
    assert "serves no ResourceSlices" in caplog.text


# The watch's life ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["event", "status", "compaction"])
def test_an_expired_watch_lists_again(
    fake: FakeApiServer, make: Callable[..., Any], how: str
) -> None:
    fake.set_slices([one_gpu("s", "GPU-a")])
    reader = make(fake, watch_seconds=30)
    assert wait_until(lambda: fake.watch_calls == 1)
    if how == "compaction":
        fake.mode = "hang"  # the client's next watch waits while
        fake.close_watches()
        assert wait_until(lambda: len(fake.tokens_seen) == 3)  # list, watch, hung watch
        fake.set_slices([one_gpu("s", "GPU-b")])  # a change it has not seen
        fake.compact()  # leaves the server's history
        fake.mode = None  # the hung watch is dropped; the next one is too old
    else:
        fake.set_slices([one_gpu("s", "GPU-b")])  # a change the client must not miss
        fake.expire_next_watch(as_status=how == "status")
        fake.close_watches()
    assert wait_until(lambda: fake.list_calls == 2)
    key = DraDevice(DRIVER, "node-a", "gpu-0")
    assert wait_until(lambda: reader.devices().get(key) == SliceDevice("GPU-b"))
    assert wait_until(lambda: fake.watch_calls >= 3)  # watching again after the list
    assert sample(reader, LISTS) == 2
    if how != "compaction":
        assert not any(errors(reader).values()) and sample(reader, UP) == 1


def test_a_watch_the_server_ends_is_resumed_without_a_list(
    fake: FakeApiServer, make: Callable[..., Any]
) -> None:
    fake.set_slices([one_gpu("s", "GPU-a")])
    reader = make(fake, watch_seconds=30)
    assert wait_until(lambda: fake.watch_calls == 1)
    fake.close_watches()
    assert wait_until(lambda: fake.watch_calls == 2)
    fake.set_slices([one_gpu("s", "GPU-b")])
    key = DraDevice(DRIVER, "node-a", "gpu-0")
    assert wait_until(lambda: reader.devices().get(key) == SliceDevice("GPU-b"))
    assert fake.list_calls == 1
    assert not any(errors(reader).values()) and sample(reader, UP) == 1


def test_a_watch_cut_mid_stream_resumes_from_its_resource_version(
    fake: FakeApiServer, make: Callable[..., Any]
) -> None:
    fake.set_slices([one_gpu("s", "GPU-a")])
    reader = make(fake, watch_seconds=30)
    assert wait_until(lambda: fake.watch_calls == 1)
    fake.close_watches(abrupt=True)
    assert wait_until(lambda: errors(reader)["connection"] == 1)
    assert wait_until(lambda: fake.watch_calls == 2 and sample(reader, UP) == 1)
    assert fake.list_calls == 1
    assert reader.devices()  # kept throughout


def test_watches_end_after_their_timeout_and_are_renewed(
    fake: FakeApiServer, make: Callable[..., Any]
) -> None:
    make(fake, watch_seconds=0.5)  # timeoutSeconds 1
    assert wait_until(lambda: fake.watch_calls >= 3, seconds=6)
    assert fake.list_calls == 1


def test_stop_interrupts_an_open_watch(fake: FakeApiServer, make: Callable[..., Any]) -> None:
    reader = make(fake, watch_seconds=60)
    assert wait_until(lambda: fake.watch_calls == 1)
    time.sleep(0.1)
    began = time.monotonic()
    reader.stop()
    assert time.monotonic() - began < 0.5
    assert not any(t.name == "dra-resource-slices" and t.is_alive() for t in threading.enumerate())


# Failures -----------------------------------------------------------------------------------


def test_forbidden_keeps_the_devices_for_the_grace_then_clears_them_and_recovers(
    fake: FakeApiServer, make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake.set_slices([one_gpu("s", "GPU-a")])
    monotonic = Monotonic()
    reader = make(fake, grace=30.0, monotonic=monotonic, watch_seconds=30)
    known = dict(reader.devices())
    assert wait_until(lambda: fake.watch_calls == 1)
    fake.mode = "forbidden"
    fake.close_watches()
    assert wait_until(lambda: errors(reader)["forbidden"] >= 3)  # retried, backing off
    assert sample(reader, UP) == 0
    assert dict(reader.devices()) == known  # within the grace
    records = [r for r in caplog.records if r.name == LOGGER]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once, however many retries
    assert "get, list and watch on resourceslices.resource.k8s.io" in warnings[0].getMessage()
    monotonic.shift = 31.0  # past the grace
    assert reader.devices() == {}  # at once, whatever the thread is doing
    assert sample(reader, DEVICES) == 0
    failures = errors(reader)["forbidden"]
    assert wait_until(lambda: errors(reader)["forbidden"] >= failures + 2)
    records = [r for r in caplog.records if r.name == LOGGER]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "no DRA devices" in warnings[1].getMessage()
    fake.mode = None
    assert wait_until(lambda: sample(reader, UP) == 1)
    assert dict(reader.devices()) == known
    assert fake.list_calls == 2  # past the grace the slices are listed again, not resumed
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in records] == [logging.INFO, *[logging.WARNING] * 2, logging.INFO]


def test_a_hung_api_server_never_blocks_a_tick_and_is_recovered_from(
    fake: FakeApiServer, make: Callable[..., Any]
) -> None:
    fake.set_slices([one_gpu("s", "GPU-a")])
    reader = make(fake, timeout_seconds=0.3, watch_seconds=0.5)  # silent for 1.3 s: dead
    known = dict(reader.devices())
    fake.mode = "hang"
    fake.close_watches()
    slowest, reads = 0.0, 0
    deadline = time.monotonic() + 10
    while errors(reader)["timeout"] == 0 and time.monotonic() < deadline:
        began = time.perf_counter()
        assert dict(reader.devices()) == known
        slowest = max(slowest, time.perf_counter() - began)
        reads += 1
        time.sleep(0.01)
    assert errors(reader)["timeout"] >= 1 and sample(reader, UP) == 0
    assert reads > 20 and slowest < 0.01
    fake.mode = None
    assert wait_until(lambda: sample(reader, UP) == 1)
    fake.set_slices([one_gpu("s", "GPU-b")])
    key = DraDevice(DRIVER, "node-a", "gpu-0")
    assert wait_until(lambda: reader.devices().get(key) == SliceDevice("GPU-b"))


def test_the_first_list_of_a_hung_api_server_is_bounded(
    fake: FakeApiServer, make: Callable[..., Any]
) -> None:
    fake.mode = "hang"
    began = time.monotonic()
    reader = make(fake, timeout_seconds=0.3)
    assert time.monotonic() - began < 1.0
    assert wait_until(lambda: errors(reader)["timeout"] == 1) and reader.devices() == {}
    fake.mode = None
    assert wait_until(lambda: sample(reader, UP) == 1)


def test_garbage_is_counted_and_survived(fake: FakeApiServer, make: Callable[..., Any]) -> None:
    fake.set_slices([one_gpu("s", "GPU-a")])
    reader = make(fake, watch_seconds=30)
    assert wait_until(lambda: fake.watch_calls == 1)
    fake.mode = "garbage"
    fake.close_watches()
    assert wait_until(lambda: errors(reader)["invalid"] >= 2)
    assert sample(reader, UP) == 0 and reader.devices()
    fake.mode = None
    assert wait_until(lambda: sample(reader, UP) == 1)
    fake.set_slices([one_gpu("s", "GPU-b")])
    key = DraDevice(DRIVER, "node-a", "gpu-0")
    assert wait_until(lambda: reader.devices().get(key) == SliceDevice("GPU-b"))


def test_a_garbage_first_list_is_counted(fake: FakeApiServer, make: Callable[..., Any]) -> None:
    fake.mode = "garbage"
    reader = make(fake)
    assert errors(reader)["invalid"] == 1 and sample(reader, UP) == 0


def test_the_rotated_token_is_used_at_the_next_request(
    fake: FakeApiServer, make: Callable[..., Any]
) -> None:
    reader = make(fake, watch_seconds=30)
    assert wait_until(lambda: fake.watch_calls == 1)
    old = fake.token
    new = fake.rotate_token()  # the old one is refused from now on
    fake.close_watches()
    assert wait_until(lambda: fake.watch_calls == 2)
    assert fake.tokens_seen == [old, old, new]
    assert not any(errors(reader).values()) and sample(reader, UP) == 1


def test_a_refused_token_is_unauthorized_until_the_file_has_a_good_one(
    fake: FakeApiServer, make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    good = fake.token
    Path(fake.token_file).write_text("stale")
    reader = make(fake)
    assert errors(reader)["unauthorized"] == 1 and sample(reader, UP) == 0
    assert "401" in caplog.text and fake.token_file in caplog.text
    Path(fake.token_file).write_text(good + "\n")
    assert wait_until(lambda: sample(reader, UP) == 1)


@pytest.mark.parametrize("content", ["", "two words", "caf\u00e9"])
def test_a_token_file_without_a_token_is_a_config_error(
    fake: FakeApiServer, make: Callable[..., Any], content: str
) -> None:
    Path(fake.token_file).write_text(content)
    reader = make(fake)
    assert errors(reader)["config"] == 1 and fake.list_calls == 0


def test_a_certificate_that_does_not_verify_is_a_tls_error(
    fake: FakeApiServer, make: Callable[..., Any]
) -> None:
    reader = make(fake, ca_file=str(TLS_DIR / "server.crt"))  # not a CA
    assert errors(reader)["tls"] == 1 and sample(reader, UP) == 0


def test_a_refused_connection_is_counted(fake: FakeApiServer, make: Callable[..., Any]) -> None:
    with FakeApiServer() as gone:
        url = gone.url
    reader = make(fake, api_server=url)  # nothing listens there any more
    assert errors(reader)["connection"] == 1 and sample(reader, UP) == 0


# Bounds: request rate, memory, time ---------------------------------------------------------


def test_watches_the_server_ends_at_once_back_off(
    fake: FakeApiServer, make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """client-go's reflector: a watch that ends within a second without an event is a failure."""
    fake.set_slices([one_gpu("s", "GPU-a")])
    fake.mode = "short_watch"
    reader = make(fake, watch_seconds=30, backoff=(0.1, 0.5))
    time.sleep(2.0)
    assert 2 <= fake.watch_calls < 10  # backing off (0.1, 0.2, 0.4, 0.5 ...), not 1000s
    assert errors(reader)["connection"] >= 2 and fake.list_calls == 1
    assert len(reader.devices()) == 1  # within the grace
    assert len(warnings_of(caplog)) == 1 and "ended the watch at once" in warnings_of(caplog)[0]
    fake.mode = None
    # Up alone is no proof: a short watch is up for a moment too. A watch asked for after the
    # change is a full one, and the short one before it has failed (and counted) by then.
    watches_before = fake.watch_calls
    assert wait_until(lambda: fake.watch_calls > watches_before and reader.up)
    failures = errors(reader)["connection"]
    time.sleep(0.5)
    assert errors(reader)["connection"] == failures


def test_a_watch_refused_with_404_backs_off(fake: FakeApiServer, make: Callable[..., Any]) -> None:
    """Lists served, watches not: list and watch again, backing off, and a successful list does
    not reset the back-off (only a watch that proved healthy does)."""
    fake.set_slices([one_gpu("s", "GPU-a")])
    fake.mode = "no_watch"
    reader = make(fake, watch_seconds=30, backoff=(0.1, 0.5))
    time.sleep(2.0)
    assert 2 <= fake.watch_calls < 10 and fake.list_calls < 10
    assert len(reader.devices()) == 1
    fake.mode = None
    assert wait_until(lambda: fake.watch_calls >= 1 and reader.up)


def test_a_list_that_never_ends_is_cut_at_the_page_cap(
    fake: FakeApiServer,
    make: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource_slices, "MAX_LIST_PAGES", 20)
    fake.set_slices(pools(3))
    fake.mode = "endless"
    reader = make(fake, start=False)
    assert start_within(reader, 1.0) < 1.5
    assert wait_until(lambda: errors(reader)["invalid"] >= 1)
    assert fake.list_calls <= 20 * errors(reader)["invalid"] + 1
    assert "more than 20 pages" in warnings_of(caplog)[0]
    assert reader.devices() == {} and not reader.up
    fake.mode = None
    assert wait_until(lambda: len(reader.devices()) == 3)


def test_start_waits_at_most_about_the_timeout_for_a_trickling_list(
    make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Each read comes in time (httpx's read timeout is per read); the request as a whole has
    timeout_seconds."""
    with FakeApiServer("node-a", trickle_seconds=0.05) as fake:
        fake.set_slices(pools(2))
        fake.mode = "trickle"
        reader = make(fake, start=False, timeout_seconds=0.5)
        assert start_within(reader, 0.5) < 0.9
        assert wait_until(lambda: errors(reader)["timeout"] == 1)
        assert not reader.up and reader.devices() == {}
        assert "no complete answer in 0.5 s" in warnings_of(caplog)[0]
        fake.mode = None
        assert wait_until(lambda: len(reader.devices()) == 2)


def test_a_list_of_pages_each_in_time_has_a_deadline(
    make: Callable[..., Any], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(resource_slices, "PAGE_SIZE", 1)
    monkeypatch.setattr(resource_slices, "LIST_DEADLINE_TIMEOUTS", 1.5)
    with FakeApiServer("node-a", trickle_seconds=0.0005) as fake:  # a page in about 0.3 s
        fake.set_slices(pools(20))  # the whole list: about 6 s
        fake.mode = "trickle"
        # timeout_seconds 2: no single page times out, even on a loaded machine; the list 3 s
        reader = make(fake, start=False, timeout_seconds=2.0)
        began = time.monotonic()
        reader.start()
        assert wait_until(lambda: errors(reader)["timeout"] == 1, seconds=15)
        assert time.monotonic() - began > 2.9  # never before the deadline
        assert 2 <= fake.list_calls < 20  # stopped part way: by the deadline, not at the end
        # The failure is counted a moment before it is logged.
        assert wait_until(lambda: bool(warnings_of(caplog)), seconds=5)
        assert "the list took longer than 3 s" in warnings_of(caplog)[0]


def test_a_list_over_the_byte_cap_is_invalid(
    fake: FakeApiServer,
    make: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource_slices, "PAGE_SIZE", 1)  # each page well under the cap
    monkeypatch.setattr(resource_slices, "MAX_LIST_BYTES", 1500)
    fake.set_slices(pools(6))
    reader = make(fake)
    assert errors(reader)["invalid"] == 1 and reader.devices() == {}
    assert 2 <= fake.list_calls < 6
    assert "over 1500 bytes" in warnings_of(caplog)[0]


def test_too_many_slices_are_invalid_in_a_list_and_in_a_watch(
    fake: FakeApiServer,
    make: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource_slices, "MAX_SLICES", 3)
    fake.set_slices(pools(4))
    reader = make(fake, watch_seconds=30)
    assert errors(reader)["invalid"] == 1 and reader.devices() == {}
    assert "more than 3 ResourceSlices" in warnings_of(caplog)[0]
    fake.set_slices(pools(3))
    assert wait_until(lambda: len(reader.devices()) == 3)
    fake.set_slices(pools(5))  # two ADDED events: the first already one too many
    assert wait_until(lambda: errors(reader)["invalid"] >= 2)
    assert len(reader.devices()) == 3 and not reader.up  # the store never grew past the cap


def test_too_many_devices_are_invalid_in_a_list_and_in_a_watch(
    fake: FakeApiServer,
    make: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource_slices, "MAX_DEVICES", 4)
    fake.set_slices(pools(1, devices_each=5))
    reader = make(fake, watch_seconds=30)
    assert errors(reader)["invalid"] == 1 and reader.devices() == {}
    assert "more than 4 devices" in warnings_of(caplog)[0]
    fake.set_slices(pools(2, devices_each=2))
    assert wait_until(lambda: len(reader.devices()) == 4)
    fake.set_slices(pools(2, devices_each=3))  # MODIFIED: 5 devices, then 6
    assert wait_until(lambda: errors(reader)["invalid"] >= 2)
    assert len(reader.devices()) == 4


# The grace, stop(), configuration -----------------------------------------------------------


def test_a_quiet_watch_is_a_success_while_open_and_the_grace_counts_from_its_break(
    make: Callable[..., Any],
) -> None:
    with FakeApiServer("node-a", bookmark_seconds=3600) as fake:  # no bookmark, no event
        fake.set_slices([one_gpu("s", "GPU-a")])
        monotonic = Monotonic()
        reader = make(fake, grace=30.0, monotonic=monotonic, watch_seconds=30)
        known = dict(reader.devices())
        assert wait_until(lambda: fake.watch_calls == 1)
        time.sleep(0.2)
        monotonic.shift = 31.0  # the watch has been open, silent, longer than the grace
        assert reader.up and dict(reader.devices()) == known
        fake.mode = "forbidden"
        fake.close_watches(abrupt=True)
        assert wait_until(lambda: errors(reader)["forbidden"] >= 1)
        assert errors(reader)["connection"] == 1 and not reader.up
        assert dict(reader.devices()) == known  # the grace runs from the break, not before
        monotonic.shift = 62.0
        assert reader.devices() == {}


def test_up_is_the_reader_s_state(fake: FakeApiServer, make: Callable[..., Any]) -> None:
    reader = make(fake, watch_seconds=30)
    assert reader.up is True
    fake.mode = "forbidden"
    fake.close_watches()
    assert wait_until(lambda: reader.up is False)
    assert sample(reader, UP) == 0


def test_watches_ask_for_a_server_side_timeout_of_one_to_two_minutes(
    fake: FakeApiServer, readers: list[ResourceSlices]
) -> None:
    """A silent watch is given up `timeoutSeconds` + timeout_seconds after it began."""
    reader = ResourceSlices(fake.settings(timeout_seconds=1.0), 30.0)
    readers.append(reader)
    reader.start()
    assert wait_until(lambda: fake.watch_calls == 1)
    (query,) = fake.watch_queries
    assert 60 <= int(query["timeoutSeconds"]) <= 120
    assert query["allowWatchBookmarks"] == "true"


def test_no_request_after_stop_even_when_its_join_times_out(
    fake: FakeApiServer, make: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() gives the thread timeout_seconds + 1 s; caught between two pages of a list past
    that, it must neither make the next request nor open a client nobody closes."""
    monkeypatch.setattr(resource_slices, "PAGE_SIZE", 1)
    fake.set_slices(pools(3))
    reader = make(fake, timeout_seconds=0.2, watch_seconds=30)
    assert wait_until(lambda: fake.watch_calls == 1) and fake.list_calls == 3
    entered, release = threading.Event(), threading.Event()
    parse = resource_slices.parse_slice

    def held(obj: Any) -> Any:  # the thread busy between two pages
        entered.set()
        release.wait(5)
        return parse(obj)

    monkeypatch.setattr(resource_slices, "parse_slice", held)
    fake.expire_next_watch()
    fake.close_watches()  # the next watch expires: list again
    assert wait_until(lambda: entered.is_set())
    calls = fake.list_calls
    reader.stop()  # its join times out
    release.set()
    assert wait_until(
        lambda: not any(t.name == "dra-resource-slices" for t in threading.enumerate())
    )
    time.sleep(0.2)
    assert fake.list_calls == calls
    assert reader._http is None  # no client left open


def test_a_malformed_in_cluster_address_is_a_config_error(
    fake: FakeApiServer, make: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "not-a-port")
    reader = make(fake, api_server="auto")
    assert errors(reader)["config"] == 1 and errors(reader)["connection"] == 0


# Configuration ------------------------------------------------------------------------------


def test_no_node_name_is_a_clear_error(
    fake: FakeApiServer,
    make: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    reader = make(fake, node_name="")
    assert errors(reader)["config"] == 1 and sample(reader, UP) == 0
    assert "set kubernetes.dra.node_name or $NODE_NAME" in caplog.text
    assert fake.list_calls == 0


def test_the_node_name_comes_from_node_name_in_the_environment(
    fake: FakeApiServer, make: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.set_slices([one_gpu("s", "GPU-a")])
    monkeypatch.setenv("NODE_NAME", "node-a")
    reader = make(fake, node_name="")
    assert len(reader.devices()) == 1


def test_auto_is_the_in_cluster_api_server(
    fake: FakeApiServer, make: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    host, port = fake.url.removeprefix("https://").split(":")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    reader = make(fake, api_server="auto")
    assert sample(reader, UP) == 1


def test_in_cluster_addresses() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert api_server_url("auto", env) == "https://[fd00:10:96::1]:443"
    assert api_server_url("auto", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == (
        "https://10.96.0.1:443"
    )
    assert api_server_url("https://api.example:6443/", {}) == "https://api.example:6443"
    with pytest.raises(ResourceSliceError) as missing:
        api_server_url("auto", {})
    assert missing.value.reason == "config"


# Parsing ------------------------------------------------------------------------------------


def test_attribute_values_of_every_kind_and_qualified_names() -> None:
    obj = resource_slice(
        "s",
        "node-a",
        [
            device("a", {f"{DRIVER}/uuid": {"string": "GPU-q"}, "type": {"string": "gpu"}}),
            device(
                "b", {"uuid": {"int": 7}, "type": {"bool": True}, "profile": {"version": "1.2.3"}}
            ),
            device("c", {"uuid": "not an attribute", "type": {}}),
        ],
    )
    name, parsed = parse_slice(obj)
    assert name == "s"
    assert dict(parsed.devices) == {
        "a": SliceDevice("GPU-q", "gpu"),
        "b": SliceDevice("7", "true", profile="1.2.3"),
        "c": SliceDevice(""),
    }


@pytest.mark.parametrize(
    "obj",
    [
        {"metadata": {"name": "s"}},
        {"metadata": {"name": "s"}, "spec": "nonsense"},
        {"metadata": {"name": "s"}, "spec": {"devices": "nonsense", "pool": []}},
        {
            "metadata": {"name": "s"},
            "spec": {"devices": [1, {"name": 2}, {"name": "d", "basic": 3}]},
        },
    ],
)
def test_a_malformed_spec_reads_as_absent(obj: dict[str, Any]) -> None:
    _, parsed = parse_slice(obj)
    assert all(d == SliceDevice("") for _, d in parsed.devices)
    assert map_devices({"s": parsed}, [DRIVER]) == {}


@pytest.mark.parametrize("obj", [None, [], {"metadata": {}}, {"metadata": {"name": ""}}])
def test_a_slice_without_a_name_is_invalid(obj: Any) -> None:
    with pytest.raises(ResourceSliceError) as invalid:
        parse_slice(obj)
    assert invalid.value.reason == "invalid"
