"""Response headers for the daemon's own HTML pages (the status page, /runbook): a CSP that
lets only each page's own inline blocks run or apply (by hash), no framing, no base or form
targets, and no referrer (the daemon's address) sent to the links a page has."""

from __future__ import annotations

import base64
import hashlib


def inline_hash(text: str) -> str:
    """A CSP source that allows exactly this inline `<script>` or `<style>` body."""
    digest = hashlib.sha256(text.encode()).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


def page_headers(sources: str) -> dict[str, str]:
    """`sources`: the page's own CSP directives (script-src, style-src, connect-src ...)."""
    csp = (
        f"default-src 'none'; {sources}; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
