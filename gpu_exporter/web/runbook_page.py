"""The alert runbook as a page: docs/runbook.md, served at `/runbook`.

The page is rendered with markdown-it-py (CommonMark, the dialect GitHub renders, so the file
reads the same in both places); headings get GitHub's anchors, raw HTML in the Markdown is shown
as text, and links relative to the repository point at nothing on the daemon, so the renderer
leaves them as text too.
"""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_exporter import __version__
from gpu_exporter.alerting.rules.runbook import slug
from gpu_exporter.web import page_security

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token


# The runbook inside the package: a link to docs/runbook.md in the source tree.
_RUNBOOK_FILE = Path(__file__).resolve().parent / "runbook.md"


_ABSOLUTE_LINK = re.compile(r"^(https?:|mailto:|#)", re.IGNORECASE)


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
