"""`gpu-exporter config check`, run as a user runs it (a subprocess of the real CLI): good files
pass with exit 0, every problem `serve` would stop at is named by file, line and field with
exit 2, and what it refuses `serve` refuses too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon import free_port
from tests.tlsfiles import make_pki

GOOD_RULES = """\
groups:
  - name: site
    rules:
      - alert: GpuHot
        expr: gpu_temperature_celsius > 90
        for: 5m
"""
BAD_RULES = """\
groups:
  - name: site
    rules:
      - alert: GpuHot
        expr: gpu_temperature_celsius > 90
      - alert: Broken
        expr: rate(gpu_power_watts[5m]
"""


def config_check(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "config", "check", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def assert_refused(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


def test_a_good_file_and_everything_it_names_pass(tmp_path):
    write(tmp_path / "site.rules.yaml", GOOD_RULES)
    config = write(
        tmp_path / "config.yaml",
        "interval_seconds: 0.5\nsimulate: faults\nrules:\n  files: [site.rules.yaml]\n",
    )
    result = config_check(config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{config}: OK\n"


def test_an_unknown_setting_and_a_value_out_of_range_name_line_and_field(tmp_path):
    config = write(tmp_path / "config.yaml", "interval_seconds: 0.1\nnvml:\n  gmp: false\n")
    result = config_check(config, cwd=tmp_path)
    assert_refused(
        result,
        f"{config}:1: interval_seconds: Input should be greater than or equal to 0.2",
        f"{config}:3: nvml.gmp: unknown setting",
    )
    assert f"{config}: OK" not in result.stdout


def test_a_missing_file_or_a_directory_is_a_clear_error(tmp_path):
    result = config_check(tmp_path / "nope.yaml", tmp_path, cwd=tmp_path)
    assert_refused(
        result,
        f"{tmp_path / 'nope.yaml'}: cannot read: No such file or directory",
        f"{tmp_path}: cannot read: a directory, not a regular file",
    )


def test_every_file_is_checked_and_one_bad_file_fails_the_run(tmp_path):
    good = write(tmp_path / "good.yaml", "log_level: debug\n")
    bad = write(tmp_path / "bad.yaml", "log_level: loud\n")
    result = config_check(bad, good, cwd=tmp_path)
    assert_refused(result, f"{bad}:1: log_level:")
    assert result.stdout == f"{good}: OK\n"


def test_rule_files_are_loaded_as_serve_loads_them(tmp_path):
    write(tmp_path / "bad.rules.yaml", BAD_RULES)
    config = write(tmp_path / "config.yaml", "rules:\n  files: [bad.rules.yaml]\n")
    assert_refused(
        config_check(config, cwd=tmp_path),
        "bad.rules.yaml:7: groups[0].rules[1].expr: alert Broken: invalid PromQL",
    )
    glob = write(tmp_path / "glob.yaml", "rules:\n  files: [missing/*.yaml]\n")
    assert_refused(config_check(glob, cwd=tmp_path), "missing/*.yaml: no rule file matches")


def test_the_shipped_pack_is_checked_with_the_settings_the_file_gives_the_rules(tmp_path):
    # The shipped rules read minutes of history: a one-minute cap refuses them at load in
    # `serve`, so the check must load the pack, with this file's settings.
    short = write(tmp_path / "short.yaml", "rules:\n  max_range_seconds: 60\n")
    assert_refused(
        config_check(short, cwd=tmp_path), "gpu-exporter.rules.yaml:", "rules.max_range_seconds"
    )
    off = write(tmp_path / "off.yaml", "rules:\n  enabled: false\n  max_range_seconds: 60\n")
    assert config_check(off, cwd=tmp_path).returncode == 0


def test_the_web_config_file_is_checked(tmp_path):
    write(tmp_path / "web.yml", "basic_auth_users:\n  alice: plain\n")
    config = write(tmp_path / "config.yaml", "web_config_file: web.yml\n")
    assert_refused(config_check(config, cwd=tmp_path), "web.yml:2: basic_auth_users.alice")


def test_the_simulation_scenario_is_checked(tmp_path):
    write(tmp_path / "scenario.yaml", "name: x\ndevices:\n  - model: H100\n    colour: blue\n")
    config = write(tmp_path / "config.yaml", "simulate: scenario.yaml\n")
    assert_refused(config_check(config, cwd=tmp_path), "scenario.yaml:4: devices[0].colour")
    builtin = write(tmp_path / "builtin.yaml", "simulate: no-such-scenario\n")
    assert_refused(
        config_check(builtin, cwd=tmp_path), "no-such-scenario: no such scenario file or built-in"
    )


def test_root_reads_absolute_paths_as_the_pod_sees_them(tmp_path):
    pod = tmp_path / "pod"
    pki = make_pki(tmp_path / "pki")
    write(pod / "etc/tls/tls.crt", pki.server_cert.read_text())
    write(pod / "etc/tls/tls.key", pki.server_key.read_text())
    write(
        pod / "etc/web/web-config.yml",
        "tls_server_config:\n  cert_file: /etc/tls/tls.crt\n  key_file: /etc/tls/tls.key\n",
    )
    write(pod / "etc/rules/site.yaml", GOOD_RULES)
    write(pod / "etc/secrets/token", "t0ken\n")
    config = write(
        pod / "etc/config/config.yaml",
        "web_config_file: /etc/web/web-config.yml\n"
        "rules: {files: [/etc/rules/*.yaml]}\n"
        "alerting:\n"
        "  alertmanagers:\n"
        "    - url: http://alertmanager:9093\n"
        "      bearer_token_file: /etc/secrets/token\n",
    )
    result = config_check("--root", pod, config, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{config}: OK\n"
    assert not [p for p in pod.rglob(".config-check-*")], "the rerooted copies are left behind"
    # Without --root the same file names paths this machine does not have.
    assert_refused(
        config_check(config, cwd=tmp_path), "'/etc/secrets/token' is not a readable file"
    )


def test_root_keeps_the_file_names_and_lines_of_problems(tmp_path):
    pod = tmp_path / "pod"
    write(pod / "etc/rules/bad.yaml", BAD_RULES)
    config = write(
        pod / "config.yaml",
        "rules:\n  files: [/etc/rules/bad.yaml]\n  reload_check_seconds: -1\n",
    )
    assert_refused(
        config_check("--root", pod, config, cwd=tmp_path),
        f"{config}:3: rules.reload_check_seconds: Input should be greater than 0",
    )
    write(config, "rules:\n  files: [/etc/rules/bad.yaml]\n")
    assert_refused(
        config_check("--root", pod, config, cwd=tmp_path),
        f"{pod / 'etc/rules/bad.yaml'}:7: groups[0].rules[1].expr",
    )


def test_help_says_what_is_checked():
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "config", "check", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    for word in ("rule files", "web-config", "scenario", "file:line: field: message", "--root"):
        assert word in " ".join(result.stdout.split()), result.stdout


@pytest.mark.parametrize(
    ("files", "config_text", "message"),
    [
        ({}, "nvml:\n  gmp: false\n", "nvml.gmp: unknown setting"),
        ({"s.yaml": "name: x\nbogus: 1\n"}, "simulate: s.yaml\n", "s.yaml:2: bogus"),
        (
            {"r.yaml": BAD_RULES},
            "simulate: mixed\nrules:\n  files: [r.yaml]\n",
            "r.yaml:7: groups[0].rules[1].expr",
        ),
        (
            {"w.yml": "http_server_config:\n  h3: 1\n"},
            "simulate: mixed\nweb_config_file: w.yml\n",
            "w.yml:2: http_server_config.h3",
        ),
    ],
    ids=["setting", "scenario", "rules", "web-config"],
)
def test_what_config_check_refuses_serve_refuses(tmp_path, files, config_text, message):
    for name, text in files.items():
        write(tmp_path / name, text)
    address = f"listen_address: 127.0.0.1:{free_port()}\n"  # a port serve can open
    config = write(tmp_path / "config.yaml", config_text + address)
    assert_refused(config_check(config, cwd=tmp_path), message)
    serve = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "serve", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert serve.returncode == 2, serve.stderr
    assert message in serve.stderr, serve.stderr


def serve_with(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "serve", "--config", str(config)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_nan_and_infinite_settings_are_refused_as_not_finite_numbers(tmp_path):
    # `.nan` was reported as "less than or equal to 3600": every bound is false for NaN.
    config = write(
        tmp_path / "config.yaml",
        f"listen_address: 127.0.0.1:{free_port()}\n"
        "interval_seconds: .nan\n"
        "rules:\n"
        "  group_time_budget_seconds: .inf\n"
        "web:\n"
        "  idle_timeout_seconds: -.inf\n"
        "classifier:\n"
        "  window_seconds: .NaN\n",
    )
    expected = [
        f"{config}:2: interval_seconds: must be a finite number, got nan",
        f"{config}:4: rules.group_time_budget_seconds: must be a finite number, got inf",
        f"{config}:6: web.idle_timeout_seconds: must be a finite number, got -inf",
        f"{config}:8: classifier.window_seconds: must be a finite number, got nan",
    ]
    assert_refused(config_check(config, cwd=tmp_path), *expected)
    serve = serve_with(config, tmp_path)
    assert serve.returncode == 2, serve.stderr
    assert sorted(serve.stderr.splitlines()) == sorted(f"config error: {e}" for e in expected)


def test_an_alertmanager_listed_twice_is_a_config_error_at_its_second_entry(tmp_path):
    # Was accepted by `config check` and stopped `serve` as a "rule error".
    config = write(
        tmp_path / "config.yaml",
        f"listen_address: 127.0.0.1:{free_port()}\n"
        "simulate: mixed\n"
        "alerting:\n"
        "  alertmanagers:\n"
        "    - url: http://127.0.0.1:9093\n"
        "    - http://127.0.0.1:9094\n"
        "    - url: http://127.0.0.1:9093/\n",
    )
    expected = (
        f"{config}:7: alerting.alertmanagers[2].url: http://127.0.0.1:9093 is listed twice "
        "(also alerting.alertmanagers[0]): give each Alertmanager once"
    )
    assert_refused(config_check(config, cwd=tmp_path), expected)
    serve = serve_with(config, tmp_path)
    assert serve.returncode == 2, serve.stderr
    assert serve.stderr.strip() == f"config error: {expected}"
