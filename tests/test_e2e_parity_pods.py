"""End to end, with pods: the daemon's alerts and Prometheus' alerts carry the same labels.

A fake kubelet reports pods on most simulated GPUs (one GPU time-sliced between two pods,
with the `<uuid>::<n>` ids the NVIDIA device plugin uses; in `mig`, on MIG instances by every
id form), in `labels` and in `info` mode. The
daemon evaluates a rule file and sends to a real Alertmanager (`node` as an external label);
a real Prometheus scrapes the daemon with the documented relabeling (`node` added, job and
instance dropped), evaluates the same file and sends to the same Alertmanager. The file holds
the shipped pack (short `for`, 1 s group intervals), one `Parity_<family>` alert per per-GPU
family of the catalog, and the joins and aggregations of tests/e2e/parity.rules.yaml.

For every alert name, at some instant, the daemon's firing alerts (with `node`), Prometheus'
firing alerts and Alertmanager's alerts must be the same label sets, each held once by
Alertmanager; a `Parity_<family>` alert must also be raised for every series of the family in
the daemon's /metrics. Disagreements that last longer than GRACE fail the test even after an
agreement, with a diff of the label sets.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.sim.kubelet import FakeKubelet, pod
from tests.daemon import serve
from tests.servers import Recorder, alertmanager, am_alerts, prometheus

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "rules/gpu-exporter.rules.yaml"
HAND_WRITTEN = ROOT / "tests/e2e/parity.rules.yaml"
NODE = "parity-node"
SHORT_FOR = "2s"
GPU = "nvidia.com/gpu"
POD_LABELS = ("namespace", "pod", "container")

# The shipped alerts that fire in each scenario (with the short `for`); the test fails if one
# of them does not fire on both paths, or if another shipped alert fires, so the lists stay true.
SHIPPED_FIRING = {
    "mixed": {
        "GpuBusyButIdle",  # GPU 4 (link-bound GPU 7 gets GpuLinkBound instead)
        "GpuLinkBound",  # 7
        "GpuTensorCoresIdle",  # 1 (memory-bound GPU 3 gets GpuMemoryBandwidthBound alone)
        "GpuMemoryBandwidthBound",  # 3
        "GpuThermalSlowdown",  # 5, from about 20 s (its low clocks are not a second alert)
        "GpuPowerBrakeSlowdown",  # 6
        # 5 for a moment at the start: with this file's short `for`, HW slowdown fires before
        # the thermal counter has the rate that hands the event to GpuThermalSlowdown (the
        # shipped 5m `for` outlasts that by far).
        "GpuHardwareSlowdown",
    },
    # GpuXidCritical on 1 and 2; GpuActivityMetricsUnavailable on 3 (no GPM) and on 1 while it
    # is lost; GpuLost on 1 from about 17 s to 30 s; GpuRowRemapPending on 2 from its XID 48
    # (10 s) until its GPU reset at 2410 s.
    # GpuAllocatedButIdle: the scenario's idle GPU 0 is held by a pod.
    "faults": {
        "GpuActivityMetricsUnavailable",
        "GpuAllocatedButIdle",
        "GpuLost",
        "GpuRowRemapPending",
        "GpuXidCritical",
    },
    # GpuBusyButIdle on GPU 0's launch-bound GI 9 only; GpuActivityMetricsUnavailable on the
    # A100's instances that hold memory (no GPM: no activity).
    "mig": {"GpuActivityMetricsUnavailable", "GpuBusyButIdle"},
    # The A100s' activity from the simulated DCGM host engine: GpuBusyButIdle on launch-bound
    # GPU 2, GpuMemoryBandwidthBound on GPU 3, exactly as on Hopper with GPM; GpuAllocatedButIdle
    # on its idle GPU, which a pod holds.
    "pre-hopper-dcgm": {"GpuAllocatedButIdle", "GpuBusyButIdle", "GpuMemoryBandwidthBound"},
}
# Alerts whose two copies differ by design, with the labels only the daemon's copy has: an
# aggregation that drops `node` sums over every node in Prometheus, while the daemon's sum is
# its own node's, labelled with `node` when sent. Alertmanager must hold both copies.
SPLIT_BY_DESIGN = {"SplitSum_by_namespace": ("node",)}
# Each run covers the whole scenario (mixed: GpuThermalSlowdown from about 20 s; faults: GPU 1
# lost from 15 s to 25 s, then re-initialised), and ends by DEADLINE at the latest.
MIN_RUN = {"mixed": 26.0, "faults": 34.0, "mig": 26.0, "pre-hopper-dcgm": 20.0}
DEADLINE = {"mixed": 45.0, "faults": 55.0, "mig": 50.0, "pre-hopper-dcgm": 40.0}
# How long the paths may disagree about an alert before that counts: their scrape, sampling
# and evaluation phases differ by a second or two when an alert starts or ends.
GRACE = 10.0
POLL = 0.5

LabelSet = frozenset[tuple[str, str]]


# --- the rule file ---------------------------------------------------------------------------


# Families present for a single tick at a time (gpu_activity_awaited: the tick that takes a
# GPM window's first sample, at start or after a re-init): whether a scrape sees one is a matter
# of phase, not of labels, so they get no Parity_ alert. Their labels are the device's, which
# every other per-GPU family compares.
ONE_TICK_FAMILIES = frozenset({"gpu_activity_awaited"})


def per_gpu_families() -> list[str]:
    from gpu_exporter.model.catalog import FAMILIES

    return [f.name for f in FAMILIES if f.per_device and f.name not in ONE_TICK_FAMILIES]


def alert_names(path: Path) -> set[str]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def rule_file(tmp_path: Path) -> Path:
    """The shipped pack with short `for` and 1 s intervals, the catalog's per-GPU families and
    the hand-written parity rules, as one file for the daemon and for Prometheus."""
    shipped = yaml.safe_load(SHIPPED.read_text())
    for group in shipped["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = SHORT_FOR
    families = {
        "name": "parity-families",
        "interval": "1s",
        "rules": [
            {"alert": f"Parity_{name}", "expr": f"{name} >= 0", "labels": {"parity": "family"}}
            for name in per_gpu_families()
        ],
    }
    hand_written = yaml.safe_load(HAND_WRITTEN.read_text())["groups"]
    path = tmp_path / "parity.rules.yaml"
    path.write_text(
        yaml.safe_dump({"groups": [*shipped["groups"], families, *hand_written]}, sort_keys=False)
    )
    return path


# --- pods --------------------------------------------------------------------------------------


_UUIDS: dict[str, list[str]] = {}


def scenario_uuids(scenario: str, tmp_path: Path) -> list[str]:
    """The scenario's GPU UUIDs, from a short-lived daemon, so that the kubelet reports the
    pods before the daemon under test starts: none of its series should lack them."""
    if scenario not in _UUIDS:
        tmp_path.mkdir(parents=True, exist_ok=True)
        with serve(tmp_path, "--simulate", scenario) as probe:
            probe.wait_ready()
            devices = probe.get("/api/v1/devices").json()["data"]["devices"]
        _UUIDS[scenario] = [d["uuid"] for d in sorted(devices, key=lambda d: d["index"])]
    return _UUIDS[scenario]


def pods_for(uuids: list[str]) -> list:
    """GPU 0 (and the last of eight) stay free; GPU 1 is time-sliced between two pods of two
    namespaces; one pod holds two GPUs in one container, another one GPU per container."""
    pods = [
        pod("research", "notebook-a", {"jupyter": [(GPU, [f"{uuids[1]}::1"])]}),
        pod("ml", "notebook-b", {"lab": [(GPU, [f"{uuids[1]}::3"])]}),
        pod("ml", "trainer-0", {"main": [(GPU, uuids[2:4])]}),
    ]
    if len(uuids) > 6:
        pods.append(pod("web", "infer-1", {"server": [(GPU, [uuids[4]])]}))
        workers = {"worker-a": [(GPU, [uuids[5]])], "worker-b": [(GPU, [uuids[6]])]}
        pods.append(pod("ml", "trainer-1", workers))
    return pods


def mig_pods() -> list:
    """Pods on MIG instances, by every id form the kubelet may carry: the launch-bound GI 9
    time-sliced between two pods (`MIG-<uuid>::<n>`), another instance by its MIG UUID, the 3g
    through the single strategy with a pre-R470 id, the A100's split GPU instance with one
    compute instance per container, and the MIG-off GPU whole."""
    from gpu_exporter.sim.scenario import load_scenario

    seven, mixed, whole, a100 = load_scenario("mig").devices

    def uuids(device: Any, gpu_instance: int) -> tuple[str, ...]:
        assert device.mig is not None
        return next(i for i in device.mig.instances if i.gpu_instance == gpu_instance).mig_uuids

    small, split = "nvidia.com/mig-1g.18gb", "nvidia.com/mig-1c.3g.40gb"
    (launch,) = uuids(seven, 9)
    ci0, ci1, _ = uuids(a100, 1)
    return [
        pod("infer", "spin-a", {"server": [(small, [f"{launch}::1"])]}),
        pod("infer", "spin-b", {"server": [(small, [f"{launch}::2"])]}),
        pod("infer", "serve-7", {"server": [(small, list(uuids(seven, 7)))]}),
        pod("train", "big", {"main": [(GPU, [f"MIG-{mixed.uuid}/1/0"])]}),
        pod("batch", "split", {"w0": [(split, [ci0])], "w1": [(split, [ci1])]}),
        pod("whole", "job", {"main": [(GPU, [whole.uuid])]}),
    ]


def kubernetes_config(tmp_path: Path, kubelet: FakeKubelet, mode: str) -> Path:
    path = tmp_path / f"k8s-{mode}.yaml"
    path.write_text(
        "kubernetes:\n"
        "  enabled: true\n"
        f"  socket_path: {kubelet.socket_path}\n"
        "  refresh_seconds: 1\n"
        f"  mode: {mode}\n"
    )
    return path


# --- the views ---------------------------------------------------------------------------------


def firing(url: str, add_node: bool) -> set[LabelSet]:
    """Firing alerts of a daemon or a Prometheus (`/api/v1/alerts`); the daemon's with `node`,
    which it adds as an external label when sending (only where the alert has none)."""
    alerts = httpx.get(f"{url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    out = set()
    for alert in alerts:
        if alert["state"] != "firing":
            continue
        labels = dict(alert["labels"])
        if add_node:
            labels.setdefault("node", NODE)
        out.add(frozenset(labels.items()))
    return out


def held(am_url: str) -> list[LabelSet]:
    """Alertmanager's alerts (a list: the same label set twice would be a bug of its own)."""
    return [frozenset(a["labels"].items()) for a in am_alerts(am_url)]


def family_alerts(metrics: str) -> dict[str, list[LabelSet]]:
    """Per `Parity_<family>`, the alerts Prometheus should raise from this exposition: one per
    non-NaN series, with its labels as scraped (empty ones are absent) and `node`."""
    wanted = set(per_gpu_families())
    out: dict[str, list[LabelSet]] = defaultdict(list)
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name not in wanted or math.isnan(sample.value):
                continue
            labels = {k: v for k, v in sample.labels.items() if v != ""}
            labels |= {"node": NODE, "parity": "family", "alertname": f"Parity_{sample.name}"}
            out[labels["alertname"]].append(frozenset(labels.items()))
    return out


def by_name(alerts: Iterable[LabelSet]) -> dict[str, list[LabelSet]]:
    out: dict[str, list[LabelSet]] = defaultdict(list)
    for alert in alerts:
        out[dict(alert)["alertname"]].append(alert)
    return out


def show(labels: Iterable[tuple[str, str]]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels) if k != "alertname") + "}"


@dataclass
class Poll:
    """One alert name at one instant, as each view has it."""

    at: float
    daemon: list[LabelSet]
    prometheus: list[LabelSet]
    alertmanager: list[LabelSet]
    series: list[LabelSet] | None = None  # Parity_<family>: one alert per series in /metrics
    daemon_only: tuple[str, ...] = ()  # SPLIT_BY_DESIGN

    def both(self) -> bool:
        return bool(self.daemon and self.prometheus)

    def agrees(self) -> bool:
        if not self.both() or len(self.alertmanager) != len(set(self.alertmanager)):
            return False
        daemon, prom, am = set(self.daemon), set(self.prometheus), set(self.alertmanager)
        if self.series is not None and set(self.series) != prom:
            return False
        if self.daemon_only:
            drop = self.daemon_only
            stripped = {frozenset((k, v) for k, v in a if k not in drop) for a in daemon}
            return stripped == prom and not daemon & prom and am == daemon | prom
        return daemon == prom == am


def explain(name: str, poll: Poll) -> str:
    """Which alert, which labels only on one side."""
    daemon, prom, am = set(poll.daemon), set(poll.prometheus), poll.alertmanager
    lines = [
        f"{name} (t={poll.at:.1f}s): daemon {len(daemon)}, Prometheus {len(prom)}, "
        f"Alertmanager {len(am)} alerts"
    ]
    if poll.daemon_only:
        lines.append(f"  expected: the daemon's copy has {poll.daemon_only} besides Prometheus'")
    only_daemon, only_prom = sorted(daemon - prom, key=show), sorted(prom - daemon, key=show)
    unmatched = list(only_prom)
    for mine in only_daemon:
        # Pair it with Prometheus' alert sharing the most labels (the same GPU, usually).
        twin = max(unmatched, key=lambda other: len(mine & other), default=None)
        if twin is not None and len(mine & twin) > 1:
            unmatched.remove(twin)
            both_held = " (Alertmanager holds both)" if {mine, twin} <= set(am) else ""
            lines.append(
                f"  {show(mine & twin)}: labels only on the daemon's alert {show(mine - twin)}, "
                f"only on Prometheus' {show(twin - mine)}{both_held}"
            )
        else:
            lines.append(f"  only the daemon fires {show(mine)}{unattributed(mine, daemon & prom)}")
    lines += [f"  only Prometheus fires {show(theirs)}" for theirs in unmatched]
    for alert in sorted(set(am) - daemon - prom, key=show):
        lines.append(f"  only Alertmanager holds {show(alert)}")
    for alert in sorted((daemon | prom) - set(am), key=show):
        lines.append(f"  Alertmanager lacks {show(alert)}")
    for alert in sorted({a for a in am if am.count(a) > 1}, key=show):
        lines.append(f"  Alertmanager holds {am.count(alert)} alerts {show(alert)}")
    if poll.series is not None:
        for alert in sorted(set(poll.series) - prom, key=show):
            lines.append(f"  no alert in Prometheus for the series {show(alert)} of /metrics")
        for alert in sorted(prom - set(poll.series), key=show):
            lines.append(f"  Prometheus' alert {show(alert)} is no series of /metrics")
    return "\n".join(lines)


def unattributed(alert: LabelSet, agreed: set[LabelSet]) -> str:
    """A hint when `alert` is an agreed alert less its pod labels: the daemon's history holds
    a sample of that GPU taken without attribution (e.g. a tick before the kubelet answered),
    which range functions keep selecting for their whole range."""
    for other in agreed:
        extra = {k for k, _ in other - alert}
        if alert < other and extra <= set(POD_LABELS):
            return f" (= {show(other)} without its pod labels: an unattributed sample?)"
    return ""


def keep_most_telling(polls: dict[str, Poll], name: str, poll: Poll) -> None:
    """The latest poll at which both paths fired `name`, else the latest: while an alert
    starts or ends, one path having it and the other not says little about its labels."""
    kept = polls.get(name)
    if poll.both() or kept is None or not kept.both():
        polls[name] = poll


@dataclass
class Tracker:
    """Per alert name: whether the views ever agreed on it, since when they disagree, and the
    disagreements that outlasted GRACE (with the most telling poll of each)."""

    started: float
    seen: set[str] = field(default_factory=set)
    agreed: set[str] = field(default_factory=set)
    disagreeing_since: dict[str, float] = field(default_factory=dict)
    last_disagreement: dict[str, Poll] = field(default_factory=dict)
    failed: dict[str, Poll] = field(default_factory=dict)

    def observe(
        self,
        daemon: set[LabelSet],
        prom: set[LabelSet],
        am: list[LabelSet],
        series: dict[str, list[LabelSet]],
    ) -> None:
        now = time.monotonic() - self.started
        d, p, a = by_name(daemon), by_name(prom), by_name(am)
        names = set(d) | set(p) | set(a)
        self.seen |= names
        for name in names | set(self.disagreeing_since):
            poll = Poll(
                now,
                d.get(name, []),
                p.get(name, []),
                a.get(name, []),
                series.get(name, []) if name.startswith("Parity_") else None,
                SPLIT_BY_DESIGN.get(name, ()),
            )
            if poll.agrees():
                self.agreed.add(name)
            elif name in names:
                keep_most_telling(self.last_disagreement, name, poll)
                since = self.disagreeing_since.setdefault(name, now)
                if now - since > GRACE:
                    keep_most_telling(self.failed, name, poll)
                continue
            self.disagreeing_since.pop(name, None)  # agreed, or gone from every view

    def settled(self, expected: set[str]) -> bool:
        """Nothing is still within its grace period, and every alert either agreed or failed."""
        pending = set(self.disagreeing_since) - set(self.failed)
        return not pending and not (expected | self.seen) - self.agreed - set(self.failed)

    def problems(self, expected: set[str], scenario: str) -> list[str]:
        out = [explain(name, poll) for name, poll in sorted(self.failed.items())]
        for name in sorted((expected | self.seen) - self.agreed - set(self.failed)):
            if name in self.last_disagreement:
                out.append(explain(name, self.last_disagreement[name]) + "\n  (never agreed)")
            else:
                out.append(f"{name}: never fired (expected in {scenario})")
        unexpected = (self.seen & alert_names(SHIPPED)) - SHIPPED_FIRING[scenario]
        if unexpected:
            out.append(
                f"shipped alerts fired that SHIPPED_FIRING[{scenario!r}] does not list: "
                f"{sorted(unexpected)}"
            )
        return out


# --- the test ----------------------------------------------------------------------------------


# Every scenario in labels mode (the default); info mode where its path differs. In info mode
# no series but gpu_pod_info carries pod labels and the rules join it: `faults` covers that join
# for whole GPUs (time-sliced, lost and XID GPUs: the pods of `mixed`, the same join), `mig` for
# MIG instances. info-mixed and info-pre-hopper-dcgm would run that same join over the same
# families; what sets them apart (the classes' alerts, DCGM as the activity source) their labels
# variants cover.
VARIANTS = [
    ("labels", "mixed"),
    ("labels", "faults"),
    ("labels", "mig"),
    ("labels", "pre-hopper-dcgm"),
    ("info", "faults"),
    ("info", "mig"),
]


@pytest.mark.parametrize(("mode", "scenario"), VARIANTS, ids=[f"{m}-{s}" for m, s in VARIANTS])
def test_daemon_and_prometheus_alerts_have_the_same_labels_with_pods(
    tmp_path: Path, mode: str, scenario: str
) -> None:
    rules = rule_file(tmp_path)
    kubelet = FakeKubelet()
    if scenario == "mig":
        kubelet.set_pods(mig_pods())
    else:
        kubelet.set_pods(pods_for(scenario_uuids(scenario, tmp_path / "probe")))
    kubelet.start()
    try:
        with (
            Recorder() as hook,
            alertmanager(tmp_path / "am", f"{hook.url}/hook") as am_url,
            serve(
                tmp_path, "--simulate", scenario, "--interval", "0.5",
                "--config", str(kubernetes_config(tmp_path, kubelet, mode)),
                "--rules", str(rules),
                "--alertmanager-url", am_url, "--external-label", f"node={NODE}",
            ) as daemon,
        ):  # fmt: skip
            daemon.wait_ready()
            with prometheus(
                tmp_path / "prom", f"127.0.0.1:{daemon.port}", rules, am_url, NODE
            ) as prom_url:
                started = time.monotonic()
                tracker = Tracker(started)
                expected = SHIPPED_FIRING[scenario] | alert_names(HAND_WRITTEN)
                while True:
                    now = time.monotonic() - started
                    series = family_alerts(daemon.metrics_text())
                    # Every per-GPU family served must fire its Parity_ alert on both paths.
                    expected |= set(series)
                    tracker.observe(
                        firing(daemon.url, add_node=True),
                        firing(prom_url, add_node=False),
                        held(am_url),
                        series,
                    )
                    if now >= MIN_RUN[scenario] and tracker.settled(expected):
                        break
                    if now > DEADLINE[scenario]:
                        break
                    time.sleep(POLL)
                elapsed = time.monotonic() - started
    finally:
        kubelet.close()

    problems = tracker.problems(expected, scenario)
    header = (
        f"{mode} mode, {scenario}: {len(problems)} problem(s) after {elapsed:.0f}s; "
        f"agreed on {len(tracker.agreed)} alerts: {' '.join(sorted(tracker.agreed))}\n"
    )
    assert not problems, header + "\n".join(problems)
