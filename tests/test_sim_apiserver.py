"""The fake API server (gpu_exporter/sim/apiserver.py) over its real wire protocol: HTTPS with
the vendored test CA, bearer tokens, ResourceSlice lists and watch streams, and its test hooks."""

from __future__ import annotations

import fnmatch
import json
import socket
import ssl
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu_exporter.cli import _simulated_api_server, _simulated_kubelet
from gpu_exporter.config.load import load_config
from gpu_exporter.sim import apiserver
from gpu_exporter.sim.apiserver import (
    TLS_DIR,
    FakeApiServer,
    device,
    resource_slice,
    scenario_slices,
    start_for,
)
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.dra import DRIVER, gpu_device_name, mig_device_name
from gpu_exporter.sim.scenario import load_scenario
from tests.daemon import free_port

REPO = Path(__file__).resolve().parent.parent
PATH = "/apis/resource.k8s.io/v1/resourceslices"

# GPU 0 whole; GPU 1 with MIG: a 3g until 20 s, then a 1g in its place; a 2g split in two
# compute instances throughout. The driver republishes its slice at 30 s.
SCENARIO = load_scenario(
    {
        "name": "dra-apiserver",
        "devices": [
            {},
            {
                "mig": {
                    "instances": [
                        {"profile": "3g.71gb", "until": 20},
                        {"profile": "1g.18gb", "from": 20},
                        {"profile": "2g.35gb", "compute_instances": 2},
                    ]
                }
            },
        ],
        "dra": {"node_name": "node-a", "republish": [30]},
    }
)


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer("node-a", bookmark_seconds=0.2) as server:
        yield server


def client(fake: FakeApiServer, token: str | None = None) -> httpx.Client:
    token = fake.token if token is None else token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    verify = ssl.create_default_context(cafile=fake.ca_file)
    return httpx.Client(base_url=fake.url, verify=verify, headers=headers, timeout=5)


def events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line:
            yield json.loads(line)


def slice_of(name: str, node: str = "node-a", *uuids: str, generation: int = 0) -> dict[str, Any]:
    devices = [device(f"gpu-{i}", {"uuid": {"string": u}}) for i, u in enumerate(uuids)]
    return resource_slice(name, node, devices, generation=generation)


# TLS and authentication ---------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_its_certificate_verifies_against_the_vendored_ca_strictly(
    fake: FakeApiServer, host: str
) -> None:
    context = ssl.create_default_context(cafile=fake.ca_file)
    context.verify_flags |= ssl.VERIFY_X509_STRICT  # Python 3.13's default
    url = fake.url.replace("127.0.0.1", host)
    with httpx.Client(verify=context) as http:
        answer = http.get(url + PATH, headers={"Authorization": f"Bearer {fake.token}"})
    assert answer.status_code == 200


def test_the_tls_files_are_package_data() -> None:
    """`pip install` must carry them: every file of sim/tls matches a package-data pattern."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["gpu_exporter"]
    files = sorted(p.relative_to(REPO / "gpu_exporter").as_posix() for p in TLS_DIR.iterdir())
    assert {"sim/tls/ca.crt", "sim/tls/server.crt", "sim/tls/server.key"} <= set(files)
    for name in files:
        assert any(fnmatch.fnmatch(name, p) for p in patterns), name


@pytest.mark.parametrize("token", ["", "wrong"])
def test_a_request_without_the_token_is_unauthorized(fake: FakeApiServer, token: str) -> None:
    with client(fake, token) as http:
        answer = http.get(PATH)
    assert answer.status_code == 401
    assert answer.json()["reason"] == "Unauthorized"


def test_a_rotated_token_replaces_the_old_one(fake: FakeApiServer) -> None:
    old = fake.token
    new = fake.rotate_token()
    assert Path(fake.token_file).read_text() == new != old
    with client(fake, old) as http:
        assert http.get(PATH).status_code == 401
    with client(fake, new) as http:
        assert http.get(PATH).status_code == 200


# Lists ------------------------------------------------------------------------------------------


def test_a_list_filters_by_node_and_pages_with_continue(fake: FakeApiServer) -> None:
    fake.set_slices(
        [slice_of(f"node-a-{i}", "node-a", f"GPU-{i}") for i in range(3)]
        + [slice_of("node-b-0", "node-b", "GPU-b")]
    )
    names, resource_versions = [], set()
    params: dict[str, str] = {"fieldSelector": "spec.nodeName=node-a", "limit": "2"}
    with client(fake) as http:
        while True:
            page = http.get(PATH, params=params).json()
            assert page["kind"] == "ResourceSliceList"
            names += [item["metadata"]["name"] for item in page["items"]]
            resource_versions.add(page["metadata"]["resourceVersion"])
            if not page["metadata"].get("continue"):
                break
            params["continue"] = page["metadata"]["continue"]
        assert http.get(PATH, params={"continue": "nonsense"}).status_code == 410
        assert http.get(PATH, params={"fieldSelector": "spec.foo=x"}).status_code == 400
    assert names == ["node-a-0", "node-a-1", "node-a-2"]
    assert resource_versions == {str(fake.resource_version)}  # one consistent snapshot
    assert fake.list_calls == 3


def test_only_the_served_versions_answer_and_v1beta1_wraps_devices_in_basic() -> None:
    with FakeApiServer("node-a", versions=("v1beta1",)) as fake:
        fake.set_slices([slice_of("s", "node-a", "GPU-x")])
        with client(fake) as http:
            missing = http.get(PATH)
            served = http.get(PATH.replace("/v1/", "/v1beta1/")).json()
    assert missing.status_code == 404
    assert missing.text == "404 page not found\n"
    assert served["apiVersion"] == "resource.k8s.io/v1beta1"
    (item,) = served["items"]
    assert item["spec"]["devices"] == [
        {"name": "gpu-0", "basic": {"attributes": {"uuid": {"string": "GPU-x"}}}}
    ]


# Watches ----------------------------------------------------------------------------------------


def test_a_watch_streams_changes_after_its_resource_version_then_ends(
    fake: FakeApiServer,
) -> None:
    fake.set_slices([slice_of("s-0", "node-a", "GPU-a")])
    start = fake.resource_version
    fake.set_slices([slice_of("s-0", "node-a", "GPU-b")])  # before the watch: replayed

    def later() -> None:
        time.sleep(0.3)
        fake.set_slices([slice_of("s-1", "node-a", "GPU-b", generation=1)])

    threading.Thread(target=later, daemon=True).start()
    params = {
        "watch": "1",
        "resourceVersion": str(start),
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "1",
        "fieldSelector": "spec.nodeName=node-a",
    }
    began = time.monotonic()
    with client(fake) as http, http.stream("GET", PATH, params=params) as response:
        assert response.status_code == 200
        seen = list(events(response))
    assert 1.0 <= time.monotonic() - began < 3.0  # ended by timeoutSeconds, cleanly
    changes = [
        (e["type"], e["object"]["metadata"]["name"]) for e in seen if e["type"] != "BOOKMARK"
    ]
    assert changes == [("MODIFIED", "s-0"), ("DELETED", "s-0"), ("ADDED", "s-1")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in seen]
    assert versions == sorted(versions) and versions[-1] == fake.resource_version
    assert [e["type"] for e in seen].count("BOOKMARK") >= 2  # periodic, and one at the end
    assert seen[-1]["type"] == "BOOKMARK"


@pytest.mark.parametrize("as_status", [False, True])
def test_the_next_watch_can_be_made_to_expire(fake: FakeApiServer, as_status: bool) -> None:
    fake.expire_next_watch(as_status=as_status)
    params = {"watch": "1", "resourceVersion": str(fake.resource_version), "timeoutSeconds": "1"}
    with client(fake) as http:
        with http.stream("GET", PATH, params=params) as response:
            if as_status:
                assert response.status_code == 410
            else:
                assert response.status_code == 200
                (error,) = events(response)
                assert error["type"] == "ERROR"
                assert (error["object"]["code"], error["object"]["reason"]) == (410, "Expired")
        with http.stream("GET", PATH, params=params) as response:  # only the next one
            assert [e["type"] for e in events(response)] == []


def test_a_watch_from_before_a_compaction_expires(fake: FakeApiServer) -> None:
    fake.set_slices([slice_of("s-0", "node-a", "GPU-a")])
    old = fake.resource_version
    fake.set_slices([slice_of("s-0", "node-a", "GPU-b")])
    fake.compact()
    params = {"watch": "1", "resourceVersion": str(old), "timeoutSeconds": "1"}
    with client(fake) as http, http.stream("GET", PATH, params=params) as response:
        (error,) = events(response)
    assert error["object"]["code"] == 410


@pytest.mark.parametrize("abrupt", [False, True])
def test_open_watches_can_be_closed(fake: FakeApiServer, abrupt: bool) -> None:
    threading.Timer(0.3, fake.close_watches, kwargs={"abrupt": abrupt}).start()
    params = {"watch": "1", "resourceVersion": str(fake.resource_version), "timeoutSeconds": "30"}
    began = time.monotonic()
    with client(fake) as http, http.stream("GET", PATH, params=params) as response:
        if abrupt:
            with pytest.raises(httpx.RemoteProtocolError):
                list(events(response))
        else:
            assert list(events(response)) == []
    assert time.monotonic() - began < 3.0


# Modes --------------------------------------------------------------------------------------


def test_forbidden_and_error_modes_answer_a_status(fake: FakeApiServer) -> None:
    with client(fake) as http:
        fake.mode = "forbidden"
        forbidden = http.get(PATH)
        fake.mode = "error"
        error = http.get(PATH)
        fake.mode = None
        fine = http.get(PATH)
    assert forbidden.status_code == 403
    assert "cannot list resource" in forbidden.json()["message"]
    assert error.status_code == 500
    assert fine.status_code == 200


def test_garbage_mode_answers_what_is_not_json(fake: FakeApiServer) -> None:
    fake.mode = "garbage"
    with client(fake) as http:
        body = http.get(PATH).text
        params = {"watch": "1", "resourceVersion": str(fake.resource_version)}
        with http.stream("GET", PATH, params=params) as response:
            lines = [line for line in response.iter_lines() if line]
    with pytest.raises(ValueError):
        json.loads(body)
    with pytest.raises(ValueError):
        json.loads(lines[0])


def test_hang_mode_answers_nothing_until_it_ends(fake: FakeApiServer) -> None:
    fake.mode = "hang"
    with client(fake) as http:
        began = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            http.get(PATH, timeout=httpx.Timeout(5, read=0.5))
        assert 0.5 <= time.monotonic() - began < 2.0
        fake.mode = None
        assert http.get(PATH).status_code == 200


def test_watch_modes_end_every_watch_at_once_or_refuse_it(fake: FakeApiServer) -> None:
    fake.set_slices([slice_of("s", "node-a", "GPU-a")])
    params = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": "30",
              "resourceVersion": str(fake.resource_version)}  # fmt: skip
    with client(fake) as http:
        fake.mode = "short_watch"
        began = time.monotonic()
        with http.stream("GET", PATH, params=params) as response:
            assert response.status_code == 200
            assert list(events(response)) == []  # not even a bookmark
        assert time.monotonic() - began < 0.5
        fake.mode = "no_watch"
        assert http.get(PATH, params=params).status_code == 404
        assert http.get(PATH).status_code == 200  # lists still served
    assert fake.watch_calls == 2
    assert [q["timeoutSeconds"] for q in fake.watch_queries] == ["30", "30"]


def test_endless_mode_pages_forever(fake: FakeApiServer) -> None:
    fake.set_slices([slice_of(f"s-{i}", "node-a", f"GPU-{i}") for i in range(3)])
    fake.mode = "endless"
    params: dict[str, str] = {"limit": "2"}
    names: list[str] = []
    with client(fake) as http:
        for _ in range(5):
            page = http.get(PATH, params=params).json()
            names += [item["metadata"]["name"] for item in page["items"]]
            params["continue"] = page["metadata"]["continue"]
    assert names == ["s-0", "s-1", "s-2"] * 2 + ["s-0", "s-1"]  # pages of 2, then over again
    assert fake.list_calls == 5


def test_trickle_mode_sends_a_byte_at_a_time() -> None:
    with FakeApiServer("node-a", trickle_seconds=0.01) as fake:
        fake.mode = "trickle"
        chunks: list[bytes] = []
        with client(fake) as http, http.stream("GET", PATH) as response:
            began = time.monotonic()
            for chunk in response.iter_raw():
                chunks.append(chunk)
                if len(chunks) == 20:
                    fake.mode = None  # the rest at once
            elapsed = time.monotonic() - began
        body = b"".join(chunks)
    assert json.loads(body)["kind"] == "ResourceSliceList"
    assert len(chunks) >= 20 and all(len(c) == 1 for c in chunks[:20])
    assert 0.15 <= elapsed < 2.0


def test_close_ends_watches_and_hung_requests() -> None:
    fake = FakeApiServer().start()
    outcomes: dict[str, str] = {}

    def request(what: str, params: dict[str, str]) -> None:
        try:
            with client(fake) as http, http.stream("GET", PATH, params=params) as response:
                list(events(response))
            outcomes[what] = "ended"
        except httpx.HTTPError as error:
            outcomes[what] = type(error).__name__

    watch = {"watch": "1", "resourceVersion": str(fake.resource_version)}
    threads = [threading.Thread(target=request, args=("watch", watch))]
    threads[0].start()
    time.sleep(0.3)
    fake.mode = "hang"  # from now on, requests get no answer
    threads.append(threading.Thread(target=request, args=("hung", {})))
    threads[1].start()
    time.sleep(0.3)
    assert outcomes == {}
    began = time.monotonic()
    fake.close()
    for thread in threads:
        thread.join(timeout=5)
    assert time.monotonic() - began < 3.0
    assert outcomes == {"watch": "ended", "hung": "RemoteProtocolError"}
    assert not Path(fake.directory).exists()


def handing_out_first(ports: list[int], binds: list[int]) -> type[apiserver._Server]:
    """The server class, as if the kernel handed out `ports`, in order, before any other (the
    race seen once on CI); each port it listened on goes to `binds`."""
    first = iter(ports)

    class HandsOutTheseFirst(apiserver._Server):
        def __init__(self, address: tuple[str, int], *args: Any, **kwargs: Any) -> None:
            super().__init__(("127.0.0.1", next(first, address[1])), *args, **kwargs)
            binds.append(self.server_address[1])

    return HandsOutTheseFirst


def test_it_never_listens_on_a_port_it_is_told_to_avoid(monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = free_port()
    binds: list[int] = []
    monkeypatch.setattr(apiserver, "_Server", handing_out_first([wanted], binds))
    fake = FakeApiServer().start(avoid_ports={wanted})
    try:
        assert len(binds) == 2
        assert not fake.url.endswith(f":{wanted}")
        with socket.socket() as daemon:  # the avoided port was let go again
            daemon.bind(("127.0.0.1", wanted))
        with client(fake) as http:
            assert http.get(PATH).status_code == 200  # served from the other port
    finally:
        fake.close()


def test_the_daemon_s_simulated_api_server_avoids_the_daemon_s_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ports = [free_port(), free_port()]
    monkeypatch.setattr(apiserver, "_Server", handing_out_first(ports, []))
    flags = {
        "listen_address": f"127.0.0.1:{ports[0]}",
        "dcgm_compat.enabled": True,
        "dcgm_compat.listen_address": f"127.0.0.1:{ports[1]}",
    }
    config = load_config(None, flags, environ={})
    scenario, clock = load_scenario("dra"), ManualClock()
    kubelet, config = _simulated_kubelet(scenario, config, clock)
    server, config = _simulated_api_server(scenario, config, clock)
    try:
        assert server is not None
        assert config.kubernetes.dra.api_server == server.url
        assert int(server.url.rsplit(":", 1)[1]) not in ports
    finally:
        for started in (server, kubelet):
            if started is not None:
                started.close()


# Scenarios ----------------------------------------------------------------------------------


def expected_devices(t: float) -> list[str]:
    gpu1 = SCENARIO.devices[1]
    assert gpu1.mig is not None
    names = [gpu_device_name(0), gpu_device_name(1)]
    for instance in gpu1.mig.live(t):
        names += [mig_device_name(1, instance, ci) for ci in range(instance.compute_instances)]
    return names


def test_a_scenario_publishes_its_gpus_and_live_mig_devices() -> None:
    (published,) = scenario_slices(SCENARIO, 0.0)
    gpu0, gpu1 = SCENARIO.devices
    assert gpu1.mig is not None
    spec = published["spec"]
    assert published["metadata"]["name"] == f"node-a-{DRIVER}-0"
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, "node-a")
    assert spec["pool"] == {"name": "node-a", "generation": 0, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == expected_devices(0.0)
    by_name = {d["name"]: d["attributes"] for d in spec["devices"]}
    assert by_name["gpu-0"]["uuid"] == {"string": gpu0.uuid}
    assert by_name["gpu-0"]["type"] == {"string": "gpu"}
    split = gpu1.mig.instances[2]
    second = by_name[mig_device_name(1, split, 1)]
    assert second["uuid"] == {"string": split.mig_uuids[1]}
    assert second["parentUUID"] == {"string": gpu1.uuid}
    assert second["profile"] == {"string": "1c.2g.35gb"}
    assert second["type"] == {"string": "mig"}


def test_a_scenario_s_mig_change_and_republish_are_watch_events() -> None:
    clock = ManualClock()
    fake = start_for(SCENARIO, clock)
    assert fake is not None
    try:
        assert fake.node_name == "node-a" and Path(fake.token_file).read_text() == fake.token
        start = fake.resource_version
        clock.advance(25)  # the 3g is gone, the 1g is there
        fake.sync()
        clock.advance(10)  # republished
        params = {"watch": "1", "resourceVersion": str(start), "timeoutSeconds": "1"}
        with client(fake) as http, http.stream("GET", PATH, params=params) as response:
            seen = [(e["type"], e["object"]) for e in events(response)]
    finally:
        fake.close()
    assert [(kind, obj["metadata"]["name"]) for kind, obj in seen] == [
        ("MODIFIED", f"node-a-{DRIVER}-0"),
        ("DELETED", f"node-a-{DRIVER}-0"),
        ("ADDED", f"node-a-{DRIVER}-1"),
    ]
    modified, added = seen[0][1], seen[2][1]
    assert [d["name"] for d in modified["spec"]["devices"]] == expected_devices(25)
    assert expected_devices(25) != expected_devices(0)
    assert added["spec"]["pool"]["generation"] == 1


def test_no_server_for_a_scenario_without_dra() -> None:
    assert start_for(load_scenario({"name": "plain", "devices": [{}]})) is None
