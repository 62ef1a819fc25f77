"""Scenario pods with `claim:`: how they are validated, and the fake kubelet reporting them under
`dynamic_resources` over a real gRPC List(), as pod attribution then maps them."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_exporter.collect.k8s.attribution import PodAttribution, PodRef
from gpu_exporter.collect.k8s.dra import Claim, DraDevice
from gpu_exporter.collect.k8s.podresources.v1 import api_pb2, api_pb2_grpc
from gpu_exporter.collect.settings import KubernetesConfig
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.kubelet import FakeKubelet, start_for
from gpu_exporter.sim.scenario import ScenarioError, load_scenario
from gpu_exporter.sim.spec import Scenario
from tests.support import unix_channel

SCENARIO = """\
name: dra
devices:
  - label: a
  - label: b
  - mig:
      instances:
        - {profile: 3g.71gb, gpu_instance: 2, compute_instances: 3}
pods:
  - {namespace: plugin, pod: old-0, gpu: 0}
  - {namespace: ml, pod: train-0, gpu: 1, claim: {name: train-0-gpus}}
  - {namespace: ml, pod: train-0, gpu: 0, claim: {name: train-0-gpus}, from: 30}
  - namespace: ml
    pod: train-0
    container: sidecar
    gpu: 2
    gpu_instance: 2
    compute_instance: 1
    claim: {name: shared, namespace: infra, pool: other-pool, driver: example.com/gpu}
  - {namespace: ml, pod: eval-0, gpu: 1, claim: {name: eval, device: gpu-99}, until: 60}
  - {namespace: ml, pod: train-0, gpu: 2, gpu_instance: 2}  # the device plugin's, beside claims
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def list_pods(kubelet: FakeKubelet) -> dict[str, api_pb2.PodResources]:
    with unix_channel(kubelet.socket_path) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
    return {p.name: p for p in response.pod_resources}


def claims_of(container: api_pb2.ContainerResources) -> list[tuple[str, str, list[tuple]]]:
    """(namespace, name, [(driver, pool, device, cdi names)]) of each DynamicResource."""
    return [
        (
            claim.claim_namespace,
            claim.claim_name,
            [
                (r.driver_name, r.pool_name, r.device_name, [c.name for c in r.cdi_devices])
                for r in claim.claim_resources
            ],
        )
        for claim in container.dynamic_resources
    ]


@pytest.fixture
def scenario(tmp_path: Path) -> Scenario:
    return load_scenario(str(write(tmp_path, SCENARIO)))


@pytest.fixture
def fake(scenario: Scenario) -> Iterator[tuple[FakeKubelet, ManualClock]]:
    clock = ManualClock()
    kubelet = start_for(scenario, clock)
    assert kubelet is not None
    try:
        yield kubelet, clock
    finally:
        kubelet.close()


# --- the fake kubelet --------------------------------------------------------------------------


def test_claims_are_reported_under_dynamic_resources_not_devices(fake, scenario):
    kubelet, _ = fake
    pods = list_pods(kubelet)
    assert set(pods) == {"old-0", "train-0", "eval-0"}
    (plugin,) = pods["old-0"].containers
    assert [list(d.device_ids) for d in plugin.devices] == [[scenario.devices[0].uuid]]
    assert not plugin.dynamic_resources

    main, sidecar = pods["train-0"].containers
    assert (main.name, sidecar.name) == ("main", "sidecar")
    mig_uuid = scenario.pods[5].device_id
    assert [(d.resource_name, list(d.device_ids)) for d in main.devices] == [
        ("nvidia.com/mig-1c.3g.71gb", [mig_uuid])
    ]
    assert not sidecar.devices
    assert claims_of(main) == [
        ("ml", "train-0-gpus",
         [("gpu.nvidia.com", "sim-node", "gpu-1", ["k8s.gpu.nvidia.com/device=gpu-1"])]),
    ]  # fmt: skip
    mig = scenario.pods[3].dra_device
    assert mig.startswith("gpu-2-mig-")  # NVIDIA's name of a MIG device (sim/dra.py)
    assert claims_of(sidecar) == [
        ("infra", "shared",
         [("example.com/gpu", "other-pool", mig, [f"k8s.example.com/gpu/device={mig}"])]),
    ]  # fmt: skip
    (eval_container,) = pods["eval-0"].containers
    assert claims_of(eval_container)[0][2][0][2] == "gpu-99"  # claim.device as written


def test_a_claims_devices_are_one_dynamic_resource_and_follow_the_clock(fake):
    kubelet, clock = fake
    clock.advance(30)  # train-0's claim gets GPU 0 too
    main = list_pods(kubelet)["train-0"].containers[0]
    assert claims_of(main) == [
        ("ml", "train-0-gpus",
         [("gpu.nvidia.com", "sim-node", "gpu-1", ["k8s.gpu.nvidia.com/device=gpu-1"]),
          ("gpu.nvidia.com", "sim-node", "gpu-0", ["k8s.gpu.nvidia.com/device=gpu-0"])]),
    ]  # fmt: skip
    clock.advance(30)
    assert "eval-0" not in list_pods(kubelet)


def test_the_pool_is_the_dra_node_name(tmp_path: Path):
    scenario = load_scenario(
        str(
            write(
                tmp_path,
                """\
                name: t
                devices: [{}]
                dra: {node_name: gpu-node-7, republish: [30]}
                pods:
                  - {namespace: a, pod: p, gpu: 0, claim: {name: c}}
                """,
            )
        )
    )
    assert scenario.dra is not None and scenario.dra.republish == (30.0,)
    kubelet = start_for(scenario, ManualClock())
    assert kubelet is not None
    try:
        (container,) = list_pods(kubelet)["p"].containers
    finally:
        kubelet.close()
    assert claims_of(container)[0][2][0][:3] == ("gpu.nvidia.com", "gpu-node-7", "gpu-0")


def test_a_scenario_with_claims_gets_a_default_dra_driver(scenario):
    assert scenario.dra is not None
    assert (scenario.dra.node_name, scenario.dra.republish) == ("sim-node", ())
    assert load_scenario({"name": "t", "devices": [{}]}).dra is None


def test_pod_attribution_maps_the_scenarios_claims(fake, scenario):
    kubelet, clock = fake
    config = KubernetesConfig(
        socket_path=kubelet.socket_path,
        dra={"enabled": True, "drivers": ["gpu.nvidia.com"]},
    )
    attribution = PodAttribution(config)
    clock.advance(30)
    assert attribution.refresh()
    train = Claim(PodRef("ml", "train-0", "main"), "ml", "train-0-gpus")
    assert attribution.claims() == {
        DraDevice("gpu.nvidia.com", "sim-node", "gpu-0"): (train,),
        DraDevice("gpu.nvidia.com", "sim-node", "gpu-1"): (train,),
        # eval-0's claim names a device of its own: gpu-99, on GPU 1 but published by no slice
        DraDevice("gpu.nvidia.com", "sim-node", "gpu-99"): (
            Claim(PodRef("ml", "eval-0", "main"), "ml", "eval"),
        ),
    }  # the sidecar's driver, example.com/gpu, is not configured
    assert attribution.pods_by_device() == {
        scenario.devices[0].uuid: (PodRef("plugin", "old-0", "main"),),
        scenario.pods[5].device_id: (PodRef("ml", "train-0", "main"),),
    }


# --- validation --------------------------------------------------------------------------------


BAD_CLAIMS = {
    "missing name": ("{namespace: a, pod: p, gpu: 0, claim: {pool: x}}",
                     r"pods\[1\]\.claim: missing required key 'name'"),
    "unknown key": ("{namespace: a, pod: p, gpu: 0, claim: {name: c, class: gpu}}",
                    r"pods\[1\]\.claim\.class: unknown key 'class'"),
    "not a mapping": ("{namespace: a, pod: p, gpu: 0, claim: c}",
                      r"pods\[1\]\.claim: expected a mapping"),
    "name not a string": ("{namespace: a, pod: p, gpu: 0, claim: {name: 7}}",
                          r"pods\[1\]\.claim\.name: expected a string, got int 7"),
    "empty name": ("{namespace: a, pod: p, gpu: 0, claim: {name: ''}}",
                   r"pods\[1\]\.claim\.name: expected a non-empty string"),
    "empty device": ("{namespace: a, pod: p, gpu: 0, claim: {name: c, device: ''}}",
                     r"pods\[1\]\.claim\.device: expected a non-empty string"),
    "empty pool": ("{namespace: a, pod: p, gpu: 0, claim: {name: c, pool: ''}}",
                   r"pods\[1\]\.claim\.pool: expected a non-empty string"),
    "empty driver": ("{namespace: a, pod: p, gpu: 0, claim: {name: c, driver: ''}}",
                     r"pods\[1\]\.claim\.driver: expected a non-empty string"),
    "replica": ("{namespace: a, pod: p, gpu: 0, replica: 1, claim: {name: c}}",
                r"pods\[1\]\.replica: `replica` is the device plugin's; not with `claim`"),
    "resource": ("{namespace: a, pod: p, gpu: 0, resource: nvidia.com/gpu, claim: {name: c}}",
                 r"pods\[1\]\.resource: `resource` is the device plugin's; not with `claim`"),
    "no such MIG device": ("{namespace: a, pod: p, gpu: 0, gpu_instance: 3, claim: {name: c}}",
                           r"pods\[1\]\.gpu_instance: GPU 0 has no GPU instance 3"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_CLAIMS))
def test_bad_claims_name_file_line_and_field(tmp_path: Path, case: str) -> None:
    entry, message = BAD_CLAIMS[case]
    text = f"""\
name: bad
devices:
  - label: a
pods:
  - {{namespace: a, pod: ok, gpu: 0, claim: {{name: fine}}}}
  - {entry}
"""
    path = tmp_path / "scenario.yaml"
    path.write_text(text)  # the bad entry is on line 6
    with pytest.raises(ScenarioError, match=re.escape(f"{path}:6: ") + message):
        load_scenario(str(path))


@pytest.mark.parametrize(
    ("dra", "message"),
    [
        ("{node_name: ''}", r"dra\.node_name: expected a non-empty string"),
        ("{republish: [10, -1]}", r"dra\.republish\[1\]: must be >= 0, got -1"),
        ("{nodes: [a]}", r"dra\.nodes: unknown key 'nodes'"),
    ],
)
def test_a_bad_dra_block_names_file_line_and_field(tmp_path: Path, dra: str, message: str):
    path = tmp_path / "scenario.yaml"
    path.write_text(f"name: bad\ndevices: [{{}}]\ndra: {dra}\n")
    with pytest.raises(ScenarioError, match=re.escape(f"{path}:3: ") + message):
        load_scenario(str(path))
