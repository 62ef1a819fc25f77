"""Convert Prometheus' promql/testdata/*.test into promtool rule unit-test files.

    python -m tests.promql.upstream.convert --out tests/promql/upstream/prometheus-2.42
    python -m tests.promql.upstream.convert --git PROMETHEUS_GIT_DIR --tag v2.42.0 --out ...

The first reads the upstream files vendored in prometheus-2.42-testdata/ (their provenance in
its PROVENANCE file, checked by the tests); the second a Prometheus git directory.

One test group per upstream `eval` command, named `<file>.test:<line>`, with the series its
segment loaded (everything since the last `clear`) and one `promql_expr_test`. How the upstream
semantics map onto promtool's:

- Samples start at 0 in both. The group's `interval` is the segment's load step; where a
  segment's loads use different steps it is their gcd, and each series is rewritten with `_`
  gaps so that every sample keeps its timestamp. A segment whose rewritten series would be too
  long (at_modifier.test: 10s and 1ms steps) keeps only the series whose metric name the
  expression mentions, when the expression cannot select others.
- A series that two loads of a segment name becomes one series with the samples of both
  (what the shared storage holds upstream); repeated lines within one load are kept as they
  are: promtool reads them as test.go does (the later line replaces the earlier).
- promtool loads samples one `evaluation_interval` step at a time up to the last step at or
  before the group's latest eval_time; upstream loads everything. Where a group has later
  samples (an `@` or negative offset can see them), an `alert_rule_test` for an alert no rule
  defines, expecting none, moves that horizon past the last sample. `evaluation_interval` is
  1m: the default subquery step upstream's engine is configured with.
- Expected values keep their text (`Inf`/`NaN` become YAML's `.inf`/`.nan`); an expected scalar
  becomes a sample with no labels, as promtool returns a scalar.
- `eval_fail` cannot be expressed (promtool has no expected error): such cases are listed in
  `unconvertible.yaml` with the reason. `eval_ordered` is converted, but promtool sorts both
  sides before comparing, so the order is not checked: listed there under `weakened`.

The output is deterministic: same upstream tree, same bytes.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

from tests.promql.upstream import provenance
from tests.promql.upstream import testfile as tf

TESTDATA = "promql/testdata"
EVALUATION_INTERVAL_MS = 60_000  # upstream's NoStepSubqueryIntervalFn: 1m
LOAD_ALL_ALERT = "load_all_samples"  # no rule defines it: only moves promtool's load horizon
# Values the rewritten series of one group may expand to; far above any upstream segment
# except at_modifier.test's (20 million at 1ms), which must be pruned instead.
MAX_EXPANDED_VALUES = 200_000
UNCONVERTIBLE_FILE = "unconvertible.yaml"
LICENSE_NOTE = (
    "Derived from Prometheus test data, Copyright The Prometheus Authors, "
    "Apache License 2.0, see LICENSE in this directory"
)
_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


# ---------------------------------------------------------------------------------------------
# YAML output: one fixed layout, so that the files are byte-for-byte reproducible and a copy
# loaded with yaml.BaseLoader (every scalar a string) can be written back identically.

# Keys whose scalars are YAML numbers (written plain); every other scalar is a quoted string.
_NUMBER_KEYS = frozenset({"value"})


def quote(text: str) -> str:
    """A YAML single-quoted scalar: no escapes, `'` doubled; read the same by every parser."""
    return "'" + text.replace("'", "''") + "'"


def emit_yaml(node: Any, indent: int = 0) -> list[str]:
    """Block-style YAML lines for dicts, lists and strings (key order kept)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            lines += _emit_entry(f"{pad}{_key(key)}:", key, value, indent)
    elif isinstance(node, list):
        for item in node:
            if isinstance(item, str):
                lines.append(f"{pad}- {quote(item)}")
                continue
            sub = emit_yaml(item, indent + 2)
            lines += [f"{pad}- {sub[0].lstrip()}", *sub[1:]] if sub else [f"{pad}- {{}}"]
    else:
        raise TypeError(f"not a mapping or a list: {node!r}")
    return lines


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) else quote(key)


def _emit_entry(prefix: str, key: str, value: Any, indent: int) -> list[str]:
    if isinstance(value, str):
        return [f"{prefix} {value if key in _NUMBER_KEYS else quote(value)}"]
    if not value:
        return [f"{prefix} {{}}" if isinstance(value, dict) else f"{prefix} []"]
    return [prefix, *emit_yaml(value, indent + 2)]


def render_test_file(header: Iterable[str], doc: dict[str, Any]) -> str:
    return (
        "".join(f"# {line}\n" if line else "#\n" for line in header)
        + "\n".join(emit_yaml(doc))
        + "\n"
    )


def yaml_number(text: str) -> str:
    """An upstream value as a YAML float promtool (yaml.v2) and PyYAML read as test.go does."""
    value = tf.go_number(text)
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    plain = re.fullmatch(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", text)
    leading_zero = re.fullmatch(r"[-+]?0\d+", text)
    if plain and not leading_zero and float(text) == value:
        return text  # the upstream text itself
    return repr(value)


# ---------------------------------------------------------------------------------------------
# Series: which go into a group, at which interval.


@dataclass(frozen=True)
class _Source:
    """A series line with the step of the load it came from."""

    load: tf.Load
    line: tf.SeriesLine

    @property
    def key(self) -> tuple[str, ...]:
        return tf.label_key(self.line.series)


def _samples(source: _Source) -> list[tuple[int, str]]:
    """(timestamp ms, value text) of each sample; computed values written to round-trip."""
    out: list[tuple[int, str]] = []
    position = 0
    for item in tf.parse_items(source.line.values):
        single = len(item.values) == 1
        for value in item.values:
            if value is not None:
                text = item.text if single else _value_text(value, item)
                out.append((position * source.load.step_ms, text))
            position += 1
    return out


def _value_text(value: float | str, item: tf.Item) -> str:
    if value == "stale":
        return "stale"
    assert isinstance(value, float)
    if not item.stepped:
        return item.start  # `AxN`: A, as written
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    text = repr(value)  # the shortest text Go's ParseFloat reads back to the same double
    return text[:-2] if text.endswith(".0") else text


def _last_ms(sources: Iterable[_Source]) -> int:
    return max((t for s in sources for t, _ in _samples(s)), default=0)


def _expanded_count(sources: list[_Source], step_ms: int) -> int:
    return sum(_last_ms([s]) // step_ms + 1 for s in sources)


def _segment_sources(ev: tf.Eval) -> list[_Source]:
    return [_Source(load, line) for load in ev.loads for line in load.series]


def _prunable(expr: str) -> bool:
    """True when every selector of `expr` names its metric: other series cannot matter."""
    if "__name__" in expr:
        return False
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    return not re.search(r"(?:^|[^A-Za-z0-9_:\s])\s*\{", text)


def _choose_sources(ev: tf.Eval) -> tuple[list[_Source], int, str | None]:
    """The series a group loads, its interval (ms), or the reason it cannot be converted."""
    sources = _segment_sources(ev)
    step = _gcd_step(sources)
    if _expanded_count(sources, step) <= MAX_EXPANDED_VALUES:
        return sources, step, None
    if not _prunable(ev.expr):
        return sources, step, "its loads' steps need too fine an interval for promtool"
    words = set(_WORD.findall(ev.expr))
    kept = [s for s in sources if tf.metric_name(s.line.series) in words]
    step = _gcd_step(kept)
    if _expanded_count(kept, step) > MAX_EXPANDED_VALUES:
        return kept, step, "its loads' steps need too fine an interval for promtool"
    return kept, step, None


def _gcd_step(sources: list[_Source]) -> int:
    steps = {s.load.step_ms for s in sources}
    return reduce(math.gcd, steps) if steps else EVALUATION_INTERVAL_MS


def _input_series(sources: list[_Source], step_ms: int) -> list[dict[str, str]]:
    """promtool `input_series`: as written where possible, else rewritten at `step_ms`."""
    by_key: dict[tuple[str, ...], list[_Source]] = {}
    for source in sources:
        by_key.setdefault(source.key, []).append(source)
    out: list[dict[str, str]] = []
    done: set[tuple[str, ...]] = set()
    for source in sources:
        group = by_key[source.key]
        if len({s.load.line for s in group}) == 1:
            out.append(_one_series(source, step_ms))
        elif source.key not in done:
            out.append(_merged_series(group, step_ms))
        done.add(source.key)
    return out


def _one_series(source: _Source, step_ms: int) -> dict[str, str]:
    if source.load.step_ms == step_ms:
        return {"series": source.line.series, "values": source.line.values}
    return {"series": source.line.series, "values": _notation(_samples(source), step_ms)}


def _merged_series(group: list[_Source], step_ms: int) -> dict[str, str]:
    """One series from several loads: within a load the last line counts, as in test.go."""
    last_per_load = {s.load.line: s for s in group}
    samples: dict[int, str] = {}
    for source in last_per_load.values():
        for t, text in _samples(source):
            if samples.get(t, text) != text:  # upstream's storage refuses a second value
                raise tf.FormatError(f"line {source.line.line}: two values at {t}ms")
            samples[t] = text
    return {"series": group[-1].line.series, "values": _notation(sorted(samples.items()), step_ms)}


def _notation(samples: list[tuple[int, str]], step_ms: int) -> str:
    """Value notation placing each (ms, text) sample at its own step, `_` in between."""
    words: list[str] = []
    position = 0
    for t, text in samples:
        index, rest = divmod(t, step_ms)
        if rest or index < position:
            raise tf.FormatError(f"sample at {t}ms does not fit a {step_ms}ms interval")
        gap = index - position
        if gap:
            words.append("_" if gap == 1 else f"_x{gap}")
        words.append(text)
        position = index + 1
    return " ".join(words)


def format_duration_ms(ms: int) -> str:
    """A Prometheus duration in one unit: the largest that divides it."""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms" if ms else "0s"


# ---------------------------------------------------------------------------------------------
# Groups and files.


def convert_eval(ev: tf.Eval) -> tuple[dict[str, Any] | None, str | None]:
    """The test group for one eval, or None and the reason promtool cannot express it."""
    if ev.kind == "eval_fail":
        return None, "eval_fail: promtool cannot expect a query to fail"
    sources, step_ms, problem = _choose_sources(ev)
    if problem:
        return None, problem
    group: dict[str, Any] = {"name": ev.name, "interval": _interval_text(sources, step_ms)}
    if sources:
        group["input_series"] = _input_series(sources, step_ms)
    horizon = _horizon(sources, tf.parse_duration_ms(ev.at))
    if horizon is not None:
        alert = {"eval_time": format_duration_ms(horizon), "alertname": LOAD_ALL_ALERT}
        group["alert_rule_test"] = [{**alert, "exp_alerts": []}]
    group["promql_expr_test"] = [
        {"expr": ev.expr, "eval_time": ev.at, "exp_samples": _exp_samples(ev)}
    ]
    return group, None


def _interval_text(sources: list[_Source], step_ms: int) -> str:
    steps = {s.load.step for s in sources if s.load.step_ms == step_ms}
    return min(steps) if len(steps) == 1 else format_duration_ms(step_ms)


def _horizon(sources: list[_Source], eval_ms: int) -> int | None:
    """A later eval_time that makes promtool load every sample, where the eval's does not."""
    loaded_until = eval_ms // EVALUATION_INTERVAL_MS * EVALUATION_INTERVAL_MS
    last = _last_ms(sources)
    if last <= loaded_until:
        return None
    return -(-last // EVALUATION_INTERVAL_MS) * EVALUATION_INTERVAL_MS


def _exp_samples(ev: tf.Eval) -> list[dict[str, str]]:
    return [
        {"labels": e.labels if e.labels is not None else "{}", "value": yaml_number(e.value)}
        for e in ev.expectations
    ]


def weakness(ev: tf.Eval) -> str | None:
    if ev.kind == "eval_ordered":
        return "eval_ordered: promtool sorts both sides by labels, so the order is not checked"
    return None


@dataclass
class Upstream:
    git_dir: Path
    tag: str

    def _git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.git_dir), *args], capture_output=True, text=True, check=True
        ).stdout

    def commit(self) -> str:
        return self._git("rev-parse", f"{self.tag}^{{commit}}").strip()

    def test_files(self) -> list[str]:
        names = self._git("ls-tree", "--name-only", self.tag, f"{TESTDATA}/").split()
        return sorted(n for n in names if n.endswith(".test"))

    def show(self, path: str) -> str | None:
        done = subprocess.run(
            ["git", "-C", str(self.git_dir), "show", f"{self.tag}:{path}"],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout if done.returncode == 0 else None


@dataclass(frozen=True)
class Vendored:
    """The same files as `Upstream` gives, from their vendored copies: the *.test files in
    `directory` and the legal files beside it, at the tag and commit its PROVENANCE names."""

    directory: Path

    @property
    def tag(self) -> str:
        return provenance.read(self.directory / "PROVENANCE").tag

    def commit(self) -> str:
        return provenance.read(self.directory / "PROVENANCE").commit

    def test_files(self) -> list[str]:
        return sorted(f"{TESTDATA}/{p.name}" for p in self.directory.glob("*.test"))

    def show(self, path: str) -> str | None:
        local = self.local(path)
        return local.read_text() if local.is_file() else None

    def local(self, path: str) -> Path:
        """The vendored copy of an upstream path."""
        if path.startswith(f"{TESTDATA}/"):
            return self.directory / path.rsplit("/", 1)[-1]
        return self.directory.parent / path  # LICENSE, NOTICE


VENDORED = Vendored(Path(__file__).resolve().parent / "prometheus-2.42-testdata")


def header(path: str, tag: str, commit: str) -> list[str]:
    return [
        f"Converted from Prometheus {path} at {tag} (commit {commit})",
        "by tests/promql/upstream/convert.py; do not edit, regenerate.",
        LICENSE_NOTE + ".",
        "",
        "One test group per upstream eval, named <file>:<line of the eval>. An alert_rule_test",
        f"for {LOAD_ALL_ALERT} (no rule defines it) only makes promtool load every sample.",
    ]


def convert_file(name: str, text: str) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """(test file document, unconvertible case -> reason, weakened case -> what is lost)."""
    groups: list[dict[str, Any]] = []
    unconvertible: dict[str, str] = {}
    weakened: dict[str, str] = {}
    for ev in tf.parse_file(name, text):
        group, reason = convert_eval(ev)
        if group is None:
            unconvertible[ev.name] = reason or "unknown"
            continue
        groups.append(group)
        note = weakness(ev)
        if note:
            weakened[ev.name] = note
    doc = {"rule_files": [], "evaluation_interval": "1m", "tests": groups}
    return doc, unconvertible, weakened


def convert(upstream: Upstream | Vendored, out: Path) -> list[Path]:
    """Write every converted file, the side file and LICENSE/NOTICE; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    commit = upstream.commit()
    written: list[Path] = []
    unconvertible: dict[str, str] = {}
    weakened: dict[str, str] = {}
    for path in upstream.test_files():
        name = path.rsplit("/", 1)[-1]
        text = upstream.show(path)
        assert text is not None, path
        doc, lost, weak = convert_file(name, text)
        unconvertible |= lost
        weakened |= weak
        target = out / f"{name}.yaml"
        target.write_text(render_test_file(header(path, upstream.tag, commit), doc))
        written.append(target)
    side = out / UNCONVERTIBLE_FILE
    side.write_text(_side_file(upstream.tag, commit, unconvertible, weakened))
    written.append(side)
    written += _copy_legal(upstream, out.parent)
    return written


def _side_file(tag: str, commit: str, lost: dict[str, str], weak: dict[str, str]) -> str:
    head = [
        f"Upstream cases ({TESTDATA}/*.test at {tag}, commit {commit}) that promtool",
        "cannot express (unconvertible) or checks only in part (weakened): case -> reason.",
        "Written by tests/promql/upstream/convert.py.",
    ]
    doc = {"unconvertible": dict(lost), "weakened": dict(weak)}
    return render_test_file(head, doc)


def _copy_legal(upstream: Upstream | Vendored, directory: Path) -> list[Path]:
    """Apache-2.0 asks for the license (and NOTICE) to travel with derived files."""
    written = []
    for name in ("LICENSE", "NOTICE"):
        text = upstream.show(name)
        if text is not None:
            (directory / name).write_text(text)
            written.append(directory / name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--git", type=Path, help="Prometheus git directory (default: the copies)")
    parser.add_argument("--tag", default="v2.42.0")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    source = Upstream(args.git, args.tag) if args.git else VENDORED
    for path in convert(source, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
