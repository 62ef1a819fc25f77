"""The settings of what is served over HTTP, one pydantic model per section of the
configuration, each default with its reason: `web:` (the server's limits), `metrics:` (what
/metrics exports) and `dcgm_compat:` (the dcgm-exporter compatible endpoint).

Light on purpose (pydantic only, no uvicorn): the configuration (`gpu_exporter/config/load.py`)
composes these models, and the HTTP server and the compat endpoint are built from the validated
sections themselves. The README's "Limits, security and failure handling" says more.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, WithJsonSchema, field_validator, model_validator

from gpu_exporter.model.catalog import FAMILIES
from gpu_exporter.model.profile import ProfileName, unknown_families
from gpu_exporter.support.validation import SettingsModel, split_commas

# Where the daemon serves HTTP (the top-level listen_address): every interface, since
# Prometheus scrapes it from another host.
DEFAULT_LISTEN_ADDRESS = "0.0.0.0:9449"


def split_host_port(address: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPV6]:PORT` -> (host, port); ValueError with the reason otherwise."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is outside 1-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)
    elif not host:
        raise ValueError(f"expected HOST:PORT, got {address!r} (no host)")
    return host, port


# `Field(default=...)` by keyword throughout: type checkers read a field's default from that
# keyword only (PEP 681), so a positional default would make the field look required.


class WebConfig(SettingsModel):
    """`web:`, the HTTP server's limits (gpu_exporter/web/http_limits.py). TLS and basic auth
    come from the web-config file, a top-level setting (`web_config_file`), which once loaded
    is web_config.WebConfig, another class."""

    # A connection must have sent a request's whole header (or finished its TLS handshake)
    # within this time: a slowloris client cannot hold a connection open for ever.
    header_read_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    # A kept-alive connection with no request in flight is closed after this time.
    idle_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    # Open connections at most (lowered to the open-file limit less http_limits.FD_RESERVE);
    # past it, the oldest connection still sending its request is answered 503 (with
    # Retry-After) and closed first, then the oldest idle one, so probes get through a
    # slowloris; only when all have a request in flight does the new one get that 503.
    max_connections: int = Field(default=256, ge=4, le=65536)
    # /healthz and /readyz without basic auth, for kubelet probes (TLS still applies).
    probes_without_auth: bool = True


def _known_family(name: str) -> str:
    if unknown_families([name]):
        raise ValueError(f"unknown metric family {name!r} (the README's metric table lists them)")
    return name


# A family's name as /metrics writes it; the JSON schema (the chart's values.schema.json) lists
# them, so helm refuses a misspelt one too.
FamilyName = Annotated[
    str,
    AfterValidator(_known_family),
    WithJsonSchema({"type": "string", "enum": [family.name for family in FAMILIES]}),
]


class MetricsConfig(SettingsModel):
    """`metrics:`, which of each tick's series /metrics exports, and the daemon's rules see
    (gpu_exporter/model/profile.py; the README's "Metrics profiles")."""

    # default: what the shipped rules, recording rules and dashboards read, fewer series than
    # dcgm-exporter's default output for the same node; full: every family and series.
    profile: ProfileName = "default"
    # Families exported whole whatever the profile, and families never exported (catalog names,
    # as /metrics writes them; the README's metric table lists them).
    include: tuple[FamilyName, ...] = ()
    exclude: tuple[FamilyName, ...] = ()

    _lists = field_validator("include", "exclude", mode="before")(split_commas)

    @model_validator(mode="after")
    def _not_both(self) -> MetricsConfig:
        both = [name for name in self.include if name in self.exclude]
        if both:
            raise ValueError(f"{', '.join(both)} both in include and in exclude; keep one")
        return self


class DcgmCompatConfig(SettingsModel):
    """`dcgm_compat:`, /metrics/dcgm: dcgm-exporter 4.8's names, labels and units
    (gpu_exporter/web/dcgm_compat)."""

    # Off unless asked: a bridge for dashboards and rules written against dcgm-exporter, to
    # be turned off once they read the native metrics (docs/migrating-from-dcgm-exporter.md).
    enabled: bool = False
    # dcgm-exporter 4.8.3 and later write `hostname`, earlier ones `Hostname`; "none" leaves
    # the label out (its -n). The value is $NODE_NAME, else the host's name.
    hostname_label: Literal["hostname", "Hostname", "none"] = "hostname"
    # HOST:PORT of a second listener serving the compat output at /metrics, for scrape
    # configs and tools that assume dcgm-exporter's port (9400) and path.
    listen_address: str | None = None
    # dcgm-exporter's counters file (its -f/--collectors CSV): serve the families it names,
    # with its types and help texts, instead of the default ones. Read at start; a field no
    # DCGM knows is an error naming the line (gpu_exporter/web/dcgm_compat/selection.py).
    counters_file: str | None = None
    # A row of the counters file /metrics/dcgm does not serve: a warning logged once (false,
    # as dcgm-exporter skips what it cannot collect), or an error that stops the start.
    strict: bool = False

    @field_validator("listen_address")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            split_host_port(value)
        return value

    @model_validator(mode="after")
    def _enabled_for_port(self) -> DcgmCompatConfig:
        uses = {
            "listen_address": "serves the compat output",
            "counters_file": "picks the compat output's families",
        }
        for setting, what in uses.items():
            if getattr(self, setting) is not None and not self.enabled:
                raise ValueError(
                    f"{setting} {what}, which is off: set enabled: true (flag --dcgm-compat) too"
                )
        return self
