"""Deployment files checked by the real tools: helm, kubectl kustomize, kubernetes-validate,
promtool and hadolint (scripts/check-deploy.sh runs them; scripts/install-tools.sh installs
them), plus what the rendered objects must say: the DaemonSet tolerates GPU taints, runs without
capabilities on a read-only root filesystem, mounts pod-resources read-only and probes
/healthz and /readyz; the ServiceMonitor relabels `node`; generated files are up to date.

A missing tool fails these tests: CI installs the tools, and a check that quietly skips is a
check that never runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter.config.load import Config

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "gpu-exporter"
TOOLS = ROOT / ".tools" / "bin"
VENV_BIN = Path(sys.executable).parent
HELM = TOOLS / "helm"
SCRIPT = ROOT / "scripts" / "check-deploy.sh"

# check-deploy.sh render writes these; deploy-* come from kustomize, chart-* from helm.
VARIANTS = [
    "deploy",
    "deploy-restricted",
    "deploy-no-operator",
    "deploy-process-attribution",
    "chart-default",
    "chart-operator",
    "chart-all-on",
    "chart-restricted",
    "chart-process-attribution",
    "chart-dra",
    "deploy-dra",
    "deploy-dra-process-attribution",
]
ATTRIBUTION_OFF = {"deploy-restricted", "chart-restricted"}
# Per-process attribution on (the host's /proc and the CRI socket mounted): the socket each mounts.
PROCESSES = {
    "deploy-process-attribution": "/run/containerd/containerd.sock",
    "chart-process-attribution": "/run/containerd/containerd.sock",
    "chart-all-on": "/var/run/crio/crio.sock",  # given as unix:///var/run/crio/crio.sock
    "deploy-dra-process-attribution": "/run/containerd/containerd.sock",
}
# DRA attribution on (ResourceSlices read from the API server): the projected token's lifetime
# and the DRA drivers each variant's daemon reads.
DRA = {
    "chart-dra": (3600, ["gpu.nvidia.com"]),
    "chart-all-on": (7200, ["gpu.nvidia.com", "gpu.example.com"]),
    "deploy-dra": (3600, ["gpu.nvidia.com"]),
    "deploy-dra-process-attribution": (3600, ["gpu.nvidia.com"]),
}
RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
OPERATOR = {"deploy", "chart-operator", "chart-all-on"}


def _env() -> dict[str, str]:
    # check-deploy.sh finds the venv tools through _venv.sh: point it at this interpreter's venv.
    return {**os.environ, "GPU_EXPORTER_DEV_VENV": str(VENV_BIN.parent)}


def run_step(*steps: str, out: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = ["bash", str(SCRIPT), *steps] + (["-o", str(out)] if out else [])
    result = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (
        f"check-deploy.sh {' '.join(steps)}:\n{result.stdout}{result.stderr}"
    )
    return result


@pytest.fixture(scope="session")
def tools() -> None:
    missing = [
        str(path)
        for path in (
            HELM,
            TOOLS / "kubectl",
            VENV_BIN / "kubernetes-validate",
            VENV_BIN / "hadolint",
        )
        if not os.access(path, os.X_OK)
    ]
    if shutil.which("promtool") is None:
        missing.append("promtool (Debian package prometheus)")
    assert not missing, f"missing: {', '.join(missing)}; run scripts/install-tools.sh"


@pytest.fixture(scope="session")
def rendered(tools, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rendered")
    run_step("render", out=out)
    return out


def docs(rendered: Path, variant: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((rendered / f"{variant}.yaml").read_text()) if d]


def one(objects: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"expected one {kind}*{suffix}, found {len(found)}"
    return found[0]


def helm_template(*args: str, chart: Path = CHART) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(HELM), "template", "gpu-exporter", str(chart), "-n", "gpu-exporter", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


# --- the tools' own verdicts ----------------------------------------------------------------


def test_generated_files_are_up_to_date(tools):
    run_step("generated")


def test_helm_lint_strict(tools):
    run_step("lint")


def test_kubernetes_validate_strict_oldest_and_newest(rendered):
    run_step("validate", out=rendered)


def test_promtool_checks_and_tests_the_rendered_rules(rendered):
    run_step("rules", out=rendered)


def test_hadolint(tools):
    run_step("hadolint")


# --- what the rendered objects say ----------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_daemonset_defaults(rendered, variant):
    daemonset = one(docs(rendered, variant), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]

    tolerations = pod["tolerations"]
    assert any(
        t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists" and "effect" not in t
        for t in tolerations
    ), tolerations
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["automountServiceAccountToken"] is False
    # The host's PID namespace only for per-process attribution (NVML's PIDs are the caller's).
    assert pod.get("hostPID", False) is (variant in PROCESSES)
    assert pod.get("hostNetwork", False) is False
    assert daemonset["spec"]["updateStrategy"]["type"] == "RollingUpdate"

    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))  # no GPU requested

    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security.get("privileged", False) is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert not security["capabilities"].get("add")
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"

    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    limits = container["resources"]["limits"]
    assert limits["memory"] == "256Mi" and container["resources"]["requests"]["memory"]


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - ATTRIBUTION_OFF))
def test_pod_attribution_mounts_pod_resources_read_only(rendered, variant):
    objects = docs(rendered, variant)
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert volumes["pod-resources"]["hostPath"] == {
        "path": "/var/lib/kubelet/pod-resources",
        "type": "Directory",
    }
    assert mounts["pod-resources"]["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"] is True
    # Every other hostPath would be a surprise (per-process attribution's are checked below).
    want = ["cri-socket", "pod-resources"] if variant in PROCESSES else ["pod-resources"]
    assert sorted(v["name"] for v in pod["volumes"] if "hostPath" in v) == want
    # The kubelet's socket is root-only (directory 0750, socket 0755, root:root): UID 0, but
    # with no capabilities at all (asserted above), so it cannot bypass file permissions.
    assert pod["securityContext"]["runAsUser"] == 0
    config = yaml.safe_load(one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"])
    assert config["kubernetes"]["enabled"] is True
    assert config["kubernetes"]["socket_path"] == "/var/lib/kubelet/pod-resources/kubelet.sock"


@pytest.mark.parametrize("variant", sorted(ATTRIBUTION_OFF))
def test_without_attribution_runs_as_non_root_without_host_paths(rendered, variant):
    objects = docs(rendered, variant)
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert not [v for v in pod["volumes"] if "hostPath" in v]
    config = yaml.safe_load(one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"])
    assert config["kubernetes"]["enabled"] is False


def _loaded_config(rendered: Path, variant: str) -> Config:
    """The variant's daemon configuration as the daemon loads it: the ConfigMap's file and the
    container's literal environment variables (credential files stood in)."""
    from gpu_exporter.config.load import load_config

    objects = docs(rendered, variant)
    text = one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"]
    secrets = rendered / f"{variant}.secrets" / "am"
    secrets.mkdir(parents=True, exist_ok=True)
    for name in ("password", "ca.crt", "token"):
        (secrets / name).write_text("x\n")
    path = rendered / f"{variant}.loaded.yaml"
    path.write_text(text.replace("/etc/gpu-exporter/secrets/", f"{secrets.parent}/"))
    (container,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    environ = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return load_config(path, environ=environ)


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - set(PROCESSES)))
def test_process_attribution_is_off_without_host_proc_or_runtime_socket(rendered, variant):
    objects = docs(rendered, variant)
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    paths = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert not [p for p in paths if p == "/proc" or p.endswith(".sock")], paths
    assert not [v for v in pod["volumes"] if v.get("hostPath", {}).get("type") == "Socket"]
    mounts = [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]]
    assert not [m for m in mounts if m.startswith("/host") or "proc" in m], mounts
    assert pod.get("hostPID", False) is False
    text = one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"]
    assert "processes" not in yaml.safe_load(text)["kubernetes"]
    config = _loaded_config(rendered, variant)
    assert config.kubernetes.processes.enabled is False and config.nvml.processes is False


@pytest.mark.parametrize("variant", sorted(PROCESSES))
def test_process_attribution_shares_the_host_pid_namespace_and_mounts_the_socket_read_only(
    rendered, variant
):
    """The host's PID namespace (NVML lists only the caller's namespace's processes) and its
    own /proc, the CRI socket read-only where the daemon's configuration (as the daemon loads
    it) looks for it; the security context of pod attribution (UID 0, no capabilities) stays."""
    objects = docs(rendered, variant)
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert pod["hostPID"] is True
    assert not [v for v in volumes.values() if v.get("hostPath", {}).get("path") == "/proc"]
    assert volumes["cri-socket"]["hostPath"] == {"path": PROCESSES[variant], "type": "Socket"}
    assert mounts["cri-socket"]["readOnly"] is True, mounts["cri-socket"]
    assert "subPath" not in mounts["cri-socket"]
    assert "mountPropagation" not in mounts["cri-socket"]

    config = _loaded_config(rendered, variant)
    processes = config.kubernetes.processes
    assert processes.enabled is True and config.nvml.processes is True
    assert processes.proc_root == "/proc"
    assert processes.runtime_socket == mounts["cri-socket"]["mountPath"] == "/host/cri.sock"
    assert config.kubernetes.active()  # the kubelet's holders, which the shares need
    want = (5, 1) if variant == "chart-all-on" else (10, 2)
    assert (processes.refresh_seconds, processes.timeout_seconds) == want

    # The same posture as pod attribution without it: UID 0, no capabilities, read-only root.
    base = "deploy" if variant.startswith("deploy") else "chart-default"
    base_pod = one(docs(rendered, base), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"] == base_pod["securityContext"]
    assert container["securityContext"] == base_pod["containers"][0]["securityContext"]
    assert pod["securityContext"]["runAsUser"] == 0
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_process_attribution_component_is_the_base_configuration_plus_processes(rendered):
    """components/process-attribution replaces deploy/configmap.yaml's file as a whole (a string
    kustomize cannot patch inside): everything but kubernetes.processes must stay the same."""

    def config(variant: str) -> dict[str, Any]:
        text = one(docs(rendered, variant), "ConfigMap", "gpu-exporter")["data"]["config.yaml"]
        return yaml.safe_load(text)

    base, component = config("deploy"), config("deploy-process-attribution")
    processes = component["kubernetes"].pop("processes")
    assert component == base
    assert processes == {
        "enabled": True,
        "proc_root": "/proc",
        "runtime_socket": "/host/cri.sock",
        "refresh_seconds": 10,
        "timeout_seconds": 2,
    }
    # Everything else in the component's output is deploy/'s.
    others = [o for o in docs(rendered, "deploy") if o["kind"] not in ("ConfigMap", "DaemonSet")]
    assert others == [
        o
        for o in docs(rendered, "deploy-process-attribution")
        if o["kind"] not in ("ConfigMap", "DaemonSet")
    ]


def _kustomize(directory: Path, kustomization: str) -> list[dict[str, Any]]:
    (directory / "kustomization.yaml").write_text(kustomization)
    result = subprocess.run(
        [str(TOOLS / "kubectl"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def test_process_attribution_component_takes_another_runtime_socket(tools, tmp_path):
    """The by-name patch docs/kubernetes.md gives for another runtime's socket (CRI-O's)
    replaces the volume's path and keeps the mount."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    (example,) = [yaml.safe_load(b) for b in blocks if "name: cri-socket" in b]
    rel = os.path.relpath(ROOT / "deploy", tmp_path)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [rel],
        "components": [f"{rel}/components/process-attribution"],
        "patches": example["patches"],
    }
    objects = _kustomize(tmp_path, yaml.safe_dump(kustomization))
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    sockets = [v for v in pod["volumes"] if v["name"] == "cri-socket"]
    assert sockets == [
        {"name": "cri-socket", "hostPath": {"path": "/var/run/crio/crio.sock", "type": "Socket"}}
    ]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["cri-socket"] == {
        "name": "cri-socket",
        "mountPath": "/host/cri.sock",
        "readOnly": True,
    }


@pytest.mark.parametrize("socket", ["/run/k0s/containerd.sock", "unix:///run/k0s/containerd.sock"])
def test_chart_process_attribution_takes_the_runtime_socket_with_or_without_unix(
    tools, tmp_path, socket
):
    """The pod shares the host's PID namespace and reads its own /proc (no /proc mount); the
    socket is mounted by its path, given with unix:// or not."""
    args = ["--set", "processAttribution.enabled=true"]
    args += ["--set", f"processAttribution.runtimeSocket={socket}"]
    objects = helm_template(*args)
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "host-proc" not in volumes
    assert volumes["cri-socket"]["hostPath"] == {
        "path": "/run/k0s/containerd.sock",
        "type": "Socket",
    }
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["cri-socket"]["readOnly"] is True and "host-proc" not in mounts
    text = one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"]
    processes = Config.model_validate(yaml.safe_load(text)).kubernetes.processes
    assert (processes.enabled, processes.proc_root, processes.runtime_socket) == (
        True,
        "/proc",
        mounts["cri-socket"]["mountPath"],
    )
    _, default_pod, default_container = _dcgm_render()
    assert pod["securityContext"] == default_pod
    assert pod["containers"][0]["securityContext"] == default_container
    # hostPID alone, without per-process attribution, still works as before.
    plain = one(helm_template("--set", "hostPID=true"), "DaemonSet")["spec"]["template"]["spec"]
    assert plain["hostPID"] is True and "cri-socket" not in {v["name"] for v in plain["volumes"]}


# --- DRA attribution (docs/kubernetes.md "DRA (ResourceClaims)") ---------------------------

DRA_ENV = "GPU_EXPORTER_KUBERNETES__DRA__"  # components/dra's settings, over the file


@pytest.mark.parametrize("variant", sorted(DRA))
def test_dra_rbac_allows_only_reading_resource_slices(rendered, variant):
    """One ClusterRole, get, list and watch on resourceslices of resource.k8s.io and nothing
    else, bound to the ServiceAccount the DaemonSet runs as and to nothing else."""
    objects = docs(rendered, variant)
    assert sorted(o["kind"] for o in objects if o["kind"] in RBAC_KINDS) == [
        "ClusterRole",
        "ClusterRoleBinding",
    ]
    role, binding = one(objects, "ClusterRole"), one(objects, "ClusterRoleBinding")
    assert role["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    assert "aggregationRule" not in role
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(objects, "ServiceAccount")
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]
    # The account still carries no token for every pod: only the exporter's container gets one.
    assert account["automountServiceAccountToken"] is False


@pytest.mark.parametrize("variant", sorted(DRA))
def test_dra_projects_a_token_and_the_ca_read_only_where_the_daemon_reads_them(rendered, variant):
    """A token bound to the pod, for the API server's audience, and the cluster's CA, in one
    projected volume mounted read-only in the container at the paths the daemon's
    configuration (as the daemon loads it) names; NODE_NAME from the downward API for the
    daemon's node_name "". Pod attribution's posture stays (UID 0, no capabilities)."""
    objects = docs(rendered, variant)
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is False
    (volume,) = [v for v in pod["volumes"] if "projected" in v]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert "subPath" not in mount  # a subPath mount would never see the renewed token
    lifetime, drivers = DRA[variant]
    token, ca = volume["projected"]["sources"]
    assert token == {"serviceAccountToken": {"path": "token", "expirationSeconds": lifetime}}
    assert ca == {
        "configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    }

    config = _loaded_config(rendered, variant)
    dra = config.kubernetes.dra
    assert dra.enabled is True and config.kubernetes.active()
    assert dra.token_file == f"{mount['mountPath']}/token"
    assert dra.ca_file == f"{mount['mountPath']}/ca.crt"
    assert (dra.api_server, dra.node_name, dra.drivers) == ("auto", "", drivers)
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}

    base = "deploy" if variant.startswith("deploy") else "chart-default"
    base_pod = one(docs(rendered, base), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"] == base_pod["securityContext"]
    assert container["securityContext"] == base_pod["containers"][0]["securityContext"]


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - set(DRA)))
def test_without_dra_there_is_no_token_and_no_rbac(rendered, variant):
    """No Role or binding, no token anywhere, the daemon's kubernetes.dra off. (NODE_NAME stays:
    it is the `node` label of the daemon's own alerts, test_daemonset_defaults.)"""
    objects = docs(rendered, variant)
    assert not [o["kind"] for o in objects if o["kind"] in RBAC_KINDS]
    assert one(objects, "ServiceAccount")["automountServiceAccountToken"] is False
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is False
    assert not [v["name"] for v in pod["volumes"] if "projected" in v]
    assert not [m for m in container["volumeMounts"] if m["mountPath"].startswith("/var/run")]
    assert not [e for e in container["env"] if e["name"].startswith(DRA_ENV)]
    text = one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"]
    assert "dra" not in yaml.safe_load(text)["kubernetes"]
    assert _loaded_config(rendered, variant).kubernetes.dra.enabled is False


def _without_dra(daemonset: dict[str, Any]) -> dict[str, Any]:
    """The DaemonSet less what components/dra adds: the token's volume and mount, DRA_ENV."""
    daemonset = json.loads(json.dumps(daemonset))
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "api-token"]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "api-token"]
    container["env"] = [e for e in container["env"] if not e["name"].startswith(DRA_ENV)]
    return daemonset


@pytest.mark.parametrize(
    ("variant", "base"),
    [("deploy-dra", "deploy"), ("deploy-dra-process-attribution", "deploy-process-attribution")],
)
def test_dra_component_leaves_the_configuration_file_and_combines_with_process_attribution(
    rendered, variant, base
):
    """components/dra turns kubernetes.dra on through environment variables, so it leaves
    config.yaml as it is, and components/process-attribution (which replaces that file) still
    works beside it: the daemon loads both. It adds only the RBAC objects, the token's volume
    and mount, and the variables."""
    objects, base_objects = docs(rendered, variant), docs(rendered, base)
    assert one(objects, "ConfigMap", "gpu-exporter") == one(
        base_objects, "ConfigMap", "gpu-exporter"
    )
    assert _without_dra(one(objects, "DaemonSet")) == one(base_objects, "DaemonSet")
    (container,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in container["env"] if DRA_ENV in e["name"]} == {
        f"{DRA_ENV}ENABLED": "true",
        f"{DRA_ENV}TOKEN_FILE": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        f"{DRA_ENV}CA_FILE": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
    }
    assert [o for o in objects if o["kind"] not in ("DaemonSet", *RBAC_KINDS)] == [
        o for o in base_objects if o["kind"] != "DaemonSet"
    ]
    loaded = _loaded_config(rendered, variant).kubernetes
    assert loaded.dra.enabled is True
    assert loaded.processes.enabled is (variant in PROCESSES)


def test_dra_component_in_another_namespace_with_the_documented_patch(tools, tmp_path):
    """kustomize's namespace transformer leaves a ClusterRoleBinding's subjects alone (but for
    ServiceAccounts named default): the patch docs/kubernetes.md gives moves the subject along
    with the ServiceAccount."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    (example,) = [yaml.safe_load(b) for b in blocks if "name: gpu-exporter-dra" in b]
    rel = os.path.relpath(ROOT / "deploy", tmp_path)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [rel],
        "components": [f"{rel}/components/dra"],
        **example,
    }
    objects = _kustomize(tmp_path, yaml.safe_dump(kustomization))
    account = one(objects, "ServiceAccount")
    assert account["metadata"]["namespace"] == example["namespace"] != "gpu-exporter"
    (subject,) = one(objects, "ClusterRoleBinding")["subjects"]
    assert subject == {
        "kind": "ServiceAccount",
        "name": "gpu-exporter",
        "namespace": example["namespace"],
    }
    # Without the patch the subject stays in gpu-exporter: the reason the patch is documented.
    bare = {k: v for k, v in kustomization.items() if k != "patches"}
    (subject,) = one(_kustomize(tmp_path, yaml.safe_dump(bare)), "ClusterRoleBinding")["subjects"]
    assert subject["namespace"] == "gpu-exporter"


def test_chart_dra_binds_the_named_service_account_it_does_not_create(tools):
    objects = helm_template(
        "--set", "podAttribution.dra.enabled=true",
        "--set", "serviceAccount.create=false",
        "--set", "serviceAccount.name=gpu-monitoring",
    )  # fmt: skip
    assert not [o for o in objects if o["kind"] == "ServiceAccount"]
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpu-monitoring"
    assert one(objects, "ClusterRoleBinding")["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-monitoring", "namespace": "gpu-exporter"}
    ]


def test_chart_dra_settings_alone_render_nothing(tools):
    """podAttribution.dra's other values do nothing while it is off."""
    objects = helm_template(
        "--set", "podAttribution.dra.timeoutSeconds=5",
        "--set", "podAttribution.dra.tokenExpirationSeconds=7200",
        "--set", "podAttribution.dra.drivers[0]=gpu.example.com",
    )  # fmt: skip
    assert objects == helm_template()


@pytest.mark.parametrize("variant", sorted(OPERATOR))
def test_servicemonitor_relabels_node_and_sets_a_scrape_timeout(rendered, variant):
    monitor = one(docs(rendered, variant), "ServiceMonitor")
    endpoint, *compat = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    # The dcgm-exporter drop-in port, scraped as the native endpoint is (chart-all-on has it).
    want = [("dcgm", "/metrics")] if variant == "chart-all-on" else []
    assert [(extra["port"], extra["path"]) for extra in compat] == want
    for extra in compat:
        # Its own job (or Prometheus would see two targets with one label set) and instance
        # kept (NVIDIA's dashboard selects on it); the rest as the native endpoint.
        job = {"targetLabel": "job", "replacement": "gpu-exporter-dcgm"}
        assert job in extra["relabelings"]  # before the user's own, which may override it
        assert [r for r in extra["relabelings"] if r != job] == endpoint["relabelings"]
        parity = {"action": "labeldrop", "regex": "(instance|job)"}
        users = [r for r in endpoint.get("metricRelabelings", []) if r != parity]
        assert extra.get("metricRelabelings", []) == users
        skip = ("port", "path", "relabelings", "metricRelabelings")
        same = {k: v for k, v in endpoint.items() if k not in skip}
        assert {k: v for k, v in extra.items() if k not in skip} == same
    relabel = endpoint["relabelings"][0]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    assert relabel["targetLabel"] == "node"
    assert relabel.get("action", "replace") == "replace"

    def seconds(duration: str) -> int:
        return int(duration[:-1]) * {"s": 1, "m": 60}[duration[-1]]

    assert seconds(endpoint["scrapeTimeout"]) < seconds(endpoint["interval"])
    # Pod attribution: the exporter pod's own namespace/pod/container target labels must not
    # push the workload's labels aside (exported_pod).
    drop = {"action": "labeldrop", "regex": "(namespace|pod|container|service|endpoint)"}
    assert drop in endpoint["relabelings"]
    # Alert parity with the daemon (README "Alerting", tests/test_e2e_alerting.py): the scraped
    # series lose job and instance, so both paths raise alerts with the same labels.
    assert endpoint["metricRelabelings"][0] == {"action": "labeldrop", "regex": "(instance|job)"}
    service = one(docs(rendered, variant), "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()


def test_chart_dcgm_compat_port_reaches_the_daemon(rendered):
    """chart-all-on turns the dcgm-exporter drop-in port on: the daemon's configuration, the
    container port, the Service port and the NetworkPolicy all name it."""
    objects = docs(rendered, "chart-all-on")
    config = yaml.safe_load(one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"])
    assert config["dcgm_compat"] == {
        "enabled": True,
        "hostname_label": "Hostname",
        "listen_address": "0.0.0.0:9400",
    }
    # The daemon accepts it (the rest of all-on names files that exist only in the pod).
    Config.model_validate({key: config[key] for key in ("listen_address", "dcgm_compat")})
    container = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "dcgm", "containerPort": 9400, "protocol": "TCP"} in container["ports"]
    ports = one(objects, "Service")["spec"]["ports"]
    assert {"name": "dcgm", "port": 9400, "targetPort": "dcgm", "protocol": "TCP"} in ports
    policy = one(objects, "NetworkPolicy")["spec"]["ingress"][0]["ports"]
    assert {"port": "dcgm", "protocol": "TCP"} in policy


def test_no_operator_component_drops_only_the_operator_resources(rendered):
    kinds = sorted(o["kind"] for o in docs(rendered, "deploy-no-operator"))
    assert kinds == ["ConfigMap", "DaemonSet", "Namespace", "Service", "ServiceAccount"]


def test_deploy_prometheusrule_is_the_exported_pack(rendered):
    """deploy/prometheusrule.yaml has every group of rules/*.yaml, unchanged but for the runbook
    links, which point where the daemon's own alerts point (deploy/configmap.yaml)."""
    from gpu_exporter.alerting.rules.runbook import resolve_url
    from gpu_exporter.config.load import Config

    rule = one(docs(rendered, "deploy"), "PrometheusRule")
    config_text = one(docs(rendered, "deploy"), "ConfigMap", "gpu-exporter")["data"]["config.yaml"]
    base = Config.model_validate(yaml.safe_load(config_text)).alerting.runbook_base_url
    assert base and base.startswith("http://gpu-exporter.gpu-exporter.svc:"), base
    pack = [
        g
        for f in sorted((ROOT / "rules").glob("*.yaml"))
        for g in yaml.safe_load(f.read_text())["groups"]
    ]
    for group in pack:
        for r in group["rules"]:
            if "runbook_url" in r.get("annotations", {}):
                r["annotations"]["runbook_url"] = resolve_url(r["annotations"]["runbook_url"], base)
    assert sorted(g["name"] for g in rule["spec"]["groups"]) == sorted(g["name"] for g in pack)
    by_name = {g["name"]: g for g in rule["spec"]["groups"]}
    for group in pack:
        assert by_name[group["name"]] == group


@pytest.mark.parametrize("variant", VARIANTS)
def test_configuration_is_accepted_by_the_daemon(rendered, variant):
    from gpu_exporter.config.load import load_config

    objects = docs(rendered, variant)
    text = one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"]
    # The daemon checks that credential files exist: stand in for the mounted Secret.
    secrets = rendered / f"{variant}.secrets"
    for name in ("password", "ca.crt", "token"):
        (secrets / "am").mkdir(parents=True, exist_ok=True)
        (secrets / "am" / name).write_text("x\n")
    text = text.replace("/etc/gpu-exporter/secrets/", f"{secrets}/")
    path = rendered / f"{variant}.config.yaml"
    path.write_text(text)
    config = load_config(path, environ={})
    assert config.listen_address.endswith(":9449")
    if config.rules.enabled and variant.startswith("chart"):
        assert config.rules.files == ["/etc/gpu-exporter/rules/*.yaml"]


@pytest.mark.parametrize("variant", ["chart-default", "chart-all-on"])
def test_rules_configmap_is_accepted_by_the_daemon(rendered, variant, tmp_path):
    from gpu_exporter.alerting.rules.loader import load_rule_files

    data = one(docs(rendered, variant), "ConfigMap", "-rules")["data"]
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    groups = load_rule_files([str(tmp_path / "*.yaml")])
    names = {g.name for g in groups}
    if variant == "chart-all-on":
        assert "site-gpu" in names
        alerts = {
            r.get("alert")
            for t in data.values()
            for g in yaml.safe_load(t)["groups"]
            for r in g["rules"]
        }
        assert "GpuTensorCoresIdle" not in alerts and "GpuBusyButIdle" in alerts


def test_rule_overrides_reach_the_prometheusrule(rendered):
    rule = one(docs(rendered, "chart-all-on"), "PrometheusRule")
    rules = {r.get("alert") or r["record"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    busy = rules["GpuBusyButIdle"]
    assert busy["for"] == "30m"
    assert busy["labels"] == {
        "category": "efficiency",
        "severity": "critical",
        "team": "ml-platform",
    }
    assert busy["annotations"]["runbook_url"] == (
        "https://example.org/gpu-exporter/docs/runbook.md#gpubusybutidle"
    )
    assert "GpuTensorCoresIdle" not in rules
    assert "GpuTooHot" in rules and "cluster:gpu_utilization_ratio:avg" in rules
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("rules.disabledGroups[0]=no-such-group", "no group"),
        ("rules.disabledAlerts[0]=NoSuchAlert", "no alert"),
        ("rules.alertOverrides.NoSuchAlert.for=5m", "no alert"),
        ("podAttribution.mode=everything", "podAttribution.mode"),
        ("dcgm.mode=sometimes", "dcgm.mode"),
        ("dcgm.extra=1", "dcgm: Additional property extra is not allowed"),
        ("unknownKey=1", "unknownKey"),
        ("webConfig.enabled=true", "webConfig.enabled needs webConfig.inline"),
        ("serviceMonitor.scheme=ftp", "serviceMonitor.scheme"),
        ("webConfig.inline.basic_auth_users.alice=plaintext", "basic_auth_users"),
        (
            "processAttribution.enabled=true,podAttribution.enabled=false",
            "processAttribution.enabled needs podAttribution.enabled",
        ),
        ("processAttribution.procMount=hostPath", "processAttribution: Additional property"),
        ("processAttribution.runtimeSocket=containerd.sock", "processAttribution.runtimeSocket"),
        ("processAttribution.refreshSeconds=7200", "processAttribution.refreshSeconds"),
        (
            "podAttribution.dra.enabled=true,podAttribution.enabled=false",
            "podAttribution.dra.enabled needs podAttribution.enabled",
        ),
        (
            "podAttribution.dra.enabled=true,serviceAccount.create=false",
            "podAttribution.dra.enabled with serviceAccount.create=false needs serviceAccount.name",
        ),
        (
            "podAttribution.dra.tokenExpirationSeconds=60",
            "podAttribution.dra.tokenExpirationSeconds: Must be greater than or equal to 600",
        ),
        (
            "podAttribution.dra.verbs[0]=create",
            "podAttribution.dra: Additional property verbs is not allowed",
        ),
    ],
)
def test_bad_values_fail_the_render(tools, setting, message):
    result = subprocess.run(
        [str(HELM), "template", "x", str(CHART), "--set", setting],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_dashboard_configmaps_follow_the_charts_files(tools, tmp_path):
    chart = tmp_path / "gpu-exporter"
    shutil.copytree(CHART, chart)
    dashboards = chart / "files" / "dashboards"
    shutil.rmtree(dashboards, ignore_errors=True)
    assert not [
        o
        for o in helm_template("--set", "dashboards.enabled=true", chart=chart)
        if "dashboard" in o["metadata"]["name"]
    ]

    dashboards.mkdir(parents=True)
    (dashboards / "GPU_Overview.json").write_text(
        json.dumps({"title": "GPU overview", "panels": []})
    )
    objects = helm_template(
        "--set",
        "dashboards.enabled=true",
        "--set",
        "dashboards.label=my_dashboard",
        "--set",
        "dashboards.annotations.grafana_folder=GPU",
        chart=chart,
    )
    (config_map,) = [
        o for o in objects if o["metadata"]["name"].startswith("gpu-exporter-dashboard-")
    ]
    assert config_map["metadata"]["name"] == "gpu-exporter-dashboard-gpu-overview"
    assert config_map["metadata"]["labels"]["my_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert json.loads(config_map["data"]["GPU_Overview.json"])["title"] == "GPU overview"
    assert not [o for o in helm_template(chart=chart) if "dashboard" in o["metadata"]["name"]]


def test_helm_test_hook_probes_readyz_with_the_exporters_own_image(tools):
    test_pod = ("--show-only", "templates/tests/test-connection.yaml")
    (pod,) = helm_template(*test_pod)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    (exporter,) = one(helm_template(), "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == exporter["image"]
    assert container["imagePullPolicy"] == exporter["imagePullPolicy"]
    assert container["command"] == [
        "gpu-exporter", "probe", "--timeout", "10",
        "http://gpu-exporter.gpu-exporter.svc:9449/readyz",
    ]  # fmt: skip
    # Pinned by digest and pulled with the DaemonSet's secrets, as the DaemonSet's image is.
    digest = "sha256:" + "ab" * 32
    (pod,) = helm_template(
        "--set", f"image.digest={digest}", "--set", "imagePullSecrets[0].name=regcred", *test_pod
    )
    assert pod["spec"]["containers"][0]["image"] == f"ghcr.io/gpu-exporter/gpu-exporter@{digest}"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_config_changes_restart_the_pods_but_rule_changes_do_not(tools):
    def checksum(*args: str) -> str:
        daemonset = one(helm_template(*args), "DaemonSet")
        return daemonset["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    base = checksum()
    assert checksum("--set", "config.logLevel=debug") != base
    assert checksum("--set", "rules.disabledAlerts[0]=GpuTensorCoresIdle") == base


def render_notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt only renders on install; wrap it in a template to render it offline."""
    chart = tmp_path / "gpu-exporter"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "zz-notes.yaml").write_text(
        '{{- define "notes" }}' + notes + "{{- end }}\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ include "notes" . | quote }}}\n'
    )
    objects = helm_template("--show-only", "templates/zz-notes.yaml", *args, chart=chart)
    return objects[0]["data"]["notes"]


@pytest.mark.parametrize(
    "args",
    [
        [],
        [
            "--set",
            "podAttribution.enabled=false",
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor",
        ],
        ["-f", str(CHART / "ci" / "all-on-values.yaml")],
        ["--set", "processAttribution.enabled=true"],
    ],
)
def test_notes_render(tools, tmp_path, args):
    text = render_notes(tmp_path, *args)
    assert "kubectl -n gpu-exporter get daemonset gpu-exporter" in text
    if "podAttribution.enabled=false" in args:
        assert "UID 65532" in text and "serviceMonitor.enabled=false" in text
    else:
        assert "UID 0 without capabilities" in text
    if args and "processAttribution" in args[-1]:
        assert "shares the host's PID namespace (hostPID)" in text
        assert "socket /run/containerd/containerd.sock read-only at /host/cri.sock" in text
    elif "-f" in args:  # all-on: CRI-O's socket
        assert "shares the host's PID namespace (hostPID)" in text
        assert "socket /var/run/crio/crio.sock read-only" in text
    else:
        assert "Per-process attribution" not in text


def test_notes_say_what_dra_attribution_adds(tools, tmp_path):
    text = render_notes(tmp_path / "on", "--set", "podAttribution.dra.enabled=true")
    assert (
        "ClusterRole gpu-exporter-gpu-exporter-dra lets ServiceAccount "
        "gpu-exporter/gpu-exporter get, list and\nwatch ResourceSlices" in text
    )
    assert "expiring after 3600 s projected read-only at\n/var/run/secrets/kubernetes.io/" in text
    assert "gpu_exporter_dra_up 0" in text
    all_on = render_notes(tmp_path / "all", "-f", str(CHART / "ci" / "all-on-values.yaml"))
    assert "expiring after 7200 s" in all_on
    assert "DRA attribution" not in render_notes(tmp_path / "off")


def _daemon_cadence(tmp_path: Path, *args: str) -> dict[float, list[str]]:
    """Seconds between evaluations -> rule groups, as the daemon runs the rendered rules and
    configuration: its rule manager fed 40 s of ticks."""
    from gpu_exporter.alerting.rules.manager import RuleManager
    from gpu_exporter.alerting.settings import RulesConfig
    from tests.test_rule_manager import series_of, snapshot

    objects = helm_template(*args)
    for name, text in one(objects, "ConfigMap", "-rules")["data"].items():
        (tmp_path / name).write_text(text)
    config = yaml.safe_load(one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"])
    settings = RulesConfig.model_validate({**config["rules"], "files": [str(tmp_path / "*.yaml")]})
    tick = float(config["interval_seconds"])
    manager = RuleManager(settings, interval_seconds=tick)
    manager.load()
    evaluated: dict[str, list[float]] = {}
    for step in range(int(40 / tick) + 1):
        now = 1000.0 + step * tick
        manager.on_series(series_of(snapshot(now, 50)))
        for group in manager.evaluator.groups:
            if group.last_evaluation == now:
                evaluated.setdefault(group.group.name, []).append(now)
    cadence: dict[float, list[str]] = {}
    for name, times in sorted(evaluated.items()):
        (period,) = {b - a for a, b in pairwise(times)}
        cadence.setdefault(period, []).append(name)
    return cadence


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["-f", str(CHART / "ci" / "all-on-values.yaml")],  # 2 s ticks, evaluation interval 5 s
        [
            *("--set", "config.intervalSeconds=0.5", "--set", "rules.disabledGroups={gpu-health}"),
            *("--set", "config.extra.rules.evaluation_interval_seconds=3"),
        ],
    ],
    ids=["defaults", "all-on", "extra"],
)
def test_notes_list_the_rule_cadence_the_daemon_runs(tools, tmp_path, args):
    text = render_notes(tmp_path / "notes", *args)
    listed = {
        float(period): names.split(", ")
        for period, names in re.findall(r"^  every ([0-9.]+) s: (.+)$", text, re.M)
    }
    (tmp_path / "rules").mkdir()
    assert listed == _daemon_cadence(tmp_path / "rules", *args)
    if not args:
        assert "The daemon evaluates its rules at its sampling ticks (every 1 s)" in text
        assert listed == {
            1.0: ["gpu-exporter-fleet"],
            5.0: ["gpu-throttling"],
            15.0: ["gpu-efficiency", "gpu-health"],
        }
    assert "evaluates its rules" not in render_notes(
        tmp_path / "off", "--set", "rules.enabled=false"
    )


def test_notes_speak_of_selectors_only_for_the_resources_created(tools, tmp_path):
    default = render_notes(tmp_path / "d")
    assert "serviceMonitorSelector" not in default and "ruleSelector" not in default
    assert "PrometheusRule" not in default and "ServiceMonitor created" not in default
    labelled = render_notes(tmp_path / "a", "-f", str(CHART / "ci" / "all-on-values.yaml"))
    assert (
        'ServiceMonitor created with labels {"release":"kube-prometheus-stack"}; your '
        "Prometheus' serviceMonitorSelector must match them." in labelled
    )
    assert (
        'PrometheusRule created with labels {"release":"kube-prometheus-stack"}; your '
        "Prometheus' ruleSelector must match them." in labelled
    )
    unlabelled = render_notes(tmp_path / "u", "--set", "serviceMonitor.enabled=true")
    assert "ServiceMonitor created without serviceMonitor.labels" in unlabelled
    assert "must match them" not in unlabelled and "PrometheusRule" not in unlabelled
    rule_only = render_notes(tmp_path / "r", "--set", "prometheusRule.enabled=true")
    assert "PrometheusRule created without prometheusRule.labels" in rule_only
    assert "ServiceMonitor" not in rule_only


# --- DCGM (docs/kubernetes.md "DCGM: activity on GPUs before Hopper") ------------------------

OPERATOR_HOSTENGINE = "nvidia-dcgm.gpu-operator.svc:5555"
DCGM_IMAGE = ("--set", "image.dcgm=true")


def _dcgm_render(*args: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the daemon's configuration as loaded, the pod securityContext, the container's), from an
    image with DCGM (image.dcgm: standalone and embedded fail the render without it)."""
    objects = helm_template(*DCGM_IMAGE, *args)
    text = one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"]
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return yaml.safe_load(text), pod["securityContext"], container["securityContext"]


@pytest.mark.parametrize("variant", sorted(v for v in VARIANTS if v.startswith("chart")))
def test_chart_writes_no_dcgm_section_unless_asked(rendered, variant):
    config = yaml.safe_load(
        one(docs(rendered, variant), "ConfigMap", "gpu-exporter")["data"]["config.yaml"]
    )
    assert "dcgm" not in config
    assert Config.model_validate({"dcgm": config.get("dcgm", {})}).dcgm.mode == "off"


@pytest.mark.parametrize("attribution", [True, False])
@pytest.mark.parametrize("mode", ["standalone", "auto"])
def test_chart_dcgm_client_modes_keep_the_security_context(tools, mode, attribution):
    """standalone/auto connect to a host engine elsewhere: the exporter stays as it was (UID
    65532 without attribution, UID 0 with it; no capabilities either way)."""
    args = ["--set", f"dcgm.mode={mode}", "--set", f"dcgm.address={OPERATOR_HOSTENGINE}"]
    args += ["--set", f"podAttribution.enabled={str(attribution).lower()}"]
    config, pod, container = _dcgm_render(*args)
    assert config["dcgm"] == {"mode": mode, "address": OPERATOR_HOSTENGINE}
    settings = Config.model_validate({"dcgm": config["dcgm"]}).dcgm
    assert (settings.mode, settings.address) == (mode, OPERATOR_HOSTENGINE)
    _, default_pod, default_container = _dcgm_render(
        "--set", f"podAttribution.enabled={str(attribution).lower()}"
    )
    assert (pod, container) == (default_pod, default_container)
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert pod["runAsNonRoot"] is (not attribution)
    assert pod["runAsUser"] == (0 if attribution else 65532)


def test_chart_dcgm_empty_address_leaves_the_daemon_default(tools):
    config, _, _ = _dcgm_render("--set", "dcgm.mode=standalone", "--set", "dcgm.address=")
    assert config["dcgm"] == {"mode": "standalone"}
    assert Config.model_validate({"dcgm": config["dcgm"]}).dcgm.address == "localhost:5555"


@pytest.mark.parametrize(
    "args",
    [
        ["--set", "dcgm.mode=embedded"],
        # The mode the daemon runs with decides, wherever it was set.
        ["--set", "config.extra.dcgm.mode=embedded"],
    ],
)
def test_chart_dcgm_embedded_runs_as_root_with_sys_admin(tools, tmp_path, args):
    config, pod, container = _dcgm_render("--set", "podAttribution.enabled=false", *args)
    assert config["dcgm"]["mode"] == "embedded" and "address" not in config["dcgm"]
    assert (pod["runAsUser"], pod["runAsGroup"], pod["runAsNonRoot"]) == (0, 0, False)
    assert container["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    # The rest stays: not privileged, read-only root filesystem. allowPrivilegeEscalation
    # false is valid with the capability spelled SYS_ADMIN (the API server refuses it only
    # with CAP_SYS_ADMIN).
    assert container["privileged"] is False and container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert "CAP_SYS_ADMIN" not in container["capabilities"]["add"]
    # A user's securityContext still wins over the chart's.
    _, _, mine = _dcgm_render(*args, "--set-json", 'securityContext={"capabilities":{"add":[]}}')
    assert mine["capabilities"] == {"drop": ["ALL"], "add": []}
    # And the objects are valid Kubernetes objects.
    out = tmp_path / "embedded.yaml"
    out.write_text(
        subprocess.run(
            [
                str(HELM),
                "template",
                "gpu-exporter",
                str(CHART),
                "-n",
                "gpu-exporter",
                *DCGM_IMAGE,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    for version in ("1.25.0", "1.37.0"):
        checked = subprocess.run(
            [str(VENV_BIN / "kubernetes-validate"), "--strict", "--quiet", "-k", version, str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_chart_dcgm_fields_come_through_config_extra(tools):
    config, _, _ = _dcgm_render(
        "--set", "dcgm.mode=auto", "--set-json", "config.extra.dcgm.fields=[1001,1002,1013]"
    )
    assert config["dcgm"] == {"mode": "auto", "fields": [1001, 1002, 1013]}
    assert Config.model_validate({"dcgm": config["dcgm"]}).dcgm.fields == (1001, 1002, 1013)


def test_notes_say_what_each_dcgm_mode_needs(tools, tmp_path):
    embedded = render_notes(tmp_path / "e", *DCGM_IMAGE, "--set", "dcgm.mode=embedded")
    assert "UID 0 with SYS_ADMIN added" in embedded and "DCGM_DEB" in embedded
    assert "without capabilities" not in embedded
    restricted = render_notes(
        tmp_path / "r",
        *DCGM_IMAGE,
        "--set",
        "dcgm.mode=embedded",
        "--set",
        "podAttribution.enabled=false",
    )
    assert 'Pod Security "privileged"' in restricted and '"restricted"' not in restricted
    standalone = render_notes(tmp_path / "s", *DCGM_IMAGE, "--set", "dcgm.mode=standalone")
    assert "nv-hostengine at localhost:5555" in standalone
    assert "set dcgm.address" in standalone and "exits at start" in standalone
    auto = render_notes(
        tmp_path / "a", "--set", "dcgm.mode=auto", "--set", f"dcgm.address={OPERATOR_HOSTENGINE}"
    )
    assert f"nv-hostengine at {OPERATOR_HOSTENGINE}" in auto and "set dcgm.address" not in auto
    assert "UID 0 without capabilities" in auto
    assert "gpu_exporter_dcgm_up" not in render_notes(tmp_path / "o")


# --- security: web config, ServiceMonitor TLS, NetworkPolicy --------------------------------


def test_web_config_is_off_by_default_and_so_is_the_network_policy(rendered):
    for variant in ("chart-default", "deploy"):
        objects = docs(rendered, variant)
        assert not [o for o in objects if o["kind"] in ("NetworkPolicy", "Secret")]
        (container,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
        assert "scheme" not in container["readinessProbe"]["httpGet"]
    monitor = one(docs(rendered, "chart-operator"), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["scheme"] == "http"


def test_web_config_secret_is_mounted_passed_and_loadable(rendered, tmp_path):
    from gpu_exporter.web.web_config import load_web_config
    from tests.tlsfiles import make_pki

    objects = docs(rendered, "chart-all-on")
    secret = one(objects, "Secret", "-web")
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["web-config"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert volumes["web-tls"]["secret"]["secretName"] == "gpu-exporter-tls"
    assert mounts["web-config"]["readOnly"] and mounts["web-tls"]["readOnly"]
    assert "subPath" not in mounts["web-config"]  # a directory: Secret updates reach the daemon
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"

    config_text = one(objects, "ConfigMap", "gpu-exporter")["data"]["config.yaml"]
    settings = yaml.safe_load(config_text)
    web_file = f"{mounts['web-config']['mountPath']}/web-config.yml"
    assert settings["web_config_file"] == web_file
    assert settings["web"] == {"probes_without_auth": True}
    # The rendered file, with the TLS Secret's files standing in, is one the daemon loads.
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "tls.crt").symlink_to(pki.server_cert)
    (tmp_path / "tls.key").symlink_to(pki.server_key)
    text = secret["stringData"]["web-config.yml"].replace(
        mounts["web-tls"]["mountPath"], str(tmp_path)
    )
    (tmp_path / "web-config.yml").write_text(text)
    web = load_web_config(tmp_path / "web-config.yml")
    assert web.ssl_context is not None and set(web.users) == {"prometheus"}


def test_servicemonitor_scrapes_https_with_the_given_tls_and_basic_auth(rendered):
    endpoints = one(docs(rendered, "chart-all-on"), "ServiceMonitor")["spec"]["endpoints"]
    assert len(endpoints) == 2  # the native /metrics and the dcgm-exporter drop-in port
    for endpoint in endpoints:
        assert endpoint["scheme"] == "https"
        ca = endpoint["tlsConfig"]["ca"]["secret"]
        assert ca == {"name": "gpu-exporter-tls", "key": "ca.crt"}
        password = endpoint["basicAuth"]["password"]
        assert password == {"name": "gpu-exporter-scrape", "key": "password"}
    test_pod = one(docs(rendered, "chart-all-on"), "Pod", "-test-readyz")
    command = test_pod["spec"]["containers"][0]["command"]
    assert command[:3] == ["gpu-exporter", "probe", "--insecure"]
    assert command[-1].startswith("https://")


def _assert_only_prometheus_may_connect(policy, selector, ports=("metrics",)):
    assert policy["spec"]["podSelector"]["matchLabels"] == selector
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": port, "protocol": "TCP"} for port in ports]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}


def test_chart_network_policy_admits_only_prometheus_on_its_ports(rendered):
    objects = docs(rendered, "chart-all-on")
    daemonset = one(objects, "DaemonSet")
    _assert_only_prometheus_may_connect(
        one(objects, "NetworkPolicy"),
        daemonset["spec"]["selector"]["matchLabels"],
        ("metrics", "dcgm"),  # chart-all-on has the dcgm-exporter drop-in port
    )


def test_deploy_network_policy_component(tools, tmp_path):
    """deploy/components/network-policy, rendered with kustomize and validated strictly."""
    rel = os.path.relpath(ROOT / "deploy", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{rel}]\ncomponents: [{rel}/components/network-policy]\n"
    )
    result = subprocess.run(
        [str(TOOLS / "kubectl"), "kustomize", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    out = tmp_path / "rendered.yaml"
    out.write_text(result.stdout)
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    policy = one(objects, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "gpu-exporter"
    daemonset = one(objects, "DaemonSet")
    _assert_only_prometheus_may_connect(policy, daemonset["spec"]["selector"]["matchLabels"])
    ports = daemonset["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert [p["name"] for p in ports] == ["metrics"]
    for version in ("1.25.0", "1.37.0"):
        checked = subprocess.run(
            [str(VENV_BIN / "kubernetes-validate"), "--strict", "--quiet", "-k", version, str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
