"""`gpu-exporter serve --dcgm-compat`: /metrics/dcgm scraped by a real Prometheus, NVIDIA's
dashboard queries answered from it, its drop-in port, and the native endpoint untouched.

NVIDIA's dashboard (dcgm-exporter's grafana/dcgm-exporter-dashboard.json, grafana.com 12239)
queries, verbatim with its variables expanded to match everything: the GPU temperature, its
average, the power and its sum, the SM clock times 1e6, the utilization, the framebuffer used,
the tensor activity, and the `label_values(DCGM_FI_DEV_GPU_TEMP, gpu)` variable.
"""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpu_exporter import sim
from gpu_exporter.sim.kubelet import FakeKubelet, pod
from tests.daemon import command, free_port, parse_samples, serve
from tests.servers import prometheus_with_config
from tests.support import promtool_check_metrics, wait_for
from tests.tlsfiles import PASSWORD, USER, password_hash

ALL = '{instance=~".*", gpu=~".*"}'
# promtool 2.42 lints DCGM-style names (no `_total`, camelCase labels, `_NS`) with exit 3; a
# parse error is exit 1 with "error while linting". Only these messages are accepted.
_LINT = re.compile(
    r'^\S+ (counter metrics should have "_total" suffix'
    r"|label names should be written in 'snake_case' not 'camelCase'"
    r"|metric names should not contain abbreviated units"
    r"|metric name should not include type 'counter')$"
)


def lint_only(text: bytes) -> tuple[bool, str]:
    """Whether promtool found nothing but dcgm-exporter's deliberate naming, and its output."""
    checked = promtool_check_metrics(text)
    output = (checked.stdout + checked.stderr).decode()
    if checked.returncode == 0:
        return True, output
    other = [line for line in output.splitlines() if line and not _LINT.match(line)]
    return checked.returncode == 3 and not other, "\n".join(other[:20])


def test_promtool_gate_tells_lint_from_a_parse_error() -> None:
    good = b'# HELP X_Y total.\n# TYPE X_Y counter\nX_Y{modelName="a"} 1\n'
    assert lint_only(good)[0]
    assert not lint_only(b'X_Y{modelName="a" 1\n')[0]


def prometheus_config(daemon_port: int) -> str:
    jobs = []
    for job, path in (("dcgm", "/metrics/dcgm"), ("native", "/metrics")):
        jobs.append(
            f"- job_name: {job}\n  metrics_path: {path}\n  scrape_interval: 1s\n"
            f"  static_configs:\n  - targets: ['127.0.0.1:{daemon_port}']\n"
        )
    return "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n" + "".join(
        jobs
    )


def query(url: str, promql: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def by_gpu(result: list[dict[str, Any]]) -> dict[str, float]:
    values: dict[str, float] = {}
    for sample in result:
        gpu = sample["metric"]["gpu"]
        assert gpu not in values, f"two series for GPU {gpu}: {result}"
        values[gpu] = float(sample["value"][1])
    return values


@pytest.fixture
def kubelet(tmp_path: Path) -> Any:
    """A fake kubelet: pods on GPUs 0 and 2 (one each: the dashboard wants a series per GPU)."""
    uuids = [device.uuid for device in sim.load_scenario("mixed").devices]
    fake = FakeKubelet().start()
    fake.set_pods(
        [
            pod("ml", "trainer-0", {"main": [("nvidia.com/gpu", [uuids[0]])]}),
            pod("web", "infer-2", {"srv": [("nvidia.com/gpu", [uuids[2]])]}),
        ]
    )
    yield fake
    fake.close()


def test_nvidias_dashboard_queries_through_prometheus(tmp_path: Path, kubelet: Any) -> None:
    config = tmp_path / "daemon.yaml"
    config.write_text(
        f"kubernetes:\n  enabled: true\n  socket_path: {kubelet.socket_path}\n"
        "dcgm_compat:\n  enabled: true\n"
    )
    # Ticks 10 s apart: activity needs two (GPM's first read is its baseline), and the
    # queries run between the second and the third, so both jobs scraped the same tick.
    args = ("--simulate", "mixed", "--config", str(config), "--interval", "10")
    with serve(tmp_path, *args, env={"NODE_NAME": "node-a"}) as daemon:
        daemon.wait_ready()
        body = daemon.get("/metrics/dcgm")
        assert body.status_code == 200, body.text
        assert body.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        ok, output = lint_only(body.content)
        assert ok, output
        openmetrics = {"accept": "application/openmetrics-text; version=1.0.0"}
        assert daemon.get("/metrics/dcgm", headers=openmetrics).text == body.text  # text only
        with prometheus_with_config(tmp_path / "prom", prometheus_config(daemon.port)) as url:
            tensor_query = f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{ALL}"
            assert wait_for(lambda: len(query(url, tensor_query)) == 8, 20)
            assert wait_for(lambda: query(url, "gpu_exporter_ticks_total == 2"), 10)

            def pair(dcgm: str, native: str) -> tuple[dict[str, float], dict[str, float]]:
                return by_gpu(query(url, dcgm)), by_gpu(query(url, native))

            temps, native = pair(
                f"DCGM_FI_DEV_GPU_TEMP{ALL}", 'gpu_temperature_celsius{sensor="gpu"}'
            )
            assert temps == native and sorted(temps) == [str(i) for i in range(8)]
            power, watts = pair(f"DCGM_FI_DEV_POWER_USAGE{ALL}", "gpu_power_watts")
            assert power == pytest.approx(watts, abs=5e-7)
            clocks, hertz = pair(
                f"DCGM_FI_DEV_SM_CLOCK{ALL} * 1000000", 'gpu_clock_hertz{clock="sm"}'
            )
            assert clocks == hertz
            util, ratio = pair(f"DCGM_FI_DEV_GPU_UTIL{ALL}", "gpu_utilization_ratio * 100")
            assert util == {gpu: round(value) for gpu, value in ratio.items()}
            fb, used = pair(f"DCGM_FI_DEV_FB_USED{ALL}", "floor(gpu_memory_used_bytes / 1048576)")
            assert fb == used
            tensor, active = pair(
                f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{ALL}", "gpu_tensor_active_ratio"
            )
            assert tensor == pytest.approx(active, abs=5e-7) and len(tensor) == 8
            (mean,) = query(url, f"avg(DCGM_FI_DEV_GPU_TEMP{ALL})")
            assert float(mean["value"][1]) == pytest.approx(sum(temps.values()) / 8)
            (total,) = query(url, f"sum(DCGM_FI_DEV_POWER_USAGE{ALL})")
            assert float(total["value"][1]) == pytest.approx(sum(watts.values()), abs=1e-5)
            labels = httpx.get(
                f"{url}/api/v1/label/gpu/values", params={"match[]": "DCGM_FI_DEV_GPU_TEMP"}
            ).json()["data"]
            assert sorted(labels, key=int) == [str(i) for i in range(8)]
            held = query(url, 'DCGM_FI_DEV_GPU_UTIL{namespace="ml",pod="trainer-0"}')
            assert [s["metric"]["gpu"] for s in held] == ["0"]
            assert held[0]["metric"]["container"] == "main"
            assert held[0]["metric"]["hostname"] == "node-a"
        # Still the second tick: every value compared above came from it.
        assert parse_samples(daemon.metrics_text())["gpu_exporter_ticks_total"] == 2.0


def test_pre_hopper_has_no_activity_and_mig_has_gpu_instances(tmp_path: Path) -> None:
    with (
        serve(tmp_path, "--simulate", "pre-hopper", "--dcgm-compat", "--interval", "0.5") as old,
        serve(tmp_path, "--simulate", "mig", "--dcgm-compat", "--interval", "0.5") as mig,
    ):
        old.wait_ready()
        mig.wait_ready()
        text = wait_for(lambda: _with(old, "DCGM_FI_PROF_PCIE_TX_BYTES{"), 10)
        assert text, old.output()
        assert "DCGM_FI_DEV_GPU_TEMP{" in text
        assert "DCGM_FI_PROF_SM_ACTIVE" not in text  # absent, never 0
        assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in text
        text = wait_for(lambda: _with(mig, "DCGM_FI_PROF_SM_ACTIVE{"), 10)
        assert text, mig.output()
        ok, output = lint_only(text.encode())
        assert ok, output
        instances = re.findall(
            r'^DCGM_FI_DEV_FB_USED\{gpu="0",.*GPU_I_PROFILE="([^"]+)",GPU_I_ID="(\d+)"', text, re.M
        )
        assert instances and all(profile.startswith("1g.") for profile, _ in instances), instances
        power = re.findall(r"^DCGM_FI_DEV_POWER_USAGE\{([^}]*)\}", text, re.M)
        assert len(power) == 4 and not [p for p in power if "GPU_I_ID" in p]
        util = re.findall(r'^DCGM_FI_DEV_GPU_UTIL\{gpu="(\d+)"', text, re.M)
        assert "0" not in util  # no whole-GPU utilization on a MIG GPU, as dcgm-exporter


def _with(daemon: Any, marker: str) -> str | None:
    text = daemon.get("/metrics/dcgm").text
    return text if marker in text else None


def test_drop_in_port_and_native_endpoint_untouched(tmp_path: Path) -> None:
    compat_port = free_port()
    address = f"127.0.0.1:{compat_port}"
    with serve(tmp_path, "--simulate", "mixed", "--dcgm-compat-listen-address", address) as bad:
        assert bad.process.wait(timeout=20) == 2
        assert "dcgm_compat: listen_address serves the compat output" in bad.output()
        assert "--dcgm-compat" in bad.output()
    with serve(
        tmp_path, "--simulate", "mixed", "--dcgm-compat", "--dcgm-compat-listen-address", address
    ) as daemon:
        daemon.wait_ready()
        drop_in = httpx.Client(base_url=f"http://{address}", timeout=5)
        text = wait_for(lambda: _ready(drop_in), 10)
        assert text and text.startswith("# HELP DCGM_FI_DEV_SM_CLOCK ")
        assert drop_in.get("/api/v1/devices").status_code == 404  # only /metrics there
        # One server, one logging setup: no access log on either listener, both announced.
        assert '"GET /metrics' not in daemon.output()
        assert f"dcgm-exporter compatible, on {address}" in daemon.output()
        native = daemon.metrics_text()
        assert "DCGM_FI_" not in native and native.startswith("# HELP gpu_")
        drop_in.close()
    with serve(tmp_path, "--simulate", "mixed") as plain:
        plain.wait_ready()
        assert plain.get("/metrics/dcgm").status_code == 404  # off unless asked for
        assert 'collector="dcgm_compat"' not in plain.metrics_text()


def _ready(client: httpx.Client, auth: tuple[str, str] | None = None) -> str | None:
    try:
        response = client.get("/metrics", auth=auth) if auth else client.get("/metrics")
    except httpx.TransportError:
        return None
    return response.text if response.status_code == 200 else None


def test_same_port_for_both_is_refused(tmp_path: Path) -> None:
    port = free_port()
    result = subprocess.run(
        command(
            "serve", "--simulate", "--listen-address", f"127.0.0.1:{port}", "--dcgm-compat",
            "--dcgm-compat-listen-address", f"0.0.0.0:{port}",
        ),
        capture_output=True,
        timeout=30,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert b"must use another port" in result.stderr


def test_drop_in_port_has_the_same_basic_auth(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  {USER}: {password_hash()}\n")
    address = f"127.0.0.1:{free_port()}"
    args = ("--simulate", "mixed", "--web-config-file", str(web), "--dcgm-compat")
    with serve(
        tmp_path, *args, "--dcgm-compat-listen-address", address, auth=(USER, PASSWORD)
    ) as daemon:
        daemon.wait_ready()
        with httpx.Client(base_url=f"http://{address}", timeout=5) as drop_in:
            assert drop_in.get("/metrics").status_code == 401
            text = wait_for(lambda: _ready(drop_in, (USER, PASSWORD)), 10)
            assert text and "DCGM_FI_DEV_GPU_TEMP{" in text
        assert daemon.get("/metrics/dcgm").status_code == 200
        assert httpx.get(f"{daemon.url}/metrics/dcgm", timeout=5).status_code == 401


def test_a_drop_in_port_in_use_is_exit_2_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        args = ("--simulate", "mixed", "--dcgm-compat", "--dcgm-compat-listen-address", address)
        with serve(tmp_path, *args) as daemon:
            assert daemon.process.wait(timeout=20) == 2
            assert f"cannot listen on {address}" in daemon.output()
