"""Where the alerts' `runbook_url` points: docs/runbook.md, or the daemon's own `/runbook`.

The shipped rules write `runbook_url: docs/runbook.md#<alert>`, a path inside this repository,
so that `promtool test rules` and `gpu-exporter rules test` check one text. Every path that
hands the rules to a person makes it absolute with one base URL (`alerting.runbook_base_url`):
the daemon when it loads rule files, `gpu-exporter rules export --runbook-base-url`, and the
Helm chart (`rules.runbookBaseUrl`). Without one, the daemon points at its own `/runbook`
(the page: `gpu_exporter/web/runbook_page.py`).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the loader brings the PromQL engine; the configuration reads this module
    from gpu_exporter.alerting.rules.loader import Group, Rule

# What the shipped rules' runbook_url values start with (the file's path in this repository).
RUNBOOK_SOURCE = "docs/runbook.md"
RUNBOOK_PATH = "/runbook"  # where the daemon serves it
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def anchor_of(alert: str) -> str:
    """The runbook anchor of an alert: its section's heading is the alert's name."""
    return slug(alert)


def slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def links_runbook(value: str) -> bool:
    """Whether a runbook_url value is a shipped link that needs a base URL."""
    return value.startswith(RUNBOOK_SOURCE)


def resolve_url(value: str, base_url: str) -> str:
    """`value` with a leading RUNBOOK_SOURCE replaced by `base_url`; other values unchanged."""
    if not base_url or not links_runbook(value):
        return value
    return base_url.rstrip("/") + value[len(RUNBOOK_SOURCE) :]


def with_runbook_base(groups: Iterable[Group], base_url: str) -> list[Group]:
    """The groups with every alert's runbook_url made absolute under `base_url` ("": as is)."""
    out = []
    for group in groups:
        rules = tuple(_with_base(rule, base_url) for rule in group.rules)
        # A rule the daemon skips is listed in /api/v1/rules with its annotations too.
        skipped = tuple(replace(s, rule=_with_base(s.rule, base_url)) for s in group.skipped)
        out.append(replace(group, rules=rules, skipped=skipped))
    return out


def _with_base(rule: Rule, base_url: str) -> Rule:
    url = rule.annotations.get("runbook_url")
    if url is None or resolve_url(url, base_url) == url:
        return rule
    return replace(
        rule, annotations={**rule.annotations, "runbook_url": resolve_url(url, base_url)}
    )


def default_base_url(
    listen_address: str, tls: bool, environ: Mapping[str, str] | None = None
) -> str:
    """The daemon's own /runbook: its listen address when that names one host, else the pod's
    IP ($POD_IP, the DaemonSet's downward API), else this host's name."""
    environ = os.environ if environ is None else environ
    host, _, port = listen_address.rpartition(":")
    if host in _WILDCARD_HOSTS:
        # gethostname, not getfqdn: no DNS lookup that a broken resolver could stall.
        host = environ.get("POD_IP") or socket.gethostname()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal in a URL
    scheme = "https" if tls else "http"
    return f"{scheme}://{host}:{port}{RUNBOOK_PATH}"
