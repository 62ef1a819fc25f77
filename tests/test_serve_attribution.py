"""The daemon with a fake kubelet: pod labels on allocated GPUs' series, none on free ones,
labels gone when the pod is, and every metric still served without a kubelet."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from gpu_exporter.sim.kubelet import FakeKubelet, pod
from tests.daemon import parse_samples, serve
from tests.support import promtool_check_metrics, wait_for


def uuids(daemon) -> list[str]:
    devices = httpx.get(f"{daemon.url}/api/v1/devices", timeout=5).json()["data"]["devices"]
    return [d["uuid"] for d in devices]


def config(tmp_path: Path, kubelet: FakeKubelet | None, mode: str = "labels") -> Path:
    socket_path = kubelet.socket_path if kubelet else "/nonexistent/kubelet.sock"
    path = tmp_path / f"k8s-{mode}.yaml"
    path.write_text(
        "kubernetes:\n"
        "  enabled: true\n"
        f"  socket_path: {socket_path}\n"
        "  refresh_seconds: 1\n"
        f"  mode: {mode}\n"
    )
    return path


def text_with(daemon, needle: str) -> str:
    """The exposition once it contains `needle`."""

    def check() -> str | None:
        text = daemon.metrics_text()
        return text if needle in text else None

    return wait_for(check, 15, f"{needle!r} in /metrics")


def test_pod_labels_follow_the_kubelet(tmp_path: Path) -> None:
    kubelet = FakeKubelet().start()
    try:
        with serve(
            tmp_path, "--simulate", "mixed", "--interval", "0.5", "--config",
            str(config(tmp_path, kubelet)),
        ) as daemon:  # fmt: skip
            daemon.wait_ready()
            gpu = uuids(daemon)
            kubelet.set_pods(
                [
                    pod("ml", "trainer-0", {"main": [("nvidia.com/gpu", [gpu[4], gpu[5]])]}),
                    pod("web", "infer-1", {"srv": [("nvidia.com/gpu", [gpu[1]])]}),
                ]
            )
            labelled = 'gpu_sm_active_ratio{container="main",gpu="4",namespace="ml",pod="trainer-0"'
            text = text_with(daemon, labelled)
            assert promtool_check_metrics(text.encode()).returncode == 0
            assert 'gpu_power_watts{container="srv",gpu="1",namespace="web",pod="infer-1"' in text
            # Free GPUs carry no pod labels at all.
            assert 'gpu_power_watts{gpu="0",uuid=' in text
            # gpu_up and gpu_info carry the pod too, as every per-GPU family does.
            assert 'gpu_up{container="srv",gpu="1",namespace="web",pod="infer-1"' in text
            assert 'gpu_info{architecture="hopper"' in text and 'pod="infer-1",uuid=' in text
            samples = parse_samples(text)
            info = [k for k in samples if k.startswith("gpu_pod_info{")]
            assert len(info) == 3  # trainer-0 holds two GPUs, infer-1 one
            # The pod finishes: its labels disappear at the next refresh.
            kubelet.set_pods([pod("web", "infer-1", {"srv": [("nvidia.com/gpu", [gpu[1]])]})])
            wait_for(
                lambda: 'pod="trainer-0"' not in daemon.metrics_text(), 15, "the pod's labels to go"
            )
            assert "gpu_attribution_up" not in daemon.metrics_text()
            assert "gpu_exporter_attribution_up 1.0" in daemon.metrics_text()
    finally:
        kubelet.close()


def test_info_mode_only_adds_the_join_metric(tmp_path: Path) -> None:
    kubelet = FakeKubelet().start()
    try:
        with serve(
            tmp_path, "--simulate", "mixed", "--interval", "0.5", "--config",
            str(config(tmp_path, kubelet, mode="info")),
        ) as daemon:  # fmt: skip
            daemon.wait_ready()
            gpu = uuids(daemon)
            kubelet.set_pods([pod("ml", "trainer-0", {"main": [("nvidia.com/gpu", [gpu[2]])]})])
            text = text_with(daemon, "gpu_pod_info{")
            assert 'gpu_pod_info{container="main",gpu="2",namespace="ml",pod="trainer-0"' in text
            assert 'namespace="ml"' not in text.split("gpu_pod_info")[0]  # no labels elsewhere
    finally:
        kubelet.close()


def test_without_a_kubelet_every_metric_is_still_served(tmp_path: Path) -> None:
    with serve(
        tmp_path, "--simulate", "mixed", "--interval", "0.5", "--config",
        str(config(tmp_path, None)), "--metrics-profile", "full",
    ) as daemon:  # fmt: skip
        daemon.wait_ready()
        text = text_with(daemon, "gpu_sm_active_ratio{")
        assert "gpu_exporter_attribution_up 0.0" in text
        assert 'gpu_exporter_attribution_refreshes_total{result="error"}' in text
        assert "pod=" not in text
        assert sum(1 for line in text.splitlines() if line.startswith("gpu_up{")) == 8


def test_a_short_kubelet_outage_keeps_the_pod_labels_a_long_one_drops_them(
    tmp_path: Path,
) -> None:
    """refresh_seconds 1: labels are kept until 3 s after the last success, then removed."""
    kubelet = FakeKubelet().start()
    try:
        with serve(
            tmp_path, "--simulate", "mixed", "--interval", "0.5", "--config",
            str(config(tmp_path, kubelet)),
        ) as daemon:  # fmt: skip
            daemon.wait_ready()
            gpu = uuids(daemon)
            kubelet.set_pods([pod("ml", "trainer-0", {"main": [("nvidia.com/gpu", [gpu[4]])]})])
            labelled = 'gpu_power_watts{container="main",gpu="4",namespace="ml",pod="trainer-0"'
            text_with(daemon, labelled)

            kubelet.stop()  # a kubelet restart: the socket is gone for a while
            seen: list[str] = []

            def failed_refresh() -> bool:
                seen.append(daemon.metrics_text())
                return "gpu_exporter_attribution_up 0.0" in seen[-1]

            wait_for(failed_refresh, 15, "a failed refresh", interval=0.1)
            # Scrapes over the next ticks too (the failure is at most 2 s past the last success,
            # the labels would go at 3 s): every one kept the labels, the series did not end.
            keep_until = time.monotonic() + 0.8
            while time.monotonic() < keep_until:
                seen.append(daemon.metrics_text())
                time.sleep(0.1)
            assert all(labelled in text for text in seen)
            assert f'gpu_power_watts{{gpu="4",uuid="{gpu[4]}"}}' not in seen[-1]

            kubelet.start()
            text = text_with(daemon, "gpu_exporter_attribution_up 1.0")
            assert labelled in text

            kubelet.stop()  # now for longer than the grace
            wait_for(lambda: 'pod="trainer-0"' not in daemon.metrics_text(), 15, "labels to go")
            text = daemon.metrics_text()
            assert f'gpu_power_watts{{gpu="4",uuid="{gpu[4]}"}}' in text
            assert "gpu_exporter_attribution_up 0.0" in text
    finally:
        kubelet.close()
