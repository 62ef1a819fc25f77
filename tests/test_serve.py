"""End to end: the real daemon process on the fake NVML, checked over HTTP and by promtool."""

from __future__ import annotations

import gzip
import subprocess
import time
from pathlib import Path

import httpx

from tests.daemon import command, parse_samples, serve
from tests.support import promtool_check_metrics, wait_for

REQUIRED_FAMILIES = (
    "gpu_info",
    "gpu_up",
    "gpu_utilization_ratio",
    "gpu_sm_active_ratio",
    "gpu_tensor_active_ratio",
    "gpu_dram_active_ratio",
    "gpu_power_watts",
    "gpu_energy_joules_total",
    "gpu_clock_hertz",
    "gpu_clock_event_active",
    "gpu_clock_event_seconds_total",
    "gpu_pcie_bytes_total",
    "gpu_nvlink_bytes_total",
)


def gpu_value(samples: dict[str, float], family: str, gpu: int, **labels: str) -> float | None:
    for series, value in samples.items():
        name, _, rest = series.partition("{")
        if name != family or f'gpu="{gpu}"' not in rest:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            return value
    return None


def test_mixed_scenario_serves_valid_metrics_matching_the_scenario(tmp_path: Path) -> None:
    with serve(tmp_path, "--simulate", "mixed", "--interval", "0.5") as daemon:
        daemon.wait_ready()

        # GPM needs two samples; wait until activity metrics are there.
        def activity_text() -> str | None:
            text = daemon.metrics_text()
            return text if "gpu_sm_active_ratio{" in text else None

        text = wait_for(activity_text, 10)
        assert text, daemon.output()
        checked = promtool_check_metrics(text.encode())
        assert checked.returncode == 0, checked.stdout + checked.stderr
        for family in REQUIRED_FAMILIES:
            assert f"\n{family}{{" in text, f"{family} missing"
        samples = parse_samples(text)
        assert sum(v for k, v in samples.items() if k.startswith("gpu_up{")) == 8
        # GPU 4 is launch-bound: busy-looking, little SM work.
        assert gpu_value(samples, "gpu_utilization_ratio", 4) >= 0.9
        assert gpu_value(samples, "gpu_sm_active_ratio", 4) < 0.2
        # GPU 5 is held down by HW thermal slowdown, GPU 1 is not: their time counters (the
        # default metrics profile leaves the 0/1 state out where the counter measures it).
        assert gpu_value(samples, "gpu_clock_event_seconds_total", 5, reason="hw_thermal_slowdown")
        assert not gpu_value(
            samples, "gpu_clock_event_seconds_total", 1, reason="hw_thermal_slowdown"
        )
        assert gpu_value(samples, "gpu_clock_event_active", 5, reason="hw_thermal_slowdown") is None
        assert gpu_value(samples, "gpu_tensor_active_ratio", 2) > 0.5
        assert gpu_value(samples, "gpu_dram_active_ratio", 3) > 0.8

        energy_before = gpu_value(samples, "gpu_energy_joules_total", 1)
        time.sleep(1.2)
        later = parse_samples(daemon.metrics_text())
        assert gpu_value(later, "gpu_energy_joules_total", 1) > energy_before

        openmetrics = daemon.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
        assert openmetrics.text.endswith("# EOF\n")
        zipped = daemon.get("/metrics", headers={"Accept-Encoding": "gzip"})
        assert zipped.headers.get("content-encoding") == "gzip"
        assert b"gpu_up{" in zipped.content  # httpx decodes transparently
        raw = httpx.get(f"{daemon.url}/metrics", headers={"Accept-Encoding": "gzip"}).read()
        assert b"gpu_up" in raw or b"gpu_up" in gzip.decompress(raw)

        devices = daemon.get("/api/v1/devices").json()["data"]["devices"]
        assert len(devices) == 8
        assert devices[4]["metrics"]["gpu_sm_active_ratio"] < 0.2
        # The API has every series: the states too.
        states = {
            (index, entry["labels"]["reason"]): entry["value"]
            for index in (1, 5)
            for entry in devices[index]["metrics"]["gpu_clock_event_active"]
        }
        assert states[(5, "hw_thermal_slowdown")] == 1 and states[(1, "hw_thermal_slowdown")] == 0
        assert daemon.get("/healthz").status_code == 200


def test_pre_hopper_has_no_activity_series_at_all(tmp_path: Path) -> None:
    with serve(tmp_path, "--simulate", "pre-hopper", "--interval", "0.5") as daemon:
        daemon.wait_ready()
        time.sleep(1.2)  # past the point where GPM would have had two samples
        text = daemon.metrics_text()
        assert "gpu_utilization_ratio{" in text
        for family in ("gpu_sm_active_ratio", "gpu_tensor_active_ratio", "gpu_dram_active_ratio"):
            assert f"{family}{{" not in text, f"{family} must be absent, not 0"
        # Older driver: the fallbacks still give clock events and throttle time.
        assert "gpu_clock_event_active{" in text
        assert "gpu_clock_event_seconds_total{" in text


def test_without_driver_serve_exits_1_with_a_sentence_about_simulate(tmp_path: Path) -> None:
    result = subprocess.run(
        command("serve", "--listen-address", "127.0.0.1:1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "--simulate" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_malformed_config_exits_2_naming_file_and_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("interval_seconds: 1\nnvml:\n  gpm: maybe\n")
    result = subprocess.run(
        command("serve", "--config", str(config), "--simulate"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert f"{config}:3: nvml.gpm:" in result.stderr


def test_malformed_scenario_exits_2_naming_file_and_field(tmp_path: Path) -> None:
    scenario = tmp_path / "bad-scenario.yaml"
    scenario.write_text(
        "name: bad\ndevices:\n  - model: NVIDIA H200\n    values:\n      power_watts: hot\n"
    )
    result = subprocess.run(
        command("serve", "--simulate", str(scenario), "--listen-address", "127.0.0.1:1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert str(scenario) in result.stderr
    assert "power_watts" in result.stderr


def test_version(tmp_path: Path) -> None:
    result = subprocess.run(command("--version"), capture_output=True, text=True, check=False)
    assert result.returncode == 0
    assert result.stdout.startswith("gpu-exporter ")


def test_faults_scenario_lost_gpu_xid_and_hang(tmp_path: Path) -> None:
    config = tmp_path / "fast-recovery.yaml"
    config.write_text(
        "nvml:\n"
        "  recovery_initial_backoff_seconds: 0.5\n"
        "  recovery_max_backoff_seconds: 1\n"
        "  device_deadline_seconds: 0.3\n"
    )
    with serve(tmp_path, "--simulate", "faults", "--interval", "0.5", "--config", str(config)) as d:
        d.wait_ready()
        # XID 79 on GPU 1 at 8 s.
        xid = wait_for(
            lambda: gpu_value(parse_samples(d.metrics_text()), "gpu_xid_errors_total", 1, xid="79"),
            timeout=20,
        )
        assert xid == 1, d.output()
        # While GPU 2's power call hangs (5-25 s), /metrics stays fast, GPU 2 is back up without
        # its power reading (the hung call is quarantined) and GPU 0 keeps updating.
        started = time.monotonic()
        first = parse_samples(d.metrics_text())
        assert time.monotonic() - started < 1.0
        assert gpu_value(first, "gpu_up", 2) == 1
        assert gpu_value(first, "gpu_power_watts", 2) is None
        assert gpu_value(first, "gpu_utilization_ratio", 2) is not None
        # GPU 1 is lost at 15 s: down while the others keep updating ...
        down = wait_for(
            lambda: gpu_value(parse_samples(d.metrics_text()), "gpu_up", 1) == 0, timeout=15
        )
        assert down, d.output()
        samples = parse_samples(d.metrics_text())
        assert gpu_value(samples, "gpu_up", 0) == 1
        assert gpu_value(samples, "gpu_energy_joules_total", 0) > gpu_value(
            first, "gpu_energy_joules_total", 0
        )
        # ... and comes back after 25 s, once NVML has been re-initialised.
        back = wait_for(
            lambda: gpu_value(parse_samples(d.metrics_text()), "gpu_up", 1) == 1, timeout=20
        )
        assert back, d.output()
        # Back, but nothing reset it: its verdict stays critical for XID 79 (and GPU 2's for 48).
        samples = parse_samples(d.metrics_text())
        assert gpu_value(samples, "gpu_health_verdict", 1, verdict="critical") == 1
        assert gpu_value(samples, "gpu_health_action_info", 1, reason="xid_79") == 1
        assert gpu_value(samples, "gpu_health_action_info", 1, action="reboot_node") == 1
        assert gpu_value(samples, "gpu_health_verdict", 2, verdict="critical") == 1
        assert gpu_value(samples, "gpu_health_action_info", 2, reason="xid_48") == 1
        # GPU 0 is not critical (its fabric runs degraded from 20 s to 40 s: a warning then).
        # The default profile exports verdict="critical" from a GPU's first critical tick on.
        assert gpu_value(samples, "gpu_health_verdict", 0, verdict="critical") in (None, 0)
        assert d.process.poll() is None, "the daemon must never exit on faults"
        errors = parse_samples(d.metrics_text())
        assert any(
            k.startswith("gpu_exporter_errors_total{") and 'error="Timeout"' in k for k in errors
        ), "the hung call is counted"


def test_sigterm_stops_cleanly_with_status_0(tmp_path: Path) -> None:
    import signal

    with serve(tmp_path, "--simulate", "mixed", "--interval", "0.5") as daemon:
        daemon.wait_ready()
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(timeout=15) == 0, daemon.output()


def test_head_answers_as_get_does_without_a_body(tmp_path: Path) -> None:
    # A long interval: GET and HEAD of /metrics fall in one tick, so their bodies match.
    with serve(tmp_path, "--simulate", "mixed", "--interval", "30") as daemon:
        daemon.wait_ready()
        for path in ("/metrics", "/healthz", "/readyz", "/api/v1/devices", "/api/v1/rules", "/"):
            get = daemon.get(path)
            head = daemon.client.head(path)
            assert head.status_code == get.status_code == 200, (path, head.status_code)
            assert head.content == b"", path
            assert head.headers["content-type"] == get.headers["content-type"], path
            for header in ("content-length", "content-encoding", "vary"):
                assert head.headers.get(header) == get.headers.get(header), (path, header)
        plain = daemon.client.head("/metrics", headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers
        assert int(plain.headers["content-length"]) == len(daemon.get("/metrics").content)
        assert daemon.client.post("/metrics").status_code == 405
