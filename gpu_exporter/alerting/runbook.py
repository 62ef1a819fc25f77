"""The alert runbook: docs/runbook.md, served at `/runbook`, and where `runbook_url` points.

The shipped rules write `runbook_url: docs/runbook.md#<alert>`, a path inside this repository,
so that `promtool test rules` and `gpu-exporter rules test` check one text. Every path that
hands the rules to a person makes it absolute with one base URL (`alerting.runbook_base_url`):
the daemon when it loads rule files, `gpu-exporter rules export --runbook-base-url`, and the
Helm chart (`rules.runbookBaseUrl`). Without one, the daemon points at its own `/runbook`.

The page is rendered with markdown-it-py (CommonMark, the dialect GitHub renders, so the file
reads the same in both places); headings get GitHub's anchors, raw HTML in the Markdown is shown
as text, and links relative to the repository point at nothing on the daemon, so the renderer
leaves them as text too.
"""

from __future__ import annotations

import functools
import html
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_exporter import __version__
from gpu_exporter.alerting.rules.loader import Group, Rule
from gpu_exporter.web import page_security

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

# What the shipped rules' runbook_url values start with (the file's path in this repository).
RUNBOOK_SOURCE = "docs/runbook.md"
RUNBOOK_PATH = "/runbook"  # where the daemon serves it
# A link to the runbook inside the package: docs/runbook.md in the source tree.
_RUNBOOK_FILE = Path(__file__).resolve().parent / "runbook.md"
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})
_ABSOLUTE_LINK = re.compile(r"^(https?:|mailto:|#)", re.IGNORECASE)


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


def markdown_source() -> str:
    return _RUNBOOK_FILE.read_text(encoding="utf-8")


def _parse(text: str) -> tuple[MarkdownIt, list[Token], list[str]]:
    from markdown_it import MarkdownIt  # only when the page is asked for: it costs memory

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    anchors: list[str] = []
    repeats: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            anchor = slug(tokens[i + 1].content)
            seen = repeats.get(anchor, 0)
            repeats[anchor] = seen + 1
            anchor = f"{anchor}-{seen}" if seen else anchor  # GitHub numbers repeats
            anchors.append(anchor)
            token.attrSet("id", anchor)
        for child in token.children or ():
            href = child.attrGet("href") if child.type == "link_open" else None
            if href is not None and not _ABSOLUTE_LINK.match(str(href)):
                # A path inside the repository: nothing the daemon serves.
                child.attrs.pop("href", None)
    return md, tokens, anchors


@functools.cache
def _parsed() -> tuple[MarkdownIt, list[Token], list[str]]:
    return _parse(markdown_source())


def anchors() -> list[str]:
    """Every heading anchor of the runbook, in order."""
    return list(_parsed()[2])


@functools.cache
def render_page() -> str:
    """The runbook as one self-contained HTML page (no external assets)."""
    md, tokens, _ = _parsed()
    body = md.renderer.render(tokens, md.options, {})
    return _PAGE.format(version=html.escape(__version__), style=_STYLE, body=body)


def page_headers() -> dict[str, str]:
    """Nothing but the page's own style may load (no scripts at all)."""
    return page_security.page_headers(f"style-src {page_security.inline_hash(_STYLE)}")


_STYLE = """
body { max-width: 60rem; margin: 0 auto; padding: 1rem 1.25rem;
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
code { font-size: 90%; }
h3 { margin-top: 2rem; border-top: 1px solid #d0d7de; padding-top: .75rem; }
:target { background: #fff8c5; color: #1b1f24; }
"""
_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>gpu-exporter alert runbook</title>
<style>{style}</style>
</head>
<body>
<p><a href="./">status page</a> · gpu-exporter {version}</p>
{body}
</body>
</html>
"""
