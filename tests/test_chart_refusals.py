"""What the daemon refuses at start, the chart refuses at `helm template` time
(templates/_checks.tpl and values.schema.json), with a message naming the values to change:
otherwise the chart renders, installs, and the exporter on every node exits at start and
restarts for ever."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from pydantic import ValidationError

from gpu_exporter.alerting.settings import AlertingConfig
from tests.test_values_schema import CHART, HELM, rendered, rendered_config

AM = "alerting.alertmanagers"
SECRETS = "/etc/gpu-exporter/secrets"
# The image the chart runs by default: values.yaml's repository at the chart's appVersion.
DEFAULT_IMAGE = "{}:{}".format(
    yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"],
    yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"],
)


def refused(*args: str) -> str:
    """helm template's error for these values; fails the test when the render succeeds."""
    assert HELM.exists(), f"{HELM} is missing: run scripts/install-tools.sh"
    result = subprocess.run(
        [str(HELM), "template", "gpu-exporter", str(CHART), "-n", "gpu-exporter", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0, f"rendered: {args}"
    return result.stderr


# --- DCGM: standalone and embedded need libdcgm.so.4 in the image -------------------------


@pytest.mark.parametrize(
    ("args", "key", "mode", "instead"),
    [
        (["--set", "dcgm.mode=embedded"], "dcgm.mode", "embedded", "dcgm.mode=off"),
        (["--set", "dcgm.mode=standalone"], "dcgm.mode", "standalone", "dcgm.mode=auto"),
        # The mode the daemon runs with, wherever it is set.
        (
            ["--set", "config.extra.dcgm.mode=embedded"],
            "config.extra.dcgm.mode",
            "embedded",
            "config.extra.dcgm.mode=off",
        ),
    ],
)
def test_dcgm_modes_that_need_the_library_fail_with_the_default_image(args, key, mode, instead):
    error = refused(*args)
    assert f"{key}={mode} needs DCGM's libdcgm.so.4 in the image" in error
    assert f"image.dcgm=false says {DEFAULT_IMAGE} has none" in error
    assert "Dockerfile's DCGM_DEB argument" in error
    assert "point image.repository/image.tag at it and set image.dcgm=true" in error
    assert f"or set {instead}" in error


def test_an_image_with_dcgm_renders_every_mode_and_auto_needs_none():
    for mode in ("standalone", "embedded", "auto"):
        config = rendered_config("--set", "image.dcgm=true", "--set", f"dcgm.mode={mode}")
        assert config["dcgm"]["mode"] == mode
    # auto turns DCGM off without libdcgm: the default image is fine.
    assert rendered_config("--set", "dcgm.mode=auto")["dcgm"] == {"mode": "auto"}


def test_image_dcgm_is_a_boolean():
    assert "image.dcgm: Invalid type. Expected: boolean" in refused(
        "--set-string", "image.dcgm=yes"
    )


# --- Alertmanagers ------------------------------------------------------------------------

MOUNT = [
    "--set",
    "alerting.secretMounts[0].name=am",
    "--set",
    "alerting.secretMounts[0].secretName=s",
]
SECOND = [
    *("--set", f"{AM}[0].url=http://first:9093"),
    *("--set", f"{AM}[1].url=https://am.monitoring.svc:9093"),
]


def test_basic_auth_and_a_bearer_token_on_one_alertmanager_fail_naming_it_and_both():
    error = refused(
        *MOUNT,
        *SECOND,
        *("--set", f"{AM}[1].bearerTokenFile={SECRETS}/am/token"),
        *("--set", f"{AM}[1].basicAuth.username=gpu-exporter"),
        *("--set", f"{AM}[1].basicAuth.passwordFile={SECRETS}/am/password"),
    )
    assert (
        f"{AM}[1] (https://am.monitoring.svc:9093) sets both basicAuth and bearerTokenFile" in error
    )
    assert "remove one" in error
    # The daemon refuses the same at start.
    with pytest.raises(ValidationError, match="set basic auth or a bearer token, not both"):
        AlertingConfig.model_validate(
            {
                "alertmanagers": [
                    {
                        "url": "https://am.monitoring.svc:9093",
                        "bearer_token": "t",
                        "basic_auth": {"username": "u", "password": "p"},
                    }
                ]
            }
        )


def test_both_auth_kinds_in_config_extra_are_named_as_written_there():
    error = refused(
        "--set-json",
        'config.extra.alerting.alertmanagers=[{"url": "http://am:9093", "bearer_token": "t",'
        ' "basic_auth": {"username": "u", "password": "p"}}]',
    )
    assert (
        "config.extra.alerting.alertmanagers[0] (http://am:9093) sets both basic_auth and "
        "bearer_token" in error
    )


def test_a_client_certificate_without_its_key_fails():
    error = refused(
        *MOUNT,
        *("--set", f"{AM}[0].url=https://am:9093"),
        *("--set", f"{AM}[0].tls.certFile={SECRETS}/am/tls.crt"),
    )
    assert f"{AM}[0] (https://am:9093): set tls.certFile and tls.keyFile together" in error


@pytest.mark.parametrize(
    ("setting", "path", "advice"),
    [
        # Under the secrets directory: the secretMounts entry that would mount it.
        (
            "bearerTokenFile",
            f"{SECRETS}/am/token",
            "add {name: am, secretName: <the Secret holding token>} to alerting.secretMounts",
        ),
        ("tls.caFile", f"{SECRETS}/ca/ca.crt", "add {name: ca, secretName:"),
        (
            "bearerTokenFile",
            "/var/run/am/token",
            "mount it with extraVolumes and extraVolumeMounts",
        ),
    ],
)
def test_a_credential_file_in_no_mounted_volume_fails(setting, path, advice):
    error = refused(*SECOND, "--set", f"{AM}[1].{setting}={path}")
    assert (
        f"{AM}[1] (https://am.monitoring.svc:9093): {setting} {path} is in no volume the pod "
        "mounts, and the daemon refuses a missing file at start" in error
    )
    assert advice in error


def test_credential_files_in_mounted_volumes_render():
    config = rendered_config(
        *MOUNT,
        *("--set", f"{AM}[0].url=https://am:9093"),
        *("--set", f"{AM}[0].basicAuth.username=u"),
        *("--set", f"{AM}[0].basicAuth.passwordFile={SECRETS}/am/password"),
        *("--set", f"{AM}[1].url=https://am-2:9093"),
        *("--set", f"{AM}[1].bearerTokenFile=/var/run/am/token"),
        "--set-json",
        'extraVolumes=[{"name": "t", "secret": {"secretName": "t"}}]',
        "--set-json",
        'extraVolumeMounts=[{"name": "t", "mountPath": "/var/run/am/"}]',
    )
    first, second = config["alerting"]["alertmanagers"]
    assert first["basic_auth"]["password_file"] == f"{SECRETS}/am/password"
    assert second["bearer_token_file"] == "/var/run/am/token"
    # A mount whose name only starts like the file's directory does not count.
    error = refused(*SECOND, "--set", f"{AM}[1].bearerTokenFile={SECRETS}/amx/token", *MOUNT)
    assert f"bearerTokenFile {SECRETS}/amx/token is in no volume" in error


# --- resources ----------------------------------------------------------------------------


@pytest.mark.parametrize("amount", ["256MB", "256 Mi", "1.5.0Gi", "Mi", "-256Mi"])
def test_a_memory_limit_that_is_not_a_quantity_fails_naming_it(amount):
    error = refused("--set-string", f"resources.limits.memory={amount}")
    assert f'resources.limits.memory: "{amount}" is not a Kubernetes quantity' in error
    assert "e.g. 256Mi" in error


def test_a_negative_number_is_refused_by_the_schema():
    error = refused("--set", "resources.requests.cpu=-1")
    assert "resources.requests.cpu: Must be greater than or equal to 0" in error


@pytest.mark.parametrize("amount", ["256Mi", "0.25Gi", "500m", "1G", "1e9", "+1Ki", ".5", "2"])
def test_kubernetes_quantities_render_as_given(amount):
    (daemonset,) = [
        o
        for o in rendered("--set-string", f"resources.limits.memory={amount}")
        if o["kind"] == "DaemonSet"
    ]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == amount
