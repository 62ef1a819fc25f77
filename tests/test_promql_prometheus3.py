"""Prometheus 3.14's own PromQL test files against the evaluator's Prometheus 3 semantics.

tests/promql/upstream/promqltest.py reads and runs them in-process. Here: every failing case is
listed in differences.yaml with a reason and every listed case still fails, the committed report
is current, the run is not vacuous (floors; mutated expectations fail), the reader survives bad
input, and the vendored files are upstream's bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.store import STALE_NAN
from tests.promql.upstream import promqltest as pt
from tests.promql.upstream import provenance

HINT = (
    "run `python -m tests.promql.upstream.promqltest --update --write-report "
    "tests/promql/upstream/prometheus-3.14/REPORT.md`"
)

# The vendored files hold exactly this many eval commands; the floors rise with the evaluator.
UPSTREAM_CASES = 2195
EVALUATED_FLOOR = 1000
PASS_FLOOR = 945
MUTATE_EVERY = 1  # mutate every passing case (cheap: the whole run takes well under a second)


@pytest.fixture(scope="module")
def parsed() -> dict[str, list[pt.Command]]:
    return pt.parse_suite()


@pytest.fixture(scope="module")
def differences() -> dict[str, str]:
    return pt.load_differences()


@pytest.fixture(scope="module")
def results(parsed: dict[str, list[pt.Command]], differences: dict[str, str]) -> pt.Results:
    return pt.run_suite(promql.PROMETHEUS_3, differences, parsed)


def test_every_failure_is_listed_and_every_listed_case_fails(
    results: pt.Results, differences: dict[str, str]
) -> None:
    failing = {o.case.name: o for o in results.failures()}
    outcomes = results.by_name()
    assert not sorted(set(failing) - set(differences)), f"unlisted failures; {HINT}"
    passing = [n for n in differences if n not in outcomes or outcomes[n].mismatch is None]
    assert not passing, f"listed cases that no longer fail: {passing}; {HINT}"
    assert all(reason.strip() for reason in differences.values()), "a failure without a reason"
    stale = [
        name
        for name, reason in differences.items()
        if reason.startswith(pt.AUTO) and reason != outcomes[name].auto_reason
    ]
    assert not stale, f"auto reasons that no longer say what fails: {stale}; {HINT}"


def test_the_report_is_current(
    parsed: dict[str, list[pt.Command]], results: pt.Results, differences: dict[str, str]
) -> None:
    p2 = pt.run_suite(promql.PROMETHEUS_2, differences, parsed)
    assert pt.REPORT.read_text() == pt.render_report(results, p2, differences), (
        f"prometheus-3.14/REPORT.md is stale: {HINT}"
    )


def test_the_run_is_not_vacuous(results: pt.Results) -> None:
    counts = pt.counts(results)
    assert pt.count_evals() == UPSTREAM_CASES
    assert counts["cases"] == UPSTREAM_CASES, "the reader lost or invented eval commands"
    assert counts["run"] >= EVALUATED_FLOOR
    assert counts["pass"] >= PASS_FLOOR
    assert len(results.by_name()) == len(results.outcomes), "case names are not unique"
    assert not results.bad_lines, f"lines outside any command: {results.bad_lines}"
    unreadable = [o.case.name for o in results.outcomes if o.case.error is not None]
    assert not unreadable, f"cases the reader could not make out: {unreadable}"
    with_values = [o for o in results.outcomes if o.verdict == "pass" and o.case.expected]
    assert len(with_values) >= PASS_FLOOR // 2, "passes should mostly compare values"


# --- mutations: a wrong expectation must fail --------------------------------------------------


def _other(value: float) -> float:
    """A value almost.Equal tells from `value`."""
    if math.isnan(value) or math.isinf(value):
        return 1.0
    return value + max(abs(value) * 1e-3, 1e-3)


def _mutate_value(case: pt.Case) -> pt.Case | None:
    if case.scalar is not None:
        return replace(case, scalar=_other(case.scalar))
    for i, series in enumerate(case.expected):
        k = next((k for k, v in enumerate(series.values) if v is not None), None)
        if k is not None:
            values = list(series.values)
            values[k] = _other(values[k])  # type: ignore[arg-type]
            changed = replace(series, values=tuple(values))
            return replace(case, expected=(*case.expected[:i], changed, *case.expected[i + 1 :]))
    return None


def _mutate_labels(case: pt.Case) -> pt.Case | None:
    if not case.expected:
        return None
    first = case.expected[0]
    labels = tuple(sorted((*first.labels, ("mutated", "1"))))
    return replace(case, expected=(replace(first, labels=labels), *case.expected[1:]))


def _mutate_shape(case: pt.Case) -> pt.Case | None:
    """An expected error made an expected result, an empty result made a non-empty one."""
    if case.fail:
        return replace(case, fail=False)
    if not case.expected and case.scalar is None:
        return replace(case, expected=(pt.Expected(0, (("__name__", "x"),), (1.0,)),))
    return None


def _among(ids: set[int]) -> Callable[[pt.Case], bool]:
    return lambda case: id(case) in ids


MUTATIONS = {"value": _mutate_value, "labels": _mutate_labels, "shape": _mutate_shape}


@pytest.mark.parametrize("kind", sorted(MUTATIONS))
def test_mutated_expectations_fail(
    kind: str, parsed: dict[str, list[pt.Command]], results: pt.Results
) -> None:
    passing = sorted(o.case.name for o in results.outcomes if o.verdict == "pass")
    sample = set(passing[::MUTATE_EVERY] if kind != "shape" else passing)
    mutate = MUTATIONS[kind]
    tried: list[pt.Outcome] = []
    for commands in parsed.values():
        mutated = {}
        for c in commands:
            if isinstance(c, pt.Case) and c.name in sample and (m := mutate(c)) is not None:
                mutated[c.name] = m
        changed = [mutated.get(c.name, c) if isinstance(c, pt.Case) else c for c in commands]
        ids = {id(m) for m in mutated.values()}
        tried += pt.run_commands(changed, promql.PROMETHEUS_3, select=_among(ids))
    assert len(tried) >= 20, f"too few {kind} mutations tried: {len(tried)}"
    # A case reading native histograms counts as skipped when it fails: still not a pass.
    survivors = [o.case.name for o in tried if o.verdict == "pass" or o.mismatch is None]
    assert not survivors, f"{kind} mutations that still pass: {survivors}"


# --- the reader and the comparison -------------------------------------------------------------

BROKEN = """\
load 5m
  good{a="1"} 0+10x4
  bad{a="1" 1 2

eval instant at 10m good
  good{a="1"} 20

eval instant at 10m good
  good{a="1"} 21

eval instant at never good

eval instant at 10m good
  expect nonsense

bogus command

clear

load 1m
  x 1 2 3

eval range from 0 to 2m step 1m x
  x 1 2 3

eval range from 0 to 2m step 1m x
  x 1 _ 3

eval instant at 1m scalar(x)
  2

eval instant at 1m x
  expect fail
"""


def test_bad_input_fails_its_own_case_only() -> None:
    commands = pt.parse_file("broken.test", BROKEN)
    assert [c.line for c in commands if isinstance(c, pt.BadLine)] == [16]
    outcomes = {o.case.line: o for o in pt.run_commands(commands, promql.PROMETHEUS_3)}
    # The first segment's bad series line fails the cases that read it: its input did not load.
    assert all(outcomes[n].verdict == "fail" for n in (5, 8, 11, 13))
    assert "input did not load" in outcomes[8].reason
    assert "input did not load" in outcomes[5].reason
    assert "unreadable case" in outcomes[11].reason and "unreadable case" in outcomes[13].reason
    verdicts = {n: outcomes[n].verdict for n in (23, 26, 29, 32)}
    assert verdicts == {23: "pass", 26: "fail", 29: "pass", 32: "fail"}
    assert "expected an error" in outcomes[32].reason


def test_a_wrong_value_fails() -> None:
    text = "load 1m\n  x 1 2 3\n\neval instant at 2m x\n  x 3\n\neval instant at 2m x\n  x 4\n"
    verdicts = [o.verdict for o in pt.run_commands(pt.parse_file("t", text), promql.PROMETHEUS_3)]
    assert verdicts == ["pass", "fail"]


def test_almost_equal_is_promqltests() -> None:
    assert pt.almost_equal(1.0, 1.0 + 1e-7) and not pt.almost_equal(1.0, 1.0 + 1e-5)
    assert pt.almost_equal(math.nan, math.nan)
    assert not pt.almost_equal(math.nan, STALE_NAN) and pt.almost_equal(STALE_NAN, STALE_NAN)
    assert not pt.almost_equal(0.0, 1e-300)  # an expected 0 must be essentially 0
    assert pt.almost_equal(0.0, 1e-320)
    assert pt.almost_equal(math.inf, math.inf) and not pt.almost_equal(math.inf, -math.inf)


def test_numbers_and_durations_read_as_go_reads_them() -> None:
    assert pt.parse_number("010") == 8.0 and pt.parse_number("0x10") == 16.0
    assert pt.parse_number("-Inf") == -math.inf and math.isnan(pt.parse_number("NaN"))
    assert pt.parse_number("1e3") == 1000.0
    with pytest.raises(pt.FormatError):
        pt.parse_number("{} 1")
    assert pt.parse_duration("1m30s") == 90_000 and pt.parse_duration("0") == 0
    assert pt.parse_duration("20s500ms") == 20_500
    with pytest.raises(pt.FormatError):
        pt.parse_duration("")


def test_features_are_recognised() -> None:
    def need(expr: str, file: str = "x.test", **kw: object) -> str | None:
        return pt.feature_needed(pt.Case(file, 1, expr, 0, **kw), frozenset({"h"}))  # type: ignore[arg-type]

    assert need("x[5m+1m]") == need("x offset (1m)") == need("x[step()]") == pt.Skip.DURATION
    assert need("rate(x[5m] anchored)") == pt.Skip.EXTENDED
    assert need("a + fill(0) b") == pt.Skip.FILL
    assert need("limitk(1, x)") == pt.Skip.LIMIT
    assert need("sort_by_label(x, 'a')") == need("start()") == pt.Skip.EXPERIMENTAL
    assert need("histogram_count(x)") == pt.Skip.NATIVE
    assert need("x @ start()", end_ms=60_000, step_ms=60_000) == pt.Skip.RANGE_AT
    assert need("x", file="native_histograms.test") == pt.Skip.NATIVE
    assert need("x @ start()") is None and need("x[5m:1m] offset 1m") is None
    assert need('label_replace(x, "a", "b[1+1]", "c", "d")') is None  # strings are not syntax
    assert pt.reads_histograms('{__name__=~"h|y"}', frozenset({"h"}))
    assert not pt.reads_histograms("hh + h_bucket", frozenset({"h"}))


# --- vendoring ---------------------------------------------------------------------------------


def test_vendored_files_are_upstreams_bytes() -> None:
    """Every file of upstream's testdata directory at the tag is here, byte for byte: their git
    blob ids are those PROVENANCE lists, as `git ls-tree` prints them upstream."""
    listing = provenance.read(pt.SUITE / "PROVENANCE")
    testdata = "promql/promqltest/testdata/"
    assert listing.tag == pt.TAG
    assert sorted(listing.blobs) == [testdata + p.name for p in pt.suite_files()]
    files = {testdata + p.name: p for p in pt.suite_files()}
    assert not provenance.mismatches(listing, files)
    readme = (pt.SUITE / "README").read_text()
    assert listing.commit in readme and pt.TAG in readme and "Apache License 2.0" in readme
    assert (pt.HERE / "LICENSE").is_file()


def test_docs_carry_the_current_report() -> None:
    # docs/alerting.md shows REPORT.md between its conformance:3 markers, word for word.
    docs = (Path(__file__).resolve().parent.parent / "docs" / "alerting.md").read_text()
    report = pt.REPORT.read_text().rstrip("\n")
    assert report in docs, "copy tests/promql/upstream/prometheus-3.14/REPORT.md into docs"
