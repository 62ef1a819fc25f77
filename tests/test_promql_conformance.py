"""Prometheus 2.42's own PromQL tests, converted for promtool, against the daemon's evaluator.

tests/promql/upstream/ holds the converter, the converted files and the runner. Here: every
disagreement between promtool and `gpu-exporter rules test` is listed (and nothing else is),
the docs section is current, the suite is not vacuous (floors; mutated expectations fail in
both tools), and the converter reproduces the committed files.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.promql.upstream import conformance as conf
from tests.promql.upstream import convert, provenance
from tests.support import promtool, require_tool

TAG = "v2.42.0"

# Today's numbers. promtool's side depends only on the converter; the both-pass floor rises
# as the daemon's evaluator learns more (raise it with the docs' count after an --update).
UPSTREAM_CASES = 566
CONVERTED = 559
PROMTOOL_PASSES = 478
BOTH_PASS_FLOOR = 478


@pytest.fixture(scope="module")
def results() -> conf.Results:
    require_tool("promtool")
    return conf.run_suite(conf.SUITE)


def test_every_disagreement_is_listed_with_a_current_reason(results: conf.Results) -> None:
    listed = conf.load_differences()
    found = {r.case.name: r for r in results.disagreements()}
    hint = "run `python -m tests.promql.upstream.conformance --update`"
    assert not sorted(set(found) - set(listed)), f"unlisted disagreements; {hint}"
    assert not sorted(set(listed) - set(found)), f"listed cases that now agree; {hint}"
    assert all(reason.strip() for reason in listed.values()), "a difference without a reason"
    stale = [
        name
        for name, reason in listed.items()
        if reason.startswith(conf.AUTO_PREFIXES) and reason != found[name].auto_reason()
    ]
    assert not stale, f"reasons that no longer say what the tool reports: {stale}; {hint}"


def test_docs_section_is_current(results: conf.Results) -> None:
    committed = conf.docs_section(conf.DOCS.read_text())
    assert committed == conf.render_docs(results, conf.load_differences()), (
        "docs/alerting.md's conformance section is stale: run "
        "`python -m tests.promql.upstream.conformance --write-docs docs/alerting.md`"
    )


def test_the_suite_is_not_vacuous(results: conf.Results) -> None:
    counts = dict(conf.counts(results))
    assert counts["upstream cases (eval commands)"] >= UPSTREAM_CASES
    assert counts["converted to promtool tests"] >= CONVERTED
    assert counts["pass in promtool"] >= PROMTOOL_PASSES
    assert counts["pass in both tools"] >= BOTH_PASS_FLOOR
    assert len({r.case.name for r in results.cases}) == len(results.cases)
    # Every case reached both tools: none is missing from either's output.
    unreported = [
        r.case.name
        for r in results.cases
        for v in (r.promtool, r.daemon)
        if v.errors[:1] == ["(no result for this case: its input did not load)"]
    ]
    assert not unreported
    assert len(results.unconvertible) == UPSTREAM_CASES - CONVERTED
    assert all(reason.startswith("eval_fail") for reason in results.unconvertible.values())


def _mutate(group: dict[str, Any], kind: int) -> None:
    """Change one expectation of a case: a value, a label, or a sample less (or more)."""
    samples = group["promql_expr_test"][0]["exp_samples"]
    if not samples:
        samples.append({"labels": '{mutated="yes"}', "value": "1"})
    elif kind == 0:
        samples[0]["value"] = _other_value(samples[0]["value"])
    elif kind == 1:
        labels = samples[0]["labels"]
        if labels.endswith("}"):
            sep = "" if labels.endswith("{}") else ","
            samples[0]["labels"] = f'{labels[:-1]}{sep}mutated="yes"}}'
        else:
            samples[0]["labels"] = f'{labels}{{mutated="yes"}}'
    else:
        del samples[0]


def _other_value(text: str) -> str:
    value = {".inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}.get(text)
    value = float(text) if value is None else value
    if not math.isfinite(value):
        return "0"
    bumped = value + 1
    return repr(bumped if bumped != value else value / 2)


def test_mutated_expectations_fail_in_both_tools(results: conf.Results, tmp_path: Path) -> None:
    passing = {r.case.name for r in results.cases if r.category == conf.BOTH_PASS}
    assert passing
    for index, path in enumerate(conf.suite_files(conf.SUITE)):
        doc = conf.load_raw(path)
        doc["tests"] = [g for g in doc["tests"] if g["name"] in passing]
        for i, group in enumerate(doc["tests"]):
            _mutate(group, (index + i) % 3)
        if doc["tests"]:
            conf.write_doc(tmp_path / path.name, doc)
    mutated = conf.run_suite(tmp_path)
    assert {r.case.name for r in mutated.cases} == passing
    still_passing = [
        (r.case.name, r.category) for r in mutated.cases if r.promtool.passed or r.daemon.passed
    ]
    assert not still_passing, f"mutated expectations that still pass: {still_passing}"


def test_converted_files_round_trip_through_the_raw_loader() -> None:
    """The runner's copies (marker added, expectations mutated) are written like the originals."""
    for path in conf.suite_files(conf.SUITE):
        text = path.read_text()
        body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
        assert convert.render_test_file([], conf.load_raw(path)) == body, path.name


def test_converter_reproduces_the_committed_files(tmp_path: Path) -> None:
    assert convert.VENDORED.tag == TAG
    out = tmp_path / "upstream" / conf.SUITE.name
    written = convert.convert(convert.VENDORED, out)
    committed = conf.SUITE.parent
    for path in written:
        relative = path.relative_to(out.parent)
        assert (committed / relative).read_bytes() == path.read_bytes(), f"{relative} differs"
    generated = {p.name for p in out.iterdir()} | {conf.DIFFERENCES.name}
    assert {p.name for p in conf.SUITE.iterdir()} == generated


def test_the_converted_files_are_upstreams() -> None:
    """The vendored upstream files (and the license beside them) are Prometheus' bytes at the
    tag: their git blob ids are those its PROVENANCE lists, as `git ls-tree` prints them."""
    source = convert.VENDORED
    listing = provenance.read(source.directory / "PROVENANCE")
    files = {path: source.local(path) for path in [*source.test_files(), "LICENSE", "NOTICE"]}
    assert set(files) == set(listing.blobs), "vendored files and the listing differ"
    assert len(files) == 13  # promql/testdata at v2.42.0: 11 .test files, LICENSE, NOTICE
    assert not provenance.mismatches(listing, files)


# A made-up upstream file with what the converter must get right: loads of different steps
# (merged at their gcd), one series in two loads, an `@` that reaches past the eval time,
# a scalar, an empty result, and an eval_fail.
SYNTHETIC = """\
load 1m
  a{x="1"} 1 2 3 _ 5
  b 0+10x3

load 30s
  c 1 _ 3 4+1x2
  a{x="1"} _x10 6

eval instant at 2m a
  a{x="1"} 3

eval instant at 30s c
  c 1

eval instant at 150s c
  {__name__="c"} 6

eval instant at 5m a
  a{x="1"} 6

eval instant at 0m b @ 180
  b 30

eval instant at 1m scalar(b)
  10

eval instant at 1m nothing_here

eval_fail instant at 0m a + on() group_left a

clear

eval instant at 0m 1.5e0
  1.5
"""


def test_converter_keeps_upstream_timestamps_and_semantics(tmp_path: Path) -> None:
    doc, unconvertible, weakened = convert.convert_file("synthetic.test", SYNTHETIC)
    names = [g["name"] for g in doc["tests"]]
    assert names == [f"synthetic.test:{n}" for n in (9, 12, 15, 18, 21, 24, 27, 33)]
    assert list(unconvertible) == ["synthetic.test:29"] and not weakened
    first = doc["tests"][0]
    assert first["interval"] == "30s"
    assert first["input_series"][0] == {"series": 'a{x="1"}', "values": "1 _ 2 _ 3 _x3 5 _ 6"}
    assert "input_series" not in doc["tests"][-1]
    path = tmp_path / "synthetic.test.yaml"
    path.write_text(convert.render_test_file(["synthetic"], doc))
    done = promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stderr
    # ... and a wrong expectation fails there: the groups are really checked.
    doc["tests"][4]["promql_expr_test"][0]["exp_samples"][0]["value"] = "31"
    path.write_text(convert.render_test_file([], doc))
    assert promtool("test", "rules", str(path)).returncode == 1


def test_upstream_values_become_yaml_floats_promtool_reads_alike() -> None:
    assert convert.yaml_number("12.34e+6") == "12.34e+6"
    assert convert.yaml_number("Inf") == ".inf"
    assert convert.yaml_number("-Inf") == "-.inf"
    assert convert.yaml_number("NaN") == ".nan"
    assert convert.yaml_number("0x10") == "16.0"
    assert convert.yaml_number("010") == "8.0"  # Go's ParseInt(s, 0, 64): octal


def test_runner_attributes_errors_to_cases() -> None:
    cases = [
        conf.Case("f.test:1", "f.test.yaml", "up", False),
        conf.Case("f.test:5", "f.test.yaml", "up", False),
    ]
    output = "\n".join(
        [
            "  FAILED:",
            "    name: f.test:1,",
            f"    alertname: {conf.MARKER}, time: 0s, ",
            "        exp:[",
            "0:",
            "  Labels:{}",
            "], ",
            "        got:[]",
            "    name: f.test:5,",
            f"    alertname: {conf.MARKER}, time: 0s, ",
            "        got:[]",
            '    expr: "up", time: 0s,',
            "        exp: {} NaN",
            "        got: {} NaN",
        ]
    )
    verdicts = conf.verdicts(output, cases, conf.go_quote)
    assert verdicts["f.test:1"].passed and not verdicts["f.test:5"].passed
    assert conf.cannot_check_reason(cases[1], verdicts["f.test:5"].errors) == conf.NAN
    with pytest.raises(conf.AttributionError):
        conf.verdicts(output.replace('expr: "up"', 'expr: "down"'), cases, conf.go_quote)


def test_cli_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.promql.upstream.conformance", "--help"],
        cwd=conf.ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0 and "--write-docs" in done.stdout
