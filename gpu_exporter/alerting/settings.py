"""The settings of the rules evaluated in the daemon and of the alerts it sends, one pydantic
model per section of the configuration, each default with its reason: `rules:` and `alerting:`
with its Alertmanagers.

Light on purpose (pydantic and the shipped pack's location, not the PromQL engine or httpx):
the configuration (`gpu_exporter/config/load.py`) composes these models, and the rule manager
and the notifier are built from the validated sections themselves. docs/alerting.md says more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gpu_exporter.alerting.pack import default_rule_files
from gpu_exporter.model.promnames import label_name_problem
from gpu_exporter.support.validation import SettingsModel, split_commas

# Which Prometheus' PromQL the rules follow (`rules.semantics`, `rules check/test --semantics`).
RuleSemantics = Literal["prometheus2", "prometheus3"]
RULE_SEMANTICS: tuple[str, ...] = get_args(RuleSemantics)
# 2.42 is what the project's CI checks the shipped rules against (Debian's promtool).
DEFAULT_RULE_SEMANTICS: RuleSemantics = "prometheus2"
# How far back a rule may read (range + offset) unless `rules.max_range_seconds` says otherwise:
# the rule store keeps each metric's history that long, at the sampling interval.
DEFAULT_MAX_RANGE_SECONDS = 3600.0


def parse_pairs(value: Any) -> Any:
    """A label map given as one string, as environment variables and flags give it:
    `k=v,k2=v2` (a before-validator; anything else is left to the field's type)."""
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


# `Field(default=...)` by keyword throughout: type checkers read a field's default from that
# keyword only (PEP 681), so a positional default would make the field look required.


class RulesConfig(SettingsModel):
    """`rules:`, the rule files evaluated in the daemon (gpu_exporter/alerting/rules/manager.py)
    and the budgets that keep a rule file from taking the node down with it."""

    enabled: bool = True
    files: list[str] = Field(default_factory=default_rule_files)  # the shipped pack
    # None: the sampling interval (interval_seconds): the rules see every tick.
    evaluation_interval_seconds: float | None = Field(default=None, ge=0.2, le=3600)
    # How often the rule files' modification times are compared (a changed file is reloaded;
    # SIGHUP reloads at the next tick).
    reload_check_seconds: float = Field(default=5.0, gt=0, le=3600)
    # A rule reading further back (range + offset) is refused at load: the store keeps each
    # metric's history as long as the longest read of it.
    max_range_seconds: float = Field(default=DEFAULT_MAX_RANGE_SECONDS, gt=0, le=7 * 86400)
    # How long one group's evaluation may take before it is stopped and counted. None: half the
    # evaluation interval, so that one slow group still leaves time for the rest of the tick.
    group_time_budget_seconds: float | None = Field(default=None, gt=0, le=3600)
    # The rule history's memory cap (64 MiB): over it, every series' history is shortened,
    # oldest samples first.
    history_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1 << 20, le=1 << 34)
    # Which Prometheus' PromQL the rules follow: match the cluster's Prometheus.
    semantics: RuleSemantics = DEFAULT_RULE_SEMANTICS

    _lists = field_validator("files", mode="before")(split_commas)


class BasicAuthConfig(SettingsModel):
    username: str
    password: str | None = None
    password_file: str | None = None  # re-read on each request (secret rotation)


class TlsConfig(SettingsModel):
    ca_file: str | None = None  # None: the system's CAs
    cert_file: str | None = None  # with key_file: mutual TLS
    key_file: str | None = None
    insecure_skip_verify: bool = False


class AlertmanagerConfig(SettingsModel):
    """One Alertmanager; alerts are POSTed to `{url}/api/v2/alerts`."""

    url: str
    basic_auth: BasicAuthConfig | None = None
    bearer_token: str | None = None
    bearer_token_file: str | None = None  # re-read on each request (token rotation)
    tls: TlsConfig = TlsConfig()
    # Prometheus' own default for an Alertmanager (alertmanager_config's timeout).
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)

    def check(self) -> None:
        """ValueError naming the Alertmanager when what is set cannot work: a URL that is not
        an Alertmanager's, two kinds of credentials, half a pair, a secret file missing."""
        _validate_url(self.url)
        where = f"alertmanager {self.url}"
        auth = self.basic_auth
        has_bearer = self.bearer_token is not None or self.bearer_token_file is not None
        if auth is not None and has_bearer:
            raise ValueError(f"{where}: set basic auth or a bearer token, not both")
        if auth is not None and auth.password is not None and auth.password_file is not None:
            raise ValueError(
                f"{where}: set basic_auth_password or basic_auth_password_file, not both"
            )
        if self.bearer_token is not None and self.bearer_token_file is not None:
            raise ValueError(f"{where}: set bearer_token or bearer_token_file, not both")
        if (self.tls.cert_file is None) != (self.tls.key_file is None):
            raise ValueError(f"{where}: cert_file and key_file must be set together")
        files = {
            "basic_auth_password_file": auth.password_file if auth else None,
            "bearer_token_file": self.bearer_token_file,
        }
        for name, path in files.items():
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{where}: {name} {path!r} is not a readable file")


def _validate_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a bad port
    except ValueError as exc:
        raise ValueError(f"alertmanager url {url!r}: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"alertmanager url {url!r}: the scheme must be http or https")
    if not parts.hostname:
        raise ValueError(f"alertmanager url {url!r}: no host")
    if parts.username is not None or parts.password is not None:
        # Credentials in the url would end up in logs and metric labels.
        raise ValueError(f"alertmanager url {url!r}: use basic_auth_username, not user@host")
    if parts.query or parts.fragment:
        raise ValueError(f"alertmanager url {url!r}: no query or fragment allowed")


class AlertingConfig(SettingsModel):
    """`alerting:`, where and how the alerts go (gpu_exporter/alerting/notify/alertmanager.py)."""

    alertmanagers: list[AlertmanagerConfig] = Field(default=[])
    # Added to every alert sent; `node` defaults to $NODE_NAME (the DaemonSet's downward API).
    external_labels: dict[LabelName, LabelValue] = Field(default={})
    # The alerts' generatorURL is this plus /api/v1/alerts ("": a relative one).
    external_url: str = ""
    # Firing alerts are sent again this often, as Prometheus' --rules.alert.resend-delay
    # (1m) does, so Alertmanager never lets one time out while it still fires.
    resend_delay_seconds: float = Field(default=60.0, gt=0, le=86400)
    # Alerts queued per Alertmanager while it is down, as Prometheus'
    # --alertmanager.notification-queue-capacity; the oldest are dropped past it.
    queue_capacity: int = Field(default=10000, ge=1, le=1_000_000)
    # Where the alerts' runbook_url points (gpu_exporter/alerting/rules/runbook.py); None: this
    # daemon's own /runbook (Config.runbook_base_url).
    runbook_base_url: str | None = None

    _pairs = field_validator("external_labels", mode="before")(parse_pairs)

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

    @field_validator("alertmanagers")
    @classmethod
    def _each_once(cls, targets: list[AlertmanagerConfig]) -> list[AlertmanagerConfig]:
        """An Alertmanager listed twice: its queue, sender and metrics are keyed by its URL
        (alerting/notify/alertmanager.py), so a second entry could only collide with the first.
        Reported at the second entry, so the file's line (or the flag) says which."""
        first: dict[str, int] = {}
        for index, target in enumerate(targets):
            url = target.url.rstrip("/")  # the notifier's key
            if url in first:
                problem = PydanticCustomError(
                    "duplicate_alertmanager",
                    "{url} is listed twice (also alerting.alertmanagers[{first}]): "
                    "give each Alertmanager once",
                    {"url": url, "first": first[url]},
                )
                raise ValidationError.from_exception_data(
                    "alertmanagers",
                    [{"type": problem, "loc": (index, "url"), "input": target.url}],
                )
            first[url] = index
        return targets

    @model_validator(mode="after")
    def _targets_valid(self) -> AlertingConfig:
        for am in self.alertmanagers:
            am.check()
        return self
