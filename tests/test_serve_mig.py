"""`gpu-exporter serve --simulate mig`: the MIG node as Prometheus scrapes it.

The reconfiguration of the built-in scenario (at 90 s) is moved to 8 s here, so that the test
sees the old layout, then the new one, from the real daemon. Faults added to it show what a
scrape sees while a MIG GPU's identity call hangs and once a MIG GPU is lost.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.sim.scenario import load_scenario
from tests.daemon import serve
from tests.support import promtool_check_metrics, wait_for

SCENARIO = Path(__file__).resolve().parent.parent / "gpu_exporter/sim/scenarios/mig.yaml"
RECONFIGURED_AT = 8  # scenario seconds: after the first scrapes below

# Every family: these tests read families the default metrics profile leaves out.
FULL = ("--metrics-profile", "full")


def fast_reconfiguration(tmp_path: Path) -> Path:
    data = yaml.safe_load(SCENARIO.read_text())
    for instance in data["devices"][1]["mig"]["instances"]:
        for key in ("from", "until"):
            if key in instance:
                instance[key] = RECONFIGURED_AT
    path = tmp_path / "mig-fast.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def series(text: str, family: str) -> list[dict[str, str]]:
    """Label sets of `family`'s samples in a text exposition (parsed as Prometheus does: a label
    value may hold commas, as `holders` does)."""
    return [
        dict(sample.labels)
        for metrics in text_string_to_metric_families(text)
        for sample in metrics.samples
        if sample.name == family
    ]


def test_mig_node_serves_valid_metrics_and_follows_the_reconfiguration(tmp_path: Path) -> None:
    path = fast_reconfiguration(tmp_path)
    spec = load_scenario(path)
    mixed = spec.devices[1].mig
    assert mixed is not None
    old_2g, new_gi5 = mixed.instances[1].mig_uuids[0], mixed.instances[4].mig_uuids[0]
    with serve(tmp_path, "--simulate", str(path), "--interval", "0.5", *FULL) as daemon:
        daemon.wait_ready()

        def with_activity() -> str | None:
            now = daemon.metrics_text()
            return now if "gpu_sm_active_ratio{" in now else None

        text = wait_for(with_activity, 10)
        assert text, daemon.output()
        checked = promtool_check_metrics(text.encode())
        assert checked.returncode == 0, checked.stdout + checked.stderr
        # The layout before the reconfiguration (the test needs to see both).
        first = {s["mig_uuid"] for s in series(text, "gpu_mig_instance_info")}
        assert old_2g in first and new_gi5 not in first, "started after the reconfiguration"
        # Parent power once per parent, without instance labels.
        power = series(text, "gpu_power_watts")
        assert sorted(p["gpu"] for p in power) == ["0", "1", "2", "3"]
        assert not [p for p in power if "mig_uuid" in p]
        # Each instance its own series, with its identity.
        sm = series(text, "gpu_sm_active_ratio")
        gpu0 = sorted(int(s["gpu_instance"]) for s in sm if s["gpu"] == "0")
        assert gpu0 == list(range(7, 14))
        assert all(
            s["mig_profile"] == "1g.18gb" and s["mig_uuid"].startswith("MIG-")
            for s in sm
            if s["gpu"] == "0"
        )
        assert {s.get("mig_uuid") for s in sm if s["gpu"] == "2"} == {None}  # MIG off
        assert not [s for s in sm if s["gpu"] == "3"]  # A100: no GPM, activity absent
        shared = [s for s in series(text, "gpu_mig_instance_info") if s["gpu"] == "3"]
        assert sorted(s.get("compute_instance", "-") for s in shared) == ["-", "-", "0", "1", "2"]
        # The scenario's pods, from the fake kubelet serve runs for them: on their instances;
        # the two sharing one are both named on its series (neither alone).
        launch = next(s for s in sm if s.get("gpu_instance") == "9" and s["gpu"] == "0")
        assert "pod" not in launch
        assert [h.split("/")[:2] for h in launch["holders"].split(",")] == [
            ["infer", "chat-small-0"],
            ["infer", "chat-small-1"],
        ]
        held = {(p.get("gpu_instance"), p["pod"]) for p in series(text, "gpu_pod_info")}
        assert {("9", "chat-small-0"), ("9", "chat-small-1"), (None, "pretrain-0")} <= held
        assert not [s for s in power if "pod" in s and s["gpu"] != "2"]  # MIG parents: none
        mode = {(m["gpu"], m["state"]) for m in series(text, "gpu_mig_mode")}
        assert ("2", "current") in mode and len(mode) == 8

        # After the reconfiguration: the 2g is gone, GI 5 is a new 1g with a new MIG UUID.
        def reconfigured() -> str | None:
            now = daemon.metrics_text()
            uuids = {s["mig_uuid"] for s in series(now, "gpu_mig_instance_info")}
            return now if new_gi5 in uuids and old_2g not in uuids else None

        after = wait_for(reconfigured, 15)
        assert after, daemon.output()
        gi5 = [s for s in series(after, "gpu_mig_instance_info") if s["mig_uuid"] == new_gi5]
        assert gi5 and gi5[0]["gpu_instance"] == "5" and gi5[0]["mig_profile"] == "1g.18gb"
        assert not [s for s in series(after, "gpu_sm_active_ratio") if s.get("mig_uuid") == old_2g]


HANG_AT, HANG_SECONDS, LOST_AT = 10, 4, 16  # scenario seconds: GPU 0's UUID read, GPU 1 lost


def with_faults(tmp_path: Path) -> Path:
    """The built-in scenario, with GPU 0's nvmlDeviceGetUUID (read for its MIG devices every
    tick) hanging for HANG_SECONDS, then GPU 1 lost for good."""
    data = yaml.safe_load(SCENARIO.read_text())
    hang = {"kind": "hang", "function": "nvmlDeviceGetUUID", "duration": HANG_SECONDS}
    data["faults"] = [
        {"at": HANG_AT, "device": 0, **hang},
        {"at": LOST_AT, "device": 1, "kind": "gpu_lost"},
    ]
    path = tmp_path / "mig-faults.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def instance_up(text: str, gpu: str) -> dict[str, tuple[float, str]]:
    """GPU `gpu`'s gpu_mig_instance_up by GPU-instance id: (value, the pods it names)."""
    return {
        s.labels["gpu_instance"]: (s.value, s.labels.get("pod") or s.labels.get("holders", ""))
        for metrics in text_string_to_metric_families(text)
        for s in metrics.samples
        if s.name == "gpu_mig_instance_up" and s.labels["gpu"] == gpu
    }


def test_mig_instances_stay_listed_and_say_so_through_a_hang_and_a_lost_gpu(
    tmp_path: Path,
) -> None:
    with serve(
        tmp_path, "--simulate", str(with_faults(tmp_path)), "--interval", "0.5", *FULL
    ) as daemon:
        daemon.wait_ready()
        before = instance_up(daemon.metrics_text(), "0")
        assert sorted(before, key=int) == [str(gi) for gi in range(7, 14)], "started after the hang"
        assert {value for value, _ in before.values()} == {1.0}
        assert before["9"][1] == "infer/chat-small-0/server,infer/chat-small-1/server"

        # The hang: the GPU answers, its instances are listed down with their pods, the health
        # verdict and /readyz say why.
        def hung() -> tuple[str, str] | None:
            text = daemon.metrics_text()
            now = instance_up(text, "0")
            if not now or {value for value, _ in now.values()} != {0.0}:
                return None
            if _up_by_gpu(text).get("0") != 1.0:
                return None  # the tick that hung: the GPU itself is down
            ready = daemon.get("/readyz")  # the next tick may have answered already
            return (text, ready.text) if "GPU 0 MIG" in ready.text else None

        text, ready = wait_for(hung, HANG_AT + 10, "GPU 0's instances listed down")
        assert instance_up(text, "0") == {gi: (0.0, pods) for gi, (_, pods) in before.items()}
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for metrics in text_string_to_metric_families(text)
            for s in metrics.samples
        }
        gpu0 = ("gpu", "0")
        unknown = [
            v
            for (name, labels), v in samples.items()
            if name == "gpu_health_action_info"
            and gpu0 in labels
            and ("reason", "mig_instances_unknown") in labels
        ]
        assert unknown == [1.0], "the health verdict names the unknown instances"
        assert not [
            name
            for (name, labels), _ in samples.items()
            if gpu0 in labels
            and any(k == "mig_uuid" for k, _ in labels)
            and name not in ("gpu_mig_instance_up", "gpu_pod_info")
        ], "an unknown instance's quantities are absent"
        assert ready.startswith("ok\n"), ready
        assert "degraded: GPU 0 MIG instances unknown: NVML call mig_uuid hung" in ready, ready

        # The call answers: the instances are read again.
        def answered() -> str | None:
            text = daemon.metrics_text()
            now = instance_up(text, "0")
            return text if now and {value for value, _ in now.values()} == {1.0} else None

        wait_for(answered, HANG_SECONDS + 10, "GPU 0's instances read again")
        assert "GPU 0" not in daemon.get("/readyz").text

        # GPU 1 lost: gpu_up 0, and its instances keep naming the pods that lost them.
        def lost() -> dict[str, tuple[float, str]] | None:
            text = daemon.metrics_text()
            return instance_up(text, "1") if _up_by_gpu(text).get("1") == 0.0 else None

        gone = wait_for(lost, LOST_AT + 15, "GPU 1 lost")
        assert gone["1"] == (0.0, "finetune-0"), gone
        assert {value for value, _ in gone.values()} == {0.0} and len(gone) == 4
        ready = daemon.get("/readyz")
        assert ready.status_code == 200 and "degraded: GPU 1 down: " in ready.text, ready.text


def _up_by_gpu(text: str) -> dict[str, float]:
    return {
        s.labels["gpu"]: s.value
        for metrics in text_string_to_metric_families(text)
        for s in metrics.samples
        if s.name == "gpu_up"
    }
