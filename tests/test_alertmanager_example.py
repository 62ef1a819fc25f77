"""The example Alertmanager configuration (deploy/alertmanager/alertmanager.yml) is valid and
does what it says, in a real Alertmanager.

amtool checks the file as shipped and refuses a copy with a broken inhibit rule. Then a real
Alertmanager runs the shipped file with its receivers' URLs pointed at a webhook recorder on
127.0.0.1 (one path per receiver) and its group_wait/group_interval cut to a second (the
shipped 30 s / 5 m would only make the test slow); the test posts alerts through the API v2
with the labels the pack gives them: alertname and the rule's own labels read from
rules/gpu-exporter.rules.yaml, plus gpu/uuid/node and, with pod attribution,
namespace/pod/container. Other series labels (reason, xid, ...) take no part in the
configuration's routing or inhibition and are left out. Each test uses nodes of its own, so
the inhibitions of one (equal on node) never reach another's alerts.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpu_exporter.alerting.rules.loader import Rule, load_rule_files
from gpu_exporter.model.catalog import BY_NAME
from tests.servers import Recorder, alertmanager
from tests.support import require_tool, wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy/alertmanager/alertmanager.yml"
PACK = ROOT / "rules/gpu-exporter.rules.yaml"
PACK_ALERTS: dict[str, Rule] = {
    rule.name: rule for group in load_rule_files([PACK]) for rule in group.rules if rule.is_alert
}
PERFORMANCE = ("efficiency", "throttling")  # the categories a critical XID makes moot
TEAM_NAMESPACE, OTHER_NAMESPACE = "ml-training", "batch"
DELIVERY_TIMEOUT = 30.0


def _example() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return data


def amtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("amtool"), "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


# --- the file ------------------------------------------------------------------------------


def test_the_example_passes_amtool() -> None:
    checked = amtool_check(EXAMPLE)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "3 inhibit rules" in checked.stdout, checked.stdout


@pytest.mark.parametrize(
    ("field", "broken", "message"),
    [
        ("target_matchers", ['alertname!~"(GpuLost"'], "missing closing )"),
        ("equal", ["node", "1gpu"], '"1gpu" is not a valid label name'),
    ],
)
def test_a_broken_inhibit_rule_fails_amtool(
    field: str, broken: list[str], message: str, tmp_path: Path
) -> None:
    config = _example()
    config["inhibit_rules"][0][field] = broken
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    checked = amtool_check(path)
    assert checked.returncode != 0, checked.stdout
    assert message in checked.stdout + checked.stderr


_MATCHER = re.compile(r'^\s*(\w+)\s*(=~|!~|!=|=)\s*"(.*)"\s*$')


def matcher_values(matcher: str, label: str) -> set[str]:
    """The values `matcher` names for `label` (each alternative of a regex); none for others."""
    found = _MATCHER.match(matcher)
    assert found, f"unexpected matcher syntax: {matcher}"
    name, _, value = found.groups()
    return set(value.split("|")) if name == label else set()


def all_matchers(config: dict[str, Any]) -> list[str]:
    def of_route(route: dict[str, Any]) -> Iterator[str]:
        yield from route.get("matchers", [])
        for child in route.get("routes", []):
            yield from of_route(child)

    rules = config["inhibit_rules"]
    return [
        *of_route(config["route"]),
        *(m for rule in rules for m in (*rule["source_matchers"], *rule["target_matchers"])),
    ]


def test_the_example_names_only_alerts_and_label_values_of_the_pack() -> None:
    # A renamed alert or category in the pack must not leave a rule here that matches nothing.
    matchers = all_matchers(_example())
    pack_values = {
        "alertname": set(PACK_ALERTS),
        "severity": {rule.labels["severity"] for rule in PACK_ALERTS.values()},
        "category": {rule.labels["category"] for rule in PACK_ALERTS.values()},
    }
    for label, known in pack_values.items():
        named = set().union(*(matcher_values(m, label) for m in matchers))
        assert named, f"the example matches on no {label}"
        assert named <= known, f"{label} values the pack does not have: {named - known}"


# --- a real Alertmanager running it ----------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    node: str
    index: str

    @property
    def labels(self) -> dict[str, str]:
        return {"node": self.node, "gpu": self.index, "uuid": f"GPU-{self.node}-{self.index}"}


def per_gpu(rule: Rule) -> bool:
    """Whether the alert is about one GPU: its expression's first catalog family has a series
    per GPU (GpuCountDropped and the exporter's alerts read node-level families or `up`)."""
    for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule.expr_text):
        if word in BY_NAME:
            return BY_NAME[word].per_device
    return False


def alert(name: str, where: Gpu | str, **labels: str) -> dict[str, Any]:
    """An API v2 alert as the pack raises it: on a GPU (a Gpu) or on a node (its name)."""
    rule = PACK_ALERTS[name]
    place = where.labels if isinstance(where, Gpu) else {"node": where}
    return {
        "labels": {"alertname": name, **rule.labels, **place, **labels},
        "annotations": {"summary": f"{name} (test)"},
    }


def pod_of(namespace: str) -> dict[str, str]:
    return {"namespace": namespace, "pod": f"{namespace}-0", "container": "main"}


def names(category: str | tuple[str, ...], *, gpu_only: bool = True) -> list[str]:
    wanted = (category,) if isinstance(category, str) else category
    return [
        name
        for name, rule in PACK_ALERTS.items()
        if rule.labels["category"] in wanted and (per_gpu(rule) or not gpu_only)
    ]


@dataclass
class RunningExample:
    url: str
    hook: Recorder

    def post(self, *alerts: dict[str, Any]) -> None:
        response = httpx.post(f"{self.url}/api/v2/alerts", json=list(alerts), timeout=5)
        assert response.status_code == 200, response.text

    def delivered(self, node: str) -> set[tuple[str, str, str]]:
        """(receiver, alertname, gpu) of every firing alert of `node` the webhook received;
        the receiver as the URL path the test's copy gave it."""
        return {
            (request.path.strip("/"), a["labels"]["alertname"], a["labels"].get("gpu", ""))
            for request in list(self.hook.requests)
            for a in request.body["alerts"]
            if a["status"] == "firing" and a["labels"]["node"] == node
        }

    def wait_delivered(self, node: str, expected: set[tuple[str, str, str]]) -> None:
        wait_for(
            lambda: expected <= self.delivered(node),
            DELIVERY_TIMEOUT,
            f"the webhook to receive {sorted(expected - self.delivered(node))}",
        )

    def api_alerts(self, node: str) -> list[dict[str, Any]]:
        response = httpx.get(
            f"{self.url}/api/v2/alerts", params={"filter": f'node="{node}"'}, timeout=5
        )
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts


def routed_to_the_recorder(config: dict[str, Any], hook: Recorder) -> dict[str, Any]:
    """The test's copy: each receiver's webhooks post to the recorder under the receiver's
    name, and groups are sent a second after their first alert and after each change."""
    for receiver in config["receivers"]:
        for webhook in receiver["webhook_configs"]:
            webhook["url"] = f"{hook.url}/{receiver['name']}"

    def fast(route: dict[str, Any]) -> None:
        for timer in ("group_wait", "group_interval"):
            if timer in route:
                route[timer] = "1s"
        for child in route.get("routes", []):
            fast(child)

    fast(config["route"])
    return config


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningExample]:
    workdir = tmp_path_factory.mktemp("am-example")
    with Recorder() as hook:
        config = yaml.safe_dump(routed_to_the_recorder(_example(), hook))
        with alertmanager(workdir, hook.url, config=config) as url:
            yield RunningExample(url, hook)


def only_gpu(delivered: set[tuple[str, str, str]], gpu: Gpu) -> set[str]:
    return {name for _, name, index in delivered if index == gpu.index}


def test_gpu_lost_mutes_every_other_alert_of_its_gpu_only(running: RunningExample) -> None:
    node = "node-lost"
    lost, healthy = Gpu(node, "0"), Gpu(node, "1")
    gpu_alerts = [name for name, rule in PACK_ALERTS.items() if per_gpu(rule)]
    node_alerts = [name for name, rule in PACK_ALERTS.items() if not per_gpu(rule)]
    others = [name for name in gpu_alerts if name != "GpuLost"]
    # The healthy GPU gets every alert no other inhibit rule mutes on it (no XID, no slowdown).
    muted_elsewhere = {"GpuXidCritical", *names(PERFORMANCE)}
    control = [name for name in others if name not in muted_elsewhere]
    mig = {"gpu_instance": "1", "mig_uuid": "MIG-lost-1", "mig_profile": "1g.18gb"}
    running.post(
        alert("GpuLost", lost),
        *(alert(name, lost) for name in others),
        alert("GpuBusyButIdle", lost, **mig),
        *(alert(name, healthy) for name in control),
        *(alert(name, node) for name in node_alerts),
    )

    running.wait_delivered(
        node,
        {("gpu-oncall-pager", "GpuLost", lost.index)}
        | {(r, name, healthy.index) for r, name, _ in _receivers(control)}
        | {(r, name, "") for r, name, _ in _receivers(node_alerts)},
    )
    # Each of the lost GPU's other alerts went to Alertmanager (it lists them all) and is muted
    # by GpuLost there; those whose group (node, alertname) the healthy GPU's alert shares
    # were judged when that group was sent, and left out.
    assert only_gpu(running.delivered(node), lost) == {"GpuLost"}
    of_lost = [
        a for a in running.api_alerts(node) if a["labels"].get("uuid") == lost.labels["uuid"]
    ]
    source = next(a["fingerprint"] for a in of_lost if a["labels"]["alertname"] == "GpuLost")
    muted = [a for a in of_lost if a["fingerprint"] != source]
    assert len(muted) == len(others) + 1  # the MIG instance's alert too
    for listed in muted:
        assert source in listed["status"]["inhibitedBy"], listed["labels"]


def _receivers(alertnames: list[str]) -> set[tuple[str, str, str]]:
    """(receiver, alertname, "") for alerts without a pod: critical pages, the rest tickets."""
    return {
        (
            "gpu-oncall-pager"
            if PACK_ALERTS[name].labels["severity"] == "critical"
            else "gpu-platform-tickets",
            name,
            "",
        )
        for name in alertnames
    }


def slowdown_alerts() -> list[str]:
    """The source alerts of the inhibit rule whose target is GpuClocksLowWhileBusy."""

    def alertnames(matchers: list[str]) -> set[str]:
        return set().union(*(matcher_values(m, "alertname") for m in matchers))

    rules = [
        rule
        for rule in _example()["inhibit_rules"]
        if alertnames(rule["target_matchers"]) == {"GpuClocksLowWhileBusy"}
    ]
    assert len(rules) == 1, rules
    return sorted(alertnames(rules[0]["source_matchers"]))


def test_slowdown_alerts_are_the_pack_thermal_and_power_slowdowns() -> None:
    expected = {
        "GpuThermalSlowdown",
        "GpuSoftwareThermalSlowdown",
        "GpuPowerBrakeSlowdown",
        "GpuHardwareSlowdown",
    }
    assert set(slowdown_alerts()) == expected
    assert {PACK_ALERTS[name].labels["category"] for name in expected} == {"throttling"}


@pytest.mark.parametrize("slowdown", slowdown_alerts())
def test_a_slowdown_mutes_clocks_low_on_its_gpu_only(
    slowdown: str, running: RunningExample
) -> None:
    node = f"node-{slowdown.lower()}"
    slowed, other = Gpu(node, "0"), Gpu(node, "1")
    running.post(
        alert(slowdown, slowed),
        alert("GpuClocksLowWhileBusy", slowed),
        alert("GpuClocksLowWhileBusy", other),
    )
    running.wait_delivered(
        node,
        {
            ("gpu-platform-tickets", slowdown, slowed.index),
            ("gpu-platform-tickets", "GpuClocksLowWhileBusy", other.index),
        },
    )
    # GPU 1's GpuClocksLowWhileBusy went out in the group GPU 0's shares: GPU 0's was muted.
    assert only_gpu(running.delivered(node), slowed) == {slowdown}


def test_a_critical_xid_mutes_the_performance_alerts_of_its_gpu(running: RunningExample) -> None:
    node = "node-xid"
    failed, other = Gpu(node, "0"), Gpu(node, "1")
    performance = names(PERFORMANCE)
    assert "GpuBusyButIdle" in performance
    health = [name for name in names("health") if name != "GpuLost"]
    # The other GPU gets every performance alert no slowdown of its own would mute.
    control = [name for name in performance if name != "GpuClocksLowWhileBusy"]
    running.post(
        *(alert(name, failed) for name in (*performance, *health)),
        *(alert(name, other) for name in control),
    )
    running.wait_delivered(
        node,
        {(r, name, failed.index) for r, name, _ in _receivers(health)}
        | {(r, name, other.index) for r, name, _ in _receivers(control)},
    )
    # The XID GPU's health alerts went out, none of its performance alerts.
    assert only_gpu(running.delivered(node), failed) == set(health)
    assert "GpuBusyButIdle" in only_gpu(running.delivered(node), other)


def test_routing_by_severity_and_team(running: RunningExample) -> None:
    node = "node-routing"
    # A critical alert that mutes nothing, and a throttling one that mutes nothing.
    critical = next(
        name
        for name in names("health")
        if PACK_ALERTS[name].labels["severity"] == "critical"
        and name not in ("GpuLost", "GpuXidCritical")
    )
    efficiency = names("efficiency")
    throttling = next(n for n in names("throttling") if n not in slowdown_alerts())
    gpus = [Gpu(node, str(i)) for i in range(6)]
    running.post(
        alert(critical, gpus[0]),
        alert(critical, gpus[1], **pod_of(TEAM_NAMESPACE)),
        *(alert(name, gpus[2], **pod_of(TEAM_NAMESPACE)) for name in efficiency),
        *(alert(name, gpus[3], **pod_of(OTHER_NAMESPACE)) for name in efficiency),
        alert(throttling, gpus[4], **pod_of(TEAM_NAMESPACE)),
        *(alert(name, gpus[5]) for name in efficiency),
    )
    ticket = {
        "warning": "gpu-platform-tickets",
        "info": "gpu-platform-tickets",
        "critical": "gpu-oncall-pager",
    }
    expected = {
        ("gpu-oncall-pager", critical, "0"),
        # Critical pages even when a team's pod is on the GPU.
        ("gpu-oncall-pager", critical, "1"),
        # The team hears of its own workloads' efficiency, at every severity.
        *(("ml-team-chat", name, "2") for name in efficiency),
        # Another namespace's, and pod-less GPUs', go by severity.
        *((ticket[PACK_ALERTS[name].labels["severity"]], name, "3") for name in efficiency),
        *((ticket[PACK_ALERTS[name].labels["severity"]], name, "5") for name in efficiency),
        # Throttling is the hardware's: the platform's tickets, not the team's chat.
        ("gpu-platform-tickets", throttling, "4"),
    }
    running.wait_delivered(node, expected)
    assert running.delivered(node) == expected
    assert {PACK_ALERTS[name].labels["severity"] for name in efficiency} >= {"warning", "info"}
