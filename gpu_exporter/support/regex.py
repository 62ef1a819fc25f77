"""Regular expressions as Prometheus runs them: RE2 syntax, matched in linear time.

Prometheus compiles label-matcher regexes with Go's `regexp` (RE2 syntax) anchored as
`^(?:PATTERN)$` (prometheus/prometheus, model/labels/regexp.go, 2.42), and its templates call
`regexp.MatchString` and `Regexp.ReplaceAllString` (template/template.go, 2.42). The
`google-re2` package binds the C++ RE2 library that Go's engine follows: the same syntax (Perl
classes `\\d \\w \\s` ASCII-only, POSIX classes, `\\pL`, no backreferences or lookarounds) and,
above all, matching in time linear in the input, so no rule or pod name can make a match run
for seconds.

Where C++ RE2 (2025) and Go 1.19's `regexp/syntax` (what Prometheus 2.42 was built with) differ,
Go is followed; each case was checked against `promtool check rules` 2.42 (go1.19.8):

* `\\C` (any byte) is refused, as Go refuses it: "invalid escape sequence".
* `(?<name>...)` is refused (Go accepts only `(?P<name>...)` before 1.22).
* Group names must be ASCII letters, digits and `_` (RE2 also takes other Unicode letters).
* Error messages use Go's wording ("missing closing )" for RE2's "missing )", and so on), with
  the offending text as RE2 reports it (the same as Go's for every pattern tests/test_regex.py
checks).

Differences left: RE2 refuses programs over its 8 MiB memory budget ("expression too large")
that Go would compile; the Unicode tables behind `\\pL` and `(?i)` are RE2's, newer than Go
1.19's Unicode 13, which only matters for characters assigned since; and a Python string may
hold a lone surrogate, which no Go string can: it is matched as the invalid bytes it encodes to.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Characters that are literal everywhere in RE2 and Go syntax. A matcher made of them and `|`
# alone (`launch_bound|link_bound`, the commonest kind in rule files) is a set of strings; one
# literal between `.*`s a substring, prefix or suffix test. Neither needs RE2.
_LITERAL = frozenset(string.ascii_letters + string.digits + "_-:/,=@% ")


@functools.cache
def _re2() -> Any:
    """The google-re2 module, imported on first use: its C++ library costs about 2.6 MiB of
    resident memory, which rule files whose matchers are all literal sets never need."""
    import re2

    return re2


@functools.cache
def _options() -> Any:
    # RE2's own default program budget (8 MiB) bounds what one pattern may cost; log_errors
    # off: RE2 would print every refused pattern to stderr, where it is refused at load already.
    options = _re2().Options()
    options.log_errors = False
    return options


# RE2's error codes (re2/regexp.cc, CodeText) in Go's words (regexp/syntax/parse.go, ErrorCode).
_GO_ERROR_CODES = {
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid named capture group": "invalid named capture",
    "pattern too large - compile failed": "expression too large",
    "pattern too large - reverse compile failed": "expression too large",
}


class RegexError(ValueError):
    """A pattern RE2 (or Go) refuses; `reason` is RE2's "code: offending text"."""

    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(f"regular expression {pattern!r} ({reason})")
        self.pattern, self.reason = pattern, reason

    @property
    def go_message(self) -> str:
        """The error as Go's regexp.Compile words it: "error parsing regexp: CODE: `TEXT`"."""
        code, _, text = self.reason.partition(": ")
        go_code = _GO_ERROR_CODES.get(code, code)
        if go_code == "expression too large":  # RE2 names no part; Go quotes the pattern
            text = self.pattern
        return f"error parsing regexp: {go_code}: `{text}`"


@dataclass(frozen=True)
class GoRegexp:
    """A compiled pattern with Go's SubexpNames (index 0, the whole match, and unnamed: "")."""

    program: Any  # re2._Regexp; match it against UTF-8 bytes for byte offsets
    names: tuple[str, ...]

    def search(self, data: bytes, pos: int = 0) -> list[tuple[int, int]] | None:
        """Leftmost-first match at or after byte `pos` (context before `pos` counts for `^`, `\\b`):
        the spans of the match and of every group ((-1, -1) if it took no part), or None."""
        m = self.program.search(data, pos)
        return None if m is None else [m.span(k) for k in range(len(self.names))]


def compile_re2(pattern: str) -> Any:
    """`pattern` compiled as is (unanchored), or RegexError."""
    return compile_go(pattern).program


@functools.lru_cache(maxsize=1024)
def compile_go(pattern: str) -> GoRegexp:
    """`pattern` as Go's regexp.Compile accepts it, or RegexError."""
    re2 = _re2()
    try:
        program = re2.compile(pattern, options=_options())
    except UnicodeEncodeError:  # a lone surrogate: Go sees invalid UTF-8
        raise RegexError(pattern, f"invalid UTF-8: {pattern}") from None
    except re2.error as exc:
        reason = exc.args[0] if exc.args else str(exc)
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        if reason.startswith(("invalid perl operator: (?<=", "invalid perl operator: (?<!")):
            reason = "invalid perl operator: (?<"  # Go quotes up to the first character it refuses
        raise RegexError(pattern, str(reason)) from None
    names = _go_group_names(pattern)
    if len(names) != program.groups + 1:  # cannot happen for a pattern RE2 parsed; be safe
        by_index = {index: name for name, index in program.groupindex.items()}
        names = tuple(by_index.get(k, "") for k in range(program.groups + 1))
    return GoRegexp(program, names)


def _go_group_names(pattern: str) -> tuple[str, ...]:
    """SubexpNames of a pattern RE2 accepted; RegexError for what Go refuses beyond RE2."""
    names = [""]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            following = pattern[i + 1 : i + 2]
            if following == "Q":  # literal text up to \E (or the end)
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
                continue
            if following == "C":
                raise RegexError(pattern, "invalid escape sequence: \\C")
            i += 2  # \x{..} and \p{..} hold no parenthesis or bracket
            continue
        if c == "[":
            i = _class_end(pattern, i)
            continue
        if c == "(":
            if pattern.startswith("(?P<", i):
                end = pattern.index(">", i)  # RE2 accepted it, so the name is closed
                name = pattern[i + 4 : end]
                if not (name.isascii() and name.replace("_", "a").isalnum()):
                    raise RegexError(
                        pattern, f"invalid named capture group: {pattern[i : end + 1]}"
                    )
                names.append(name)
            elif pattern.startswith("(?<", i):  # lookbehinds are refused by RE2 already
                raise RegexError(pattern, "invalid perl operator: (?<")
            elif not pattern.startswith("(?", i):
                names.append("")
        i += 1
    return tuple(names)


def _class_end(pattern: str, i: int) -> int:
    """Index after the character class opening at `i` (RE2 parse.cc's rules for a valid one)."""
    j = i + 1
    if pattern.startswith("^", j):
        j += 1
    if pattern.startswith("]", j):  # a leading ] is a literal
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        if pattern[j] == "\\":
            j += 2
        elif pattern.startswith("[:", j) and (close := pattern.find(":]", j + 2)) >= 0:
            j = close + 2  # [:alpha:]; RE2 looks for ":]" this far too
        else:
            j += 1
    return j + 1


def expand(
    add: Callable[[bytes], None],
    template: str,
    src: bytes,
    spans: Sequence[tuple[int, int]],
    names: Sequence[str],
) -> None:
    """Go's Regexp.Expand of `template` for one match of `src` (its `spans`, from
    GoRegexp.search), passed piecewise to `add`: $1, ${1}, $name, ${name}, $$; a group that
    took no part adds nothing; a malformed `$` stays as text."""
    i = 0
    while (j := template.find("$", i)) >= 0:
        add(_utf8(template[i:j]))
        if template.startswith("$", j + 1):
            add(b"$")
            i = j + 2
            continue
        ref = _extract(template, j + 1)
        if ref is None:
            add(b"$")
            i = j + 1
            continue
        name, num, i = ref
        if num < 0:  # the first group of that name that took part (names may repeat in Go)
            num = next((k for k, n in enumerate(names) if n == name and spans[k][0] >= 0), -1)
        if 0 <= num < len(spans) and spans[num][0] >= 0:
            add(src[spans[num][0] : spans[num][1]])
    add(_utf8(template[i:]))


def _extract(template: str, i: int) -> tuple[str, int, int] | None:
    """regexp's extract after a '$' at i-1: (name, number or -1, end), None if malformed."""
    brace = template.startswith("{", i)
    start = end = i + brace
    while end < len(template) and (
        template[end].isalpha() or template[end].isdecimal() or template[end] == "_"
    ):
        end += 1  # unicode.IsLetter, unicode.IsDigit (Nd) or '_'
    if end == start:
        return None
    name = template[start:end]
    if brace:
        if not template.startswith("}", end):
            return None
        end += 1
    # A number: ASCII digits only, at most 9 of them, no leading zero.
    is_num = name.isascii() and name.isdigit() and len(name) <= 9
    num = int(name) if is_num and (name[0] != "0" or name == "0") else -1
    return name, num, end


def _utf8(s: str) -> bytes:
    # A lone surrogate (not UTF-8) passes as the invalid bytes that Go would carry along.
    return s.encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class FullMatcher:
    """An anchored pattern; `match(value)` is a match object when all of `value` matches."""

    program: Any

    def match(self, value: str) -> Any:
        # A lone surrogate in a value (not UTF-8) must not raise: it matches as invalid bytes.
        return self.program.match(value.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class SetMatcher:
    """A pattern of literal alternatives: a full match is membership in the set (Prometheus'
    FastRegexMatcher does the same, model/labels/regexp.go `setMatches`)."""

    values: frozenset[str]

    def match(self, value: str) -> bool | None:
        return True if value in self.values else None  # None: no match, as RE2's match()


@dataclass(frozen=True)
class AffixMatcher:
    """`.*TEXT.*`, `TEXT.*` or `.*TEXT` with literal TEXT: a substring, prefix or suffix test
    (FastRegexMatcher's contains/prefix/suffix cases). `.` matches anything but a newline."""

    text: str
    any_before: bool
    any_after: bool

    def match(self, value: str) -> bool | None:
        if "\n" in value:
            return None
        if self.any_before and self.any_after:
            found = self.text in value
        elif self.any_before:
            found = value.endswith(self.text)
        else:
            found = value.startswith(self.text)
        return True if found else None


def _literal_matcher(pattern: str) -> SetMatcher | AffixMatcher | None:
    """The pattern as a set or affix test when it is one of those shapes, else None."""
    if _LITERAL.issuperset(pattern.replace("|", "")):
        return SetMatcher(frozenset(pattern.split("|")))
    any_before, any_after = pattern.startswith(".*"), pattern.endswith(".*")
    text = pattern[2 if any_before else 0 : len(pattern) - 2 if any_after else len(pattern)]
    if (any_before or any_after) and _LITERAL.issuperset(text):
        return AffixMatcher(text, any_before, any_after)
    return None


@functools.lru_cache(maxsize=1024)
def label_matcher(pattern: str) -> FullMatcher | SetMatcher | AffixMatcher:
    """A PromQL `=~`/`!~` pattern as Prometheus anchors it; `.match(value)` is a full match.

    Prometheus 2.42 (labels.NewFastRegexMatcher) compiles `^(?:PATTERN)$`, then parses PATTERN
    alone, so `a)|(b`, valid once wrapped, is refused too; the first failure is the message."""
    simple = _literal_matcher(pattern)
    if simple is not None:
        return simple
    try:
        anchored = compile_re2(f"^(?:{pattern})$")
        compile_go(pattern)
    except RegexError as exc:
        raise RegexError(pattern, exc.reason) from None
    return FullMatcher(anchored)


def check_label_matcher(pattern: str) -> None:
    """RegexError unless Prometheus would accept `pattern` in a label matcher."""
    label_matcher(pattern)
