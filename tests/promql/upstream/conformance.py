"""Run the converted Prometheus 2.42 PromQL tests through promtool and the daemon; compare.

    python -m tests.promql.upstream.conformance            # summary
    python -m tests.promql.upstream.conformance --update   # rewrite differences.yaml
    python -m tests.promql.upstream.conformance --write-docs docs/alerting.md
    python -m tests.promql.upstream.conformance --report conformance.md  # every case

A case is one test group (one upstream eval). Each tool runs each file once. promtool names the
group only in alert failures, so the runner works on copies in which every group starts with
an alert test that always fails (`conformance_marker`, expecting an alert no rule defines):
each group's errors then follow its `name: ...` line in both tools' output, and a case passes
in a tool when nothing but the marker failed.

Where both tools fail, the reason is derived from promtool's output where it can be told
mechanically: the upstream expectation is NaN (test.go counts NaN equal to NaN, promtool's
reflect.DeepEqual never does), or an expected value is written approximately (promtool's result
is within test.go's relative epsilon of 1e-6 but not equal), or the group has samples promtool
does not load. Such a case still says something: whether the daemon's result is promtool's.

A disagreement is a case one tool passes and the other fails, or one both fail with different
results (NaN = NaN). Each must be listed, with a reason, in differences.yaml; `--update`
rewrites that file from the current results.
"""

from __future__ import annotations

import argparse
import codecs
import copy
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.promql.upstream import convert
from tests.promql.upstream import testfile as tf

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SUITE = HERE / "prometheus-2.42"
DIFFERENCES = SUITE / "differences.yaml"
DOCS = ROOT / "docs" / "alerting.md"
DOCS_BEGIN = "<!-- conformance:2.42:begin -->"
DOCS_END = "<!-- conformance:2.42:end -->"
MARKER = "conformance_marker"
EPSILON = 1e-6  # test.go's relative error for sample values
MIN_NORMAL = 2.2250738585072014e-308
# Prometheus adds floats across series in the order it meets them, and promtool meets them in
# a different order each run (series are created from a Go map): sum, avg, stddev and stdvar
# results vary by an ulp or two between runs (seen: aggregators.test:106/191/194,
# histograms.test:131/135/138). Such differences are not held against either tool.
ORDER_SENSITIVE = re.compile(r"\b(?:sum|avg|stddev|stdvar)\s*(?:\(|by\b|without\b)", re.I)
ROUNDING_ULPS = 8

# Verdict categories.
BOTH_PASS = "both pass"
BOTH_FAIL = "both fail"  # with the same result: promtool cannot check the case
BOTH_FAIL_DIFFERENT = "both fail, the daemon's result is not promtool's"
DAEMON_FAILS = "promtool passes, the daemon fails"
PROMTOOL_FAILS = "promtool fails, the daemon passes"
DISAGREEMENTS = (DAEMON_FAILS, PROMTOOL_FAILS, BOTH_FAIL_DIFFERENT)
# Why promtool fails a case test.go passes.
NAN = "expected NaN"
APPROXIMATE = "expected value written approximately"
NOT_LOADED = "samples promtool does not load"
OTHER = "other"
CANNOT_CHECK_REASONS = (NAN, APPROXIMATE, NOT_LOADED, OTHER)
# Reasons --update writes start so; other reasons are hand-written and kept.
AUTO_PREFIXES = ("daemon: ", "promtool: ")


class AttributionError(RuntimeError):
    """A tool's output could not be split into cases: the verdicts would be guesses."""


# ---------------------------------------------------------------------------------------------
# The suite as files.


@dataclass(frozen=True)
class Case:
    name: str
    file: str  # the converted file's name
    expr: str
    samples_after_horizon: bool  # promtool would not load every sample of the group

    @property
    def order_sensitive(self) -> bool:
        return bool(ORDER_SENSITIVE.search(self.expr))


def load_raw(path: Path) -> dict[str, Any]:
    """A converted file with every scalar a string, so that it writes back unchanged."""
    return yaml.load(path.read_text(), Loader=yaml.BaseLoader)


def suite_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.test.yaml"))


def cases_of(file: str, doc: dict[str, Any]) -> list[Case]:
    step = tf.parse_duration_ms(doc.get("evaluation_interval", "1m"))
    return [_case(file, group, step) for group in doc.get("tests") or []]


def _case(file: str, group: dict[str, Any], step: int) -> Case:
    (expr_test,) = group["promql_expr_test"]
    times = [tf.parse_duration_ms(expr_test["eval_time"])]
    times += [tf.parse_duration_ms(a["eval_time"]) for a in group.get("alert_rule_test") or []]
    # promtool loads samples step by step up to the last step at or before the latest eval
    loaded_until = max(times) // step * step
    return Case(group["name"], file, expr_test["expr"], _last_sample_ms(group) > loaded_until)


def _last_sample_ms(group: dict[str, Any]) -> int:
    step = tf.parse_duration_ms(group["interval"])
    last = 0
    for series in group.get("input_series") or []:
        values = [v for item in tf.parse_items(series["values"]) for v in item.values]
        present = [i for i, v in enumerate(values) if v is not None]
        last = max(last, present[-1] * step if present else 0)
    return last


def with_marker(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy in which every group's first alert test always fails, naming the group."""
    marked = copy.deepcopy(doc)
    for group in marked.get("tests") or []:
        marker = {"eval_time": "0", "alertname": MARKER, "exp_alerts": [{}]}
        group["alert_rule_test"] = [marker, *(group.get("alert_rule_test") or [])]
    return marked


def write_doc(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(convert.render_test_file([], doc))


# ---------------------------------------------------------------------------------------------
# Running the tools.


def run_promtool(path: Path) -> str:
    """promtool's error output for one file (errors go to stderr, blank lines to stdout)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise RuntimeError("promtool is not installed; scripts/test.sh installs it")
    done = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stderr


def run_daemon(path: Path) -> str:
    """`gpu-exporter rules test`'s error lines for one file, in-process.

    A crash (an exception escaping the evaluator) is a failure of the case that caused it:
    the file is then run a group at a time to find it.
    """
    try:
        return _daemon_errors(path)
    except Exception:
        pass
    doc = load_raw(path)
    out = []
    for group in doc.get("tests") or []:
        single = path.with_name(f"single-{path.name}")
        write_doc(single, {**doc, "tests": [group]})
        try:
            out.append(_daemon_errors(single))
        except Exception as exc:
            out.append(f"    name: {group['name']},\n    crash: {type(exc).__name__}: {exc}")
    return "\n".join(out)


def _daemon_errors(path: Path) -> str:
    from gpu_exporter.alerting.rules.unit_tests import run_test_file

    return "\n".join(run_test_file(path).errors)


@dataclass
class Verdict:
    passed: bool
    errors: list[str] = field(default_factory=list)  # the tool's lines, marker's left out

    @property
    def text(self) -> str:
        return "\n".join(self.errors)


def verdicts(output: str, cases: list[Case], quote: Any) -> dict[str, Verdict]:
    """Per case, from one file's output: the lines after its `name:` line, marker skipped."""
    names = {c.name for c in cases}
    blocks: dict[str, list[str]] = {}
    current: str | None = None
    lines = iter(output.splitlines())
    for line in lines:
        match = re.fullmatch(r"    name: (.*),", line)
        if match and match.group(1) in names:
            current = match.group(1)
            blocks.setdefault(current, [])
        elif line.startswith(f"    alertname: {MARKER},"):
            _skip_marker(lines)
        elif current is not None and line.strip():
            blocks[current].append(line)
    by_name = {c.name: c for c in cases}
    for name, block in blocks.items():
        _check_exprs(by_name[name], block, quote)
    return {
        c.name: Verdict(not blocks[c.name], blocks[c.name])
        if c.name in blocks
        else Verdict(False, ["(no result for this case: its input did not load)"])
        for c in cases
    }


def _skip_marker(lines: Iterator[str]) -> None:
    for line in lines:
        if line.startswith("        got:"):
            return


def _check_exprs(case: Case, block: list[str], quote: Any) -> None:
    """Every expression error in a case's block must be about that case's expression."""
    for line in block:
        if line.startswith("    expr: ") and not line.startswith(f"    expr: {quote(case.expr)},"):
            raise AttributionError(f"{case.name}: an error about another expression: {line}")


def go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Classification.


@dataclass
class CaseResult:
    case: Case
    promtool: Verdict
    daemon: Verdict

    @property
    def promtool_passes(self) -> bool:
        return _passes(self.case, self.promtool)

    @property
    def daemon_passes(self) -> bool:
        return _passes(self.case, self.daemon)

    @property
    def category(self) -> str:
        if self.promtool_passes and self.daemon_passes:
            return BOTH_PASS
        if not self.promtool_passes and not self.daemon_passes:
            return BOTH_FAIL if self.same_result else BOTH_FAIL_DIFFERENT
        return DAEMON_FAILS if self.promtool_passes else PROMTOOL_FAILS

    @property
    def disagrees(self) -> bool:
        return self.category in DISAGREEMENTS

    @property
    def promtool_reason(self) -> str | None:
        """Why promtool fails, where it does."""
        if self.promtool_passes:
            return None
        return cannot_check_reason(self.case, self.promtool.errors)

    @property
    def same_result(self) -> bool:
        """Whether the daemon's result is promtool's (NaN = NaN), or both tools fail the query."""
        if _has_error(self.promtool) and _has_error(self.daemon):
            return True
        ours, theirs = _got(self.daemon.errors), _got(self.promtool.errors)
        if ours is None or theirs is None:
            return False
        close = _rounding_apart if self.case.order_sensitive else _same_value
        return len(ours) == len(theirs) and all(
            a[0] == b[0] and (_same_value(a[1], b[1]) or close(a[1], b[1]))
            for a, b in zip(ours, theirs, strict=True)
        )

    def auto_reason(self) -> str:
        """A one-line reason for a disagreement, from the failing tool's output."""
        if self.category in (DAEMON_FAILS, BOTH_FAIL_DIFFERENT):
            return f"daemon: {_first_problem(self.daemon.errors)}"
        reason = self.promtool_reason
        if reason == NAN:
            return f"promtool: {NAN}, which promtool never matches; the daemon counts NaN = NaN"
        if reason == APPROXIMATE:
            return f"promtool: {APPROXIMATE}; the daemon's result is exactly the text's value"
        # Not promtool's values: in the order-sensitive cases they vary from run to run.
        problem = _first_problem(self.promtool.errors) if _has_error(self.promtool) else ""
        return f"promtool: {reason}: {problem or 'a different result'}"


def _has_error(verdict: Verdict) -> bool:
    return any(", err: " in line or line.startswith("    crash: ") for line in verdict.errors)


def _passes(case: Case, verdict: Verdict) -> bool:
    """A tool's verdict; where Prometheus' own result depends on the order in which it meets
    the series (a float sum over series), differences of a few ulps count as passing."""
    return verdict.passed or (case.order_sensitive and rounding_only(verdict.errors))


def rounding_only(errors: list[str]) -> bool:
    """The one error is a result whose values differ from the expected by float rounding."""
    expected, got = _samples_after(errors, "        exp: "), _got(errors)
    if len(errors) != 3 or expected is None or got is None or len(expected) != len(got):
        return False
    return all(
        el == gl and (ev == gv or _rounding_apart(ev, gv))
        for (el, ev), (gl, gv) in zip(expected, got, strict=True)
    )


def _rounding_apart(a: float, b: float) -> bool:
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= ROUNDING_ULPS * math.ulp(max(abs(a), abs(b)))


def cannot_check_reason(case: Case, errors: list[str]) -> str:
    """Why promtool fails a case, from its exp/got lines."""
    if case.samples_after_horizon:
        return NOT_LOADED
    expected, got = _samples_after(errors, "        exp: "), _got(errors)
    if expected is None or got is None or len(expected) != len(got):
        return OTHER
    kinds = set()
    for (el, ev), (gl, gv) in zip(expected, got, strict=True):
        if el != gl:
            return OTHER
        if ev == gv:
            continue
        if math.isnan(ev) and math.isnan(gv):
            kinds.add(NAN)
        elif almost_equal(ev, gv):
            kinds.add(APPROXIMATE)
        else:
            return OTHER
    # A NaN decides: promtool fails it whatever else the result holds.
    if NAN in kinds:
        return NAN
    return APPROXIMATE if kinds else OTHER


def almost_equal(a: float, b: float) -> bool:
    """test.go's almostEqual (NaN equals NaN)."""
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    diff = abs(a - b)
    if a == 0 or b == 0 or diff < MIN_NORMAL:
        return diff < EPSILON * MIN_NORMAL
    return diff / (abs(a) + abs(b)) < EPSILON


def _same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


Sample = tuple[tuple[tuple[str, str], ...], float]


def _got(errors: list[str]) -> list[Sample] | None:
    return _samples_after(errors, "        got: ")


def _samples_after(errors: list[str], prefix: str) -> list[Sample] | None:
    """The samples of the first line starting with `prefix`, in either tool's notation."""
    for line in errors:
        if line.startswith(prefix):
            return parse_samples(line[len(prefix) :])
    return None


def parse_samples(text: str) -> list[Sample] | None:
    """`{a="b"} 1E+00, {} NaN` (promtool), `[{a="b"} 1.0, {} nan]` (daemon), `nil`, `[]`."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if text in ("", "nil"):
        return []
    samples: list[Sample] = []
    i = 0
    while i < len(text):
        if text[i] != "{":
            return None
        end = tf._end_of_braces(text, i)
        value_end = text.find(", {", end)
        value_end = len(text) if value_end < 0 else value_end
        try:
            value = float(text[end:value_end])
        except ValueError:
            return None
        samples.append((_label_pairs(text[i + 1 : end - 1]), value))
        i = value_end + 2
    return sorted(samples, key=lambda s: s[0])


def _label_pairs(body: str) -> tuple[tuple[str, str], ...]:
    pairs = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', body)
    return tuple(sorted((k, codecs.decode(v, "unicode_escape")) for k, v in pairs))


def _first_problem(errors: list[str]) -> str:
    """A failed case's error on one line: the query error, else the two results."""
    for line in errors:
        if ", err: " in line:
            return line.split(", err: ", 1)[1].strip()
        if line.startswith("    crash: "):
            return line.strip()
    got = next((line.strip() for line in errors if line.startswith("        got: ")), None)
    exp = next((line.strip() for line in errors if line.startswith("        exp: ")), None)
    text = f"{got}, {exp}" if got and exp else "; ".join(" ".join(e.split()) for e in errors)
    return text if len(text) <= 240 else text[:237] + "..."


# ---------------------------------------------------------------------------------------------
# The whole run.


@dataclass
class Results:
    cases: list[CaseResult]
    unconvertible: dict[str, str]
    weakened: dict[str, str]

    def by_category(self) -> Counter[str]:
        return Counter(r.category for r in self.cases)

    def disagreements(self) -> list[CaseResult]:
        return [r for r in self.cases if r.disagrees]

    def cannot_check(self) -> Counter[str]:
        both = (BOTH_FAIL, BOTH_FAIL_DIFFERENT)
        return Counter(r.promtool_reason for r in self.cases if r.category in both)


def run_suite(directory: Path = SUITE) -> Results:
    """Both tools over every converted file in `directory` (once per file per tool)."""
    docs = {path.name: load_raw(path) for path in suite_files(directory)}
    with tempfile.TemporaryDirectory(prefix="promql-conformance-") as tmp:
        paths = []
        for name, doc in docs.items():
            paths.append(Path(tmp) / name)
            write_doc(paths[-1], with_marker(doc))
        with ThreadPoolExecutor(max_workers=4) as pool:
            promtool_out = dict(zip(docs, pool.map(run_promtool, paths), strict=True))
            daemon_out = {path.name: run_daemon(path) for path in paths}
    results: list[CaseResult] = []
    for name, doc in docs.items():
        cases = cases_of(name, doc)
        theirs = verdicts(promtool_out[name], cases, go_quote)
        ours = verdicts(daemon_out[name], cases, repr)
        results += [CaseResult(c, theirs[c.name], ours[c.name]) for c in cases]
    side = directory / convert.UNCONVERTIBLE_FILE
    extra = yaml.safe_load(side.read_text()) if side.exists() else {}
    return Results(results, extra.get("unconvertible") or {}, extra.get("weakened") or {})


# ---------------------------------------------------------------------------------------------
# differences.yaml


def load_differences(path: Path = DIFFERENCES) -> dict[str, str]:
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    return {str(k): str(v) for k, v in data.items()}


def updated_differences(results: Results, current: dict[str, str]) -> dict[str, str]:
    """Every disagreement: a hand-written reason kept, an automatic one refreshed."""
    out = {}
    for r in results.disagreements():
        kept = current.get(r.case.name, "")
        hand_written = kept.strip() and not kept.startswith(AUTO_PREFIXES)
        out[r.case.name] = kept if hand_written else r.auto_reason()
    return out


def render_differences(differences: dict[str, str]) -> str:
    header = [
        "Cases of prometheus-2.42/*.test.yaml on which promtool and `gpu-exporter rules test`",
        "disagree (one passes, the other fails; or both fail with different results):",
        "case -> one-line reason. Rewritten by",
        "`python -m tests.promql.upstream.conformance --update`, which keeps hand-written",
        f"reasons and refreshes those starting {' or '.join(map(repr, AUTO_PREFIXES))}.",
    ]
    return convert.render_test_file(header, differences) if differences else _empty(header)


def _empty(header: list[str]) -> str:
    return "".join(f"# {line}\n" for line in header) + "{}\n"


# ---------------------------------------------------------------------------------------------
# Reports.


def counts(results: Results) -> list[tuple[str, int]]:
    """(what, how many) rows of the summary, in order."""
    cats = results.by_category()
    converted = len(results.cases)
    rows = [
        ("upstream cases (eval commands)", converted + len(results.unconvertible)),
        ("converted to promtool tests", converted),
        (
            "not convertible (eval_fail: promtool cannot expect an error)",
            len(results.unconvertible),
        ),
        ("converted without the order check (eval_ordered)", len(results.weakened)),
        ("pass in promtool", cats[BOTH_PASS] + cats[DAEMON_FAILS]),
        (
            "… of which a sum, avg, stddev or stdvar over series (compared up to 8 ulps)",
            sum(1 for r in results.cases if r.promtool_passes and r.case.order_sensitive),
        ),
        ("pass in both tools", cats[BOTH_PASS]),
        (
            "fail in both tools (promtool cannot check them)",
            cats[BOTH_FAIL] + cats[BOTH_FAIL_DIFFERENT],
        ),
    ]
    cannot = results.cannot_check()
    rows += [(f"… {reason}", cannot[reason]) for reason in CANNOT_CHECK_REASONS]
    rows.append(("… of which the daemon's result is promtool's (NaN = NaN)", cats[BOTH_FAIL]))
    rows.append(("disagreements", sum(cats[c] for c in DISAGREEMENTS)))
    rows += [(f"… {c}", cats[c]) for c in DISAGREEMENTS]
    return rows


def render_summary(results: Results) -> str:
    width = max(len(what) for what, _ in counts(results))
    return "\n".join(f"{what:<{width}}  {n:>4}" for what, n in counts(results)) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_docs(results: Results, differences: dict[str, str]) -> str:
    """The section between the markers in docs/alerting.md."""
    rows = "\n".join(f"| {what} | {n} |" for what, n in counts(results))
    table = "\n".join(
        f"| `{name}` | {_md_cell(reason)} |"
        for name, reason in sorted(differences.items(), key=_order)
    )
    return _DOCS_TEMPLATE.format(
        rows=rows, differences=table or "| (none) | |", count=len(differences)
    )


def _order(item: tuple[str, str]) -> tuple[str, int]:
    file, _, line = item[0].rpartition(":")
    return file, int(line) if line.isdigit() else 0


_DOCS_TEMPLATE = """\
## Conformance with Prometheus' own PromQL tests

Prometheus 2.42 tests its PromQL engine with `promql/testdata/*.test` (Apache-2.0 test data;
the license travels with the copies). `tests/promql/upstream/convert.py` turns each of those
files into a promtool unit-test file in `tests/promql/upstream/prometheus-2.42/`: one test
group per upstream `eval`, named `<file>:<line>`, with the series its segment loaded (loads
with different steps are merged at their gcd, every sample at its upstream timestamp) and an
alert test that only makes promtool load every sample, as upstream does. Cases promtool cannot
express are listed in `unconvertible.yaml`. `tests/promql/upstream/conformance.py` runs every
file through `promtool test rules` and `gpu-exporter rules test` and compares the verdicts
case by case; `tests/test_promql_conformance.py` fails when a disagreement is not listed in
`differences.yaml`, when a listed one is gone, or when this section is out of date.

Upstream's harness checks more than promtool can: it compares values with a relative error of
1e-6 and counts NaN equal to NaN (promtool compares exactly and never matches NaN, so such
cases fail in promtool whatever the engine computes), checks the order of `eval_ordered`
results, and reruns each query as a range query and with `@` added. Where both tools fail,
the counts below say why promtool does; the daemon's result must then be promtool's (or both
must fail the query), else the case counts as a difference.

promtool itself is not exact everywhere: it creates the loaded series in Go map order, so a
sum, avg, stddev or stdvar over series adds its floats in a different order each run, and its
result moves by an ulp or two (seen in `aggregators.test:106`, `:191`, `:194` and
`histograms.test:131`, `:135`, `:138`). For those expressions a difference of at most 8 ulps
counts as passing, in both tools.

```sh
.venv/bin/python -m tests.promql.upstream.convert --git PROMETHEUS_GIT_DIR --tag v2.42.0 \\
    --out tests/promql/upstream/prometheus-2.42
.venv/bin/python -m tests.promql.upstream.conformance --update
.venv/bin/python -m tests.promql.upstream.conformance --write-docs docs/alerting.md
```

| cases | count |
| --- | ---: |
{rows}

Remaining differences: {count} (`tests/promql/upstream/prometheus-2.42/differences.yaml`).

| case | reason |
| --- | --- |
{differences}
"""


def render_report(results: Results, differences: dict[str, str]) -> str:
    """Every case: both verdicts and, where one fails, why."""
    lines = ["# PromQL conformance: Prometheus 2.42 test data", "", "```", render_summary(results)]
    lines += [
        "```",
        "",
        "| case | promtool | daemon | category | detail |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results.cases:
        detail = differences.get(r.case.name) or (
            f"promtool cannot check it: {r.promtool_reason}" if r.category == BOTH_FAIL else ""
        )
        verdicts = f"{_pf(r.case, r.promtool)} | {_pf(r.case, r.daemon)}"
        lines.append(f"| `{r.case.name}` | {verdicts} | {r.category} | {_md_cell(detail)} |")
    for name, reason in results.unconvertible.items():
        lines.append(f"| `{name}` | - | - | not converted | {_md_cell(reason)} |")
    return "\n".join(lines) + "\n"


def _pf(case: Case, verdict: Verdict) -> str:
    if verdict.passed:
        return "pass"
    return "pass (up to rounding)" if _passes(case, verdict) else "fail"


def docs_section(text: str) -> str:
    """The text between the markers (markers excluded, newlines around them trimmed)."""
    begin, end = text.index(DOCS_BEGIN) + len(DOCS_BEGIN), text.index(DOCS_END)
    return text[begin:end].strip("\n") + "\n"


def write_docs(path: Path, section: str) -> None:
    """Replace the marked section of `path`, appending it (with markers) if absent."""
    text = path.read_text()
    block = f"{DOCS_BEGIN}\n{section.rstrip()}\n{DOCS_END}"
    if DOCS_BEGIN in text:
        begin, end = text.index(DOCS_BEGIN), text.index(DOCS_END) + len(DOCS_END)
        text = text[:begin] + block + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", type=Path, default=SUITE)
    parser.add_argument("--update", action="store_true", help="rewrite differences.yaml")
    parser.add_argument("--write-docs", type=Path, metavar="MARKDOWN")
    parser.add_argument("--report", type=Path, metavar="MARKDOWN", help="every case's verdicts")
    args = parser.parse_args(list(argv) if argv is not None else None)
    results = run_suite(args.suite)
    differences_path = args.suite / DIFFERENCES.name
    differences = load_differences(differences_path)
    if args.update:
        differences = updated_differences(results, differences)
        differences_path.write_text(render_differences(differences))
    sys.stdout.write(render_summary(results))
    unlisted = sorted({r.case.name for r in results.disagreements()} - set(differences))
    stale = sorted(set(differences) - {r.case.name for r in results.disagreements()})
    for name in unlisted:
        print(f"not in {differences_path.name}: {name}")
    for name in stale:
        print(f"no longer a difference: {name}")
    if args.write_docs:
        write_docs(args.write_docs, render_docs(results, differences))
    if args.report:
        args.report.write_text(render_report(results, differences))
    return 1 if unlisted or stale else 0


if __name__ == "__main__":
    sys.exit(main())
