"""Pods in the simulator: `pods:` entries with a lifetime (`from`, `until`), the fake kubelet
reporting the ones active at each List(), and `serve --simulate` (the `mixed` scenario) putting
them on /metrics."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_exporter.collect.k8s.podresources.v1 import api_pb2, api_pb2_grpc
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.kubelet import FakeKubelet, scenario_pods, start_for
from gpu_exporter.sim.scenario import ScenarioError, load_scenario
from tests.daemon import Daemon, parse_samples, serve
from tests.support import unix_channel, wait_for

SCENARIO = """\
name: churn
devices:
  - label: a
  - label: b
  - label: c
pods:
  - {namespace: batch, pod: job-0, container: solver, gpu: 0, until: 90}
  - {namespace: batch, pod: job-1, container: solver, gpu: 0, from: 90}
  - {namespace: ml, pod: train-0, gpu: 1}
  - {namespace: ml, pod: train-0, gpu: 2, from: 30, until: 60}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def listed(kubelet: FakeKubelet) -> dict[tuple[str, str, str], list[str]]:
    """(namespace, pod, container) -> device ids, from a real gRPC List() on its socket."""
    with unix_channel(kubelet.socket_path) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
    return {
        (p.namespace, p.name, c.name): [i for d in c.devices for i in d.device_ids]
        for p in response.pod_resources
        for c in p.containers
    }


# --- parsing -----------------------------------------------------------------------------------


def test_pod_lifetimes_are_parsed(tmp_path: Path) -> None:
    scenario = load_scenario(str(write(tmp_path, SCENARIO)))
    lifetimes = [(p.pod, p.start, p.until) for p in scenario.pods]
    assert lifetimes == [
        ("job-0", 0.0, 90.0),
        ("job-1", 90.0, None),
        ("train-0", 0.0, None),
        ("train-0", 30.0, 60.0),
    ]
    assert [p.active(89.9) for p in scenario.pods] == [True, False, True, False]
    assert [p.active(90.0) for p in scenario.pods] == [False, True, True, False]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{namespace: a, pod: p, gpu: 0, from: 30, until: 30}", r"pods\[1\]\.until: "
         "`until` must be after `from`"),
        ("{namespace: a, pod: p, gpu: 0, from: 40, until: 10}", r"pods\[1\]\.until: "
         "`until` must be after `from`"),
        ("{namespace: a, pod: p, gpu: 0, until: -1}", r"pods\[1\]\.until: must be >= 0"),
        ("{namespace: a, pod: p, gpu: 0, to: 30}", r"pods\[1\]\.to: unknown key 'to'"),
    ],
)  # fmt: skip
def test_bad_pod_lifetimes_name_file_line_and_field(
    tmp_path: Path, entry: str, message: str
) -> None:
    text = f"""\
name: bad
devices:
  - label: a
pods:
  - {{namespace: a, pod: ok, gpu: 0, until: 5}}
  - {entry}
"""
    path = write(tmp_path, text)  # the bad entry is on line 6
    with pytest.raises(ScenarioError, match=re.escape(f"{path}:6: ") + message):
        load_scenario(str(path))


# --- the fake kubelet over time ----------------------------------------------------------------


@pytest.fixture
def churn(tmp_path: Path) -> Iterator[tuple[FakeKubelet, ManualClock, list[str]]]:
    scenario = load_scenario(str(write(tmp_path, SCENARIO)))
    clock = ManualClock()
    kubelet = start_for(scenario, clock)
    assert kubelet is not None
    try:
        yield kubelet, clock, [d.uuid for d in scenario.devices]
    finally:
        kubelet.close()


def test_the_fake_kubelet_lists_the_pods_active_at_each_call(
    churn: tuple[FakeKubelet, ManualClock, list[str]],
) -> None:
    kubelet, clock, uuid = churn
    at_start = {
        ("batch", "job-0", "solver"): [uuid[0]],
        ("ml", "train-0", "main"): [uuid[1]],
    }
    assert listed(kubelet) == at_start
    clock.advance(30)  # train-0 takes a second GPU for 30 s
    assert listed(kubelet) == {**at_start, ("ml", "train-0", "main"): [uuid[1], uuid[2]]}
    clock.advance(30)
    assert listed(kubelet) == at_start
    clock.advance(29.5)
    assert listed(kubelet) == at_start
    clock.advance(0.5)  # job-0 is replaced by job-1 on the same GPU
    assert listed(kubelet) == {
        ("batch", "job-1", "solver"): [uuid[0]],
        ("ml", "train-0", "main"): [uuid[1]],
    }
    assert kubelet.list_calls == 5


def test_scenario_pods_without_a_time_is_every_entry(tmp_path: Path) -> None:
    scenario = load_scenario(str(write(tmp_path, SCENARIO)))
    assert [p.name for p in scenario_pods(scenario)] == ["job-0", "job-1", "train-0"]
    assert [p.name for p in scenario_pods(scenario, 95)] == ["job-1", "train-0"]


def test_start_for_follows_real_time_by_default(tmp_path: Path) -> None:
    text = SCENARIO.replace("until: 90", "until: 0.3").replace("from: 90", "from: 0.3")
    kubelet = start_for(load_scenario(str(write(tmp_path, text))))
    assert kubelet is not None
    try:
        assert ("batch", "job-0", "solver") in listed(kubelet)
        wait_for(
            lambda: ("batch", "job-1", "solver") in listed(kubelet) or None, 5, "job-1 to start"
        )
        assert ("batch", "job-0", "solver") not in listed(kubelet)
    finally:
        kubelet.close()


# --- serve --simulate --------------------------------------------------------------------------


def text_with(daemon: Daemon, needle: str) -> str:
    """The exposition once it contains `needle`."""

    def check() -> str:
        text = daemon.metrics_text()
        return text if needle in text else ""

    return wait_for(check, 15, f"{needle!r} in /metrics")


def pods_per_gpu(text: str) -> dict[str, tuple[str, str, str] | None]:
    """gpu index -> (namespace, pod, container) of its gpu_up series, None without pod labels."""
    found: dict[str, tuple[str, str, str] | None] = {}
    for series in parse_samples(text):
        if not series.startswith("gpu_up{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', series))
        held = {"namespace", "pod", "container"} & labels.keys()
        found[labels["gpu"]] = (
            (labels["namespace"], labels["pod"], labels["container"]) if held else None
        )
    return found


def test_serve_simulate_default_scenario_has_pod_labels_and_a_free_gpu(tmp_path: Path) -> None:
    scenario = load_scenario("mixed")
    expected: dict[str, tuple[str, str, str] | None] = {
        str(d.index): None for d in scenario.devices
    }
    uuid_to_gpu = {d.uuid: str(d.index) for d in scenario.devices}
    for spec in scenario.pods:
        if spec.active(0):
            expected[uuid_to_gpu[spec.device_id]] = (spec.namespace, spec.pod, spec.container)
    free = [gpu for gpu, held in expected.items() if held is None]
    assert len(free) == 1  # the scenario leaves one GPU to no pod

    with serve(tmp_path, "--simulate", "--interval", "0.5") as daemon:
        daemon.wait_ready()
        text = text_with(daemon, "pod=")
        assert pods_per_gpu(text) == expected
        samples = parse_samples(text)
        (free_gpu,) = free
        power = [s for s in samples if s.startswith("gpu_power_watts{")]
        assert len(power) == 8
        for series in power:
            if f'gpu="{free_gpu}"' in series:
                assert "namespace=" not in series and "pod=" not in series
            else:
                assert "namespace=" in series and "pod=" in series and "container=" in series
        assert "gpu_exporter_attribution_up 1.0" in text
        # The fake kubelet's start-up line and pod attribution's first answer count alike.
        log = daemon.output()
    held = len({uuid_to_gpu[s.device_id] for s in scenario.pods if s.active(0)})
    pods = len({(s.namespace, s.pod) for s in scenario.pods if s.active(0)})
    assert f": {pods} pods holding {held} devices at 0 s" in log
    assert f"({held} devices held by pods)" in log


def test_serve_simulate_follows_the_scenario_pods_over_time(tmp_path: Path) -> None:
    text = SCENARIO.replace("until: 90", "until: 3").replace("from: 90", "from: 3")
    path = write(tmp_path, text)
    config = tmp_path / "daemon.yaml"
    config.write_text("kubernetes:\n  refresh_seconds: 1\n")
    with serve(
        tmp_path, "--simulate", str(path), "--interval", "0.5", "--config", str(config)
    ) as daemon:
        daemon.wait_ready()
        text_with(daemon, 'pod="job-0"')
        text = text_with(daemon, 'pod="job-1"')
        assert 'pod="job-0"' not in text
        assert pods_per_gpu(text)["0"] == ("batch", "job-1", "solver")
