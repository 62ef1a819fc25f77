"""Settings from one YAML file, environment variables and flags (flags win, then environment).

Each section is the model of the folder that reads it (collect/settings.py, alerting/settings.py,
web/settings.py); `Config` composes them with the top-level settings and checks what spans
sections. Every error names where the bad value came from: the file, field and line; the
environment variable; or the flag.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from gpu_exporter.alerting.rules.runbook import default_base_url as default_runbook_base_url
from gpu_exporter.alerting.settings import AlertingConfig, RulesConfig
from gpu_exporter.collect.settings import (
    DEFAULT_INTERVAL_SECONDS,
    ClassifierConfig,
    DcgmConfig,
    KubernetesConfig,
    NvmlConfig,
)
from gpu_exporter.support.validation import SettingsModel, Wording, explain
from gpu_exporter.support.yamlfile import LocatedYaml, YamlFileError, format_path, load_yaml_file
from gpu_exporter.web.settings import (
    DEFAULT_LISTEN_ADDRESS,
    DcgmCompatConfig,
    MetricsConfig,
    WebConfig,
    split_host_port,
)

if TYPE_CHECKING:  # the rule manager and the PromQL engine: imported when one is built
    from gpu_exporter.alerting.rules.manager import AlertSink, RuleManager

ENV_PREFIX = "GPU_EXPORTER_"
ENV_CONFIG_FILE = "GPU_EXPORTER_CONFIG"


FLAG_NAMES = {
    "interval_seconds": "interval",
    "rules.files": "rules",
    "alerting.alertmanagers": "alertmanager-url",
    "alerting.external_labels": "external-label",
    "dcgm.mode": "dcgm",
    "dcgm.address": "dcgm-address",
    "metrics.profile": "metrics-profile",
    "dcgm_compat.enabled": "dcgm-compat",
    "dcgm_compat.listen_address": "dcgm-compat-listen-address",
    "dcgm_compat.counters_file": "dcgm-compat-counters-file",
}


class ConfigError(ValueError):
    """Invalid settings; the message is ready to print (one line per problem)."""


# `Field(default=...)` by keyword throughout: type checkers read a field's default from that
# keyword only (PEP 681), so a positional default would make the field look required.


class Config(SettingsModel):
    """The whole configuration: the top-level settings and every folder's section."""

    listen_address: str = DEFAULT_LISTEN_ADDRESS
    # 0.2 s at least: GPM needs windows of 100 ms or more.
    interval_seconds: float = Field(default=DEFAULT_INTERVAL_SECONDS, ge=0.2, le=3600)
    simulate: str | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    nvml: NvmlConfig = NvmlConfig()
    dcgm: DcgmConfig = DcgmConfig()
    rules: RulesConfig = RulesConfig()
    alerting: AlertingConfig = AlertingConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    classifier: ClassifierConfig = ClassifierConfig()
    # exporter-toolkit web-configuration file: TLS and basic auth on every endpoint.
    web_config_file: str | None = None
    web: WebConfig = WebConfig()
    metrics: MetricsConfig = MetricsConfig()
    dcgm_compat: DcgmCompatConfig = DcgmCompatConfig()
    # Setting ("a.b") -> the environment variable or flag that set it (the file's are absent):
    # errors found after loading (a scenario, a rule file) name where their setting came from.
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    def origin_of(self, setting: str) -> str:
        """Which environment variable or flag set `setting` ("a.b", as the file writes it):
        "environment variable GPU_EXPORTER_X" or "flag --x"; "" for the file's and defaults."""
        return self._origins.get(setting, "")

    def runbook_base_url(
        self, tls: Callable[[], bool], environ: Mapping[str, str] | None = None
    ) -> str:
        """alerting.runbook_base_url, or this daemon's own /runbook (`tls` asked only then)."""
        configured = self.alerting.runbook_base_url
        return configured or default_runbook_base_url(self.listen_address, tls(), environ)

    def external_labels(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        environ = os.environ if environ is None else environ
        labels = dict(self.alerting.external_labels)
        node = node_name(environ)
        if "node" not in labels and node:
            labels["node"] = node
        return labels

    @field_validator("listen_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        split_host_port(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        deadline = self.nvml.device_deadline_seconds
        if deadline is not None and deadline >= self.interval_seconds:
            raise ValueError(
                f"nvml.device_deadline_seconds ({deadline:g}) must be "
                f"shorter than interval_seconds ({self.interval_seconds:g})"
            )
        compat = self.dcgm_compat.listen_address
        if (
            compat is not None
            and split_host_port(compat)[1] == split_host_port(self.listen_address)[1]
        ):
            raise ValueError(
                f"dcgm_compat.listen_address ({compat}) must use another port than "
                f"listen_address ({self.listen_address})"
            )
        if self.kubernetes.dra.enabled and self.kubernetes.enabled in (False, "false"):
            raise ValueError(
                "kubernetes.dra.enabled needs pod attribution (kubernetes.enabled true or "
                "auto): the kubelet's PodResources API reports the claimed devices"
            )
        return self

    @model_validator(mode="after")
    def _processes_read_for_attribution(self) -> Config:
        """Per-process attribution maps NVML's per-process reads: it turns them on."""
        if self.kubernetes.processes.enabled and not self.nvml.processes:
            nvml = self.nvml.model_copy(update={"processes": True})
            return self.model_copy(update={"nvml": nvml})
        return self


def node_name(environ: Mapping[str, str]) -> str:
    """The node's name, from $NODE_NAME (the DaemonSet's downward API); "" when unset."""
    return environ.get("NODE_NAME", "")


# Setting path (as pydantic's error `loc`) -> (precedence, where its value came from).
_Origins = dict[tuple[str | int, ...], tuple[int, str]]
_FROM_ENVIRONMENT, _FROM_FLAG = 1, 2  # the file is 0 and has no entries: its lines say where


def _env_settings(environ: Mapping[str, str]) -> list[tuple[tuple[str, ...], str, str]]:
    """GPU_EXPORTER_A__B=v -> (("a", "b"), "v", origin); `__` separates nesting levels.

    Only variables naming a top-level setting are read: Kubernetes injects
    GPU_EXPORTER_SERVICE_HOST and friends for a Service called gpu-exporter, and those must
    not stop the daemon. Below the top level, unknown names are errors as in the file.
    """
    settings = []
    for name, value in sorted(environ.items()):  # sorted: the same error whatever the order
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG_FILE:
            continue
        path = tuple(part.lower() for part in name[len(ENV_PREFIX) :].split("__"))
        if path[0] in Config.model_fields:
            settings.append((path, value, f"environment variable {name}"))
    return settings


def _place(
    data: dict[str, Any],
    path: tuple[str, ...],
    value: Any,
    origin: tuple[int, str],
    origins: _Origins,
) -> None:
    """Set `path` in `data`, over what a source of lower precedence set there or around it.

    Two variables (or two flags) that set one setting, or one a setting inside the other's
    (GPU_EXPORTER_RULES and GPU_EXPORTER_RULES__ENABLED), are a ConfigError naming both.
    """
    overlapping = [
        other for other in origins if other[: len(path)] == path or path[: len(other)] == other
    ]
    for other in overlapping:
        rank, where = origins[other]
        if rank == origin[0]:
            shared = format_path(min(other, path, key=len))
            raise ConfigError(
                f"config error: {where} and {origin[1]} both set {shared}; give one of them"
            )
        del origins[other]  # replaced by a source that wins
    node = data
    for part in path[:-1]:
        child = node.get(part)
        # A copy, so the file's data stays as read; anything but a mapping is replaced.
        node[part] = child = dict(child) if isinstance(child, dict) else {}
        node = child
    node[path[-1]] = value
    origins[path] = origin


def load_config(
    path: str | Path | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build the effective configuration. `flags` holds only flags the user gave."""
    environ = os.environ if environ is None else environ
    # A file named by GPU_EXPORTER_CONFIG: its errors say so (the person may not know it is set).
    named_by = "" if path else f"environment variable {ENV_CONFIG_FILE}: "
    path = path or environ.get(ENV_CONFIG_FILE) or None
    located: LocatedYaml | None = None
    data: dict[str, Any] = {}
    if path:
        try:
            located = load_yaml_file(path)
        except YamlFileError as exc:
            raise ConfigError(f"config error: {named_by}{exc}") from exc
        if located.data is None:
            located.data = {}
        if not isinstance(located.data, dict):
            raise ConfigError(f"config error: {named_by}{path}: the top level must be a mapping")
        data = dict(located.data)
    origins: _Origins = {}
    for setting, value, where in _env_settings(environ):
        _place(data, setting, value, (_FROM_ENVIRONMENT, where), origins)
    for key, value in (flags or {}).items():
        flag = f"flag --{FLAG_NAMES.get(key, key.replace('_', '-'))}"
        _place(data, tuple(key.split(".")), value, (_FROM_FLAG, flag), origins)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(err, located, origins, data) for err in exc.errors()]
        raise ConfigError("\n".join(problems)) from exc
    config._origins = {format_path(setting): where for setting, (_, where) in origins.items()}
    return config


def load_config_leniently(path: str | Path) -> Config | None:
    """The file's configuration with every invalid setting left at its default (environment
    and flags not read), or None when the file cannot be read as a mapping: what `config
    check` checks the files a configuration names with (its scenario, web-config and rule
    files), so that one run reports their problems next to the settings' own."""
    try:
        located = load_yaml_file(path)
    except YamlFileError:
        return None
    if not isinstance(located.data, dict):
        return None if located.data is not None else Config()
    data: dict[str, Any] = copy.deepcopy(located.data)
    for _ in range(_LENIENT_ROUNDS):  # a setting dropped may reveal a check across others
        try:
            return Config.model_validate(data)
        except ValidationError as exc:
            dropped = False
            for err in exc.errors():
                loc = tuple(part for part in err["loc"] if part != "[key]")
                paths = [loc] if loc else _mentioned(str(err.get("msg", "")))
                dropped = any([_drop(data, p) for p in paths]) or dropped
            if not dropped:
                return None
    return None


_LENIENT_ROUNDS = 5


def _drop(data: Any, path: tuple[Any, ...]) -> bool:
    """Remove the value at `path` when it is there; False when it is not."""
    node = data
    for part in path[:-1]:
        if not _holds(node, part):
            return False
        node = node[part]
    if not path or not _holds(node, path[-1]):
        return False
    del node[path[-1]]
    return True


def _holds(node: Any, key: Any) -> bool:
    if isinstance(node, dict):
        return key in node
    return isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)


# Pydantic's own words, but for an unknown key: the settings' vocabulary.
_WORDING = Wording(
    unknown_key="unknown setting", missing_key=None, not_a_mapping=None, not_a_list=None
)


def _describe(
    err: Mapping[str, Any], located: LocatedYaml | None, origins: _Origins, data: Any
) -> str:
    path, message = explain(err, data, Config, _WORDING)
    loc = tuple(err["loc"])
    if loc and loc[-1] == "[key]":  # pydantic's mark for a problem with a mapping's key
        loc = loc[:-1]
    for i in range(len(loc), 0, -1):
        if loc[:i] in origins:
            return f"config error: {origins[loc[:i]][1]} ({format_path(loc)}): {message}"
    # A check across settings (a section's or the top level's): the settings inside it that an
    # environment variable or flag set, those its message names (or, for a section, all).
    mentioned = _mentioned(message)
    inside = [p for p in origins if p[: len(loc)] == loc and len(p) > len(loc)]
    named = [p for p in inside if p in mentioned] or (inside if loc else [])
    also = "; ".join(f"{format_path(p)} from {origins[p][1]}" for p in named)
    suffix = f" ({also})" if also else ""
    if located is not None:
        # The top level's checks name their settings: point at the first one the file sets.
        in_file = [p for p in mentioned if not loc and located.line_of(p)]
        return f"config error: {located.where(in_file[0] if in_file else path)}: {message}{suffix}"
    return f"config error: {format_path(path)}: {message}{suffix}"


_SETTING = re.compile(r"\b[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+\b|\b[a-z]+_[a-z0-9_]+\b")


def _mentioned(message: str) -> list[tuple[str, ...]]:
    """The setting paths a message names ("nvml.device_deadline_seconds"), in its order."""
    return [tuple(name.split(".")) for name in _SETTING.findall(message)]


def rule_manager(config: Config, notifier: AlertSink | None = None) -> RuleManager:
    """The rule manager `serve` runs for `config` (its rules not loaded yet); `config check`
    loads the rules with it too. What it needs from other sections and the environment is
    resolved here: the evaluation interval's default, the node's external label and the
    runbook base URL."""
    from gpu_exporter.alerting.rules.manager import RuleManager
    from gpu_exporter.web.http_server import serves_tls

    return RuleManager(
        config.rules,
        notifier,
        alerting=config.alerting,
        interval_seconds=config.interval_seconds,
        external_labels=config.external_labels(),
        runbook_base_url=config.runbook_base_url(lambda: serves_tls(config.web_config_file)),
    )
