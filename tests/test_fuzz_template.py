"""Property-based fuzzing of the template engine (bounded: a few seconds, derandomized for CI).

Templates are built from the engine's own vocabulary (every function, keyword, delimiter and
variable) mixed with random text, formats and regexes, and run against random labels and
values. Whatever the input: check() and expand() raise nothing but TemplateError, expand()
stays within a few MB and its text within OUTPUT_LIMIT.
"""

from __future__ import annotations

import math
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_exporter.alerting.rules import template
from gpu_exporter.alerting.rules.template import OUTPUT_LIMIT, TemplateError, check, expand

MEMORY_LIMIT = 8 << 20  # bytes one expansion may allocate at its peak

FUNCTIONS = sorted(template._FUNCS)  # the engine's own table: a new function is fuzzed too
KEYWORDS = ["if", "else", "end", "range", "with", "else if", "nil", "true", "false"]
VARIABLES = ["$labels", "$value", "$externalLabels", "$externalURL", "$", "$x", "$k", "$v"]
LABEL_NAMES = ["job", "re", "instance", "uuid"]
FIELDS = [".Labels", ".Value", ".ExternalURL", ".", *(f"$labels.{n}" for n in LABEL_NAMES)]
STRING_FIELDS = [".Labels.job", ".ExternalURL", *(f"$labels.{n}" for n in LABEL_NAMES)]
DELIMITERS = ["{{", "}}", "{{- ", " -}}", "{{/*", "*/}}", "(", ")", "|", ":=", "=", ",", " "]
REGEXES = [
    "GPU-([0-9a-f]+-?)*Z", "([a-z0-9]+-?)+-worker-[0-9]+", "(a|aa)*$", "", "x*", "(?i)k",
    "(?P<n>a)|(?P<n>b)", "\\pL+", "[[:alpha:]]", "(", "(?=x)", "\\1", "\\C", "a{1001}", "$",
    "\\b", "(?U)a+", "\\Q.*\\E",
]  # fmt: skip
FORMATS = [
    "%d", "%s", "%v", "%q", "%x", "%X", "%e", "%g", "%.3f", "%5.2f", "%-8s", "%08d", "%+v",
    "%T", "%%", "%", "%c", "%U", "%b", "%o", "%t", "%!", "%999999999d", "%.999999999f",
    "%1000s", "%1001d", "%#x", "%*d", "%[1]d", "% x", "%.0s",
]  # fmt: skip
REPLACEMENTS = ["$1", "${1}", "$n", "${n}", "$$", "$", "$1x", "$²", "$٣", "${", "[$0]"]
OTHER_STRINGS = ["1e3", "NaN", "-Inf", "0x1p-2", "1_0", "1h30m", "0", "", "host:80", "[::1]:9"]

texts = st.text(st.characters(codec="utf-8"), max_size=12)
# A str may hold lone surrogates (not UTF-8), and label values are strs.
odd_texts = st.lists(  # (st.text over this union alphabet would drop the surrogates)
    st.one_of(
        st.characters(codec="utf-8"), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
    ),
    max_size=8,
).map("".join)
strings = st.one_of(
    texts, odd_texts, st.sampled_from(REGEXES + FORMATS + REPLACEMENTS + OTHER_STRINGS)
)
quoted = strings.map(lambda s: "`" + s.replace("`", "") + "`")
numbers = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["0x1F", "1e308", "1e400", "-0", ".5", "1_000", "0b101", "9" * 20]),
)  # fmt: skip


@st.composite
def commands(draw: st.DrawFn, depth: int = 0, piped: bool = False) -> str:
    """Mostly a call with the arity and argument kinds the function takes (one fewer when a
    pipeline passes the last); else anything."""
    if not piped and draw(st.integers(0, 9)) >= 8:
        return draw(operands(depth))
    name = draw(st.sampled_from(FUNCTIONS))
    spec = template._FUNCS[name]
    if draw(st.integers(0, 9)) == 0:  # any arity: the wrong-arity errors are fuzzed too
        kinds = ["any"] * draw(st.integers(0, 4))
    else:
        extra = draw(st.integers(0, 3)) if spec.variadic else 0
        kinds = [*spec.params, *[spec.variadic or "any"] * extra][: -1 if piped else None]
    return " ".join([name, *(draw(operands(depth, kind)) for kind in kinds)])


@st.composite
def operands(draw: st.DrawFn, depth: int = 0, kind: str = "any") -> str:
    choices = [quoted, st.sampled_from(STRING_FIELDS)]
    if kind != "string":
        choices.append(st.sampled_from(FIELDS))
        choices += [numbers, st.sampled_from(VARIABLES), st.sampled_from(["true", "false", "nil"])]
    if depth < 2:
        choices.append(commands(depth + 1).map(lambda c: f"({c})"))
    return draw(st.one_of(*choices))


@st.composite
def pipelines(draw: st.DrawFn) -> str:
    stages = [draw(commands())]
    stages += draw(st.lists(commands(piped=True), max_size=2))
    declare = draw(st.sampled_from(["", "", "", "$x := ", "$x = "]))
    return declare + " | ".join(stages)


@st.composite
def bodies(draw: st.DrawFn, depth: int = 0) -> str:
    parts = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.integers(0, 9))
        if kind <= 2:
            parts.append(draw(texts))
        elif kind <= 6 or depth >= 2:
            parts.append("{{ " + draw(pipelines()) + " }}")
        else:
            word = draw(st.sampled_from(["if", "with", "range"]))
            if word == "range" and draw(st.booleans()):
                word = "range $k, $v :="
            inner = draw(bodies(depth + 1))
            other = draw(st.one_of(st.just(""), bodies(depth + 1).map(lambda b: "{{ else }}" + b)))
            parts.append(f"{{{{ {word} {draw(pipelines())} }}}}{inner}{other}{{{{ end }}}}")
    return "".join(parts)


vocabulary = st.one_of(
    texts, quoted, numbers, *(st.sampled_from(x) for x in (FUNCTIONS, KEYWORDS, VARIABLES)),
    st.sampled_from(FIELDS), st.sampled_from(DELIMITERS),
)  # fmt: skip
token_soup = st.lists(vocabulary, max_size=30).map(" ".join)
# $x, $k and $v declared up front, so that the bodies' uses and assignments of them parse.
declared = st.tuples(commands(), bodies()).map(
    lambda t: f"{{{{ $x := {t[0]} }}}}{{{{ $k := 1 }}}}{{{{ $v := `` }}}}{t[1]}"
)
templates = st.one_of(declared, bodies(), token_soup)

label_sets = st.fixed_dictionaries({}, optional={name: strings for name in LABEL_NAMES})
values = st.one_of(
    st.floats(), st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 1e300, 5e-324])
)


def _run(text: str, labels: dict[str, str], value: float) -> None:
    try:
        check(text)
    except TemplateError:
        return
    tracemalloc.start()
    try:
        output = expand(text, labels=labels, value=value, external_url="http://h:9090/p")
    except TemplateError:
        output = ""
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT, f"expansion peaked at {peak} bytes"
    assert len(output) <= OUTPUT_LIMIT


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,  # the same examples on every run: CI stays stable
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
@given(text=templates, labels=label_sets, value=values)
def test_templates_fail_only_with_template_error_within_memory(
    text: str, labels: dict[str, str], value: float
) -> None:
    _run(text, labels, value)


@settings(
    max_examples=800,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)
@given(call=commands(depth=2), labels=label_sets, value=values)
def test_every_function_with_odd_arguments_fails_only_with_template_error(
    call: str, labels: dict[str, str], value: float
) -> None:
    """One call each, cheap to draw, so each function meets many arguments and label values."""
    _run("{{ " + call + " }}", labels, value)
