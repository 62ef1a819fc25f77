"""Regular expressions as Prometheus runs them: RE2 syntax, matched in linear time.

Prometheus compiles label-matcher regexes with Go's `regexp` (RE2 syntax) anchored as
`^(?:PATTERN)$` (prometheus/prometheus, model/labels/regexp.go, 2.42). The `google-re2` package
binds the C++ RE2 library that Go's engine follows: the same syntax (Perl classes `\\d \\w \\s`
ASCII-only, POSIX classes, `\\pL`, no backreferences or lookarounds) and, above all, matching in
time linear in the input, so no rule or pod name can make a match run for seconds.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

# RE2's own default program budget (8 MiB) bounds what one compiled pattern may cost; log_errors
# off: RE2 would print every refused pattern to stderr, where it is refused at load already.
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


class RegexError(ValueError):
    """A pattern RE2 refuses; the message is RE2's reason, with the pattern."""

    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(f"regular expression {pattern!r} ({reason})")
        self.pattern, self.reason = pattern, reason


def compile_re2(pattern: str) -> Any:
    """`pattern` compiled as is (unanchored), or RegexError."""
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else str(exc)
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise RegexError(pattern, str(reason)) from None


@functools.lru_cache(maxsize=1024)
def label_matcher(pattern: str) -> Any:
    """A PromQL `=~`/`!~` pattern as Prometheus anchors it; `.match(value)` is a full match."""
    try:
        return compile_re2(f"^(?:{pattern})$")
    except RegexError as exc:
        raise RegexError(pattern, exc.reason) from None


def check_label_matcher(pattern: str) -> None:
    """RegexError unless Prometheus would accept `pattern` in a label matcher."""
    label_matcher(pattern)
