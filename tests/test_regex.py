"""rules/regex.py: RE2 with Go's syntax, checked against `promtool check rules` (Go 1.19 regexp).

Every pattern below goes into one rule file as a label matcher; promtool's verdict (accepted,
or Go's error message) must be ours, word for word.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from gpu_exporter.support.regex import (
    AffixMatcher,
    RegexError,
    SetMatcher,
    compile_go,
    compile_re2,
    label_matcher,
)
from tests.support import promtool

PATTERNS = [
    # Go refuses, C++ RE2 accepts: mirrored
    r"\C", r"a\Cb", r"(?<n>a)", r"(?P<名>a)",
    # the same in both
    r"\Q\C\E", r"[\Q]\E]", r"(?U)a+", r"a\z", r"a\Z", r"a{,2}", r"a{,}", r"\pL", r"\p{Greek}",
    r"\p{^Greek}", r"\PL", r"[\pL]", r"\p{Any}", r"\pX", r"[[:^alpha:]]", r"[[:foo:]]",
    r"(?P<n>a)", r"(?P<n>a)(?P<n>b)", r"(?P<a1_>x)", r"(?P<>a)", r"(?P<n", r"(?P=n)", r"(?P>n)",
    r"a**", r"a++", r"a?*", r"a*?", r"a*??", r"a{2}{3}", r"a{2}*", r"a{1000}{2}", r"*", r"a|*",
    r"(?=x)", r"(?<=a)", r"(?<!a)", r"(?#c)", r"(?x)a", r"(?)", r"(?-)", r"(?i-)", r"(?-i)",
    r"(?--i)", r"(?i)k", r"(?s:.)", r"(?m)",
    r"(a)\1", r"\12", r"\8", r"\0", r"\08", r"\400", r"\777", r"\_", r"\e", r"\v", r"\G", r"\X",
    r"\x7", r"\x{}", r"\x{41", r"\x{110000}",
    r"a{1001}", r"a{1000}", r"x{1,1001}", r"x{2,1}", r"(a{2}){1001}", r"((a{100}){100}){100}",
    r"[a-\d]", r"[]a]", r"[^]a]", r"[]", r"[a-]", r"[-a]", r"(", r")", r"[a", "\\", r"\Q", r"\Qab",
    r"\Q\E*", r"(?i)\Q*\E", r"a)|(b",
]  # fmt: skip


def _go_verdicts(tmp_path: Path) -> dict[str, str]:
    """pattern -> "OK" or Go's "error parsing regexp: ..." from one promtool run."""
    rules = [
        {"record": f"r{i}", "expr": f"up{{a=~{json.dumps(p)}}}"} for i, p in enumerate(PATTERNS)
    ]
    path = tmp_path / "patterns.rules.json"  # JSON is YAML: no quoting questions
    path.write_text(json.dumps({"groups": [{"name": "g", "rules": rules}]}))
    proc = promtool("check", "rules", str(path))
    verdicts = dict.fromkeys(PATTERNS, "OK")
    for line in (proc.stdout + proc.stderr).splitlines():
        m = re.search(r'"r(\d+)": could not parse expression: .*?(error parsing regexp: .*)$', line)
        if m:
            verdicts[PATTERNS[int(m.group(1))]] = m.group(2)
    assert "OK" in verdicts.values() and set(verdicts.values()) != {"OK"}, proc.stdout
    return verdicts


def _ours(pattern: str) -> str:
    try:
        label_matcher(pattern)
    except RegexError as exc:
        return exc.go_message
    return "OK"


def test_label_matchers_accept_and_refuse_as_go_does(tmp_path: Path) -> None:
    go = _go_verdicts(tmp_path)
    differences = [f"{p!r}: ours {_ours(p)!r}, Go {go[p]!r}" for p in PATTERNS if _ours(p) != go[p]]
    assert not differences, "\n".join(differences)


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ("GPU-([0-9a-f]+-?)*Z", "GPU-" + "0123456789abcdef" * 4096),
        ("([a-z0-9]+-?)+-worker-[0-9]+", "a" * 100_000),
        ("(a|aa)*b", "a" * 100_000),
        ("(x+x+)+y", "x" * 100_000),
    ],
)
def test_backtracking_bombs_match_in_linear_time(pattern: str, text: str) -> None:
    # Python's re needs minutes for 30 characters of any of these; RE2 scans once.
    start = time.monotonic()
    assert label_matcher(pattern).match(text) is None
    assert compile_go(pattern).search(text.encode()) is None
    assert time.monotonic() - start < 1.0


def test_group_names_are_gos_subexp_names() -> None:
    # parentheses in classes, \Q...\E and escapes are no groups; (?:) and (?i) neither
    assert compile_go(r"(?P<n>a)|(?P<n>b)(c)(?:d)[(](?i)\Q(\E[[:alpha:](]\(").names == (
        "",
        "n",
        "n",
        "",
    )
    spans = compile_go("(?P<n>a)|(?P<n>b)").search(b"xb")
    assert spans == [(1, 2), (-1, -1), (1, 2)]


def test_errors_read_as_go_and_as_before() -> None:
    with pytest.raises(RegexError) as info:
        compile_go("a(")
    assert info.value.go_message == "error parsing regexp: missing closing ): `a(`"
    assert str(info.value) == "regular expression 'a(' (missing ): a()"
    with pytest.raises(RegexError) as info:
        compile_go("ab\\")
    assert (
        info.value.go_message == "error parsing regexp: trailing backslash at end of expression: ``"
    )


def test_a_lone_surrogate_is_invalid_utf8_not_a_crash() -> None:
    with pytest.raises(RegexError, match="invalid UTF-8"):
        compile_go("a\ud800")


def test_label_values_with_lone_surrogates_match_without_raising() -> None:
    assert label_matcher("a.*").match("a\ud800b") is not None
    assert label_matcher("b.*").match("a\ud800b") is None


def test_programs_over_re2s_memory_budget_are_refused_as_too_large() -> None:
    # Go 1.19 compiles this (promtool accepts it); RE2's 8 MiB program budget does not: the one
    # difference kept, since it bounds what a single pattern may cost.
    with pytest.raises(RegexError) as info:
        label_matcher(r"\pL{1000}")
    assert info.value.go_message == "error parsing regexp: expression too large: `\\pL{1000}`"


@pytest.mark.parametrize(
    "pattern", ["launch_bound|link_bound", "a", "", "a|", "|", "a||b", "x-1:y/z,q=r@s% t"]
)
def test_literal_alternatives_are_a_set_that_matches_as_re2_does(pattern: str) -> None:
    matcher = label_matcher(pattern)
    assert isinstance(matcher, SetMatcher)
    anchored = compile_re2(f"^(?:{pattern})$")
    values = ["", "a", "b", "ab", "a|b", "launch_bound", "link_bound", "launch", " ", "A"]
    values += [*pattern.split("|"), pattern, pattern + "x"]
    for value in values:
        assert (matcher.match(value) is not None) == (anchored.match(value) is not None), value


@pytest.mark.parametrize("pattern", ["a.b", "a|b.*", "(a|b)", "a+", "[ab]", "(?i)a", "a\\|b"])
def test_patterns_with_any_operator_are_not_a_set(pattern: str) -> None:
    assert not isinstance(label_matcher(pattern), SetMatcher)


@pytest.mark.parametrize(
    "pattern", [".*gpu-exporter.*", "gpu.*", ".*exporter", ".*", ".*.*", ".*a|b.*"]
)
def test_a_literal_between_wildcards_matches_as_re2_does(pattern: str) -> None:
    matcher = label_matcher(pattern)
    anchored = compile_re2(f"^(?:{pattern})$")
    values = ["", "gpu", "gpu-exporter", "x-gpu-exporter-y", "exporter", "gpu\nexporter", "\n"]
    values += ["a|b", "a", "b", "xa|bx", "gpu-exporter\n", "\ngpu-exporter"]
    for value in values:
        assert (matcher.match(value) is not None) == (anchored.match(value) is not None), value
    assert isinstance(matcher, AffixMatcher) == ("|" not in pattern)
