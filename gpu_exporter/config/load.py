"""Settings from one YAML file, environment variables and flags (flags win, then environment).

Every error names where the bad value came from: the file, field and line; the environment
variable; or the flag.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gpu_exporter.alerting.notify.alertmanager import AlertmanagerTarget, NotifierSettings
from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.manager import RuleSettings
from gpu_exporter.alerting.rules.pack import default_rule_files
from gpu_exporter.alerting.rules.runbook import default_base_url as default_runbook_base_url
from gpu_exporter.collect.settings import (
    ClassifierConfig,
    DcgmConfig,
    KubernetesConfig,
    NvmlConfig,
)
from gpu_exporter.model.defaults import (
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_LISTEN_ADDRESS,
    DEFAULT_RULE_SEMANTICS,
)
from gpu_exporter.model.promnames import label_name_problem
from gpu_exporter.support.validation import SettingsModel, Wording, explain, split_commas
from gpu_exporter.support.yamlfile import LocatedYaml, YamlFileError, format_path, load_yaml_file
from gpu_exporter.web import http_server
from gpu_exporter.web.settings import DcgmCompatConfig, WebConfig, split_host_port

ENV_PREFIX = "GPU_EXPORTER_"
ENV_CONFIG_FILE = "GPU_EXPORTER_CONFIG"


FLAG_NAMES = {
    "interval_seconds": "interval",
    "rules.files": "rules",
    "alerting.alertmanagers": "alertmanager-url",
    "alerting.external_labels": "external-label",
    "dcgm.mode": "dcgm",
    "dcgm.address": "dcgm-address",
    "dcgm_compat.enabled": "dcgm-compat",
    "dcgm_compat.listen_address": "dcgm-compat-listen-address",
}


class ConfigError(ValueError):
    """Invalid settings; the message is ready to print (one line per problem)."""


# Every default below comes from the dataclass the setting ends up in; tests/test_config.py
# fails if a literal creeps back in and drifts.
# RuleSettings, AlertmanagerTarget and NotifierSettings defaults are read as class attributes:
# the last two cannot be built without arguments (a url, the targets).


# `Field(default=...)` by keyword throughout: type checkers read a field's default from that
# keyword only (PEP 681), so a positional default would make the field look required.


def _parse_pairs(value: Any) -> Any:
    """Label maps from the environment arrive as `k=v,k2=v2`."""
    if isinstance(value, str):
        pairs: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            key, sep, item = part.partition("=")
            if not sep:
                raise ValueError(f"expected key=value, got {part!r}")
            if key.strip() in pairs:
                raise ValueError(f"{key.strip()!r} is given twice")
            pairs[key.strip()] = item.strip()
        return pairs
    return value


def _label_name(name: str) -> str:
    """Alertmanager's API answers 400 to an alert with an invalid label name: all are lost."""
    problem = label_name_problem(name)
    if problem:
        raise ValueError(problem)
    return name


LabelName = Annotated[str, AfterValidator(_label_name)]
LabelValue = Annotated[str, Field(min_length=1)]  # an empty value is no label at all


class RulesConfig(SettingsModel):
    enabled: bool = True
    files: list[str] = Field(default_factory=default_rule_files)  # the shipped pack
    evaluation_interval_seconds: float | None = Field(
        default=None, ge=0.2, le=3600
    )  # default: interval
    reload_check_seconds: float = Field(default=RuleSettings.reload_check_seconds, gt=0, le=3600)
    max_range_seconds: float = Field(default=RuleSettings.max_range_seconds, gt=0, le=7 * 86400)
    # Default: half the evaluation interval.
    group_time_budget_seconds: float | None = Field(default=None, gt=0, le=3600)
    history_max_bytes: int = Field(default=RuleSettings.history_max_bytes, ge=1 << 20, le=1 << 34)
    # Which Prometheus' PromQL the rules follow: match the cluster's Prometheus.
    semantics: Literal["prometheus2", "prometheus3"] = DEFAULT_RULE_SEMANTICS  # type: ignore[assignment]

    _lists = field_validator("files", mode="before")(split_commas)


class BasicAuthConfig(SettingsModel):
    username: str
    password: str | None = None
    password_file: str | None = None


class TlsConfig(SettingsModel):
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = AlertmanagerTarget.insecure_skip_verify


class AlertmanagerConfig(SettingsModel):
    url: str
    basic_auth: BasicAuthConfig | None = None
    bearer_token: str | None = None
    bearer_token_file: str | None = None
    tls: TlsConfig = TlsConfig()
    timeout_seconds: float = Field(default=AlertmanagerTarget.timeout_seconds, gt=0, le=300)

    def target(self) -> AlertmanagerTarget:
        auth = self.basic_auth
        return AlertmanagerTarget(
            url=self.url,
            basic_auth_username=auth.username if auth else None,
            basic_auth_password=auth.password if auth else None,
            basic_auth_password_file=auth.password_file if auth else None,
            bearer_token=self.bearer_token,
            bearer_token_file=self.bearer_token_file,
            ca_file=self.tls.ca_file,
            cert_file=self.tls.cert_file,
            key_file=self.tls.key_file,
            insecure_skip_verify=self.tls.insecure_skip_verify,
            timeout_seconds=self.timeout_seconds,
        )


class AlertingConfig(SettingsModel):
    alertmanagers: list[AlertmanagerConfig] = Field(default=[])
    # Added to every alert sent; `node` defaults to $NODE_NAME (the DaemonSet's downward API).
    external_labels: dict[LabelName, LabelValue] = Field(default={})
    external_url: str = RuleSettings.external_url
    resend_delay_seconds: float = Field(default=RuleSettings.resend_delay, gt=0, le=86400)
    queue_capacity: int = Field(default=NotifierSettings.queue_capacity, ge=1, le=1_000_000)
    # Where the alerts' runbook_url points (gpu_exporter/alerting/rules/runbook.py); None: this
    # daemon's own /runbook (Config.runbook_base_url).
    runbook_base_url: str | None = None

    _pairs = field_validator("external_labels", mode="before")(_parse_pairs)

    @field_validator("runbook_base_url")
    @classmethod
    def _absolute_url(cls, value: str | None) -> str | None:
        if value is not None:
            url = urlsplit(value)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise ValueError(f"must be an absolute http(s) URL, got {value!r}")
            if url.fragment:
                raise ValueError(
                    f"must not have a #fragment (the alert adds its own), got {value!r}"
                )
        return value

    @field_validator("alertmanagers", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        """URLs alone (flag or `GPU_EXPORTER_ALERTING__ALERTMANAGERS=http://a,http://b`)."""
        if isinstance(value, str):
            value = split_commas(value)
        if isinstance(value, list):
            return [{"url": item} if isinstance(item, str) else item for item in value]
        return value

    @model_validator(mode="after")
    def _targets_valid(self) -> AlertingConfig:
        for am in self.alertmanagers:
            am.target()  # the notifier's own checks: scheme, auth combinations, files
        return self


class Config(SettingsModel):
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
    dcgm_compat: DcgmCompatConfig = DcgmCompatConfig()

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
    path = path or environ.get(ENV_CONFIG_FILE) or None
    located: LocatedYaml | None = None
    data: dict[str, Any] = {}
    if path:
        try:
            located = load_yaml_file(path)
        except YamlFileError as exc:
            raise ConfigError(f"config error: {exc}") from exc
        if located.data is None:
            located.data = {}
        if not isinstance(located.data, dict):
            raise ConfigError(f"config error: {path}: the top level must be a mapping")
        data = dict(located.data)
    origins: _Origins = {}
    for setting, value, where in _env_settings(environ):
        _place(data, setting, value, (_FROM_ENVIRONMENT, where), origins)
    for key, value in (flags or {}).items():
        flag = f"flag --{FLAG_NAMES.get(key, key.replace('_', '-'))}"
        _place(data, tuple(key.split(".")), value, (_FROM_FLAG, flag), origins)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(err, located, origins, data) for err in exc.errors()]
        raise ConfigError("\n".join(problems)) from exc


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
    if located is not None:
        return f"config error: {located.where(path)}: {message}"
    return f"config error: {format_path(path)}: {message}"


def rule_settings(config: Config) -> RuleSettings:
    """The rule manager's settings for `config`; `config check` loads the rules with these too."""
    return RuleSettings(
        files=config.rules.files,
        evaluation_interval=config.rules.evaluation_interval_seconds or config.interval_seconds,
        resend_delay=config.alerting.resend_delay_seconds,
        external_labels=config.external_labels(),
        external_url=config.alerting.external_url,
        runbook_base_url=config.runbook_base_url(
            lambda: http_server.serves_tls(config.web_config_file)
        ),
        reload_check_seconds=config.rules.reload_check_seconds,
        max_range_seconds=config.rules.max_range_seconds,
        group_time_budget_seconds=config.rules.group_time_budget_seconds,
        history_max_bytes=config.rules.history_max_bytes,
        semantics=promql.SEMANTICS[config.rules.semantics],
    )
