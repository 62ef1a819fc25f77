"""An error about a setting names where the setting came from: the environment variable (or
flag) that set it, the file and line otherwise, also for checks across settings and for the
files a setting names (a scenario, rule files, the web-config file); and a DCGM mode that
needs libdcgm where there is none says how to get it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_exporter.collect import dcgm, dcgm_api
from gpu_exporter.collect.settings import DcgmConfig
from gpu_exporter.collect.source import ErrorLog, SourceUnavailableError
from gpu_exporter.config.load import ConfigError, load_config
from tests.daemon import free_port

ROOT = Path(__file__).resolve().parent.parent


def config_error(path: Path | None = None, **environ: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ=environ)
    return str(caught.value)


def test_a_config_file_named_by_the_environment_names_the_variable(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    message = config_error(GPU_EXPORTER_CONFIG=str(missing))
    assert message.startswith(f"config error: environment variable GPU_EXPORTER_CONFIG: {missing}")
    (tmp_path / "list.yaml").write_text("- a\n")
    message = config_error(GPU_EXPORTER_CONFIG=str(tmp_path / "list.yaml"))
    assert "environment variable GPU_EXPORTER_CONFIG: " in message
    assert "the top level must be a mapping" in message


def test_a_check_across_settings_names_the_variable_that_set_one(tmp_path: Path) -> None:
    message = config_error(GPU_EXPORTER_NVML__DEVICE_DEADLINE_SECONDS="5")
    assert "must be shorter than interval_seconds" in message
    assert (
        "(nvml.device_deadline_seconds from environment variable "
        "GPU_EXPORTER_NVML__DEVICE_DEADLINE_SECONDS)"
    ) in message


def test_a_check_across_settings_points_at_the_files_line(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("log_level: info\nnvml:\n  device_deadline_seconds: 2\n")
    message = config_error(path)
    assert message.startswith(f"config error: {path}:3: nvml.device_deadline_seconds: ")
    message = config_error(path, GPU_EXPORTER_INTERVAL_SECONDS="0.5")
    assert message.startswith(f"config error: {path}:3: nvml.device_deadline_seconds: ")
    assert message.endswith(
        "(interval_seconds from environment variable GPU_EXPORTER_INTERVAL_SECONDS)"
    )


def test_a_sections_check_names_the_variable_that_set_a_value_in_it() -> None:
    message = config_error(GPU_EXPORTER_ALERTING__ALERTMANAGERS="notaurl")
    assert "alertmanager url 'notaurl': the scheme must be http or https" in message
    assert (
        "(alerting.alertmanagers from environment variable GPU_EXPORTER_ALERTING__ALERTMANAGERS)"
        in message
    )


def serve_with(tmp_path: Path, **environ: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **environ}
    port = free_port()
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "serve", "--listen-address", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
        check=False,
    )


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        (
            "GPU_EXPORTER_SIMULATE",
            "no-such-scenario",
            "scenario error: environment variable GPU_EXPORTER_SIMULATE (simulate): "
            "no-such-scenario: ",
        ),
        (
            "GPU_EXPORTER_RULES__FILES",
            "missing.rules.yaml",
            "rule error: environment variable GPU_EXPORTER_RULES__FILES (rules.files): "
            "missing.rules.yaml: ",
        ),
        (
            "GPU_EXPORTER_WEB_CONFIG_FILE",
            "missing-web.yml",
            "web config error: environment variable GPU_EXPORTER_WEB_CONFIG_FILE "
            "(web_config_file): missing-web.yml: ",
        ),
    ],
)
def test_serve_names_the_variable_that_named_a_bad_file(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    """The files are checked before NVML is needed (a scenario), or reported even without a
    driver (the rule and web-config files are checked with --simulate)."""
    extra = {} if variable == "GPU_EXPORTER_SIMULATE" else {"GPU_EXPORTER_SIMULATE": "mixed"}
    result = serve_with(tmp_path, **{variable: value, **extra})
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr


def test_a_dcgm_mode_that_needs_libdcgm_says_how_to_get_it() -> None:
    dcgm_api.use_library(dcgm_api.NO_LIBRARY)
    try:
        for mode in ("embedded", "standalone"):
            with pytest.raises(SourceUnavailableError) as caught:
                dcgm.configured(DcgmConfig(mode=mode), ErrorLog(), 1.0)
            message = str(caught.value)
            assert message.startswith(f"dcgm.mode is {mode}, but libdcgm.so.4 is not installed")
            assert "datacenter-gpu-manager-4-core" in message
            assert "An image with DCGM" in message
        assert dcgm.configured(DcgmConfig(mode="auto"), ErrorLog(), 1.0) is None
    finally:
        dcgm_api.use_library(None)
