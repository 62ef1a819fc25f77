"""The chart's values.schema.json, whose daemon-settings parts scripts/gen-values-schema.py
generates from the configuration model: it is up to date, it refuses what the daemon refuses,
the real helm refuses bad settings naming them and accepts numbers given with --set, and what
the chart renders passes `gpu-exporter config check`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from gpu_exporter.collect.settings import NvmlConfig
from gpu_exporter.config.load import Config, load_config
from tests.tlsfiles import make_pki

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "gpu-exporter"
HELM = ROOT / ".tools" / "bin" / "helm"
GENERATOR = ROOT / "scripts" / "gen-values-schema.py"


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_values_schema", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM.exists(), f"{HELM} is missing: run scripts/install-tools.sh"
    return subprocess.run(
        [str(HELM), "template", "gpu-exporter", str(CHART), "-n", "gpu-exporter", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def rendered(*args: str) -> list[dict[str, Any]]:
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def rendered_config(*args: str) -> dict[str, Any]:
    (configmap,) = [
        o
        for o in rendered("--show-only", "templates/configmap.yaml", *args)
        if o["kind"] == "ConfigMap"
    ]
    return yaml.safe_load(configmap["data"]["config.yaml"])


# --- generated from the model ---------------------------------------------------------------


def test_the_committed_schema_is_what_the_generator_writes():
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_the_generator_rewrites_its_parts_and_keeps_the_hand_written_rest():
    gen = generator()
    committed = schema()
    stale = json.loads(json.dumps(committed))
    config = stale["properties"]["config"]["properties"]
    config["extra"] = {"type": "object"}  # what the chart had: any typo passed
    del config["nvml"]["properties"]["max_devices"]
    config["intervalSeconds"] = {"type": "number"}
    stale["properties"]["image"]["properties"]["tag"]["maxLength"] = 7  # hand-written
    regenerated = gen.generate(stale)
    assert regenerated["properties"]["image"]["properties"]["tag"]["maxLength"] == 7
    del regenerated["properties"]["image"]["properties"]["tag"]["maxLength"]
    assert gen.render(regenerated) == (CHART / "values.schema.json").read_text()


def test_every_schema_reference_is_inlined():
    def refs(node: Any) -> list[str]:
        if isinstance(node, dict):
            here = [node["$ref"]] if "$ref" in node else []
            return here + [r for v in node.values() for r in refs(v)]
        if isinstance(node, list):
            return [r for v in node for r in refs(v)]
        return []

    config = schema()["properties"]["config"]["properties"]
    assert refs(config["extra"]) == [] and refs(config["nvml"]) == []
    assert set(config["nvml"]["properties"]) == set(NvmlConfig.model_fields)


# Settings as a values file gives them under config.extra: (settings, the daemon accepts them).
SAMPLES = [
    ({"nvml": {"max_devices": 8, "gpm": False}}, True),
    ({"classifier": {"idle_utilization": 0.1, "window_seconds": None}}, True),
    ({"interval_seconds": "0.5"}, True),  # as `--set` gives it
    ({"kubernetes": {"enabled": "auto", "refresh_seconds": 20}}, True),
    ({"alerting": {"alertmanagers": [{"url": "http://am:9093", "timeout_seconds": 3}]}}, True),
    ({"nvml_typo": 1}, False),
    ({"nvml": {"typo": 1}}, False),
    ({"nvml": {"max_devices": 0}}, False),
    ({"nvml": {"max_devices": "many"}}, False),
    ({"classifier": {"idle_utilization": 2}}, False),
    ({"log_level": "loud"}, False),
    ({"kubernetes": {"mode": "everything"}}, False),
    ({"alerting": {"alertmanagers": [{"timeout_seconds": 3}]}}, False),
    ({"alerting": {"external_labels": {"cluster": ""}}}, False),
    ({"rules": {"history_max_bytes": 1}}, False),
    ({"dcgm": {"mode": "standalone", "address": "nvidia-dcgm.gpu-operator.svc:5555"}}, True),
    ({"dcgm": {"mode": "auto", "fields": [1001, 1002, 1013]}}, True),
    ({"dcgm": {"mode": "sometimes"}}, False),
    ({"dcgm": {"address": ""}}, False),  # the chart's dcgm.address "" is no setting at all
    ({"dcgm": {"fields": []}}, False),
    ({"dcgm": {"typo": 1}}, False),
]


@pytest.mark.parametrize(("settings", "accepted"), SAMPLES, ids=[json.dumps(s) for s, _ in SAMPLES])
def test_config_extra_refuses_what_the_daemon_refuses(settings, accepted):
    extra = schema()["properties"]["config"]["properties"]["extra"]
    schema_accepts = jsonschema.Draft7Validator(extra).is_valid(settings)
    try:
        Config.model_validate(settings)
        daemon_accepts = True
    except ValidationError:
        daemon_accepts = False
    assert (schema_accepts, daemon_accepts) == (accepted, accepted)


# --- the real helm ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("config.extra.nvml_typo=1", "config.extra: Additional property nvml_typo is not allowed"),
        ("config.extra.nvml.typo=1", "config.extra.nvml: Additional property typo is not allowed"),
        ("config.nvml.typo=1", "config.nvml: Additional property typo is not allowed"),
        ("config.extra.nvml.gpm=maybe", "config.extra.nvml.gpm: Invalid type"),
        ("config.extra.nvml.max_devices=many", "config.extra.nvml.max_devices: Does not match"),
        ("config.extra.nvml.max_devices=0", "config.extra.nvml.max_devices: Must be greater"),
        ("config.extra.classifier.idle_utilization=2", "idle_utilization: Must be less than"),
        ("config.intervalSeconds=fast", "config.intervalSeconds: Does not match"),
        ("config.intervalSeconds=7200", "config.intervalSeconds: Must be less than"),
        ("dcgm.mode=sometimes", "dcgm.mode: dcgm.mode must be one of the following"),
        ("config.extra.dcgm.mode=sometimes", "config.extra.dcgm.mode: config.extra.dcgm.mode"),
        ("config.extra.dcgm.fields=1001", "config.extra.dcgm.fields: Invalid type"),
        ("processAttribution.refreshSeconds=0", "processAttribution.refreshSeconds: Must be"),
        ("processAttribution.timeoutSeconds=0", "processAttribution.timeoutSeconds: Must be"),
        ("processAttribution.timeoutSeconds=soon", "processAttribution.timeoutSeconds: Does not"),
        ("processAttribution.procMount=hostPath", "Additional property procMount is not allowed"),
        (
            "processAttribution.runtimeSocket=run/crio.sock",
            "processAttribution.runtimeSocket: Does",
        ),
        ("processAttribution.socket=/run/x.sock", "Additional property socket is not allowed"),
        ("podAttribution.dra.enabled=maybe", "podAttribution.dra.enabled: Invalid type"),
        ("podAttribution.dra.timeoutSeconds=0", "podAttribution.dra.timeoutSeconds: Must be"),
        ("podAttribution.dra.timeoutSeconds=301", "podAttribution.dra.timeoutSeconds: Must be"),
        ("podAttribution.dra.timeoutSeconds=soon", "podAttribution.dra.timeoutSeconds: Does not"),
        ("podAttribution.dra.drivers=gpu.nvidia.com", "podAttribution.dra.drivers: Invalid type"),
        (
            "podAttribution.dra.tokenExpirationSeconds=599",
            "podAttribution.dra.tokenExpirationSeconds: Must be greater than or equal to 600",
        ),
        (
            "podAttribution.dra.tokenExpirationSeconds=4294967296",
            "podAttribution.dra.tokenExpirationSeconds: Must be less than or equal to",
        ),
        ("podAttribution.dra.tokenExpirationSeconds=1h", "tokenExpirationSeconds: Invalid type"),
        ("podAttribution.dra.audience=x", "podAttribution.dra: Additional property audience"),
    ],
)
def test_helm_refuses_a_bad_daemon_setting_naming_it(setting, message):
    result = helm("--set", setting)
    assert result.returncode != 0, result.stdout
    assert message in result.stderr, result.stderr


def test_set_gives_numbers_the_daemon_reads_as_numbers():
    config = rendered_config(
        "--set", "config.intervalSeconds=0.5",
        "--set", "podAttribution.refreshSeconds=2.5",
        "--set", "podAttribution.timeoutSeconds=0.5",
        "--set", "rules.evaluationIntervalSeconds=1.5",
        "--set", "alerting.resendDelaySeconds=30.5",
        "--set-string", "alerting.queueCapacity=500",
        "--set", "alerting.alertmanagers[0].url=http://am:9093",
        "--set", "alerting.alertmanagers[0].timeoutSeconds=2.5",
    )  # fmt: skip
    assert config["interval_seconds"] == 0.5
    assert (config["kubernetes"]["refresh_seconds"], config["kubernetes"]["timeout_seconds"]) == (
        2.5,
        0.5,
    )
    assert config["rules"]["evaluation_interval_seconds"] == 1.5
    alerting = config["alerting"]
    assert (alerting["resend_delay_seconds"], alerting["queue_capacity"]) == (30.5, 500)
    assert alerting["alertmanagers"][0]["timeout_seconds"] == 2.5
    assert isinstance(alerting["queue_capacity"], int)


def test_process_attribution_numbers_and_limits_are_the_daemons():
    """processAttribution.refreshSeconds and timeoutSeconds are kubernetes.processes'
    refresh_seconds and timeout_seconds, generated from the model, and --set numbers reach the
    daemon as numbers."""
    properties = schema()["properties"]
    chart = properties["processAttribution"]["properties"]
    model = properties["config"]["properties"]["extra"]["properties"]["kubernetes"]
    setting = model["properties"]["processes"]["properties"]
    for value, name in (
        ("refreshSeconds", "refresh_seconds"),
        ("timeoutSeconds", "timeout_seconds"),
    ):
        assert {k: v for k, v in chart[value].items() if k != "$comment"} == setting[name]
    config = rendered_config(
        "--set", "processAttribution.enabled=true",
        "--set", "processAttribution.refreshSeconds=2.5",
        "--set", "processAttribution.timeoutSeconds=0.5",
    )  # fmt: skip
    processes = config["kubernetes"]["processes"]
    assert (processes["refresh_seconds"], processes["timeout_seconds"]) == (2.5, 0.5)
    loaded = Config.model_validate(config).kubernetes.processes
    assert (loaded.refresh_seconds, loaded.timeout_seconds) == (2.5, 0.5)


def test_dra_numbers_lists_and_limits_are_the_daemons():
    """podAttribution.dra.drivers and timeoutSeconds are kubernetes.dra's drivers and
    timeout_seconds, generated from the model (an empty list of drivers is refused as the
    daemon refuses it), and reach the daemon as a list and a number."""
    properties = schema()["properties"]
    chart = properties["podAttribution"]["properties"]["dra"]["properties"]
    model = properties["config"]["properties"]["extra"]["properties"]["kubernetes"]
    setting = model["properties"]["dra"]["properties"]
    for value, name in (("drivers", "drivers"), ("timeoutSeconds", "timeout_seconds")):
        assert {k: v for k, v in chart[value].items() if k != "$comment"} == setting[name]
    empty = helm(
        "--set", "podAttribution.dra.enabled=true", "--set-json", "podAttribution.dra.drivers=[]"
    )
    assert empty.returncode != 0
    assert "podAttribution.dra.drivers: Array must have at least 1 items" in empty.stderr
    config = rendered_config(
        "--set", "podAttribution.dra.enabled=true",
        "--set", "podAttribution.dra.timeoutSeconds=2.5",
        "--set-json", 'podAttribution.dra.drivers=["gpu.nvidia.com","gpu.example.com"]',
    )  # fmt: skip
    dra = config["kubernetes"]["dra"]
    assert (dra["timeout_seconds"], dra["drivers"]) == (2.5, ["gpu.nvidia.com", "gpu.example.com"])
    loaded = Config.model_validate(config).kubernetes.dra
    assert (loaded.enabled, loaded.timeout_seconds) == (True, 2.5)
    assert loaded.drivers == ["gpu.nvidia.com", "gpu.example.com"]


def test_a_valid_extra_setting_reaches_the_daemon_and_may_replace_the_charts(tmp_path):
    config = rendered_config(
        "--set", "config.extra.classifier.idle_utilization=0.1",
        "--set", "config.extra.nvml.max_devices=8",
        "--set", "config.extra.kubernetes.refresh_seconds=20",
        "--set", "config.nvml.slow_refresh_seconds=60",
    )  # fmt: skip
    assert config["kubernetes"]["refresh_seconds"] == 20  # over the chart's 10
    assert config["kubernetes"]["mode"] == "labels"  # the rest of the chart's section stays
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path, environ={})
    assert loaded.classifier.idle_utilization == 0.1
    assert (loaded.nvml.max_devices, loaded.nvml.slow_refresh_seconds) == (8, 60)


def test_the_chart_dcgm_address_accepts_empty_for_the_daemon_default():
    """The chart's dcgm.address is the model's setting but for "" (the chart then writes no
    address and the daemon uses its own default), which the setting itself refuses."""
    chart = schema()["properties"]["dcgm"]["properties"]
    setting = schema()["properties"]["config"]["properties"]["extra"]["properties"]["dcgm"]
    address = setting["properties"]["address"]
    assert address["minLength"] == 1
    assert {k: v for k, v in chart["address"].items() if k != "$comment"} == {
        k: v for k, v in address.items() if k != "minLength"
    }
    assert chart["mode"]["enum"] == setting["properties"]["mode"]["enum"]
    validator = jsonschema.Draft7Validator(schema()["properties"]["dcgm"])
    assert validator.is_valid({"mode": "off", "address": ""})
    assert not validator.is_valid({"mode": "off", "address": "x" * 4097})
    assert not validator.is_valid({"mode": False})  # a bare `off` in a values file
    gen = generator()
    assert set(gen.EMPTY_MEANS_DEFAULT) <= set(gen.GENERATED_LEAVES)


def pod_files(objects: list[dict[str, Any]], root: Path) -> Path:
    """The files the DaemonSet's container sees, under `root`: the chart's ConfigMaps and
    Secrets as rendered, stand-ins for Secrets the chart does not create and for what the
    kubelet projects (a ServiceAccount token, the cluster's kube-root-ca.crt). Returns the
    config."""
    pki = make_pki(root.parent / "pki")
    data = {
        (o["kind"], o["metadata"]["name"]): o.get("data") or o.get("stringData") or {}
        for o in objects
        if o["kind"] in ("ConfigMap", "Secret")
    }
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in pod["containers"][0]["volumeMounts"]:
        volume = volumes[mount["name"]]
        directory = root / mount["mountPath"].lstrip("/")
        if "configMap" in volume:
            files = data[("ConfigMap", volume["configMap"]["name"])]
        elif "secret" in volume and ("Secret", volume["secret"]["secretName"]) in data:
            files = data[("Secret", volume["secret"]["secretName"])]
        elif "secret" in volume:  # the user's: TLS files, Alertmanager credentials
            files = {
                "tls.crt": pki.server_cert.read_text(),
                "tls.key": pki.server_key.read_text(),
                **{name: "stand-in\n" for name in ("password", "token", "ca.crt")},
            }
        elif "projected" in volume:  # the kubelet's: a token, the cluster's CA
            files = {}
            for source in volume["projected"]["sources"]:
                if "serviceAccountToken" in source:
                    files[source["serviceAccountToken"]["path"]] = "stand-in.token.jwt\n"
                for item in source.get("configMap", {}).get("items", []):
                    files[item["path"]] = pki.ca.read_text()
        else:
            continue
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text)
    args = pod["containers"][0]["args"]
    return root / args[args.index("--config") + 1].lstrip("/")


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["-f", str(CHART / "ci" / "all-on-values.yaml")],
        [
            "--set",
            "image.dcgm=true",
            "--set",
            "dcgm.mode=standalone",
            "--set",
            "dcgm.address=nvidia-dcgm.gpu-operator.svc:5555",
        ],
        ["--set", "dcgm.mode=auto", "--set", "dcgm.address=unix:/run/dcgm/hostengine.sock"],
        [
            *("--set", "image.dcgm=true", "--set", "dcgm.mode=embedded"),
            *("--set-json", "config.extra.dcgm.fields=[1001,1013]"),
        ],
        ["--set", "processAttribution.enabled=true"],
        ["--set", "podAttribution.dra.enabled=true"],
    ],
    ids=[
        "defaults",
        "all-on",
        "dcgm-standalone",
        "dcgm-auto-unix",
        "dcgm-embedded",
        "process-attribution",
        "dra",
    ],
)
def test_the_rendered_configuration_passes_config_check(values, tmp_path):
    root = tmp_path / "pod"
    config = pod_files(rendered(*values), root)
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "config", "check", "--root", str(root), str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{config}: OK\n"


def test_the_dra_token_and_ca_are_where_the_configuration_points(tmp_path):
    """With podAttribution.dra on, the files the pod sees include the projected token and CA at
    the paths the daemon's kubernetes.dra names."""
    root = tmp_path / "pod"
    config = pod_files(rendered("--set", "podAttribution.dra.enabled=true"), root)
    dra = load_config(config, environ={}).kubernetes.dra
    assert dra.enabled is True
    for path in (dra.token_file, dra.ca_file):
        assert (root / path.lstrip("/")).is_file(), path
    assert (root / dra.token_file.lstrip("/")).read_text() == "stand-in.token.jwt\n"
