"""Configuration: file, environment and flags, and errors that say where the bad value is."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_exporter.collect.classify import Classifier
from gpu_exporter.collect.settings import ClassifierConfig, default_window_seconds
from gpu_exporter.config.load import ConfigError, load_config
from gpu_exporter.web.settings import split_host_port


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpu-exporter.yaml"
    path.write_text(text)
    return path


def test_defaults_without_any_source() -> None:
    config = load_config(environ={})
    assert config.listen_address == "0.0.0.0:9449"
    assert config.interval_seconds == 1.0
    assert config.simulate is None
    assert config.nvml.gpm is True


def test_flags_win_over_environment_over_file(tmp_path: Path) -> None:
    path = write(
        tmp_path, "interval_seconds: 5\nlisten_address: 127.0.0.1:1000\nlog_level: error\n"
    )
    env = {"GPU_EXPORTER_INTERVAL_SECONDS": "3", "GPU_EXPORTER_LISTEN_ADDRESS": "127.0.0.1:2000"}
    config = load_config(path, {"interval_seconds": 2.0}, environ=env)
    assert config.interval_seconds == 2.0  # flag
    assert config.listen_address == "127.0.0.1:2000"  # environment
    assert config.log_level == "error"  # file


def test_nested_environment_variable() -> None:
    config = load_config(environ={"GPU_EXPORTER_NVML__DEVICE_DEADLINE_SECONDS": "0.25"})
    assert config.nvml.device_deadline_seconds == 0.25
    assert config.nvml.deadline(1.0) == 0.25


def test_config_file_named_by_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "simulate: faults\n")
    assert load_config(environ={"GPU_EXPORTER_CONFIG": str(path)}).simulate == "faults"


def test_bad_value_names_file_field_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "listen_address: 127.0.0.1:9449\nnvml:\n  device_deadline_seconds: -1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    message = str(err.value)
    assert str(path) in message
    assert f"{path}:3: nvml.device_deadline_seconds:" in message


def test_unknown_key_is_an_error_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "interval_seconds: 1\nintervall: 2\n")
    with pytest.raises(ConfigError, match=r"\.yaml:2: intervall: unknown setting"):
        load_config(path, environ={})


def test_bad_environment_variable_is_named() -> None:
    with pytest.raises(ConfigError, match="environment variable GPU_EXPORTER_INTERVAL_SECONDS"):
        load_config(environ={"GPU_EXPORTER_INTERVAL_SECONDS": "soon"})


def test_bad_flag_is_named() -> None:
    with pytest.raises(ConfigError, match="flag --listen-address"):
        load_config(flags={"listen_address": "nowhere"}, environ={})


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    path = write(tmp_path, "interval_seconds: [1\n")
    with pytest.raises(ConfigError, match=r"\.yaml:\d+: invalid YAML"):
        load_config(path, environ={})


def test_missing_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml", environ={})


@pytest.mark.parametrize(
    ("address", "expected"),
    [("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9449", ("::1", 9449)), ("host:1", ("host", 1))],
)
def test_split_host_port(address: str, expected: tuple[str, int]) -> None:
    assert split_host_port(address) == expected


@pytest.mark.parametrize("address", ["9449", ":9449", "host:0", "host:70000", "[nope]:1"])
def test_split_host_port_rejects(address: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(address)


def test_unrelated_prefixed_variables_are_ignored() -> None:
    # Kubernetes injects these for a Service named gpu-exporter; they must not stop the daemon.
    env = {
        "GPU_EXPORTER_SERVICE_HOST": "10.0.0.1",
        "GPU_EXPORTER_PORT": "tcp://10.0.0.1:9449",
        "GPU_EXPORTER_PORT_9449_TCP_ADDR": "10.0.0.1",
        "GPU_EXPORTER_DEV_VENV": "/tmp/venv",
    }
    assert load_config(environ=env).listen_address == "0.0.0.0:9449"


def test_unknown_nested_environment_setting_is_still_an_error() -> None:
    with pytest.raises(ConfigError, match="GPU_EXPORTER_NVML__GPMM"):
        load_config(environ={"GPU_EXPORTER_NVML__GPMM": "true"})


def test_deadline_must_be_shorter_than_the_interval(tmp_path: Path) -> None:
    path = write(tmp_path, "interval_seconds: 0.5\nnvml:\n  device_deadline_seconds: 0.6\n")
    with pytest.raises(ConfigError, match="must be shorter than interval_seconds"):
        load_config(path, environ={})


def test_default_deadline_follows_a_short_interval() -> None:
    config = load_config(flags={"interval_seconds": 0.5}, environ={})
    assert config.nvml.deadline(config.interval_seconds) == 0.4
    assert load_config(environ={}).nvml.deadline(1.0) == 0.8


def test_the_classifier_window_defaults_to_the_intervals() -> None:
    assert ClassifierConfig().window_seconds is None  # default_window_seconds(interval)
    assert default_window_seconds(1.0) == Classifier().window_seconds


def test_the_validation_scripts_deadline_is_the_daemons() -> None:
    from bench.gpu_validation import parse_args
    from gpu_exporter.collect.settings import default_deadline

    assert parse_args(["--workloads", "idle"]).deadline == default_deadline(1.0)
    assert parse_args(["--workloads", "idle", "--interval", "0.5"]).deadline == pytest.approx(0.4)
    assert parse_args(["--workloads", "idle", "--deadline", "0.3"]).deadline == 0.3


# -- external labels: what Alertmanager accepts, checked at load --------------------------


def test_an_invalid_external_label_name_from_a_flag_is_named() -> None:
    # Alertmanager answers 400 to an alert with this label: every alert would be dropped.
    with pytest.raises(ConfigError) as err:
        load_config(flags={"alerting.external_labels": "k8s-cluster=prod"}, environ={})
    assert str(err.value) == (
        "config error: flag --external-label (alerting.external_labels.k8s-cluster): "
        "'k8s-cluster' is not a valid label name (letters, digits and _, not starting with a digit)"
    )


def test_a_reserved_or_empty_external_label_in_the_file_names_its_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "alerting:\n  external_labels:\n    cluster: prod\n    __tenant: a\n    region: ''\n",
    )
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    problems = str(err.value).splitlines()
    assert problems == [
        f"config error: {path}:4: alerting.external_labels.__tenant: '__tenant' is reserved: "
        "names starting with __ are Prometheus' own",
        f"config error: {path}:5: alerting.external_labels.region: "
        "String should have at least 1 character",
    ]


def test_an_external_label_from_the_environment_is_checked_and_named() -> None:
    env = {"GPU_EXPORTER_ALERTING__EXTERNAL_LABELS": "cluster=prod,1zone=a"}
    with pytest.raises(ConfigError, match=r"GPU_EXPORTER_ALERTING__EXTERNAL_LABELS .*'1zone'"):
        load_config(environ=env)
    with pytest.raises(ConfigError, match="'cluster' is given twice"):
        load_config(flags={"alerting.external_labels": "cluster=a,cluster=b"}, environ={})
    valid = load_config(flags={"alerting.external_labels": "cluster=prod,_zone=a"}, environ={})
    assert valid.alerting.external_labels == {"cluster": "prod", "_zone": "a"}


def test_serve_exits_2_for_an_invalid_external_label() -> None:
    import subprocess

    from tests.daemon import command, free_port

    listen = f"127.0.0.1:{free_port()}"
    result = subprocess.run(
        command("serve", "--listen-address", listen, "--external-label", "k8s-cluster=prod"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "flag --external-label" in result.stderr and "'k8s-cluster'" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_exits_2_naming_the_flag_for_an_alertmanager_given_twice() -> None:
    import subprocess

    from tests.daemon import command, free_port

    url = "http://127.0.0.1:9093"
    listen = f"127.0.0.1:{free_port()}"
    result = subprocess.run(
        command("serve", "--listen-address", listen, "--simulate", "mixed",
                "--alertmanager-url", url, "--alertmanager-url", f"{url}/"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (  # was "rule error: alertmanager url listed more than once"
        "config error: flag --alertmanager-url (alerting.alertmanagers[1].url): "
        f"{url} is listed twice (also alerting.alertmanagers[0]): give each Alertmanager once"
    )


def test_a_nan_from_the_environment_is_refused_as_not_finite() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {}, environ={"GPU_EXPORTER_INTERVAL_SECONDS": "nan"})
    assert str(err.value) == (
        "config error: environment variable GPU_EXPORTER_INTERVAL_SECONDS (interval_seconds): "
        "must be a finite number, got nan"
    )
    finite = r"\(nvml\.slow_refresh_seconds\): must be a finite number, got inf"
    with pytest.raises(ConfigError, match=finite):
        load_config(None, {}, environ={"GPU_EXPORTER_NVML__SLOW_REFRESH_SECONDS": "inf"})


# -- environment variables and flags that collide -----------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {"GPU_EXPORTER_RULES": "x", "GPU_EXPORTER_RULES__ENABLED": "false"},
        {"GPU_EXPORTER_RULES__ENABLED": "false", "GPU_EXPORTER_RULES": "x"},
    ],
    ids=["outer first", "inner first"],
)
def test_a_variable_inside_another_is_a_conflict_naming_both(env: dict[str, str]) -> None:
    # Was a TypeError traceback in one order and a silent pick in the other.
    with pytest.raises(ConfigError) as err:
        load_config(environ=env)
    assert str(err.value) == (
        "config error: environment variable GPU_EXPORTER_RULES and environment variable "
        "GPU_EXPORTER_RULES__ENABLED both set rules; give one of them"
    )


def test_two_spellings_of_one_variable_are_a_conflict() -> None:
    env = {"GPU_EXPORTER_LOG_LEVEL": "debug", "GPU_EXPORTER_log_level": "error"}
    with pytest.raises(ConfigError, match=r"GPU_EXPORTER_LOG_LEVEL and .*GPU_EXPORTER_log_level"):
        load_config(environ=env)


def test_a_flag_wins_over_a_variable_around_or_inside_it() -> None:
    # Precedence, not a conflict: the flag replaces what the environment set there.
    env = {"GPU_EXPORTER_ALERTING": "oops", "GPU_EXPORTER_RULES__FILES": "/absent/*.yaml"}
    config = load_config(
        flags={"alerting.external_labels": "cluster=a", "rules.files": ["/x.yaml"]}, environ=env
    )
    assert config.alerting.external_labels == {"cluster": "a"}
    assert config.rules.files == ["/x.yaml"]
    env = {"GPU_EXPORTER_ALERTING__EXTERNAL_LABELS__CLUSTER": "b"}
    config = load_config(flags={"alerting.external_labels": "cluster=a"}, environ=env)
    assert config.alerting.external_labels == {"cluster": "a"}


def test_a_variable_under_a_file_value_that_is_not_a_mapping_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "rules: [a, b]\n")
    config = load_config(path, environ={"GPU_EXPORTER_RULES__ENABLED": "false"})
    assert config.rules.enabled is False
    with pytest.raises(ConfigError, match=r"\.yaml:1: rules: Input should be a valid dictionary"):
        load_config(path, environ={})


_ENV_PARTS = ["rules", "RULES", "enabled", "files", "nvml", "alerting", "external_labels", "", "x"]
_VALUES = ["", "1", "true", "a=b", "k8s-cluster=1", "http://am", "x,y", "=", "a=b,a=c", "\x00"]
_FLAG_KEYS = [
    "interval_seconds",
    "rules.files",
    "alerting.alertmanagers",
    "alerting.external_labels",
]


@settings(derandomize=True, database=None, deadline=None, max_examples=300)
@given(
    env=st.dictionaries(
        st.lists(st.sampled_from(_ENV_PARTS), min_size=1, max_size=3).map(
            lambda parts: "GPU_EXPORTER_" + "__".join(parts)
        ),
        st.sampled_from(_VALUES),
        max_size=4,
    ),
    flags=st.dictionaries(
        st.sampled_from(_FLAG_KEYS),
        st.one_of(st.sampled_from(_VALUES), st.lists(st.sampled_from(_VALUES), max_size=2)),
    ),
)
def test_any_variables_and_flags_give_a_config_or_a_config_error(
    env: dict[str, str], flags: dict[str, object]
) -> None:
    try:
        load_config(flags=flags, environ=env)
    except ConfigError as exc:
        assert str(exc).startswith("config error: "), exc


def test_the_kubelet_grace_reaches_pod_attribution(tmp_path: Path) -> None:
    from gpu_exporter.pipeline.assembly import _attribution

    path = tmp_path / "config.yaml"
    path.write_text("kubernetes:\n  enabled: true\n  stale_after_seconds: 45\n")
    attribution = _attribution(load_config(path, environ={}), clock=lambda: 0.0)
    assert attribution is not None
    assert attribution.settings.stale_after_seconds == 45
    default = _attribution(
        load_config(None, {"kubernetes.enabled": True}, environ={}), clock=lambda: 0.0
    )
    assert default is not None and default.settings.stale_after_seconds is None
    path.write_text("kubernetes:\n  stale_after_seconds: -1\n")
    with pytest.raises(ConfigError, match=r"config.yaml:2: kubernetes.stale_after_seconds"):
        load_config(path, environ={})


def test_dra_settings_and_dra_without_pod_attribution_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("kubernetes:\n  dra:\n    enabled: true\n    drivers: gpu.nvidia.com,x.io\n")
    dra = load_config(path, environ={}).kubernetes.dra
    assert dra.enabled and dra.drivers == ["gpu.nvidia.com", "x.io"]
    assert dra.token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    path.write_text("kubernetes:\n  enabled: false\n  dra:\n    enabled: true\n")
    with pytest.raises(ConfigError, match=r"kubernetes\.dra\.enabled needs pod attribution"):
        load_config(path, environ={})
    path.write_text("kubernetes:\n  dra:\n    drivers: []\n")
    with pytest.raises(ConfigError, match=rf"{path}:3.*kubernetes\.dra\.drivers"):
        load_config(path, environ={})


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("http://10.96.0.1:443", "must be auto or an https:// URL"),
        ("10.96.0.1:6443", "must be auto or an https:// URL"),
        ("https://", "not an https://host"),
        ("https://api.example:x", "not a URL"),
        ("https://api.example:70000", "not a URL"),
    ],
)
def test_the_dra_api_server_must_be_auto_or_https(
    tmp_path: Path, address: str, problem: str
) -> None:
    """The ServiceAccount token goes with every request: never in clear text."""
    path = tmp_path / "config.yaml"
    path.write_text(f"kubernetes:\n  dra:\n    api_server: '{address}'\n")
    with pytest.raises(
        ConfigError, match=rf"config\.yaml:3: kubernetes\.dra\.api_server: .*{problem}"
    ):
        load_config(path, environ={})
    for good in ("auto", "https://api.example:6443", "https://[fd00:10:96::1]:443"):
        path.write_text(f"kubernetes:\n  dra:\n    api_server: '{good}'\n")
        assert load_config(path, environ={}).kubernetes.dra.api_server == good
