"""Alert template rendering, checked against the real `promtool test rules` (Prometheus 2.42).

The oracle test writes one rule file whose annotations are the templates below and one
promtool unit-test file whose `exp_annotations` are what `expand()` renders for every sample;
promtool passing means every string matched Prometheus byte for byte.
"""

from __future__ import annotations

import math
import random
import re
import shutil
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from gpu_exporter.alerting.rules.template import (
    BUILD_LIMIT,
    FORMAT_WIDTH_LIMIT,
    NESTING_LIMIT,
    OUTPUT_LIMIT,
    STEP_LIMIT,
    TemplateError,
    check,
    expand,
)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")

EXTERNAL_LABELS = {"region": "eu-west", "replica": "A"}
EXTERNAL_URL = "http://prom.example.com:9090/prom/"

VALUES = [
    0.12, 3.0, 1e6, 123456789.0, 1e21, 1e-5, 0.1 + 0.2, -2.5, 0.0, -0.0,
    math.nan, math.inf, -math.inf, 0.0001, 1234567.0, 1e-7, 100000.0, 999999.0,
    999.95, 59.999, 90.0, 3600.0, 2 * 86400 + 3661.5, 0.1234, -1e6, 1024.0,
    1536.0 * 1024 * 1024, 1.7e9 + 0.123, 1e-300, 1.5e300, 2.0**53 + 2, -123.456,
    0.5, 1.0, -1.0, 1e15, 1e16, 12345.6789, 5e-324, -0.000123,
]  # fmt: skip

LABEL_SETS = [
    {"instance": "host-1.example.com:9100", "job": "node"},
    {"instance": "10.0.0.7:9400", "job": "dcgm", "gpu": "0"},
    {"instance": "[::1]:9100"},
    {"instance": "Ünïcode.host:80", "job": "straße ǆ"},
    {"instance": "gpu-node-03", "job": 'quote"back\\slash', "uuid": "GPU-1a2b"},
]

TEMPLATES = [
    # $value: fmt's %v for float64 (strconv shortest digits, %e from exponent -5 and 21 up)
    "{{ $value }}",
    "{{ .Value }}|{{ $value | printf `%v` }}|{{ printf `%.2f` $value }}",
    "{{ printf `%g|%G|%e|%E|%.3g|%10.4f|%-12.3e|%+.1f|% f|%F|%08.2f|%.0f` "
    "$value $value $value $value $value $value $value $value $value $value $value $value }}",
    "{{ printf `%d|%s|%t|%x` $value $value $value $value }}",
    # Prometheus' humanize family
    "{{ humanize $value }}",
    "{{ humanize1024 $value }}",
    "{{ humanizeDuration $value }}",
    "{{ humanizePercentage $value }}",
    "{{ if and (lt $value 1e10) (gt $value -1e10) }}{{ humanizeTimestamp $value }}{{ end }}",
    "{{ $value | humanize }}/{{ $value | humanizePercentage | toUpper }}",
    "{{ humanize 0 }}|{{ humanize -1234 }}|{{ humanize `2.5e-7` }}|{{ humanize 1e27 }}"
    "|{{ humanize 999.95 }}|{{ humanize 1e-27 }}|{{ humanize `1_000` }}|{{ humanize `-Inf` }}",
    "{{ humanize1024 0 }}|{{ humanize1024 1 }}|{{ humanize1024 1025 }}|{{ humanize1024 -3e9 }}"
    "|{{ humanize1024 0.5 }}|{{ humanize1024 1e30 }}|{{ humanize1024 `NaN` }}",
    "{{ humanizeDuration 0 }}|{{ humanizeDuration 0.0001234 }}|{{ humanizeDuration 59.99 }}"
    "|{{ humanizeDuration -90.5 }}|{{ humanizeDuration 86400 }}|{{ humanizeDuration 1e-12 }}"
    "|{{ humanizeDuration `3661` }}|{{ humanizeDuration -0.5 }}",
    "{{ humanizePercentage 0 }}|{{ humanizePercentage 0.1234 }}|{{ humanizePercentage -1.5 }}"
    "|{{ humanizePercentage 12 }}|{{ humanizePercentage 0.00001 }}",
    "{{ humanizeTimestamp 0 }}|{{ humanizeTimestamp 1700000000.123 }}|{{ humanizeTimestamp -1.5 }}"
    "|{{ humanizeTimestamp `1.7e9` }}|{{ toTime 1234567890.5 }}|{{ humanizeTimestamp 1e-4 }}",
    # printf with integers, strings, maps, and Go's error notations
    "{{ printf `%d|%5d|%-5d|%05d|%x|%X|%o|%b|%c|%+d|%#x|%#o|%.3d|%+05d` "
    "42 42 42 -42 255 255 8 5 65 3 255 8 7 9 }}",
    "{{ printf `%s|%12s|%-12s|%.3s|%q|%x|%v|%5.2s|%05s` $labels.instance $labels.instance "
    "$labels.instance $labels.instance $labels.instance $labels.job $labels.job "
    "$labels.instance $labels.gpu }}",
    "{{ printf `%s is at %.1f%% on %s` $labels.instance $value $externalLabels.region }}",
    "{{ printf `%d %d` 1 }}|{{ printf `%d` 1 2 `x` }}|{{ printf `100%` }}|{{ printf `%z` 1 }}"
    "|{{ printf `%t|%v|%5t` true false true }}|{{ printf `%T %T %T %T` 1 1.5 `s` $labels }}",
    "{{ printf `%v` $labels }}|{{ printf `%d` $externalLabels }}|{{ printf `%s` nil }}",
    "{{ printf `%v` . }}|{{ printf `%+v` 3.0 }}|{{ printf `%5.1v|%-6v|%06v` 3.14159 `ab` -3.5 }}",
    # data access: labels present and missing, external labels and URL
    "{{ $labels.instance }}|{{ .Labels.job }}|{{ $labels.missing }}|{{ .Labels.gpu }}",
    "{{ index $labels `job` }}|{{ index $labels `nope` }}|{{ len $labels }}|{{ len `héllo` }}",
    "{{ $externalLabels.region }}|{{ .ExternalLabels.nope }}|{{ $externalURL }}|{{ .ExternalURL }}",
    "{{ $labels }}",
    "{{ . }}",
    # string functions
    "{{ toUpper $labels.instance }}|{{ toLower `MiXeD ÄÖ İ` }}|{{ toUpper `straße ǆ` }}",
    "{{ title `hello wORLD foo_bar it's a-b x.y 1abc ǆx ßa` }}|{{ title $labels.job }}",
    "{{ reReplaceAll `(.*):(\\d+)` `$1 port $2` $labels.instance }}",
    "{{ reReplaceAll `^([^.]+)\\..*$` `${1}` $labels.instance }}",
    "{{ reReplaceAll `x*` `-` `abxd` }}|{{ reReplaceAll `a|e` `[$0]` `banana cake` }}",
    "{{ reReplaceAll `(?P<first>\\w+)\\s(?P<second>\\w+)` `$second $first` `hello world` }}",
    "{{ reReplaceAll `\\bfoo\\b` `X` `foo food foo_bar foo.bar` }}"
    "|{{ reReplaceAll `[[:digit:]]+` `#` `a1b22c333` }}",
    '{{ reReplaceAll `$` `!` "line1\\nline2\\n" }}|{{ reReplaceAll `(?m)^` `> ` "a\\nb" }}',
    "{{ reReplaceAll `a{,2}` `X` `a{,2}` }}|{{ reReplaceAll `(a)` `$1x|${1}x|$$|$|$2` `a` }}",
    "{{ reReplaceAll `(?i)HOST` `h` $labels.instance }}|{{ reReplaceAll `[^a-z0-9]+` `_` "
    "$labels.instance }}|{{ reReplaceAll `\\s+` ` ` `a \\t  b` }}",
    "{{ match `^host` $labels.instance }}|{{ match `\\d$` $labels.instance }}"
    "|{{ if match `example` $labels.instance }}yes{{ else }}no{{ end }}",
    "{{ stripPort $labels.instance }}|{{ stripDomain $labels.instance }}"
    "|{{ stripPort `[::1]:9100` }}|{{ stripDomain `10.0.0.1:9100` }}|{{ stripPort `nohost` }}"
    "|{{ stripDomain `a.b.c` }}|{{ stripPort `a:b:c` }}|{{ stripDomain `[fe80::1%eth0]:80` }}",
    "{{ safeHtml `<b>x</b>` }}|{{ html `<a href='x'>&\"</a>` }}|{{ urlquery `a b&c/d=é` }}"
    "|{{ html 1 `x` 2 }}",
    '{{ graphLink `rate(x[5m]) > 0` }}|{{ tableLink `up{job="a b"}` }}',
    "{{ parseDuration `1h30m` }}|{{ parseDuration `500ms` }}|{{ parseDuration `2d` }}"
    "|{{ humanizeDuration (parseDuration `1w`) }}|{{ parseDuration `0` }}",
    "{{ (args 1 `two` 3.5).arg1 }}|{{ args `a` 2 }}|{{ (args).x }}|{{ range args }}x{{ else }}"
    "empty{{ end }}",
    "{{ print `a` 1 2 `b` $value }}|{{ println `x` 1 }}",
    # control flow, comparisons, variables
    "{{ if gt $value 100.0 }}high{{ else if gt $value 1.0 }}medium{{ else }}low{{ end }}",
    "{{ if and (ge $value 0.0) (lt $value 1.0) }}unit{{ end }}"
    "{{ if or (eq $labels.job `node`) (ne $labels.job ``) }}job{{ end }}",
    "{{ if not (eq $value $value) }}nan{{ end }}{{ if ge $value 0.0 }}ge0{{ end }}",
    "{{ and 1 0 }}|{{ or 0 `` `x` }}|{{ and `a` `b` }}|{{ not 0 }}|{{ eq `a` `b` `a` }}"
    "|{{ eq 1 1 }}|{{ lt `a` `b` }}|{{ gt 2 1 }}|{{ le 1.5 1.5 }}|{{ ne $value 3.0 }}",
    "{{ with $labels.job }}job={{ . }}{{ else }}no job{{ end }}",
    "{{ range $k, $v := $labels }}{{ $k }}={{ $v }},{{ end }}"
    "|{{ range $labels }}[{{ . }}]{{ end }}|{{ range $v := $externalLabels }}<{{ $v }}>{{ end }}",
    "{{ $x := humanize $value }}{{ $x }}!{{ $x = `changed` }}{{ $x }}",
    "{{ if $v := $labels.job }}[{{ $v | toUpper }}]{{ else }}none{{ end }}",
    "{{ $value | humanize | toUpper }}|{{ (humanize $value) }}"
    "|{{ printf `%s-%s` (toUpper `a`) (`b` | toUpper) }}|{{ `x` | printf `%s%s` `y` }}",
    # whitespace trimming, comments, literals
    "a  {{- 1 -}}  b|{{-3}}|x {{/* c */}} y|{{- /* trimmed */ -}} z",
    "line1\n{{- /* comment */ -}}\n  line2\n  {{ $labels.job }}  \n{{ $value -}} \t\n end",
    '{{ `quoted` }}|{{ "esc \\"x\\" \\t\\u00e9" }}|{{ 1e3 }}|{{ 0x1F }}|{{ 010 }}|{{ -2.50 }}'
    "|{{ true }}|{{ 1_000 }}|{{ .5 }}|{{ 0b101 }}|{{ 0o17 }}|{{ -0x10 }}|{{ .5e1 }}|{{ +7 }}",
    "{{ printf `%q|%5s|%-5s|%.2s|%x` `é\u00a0\t` `日本語` `é` `日本語` `日本` }}",
    # more corners of fmt, regexp and control flow
    "{{ printf `%x|%X|%b|%q|%U|%c` $value 1.5 2.0 65 8364 9731 }}|{{ printf `%6.2f%%` "
    "(humanizePercentage 0.5) }}|{{ printf `%v %v` (args 1 true).arg1 (args).arg0 }}",
    "{{ print 1.5 2 `s` true $labels }}|{{ print }}|{{ print nil 1 }}|{{ println }}",
    "{{ reReplaceAll `(?i)ß|Ü` `_` `straße ÜBER über` }}|{{ reReplaceAll `[a-c\\-x]+` `#` "
    "`a-b_x-yz` }}|{{ reReplaceAll `\\Q.*\\E` `!` `a.*b` }}|{{ reReplaceAll `(?s)a.b` `X` "
    '"a\\nb" }}|{{ reReplaceAll `\\Aa|b\\z` `_` `aab` }}'
    "|{{ reReplaceAll `\\101\\x{42}\\x43` `-` `ABC` }}",
    "{{ reReplaceAll `^(\\w+)-(\\d+)$` `${2}_$1` `gpu-17` }}|{{ reReplaceAll `(?:x|(y))+` `<$1>` "
    "`xyxx` }}|{{ reReplaceAll `` `.` `ab` }}|{{ reReplaceAll `b*` `-` `abc` }}",
    "{{ if eq $labels.job `node` }}N{{ else if eq $labels.job `dcgm` }}D{{ else if $labels.job }}"
    "J{{ else }}-{{ end }}{{ with $labels.gpu }}g{{ . }}{{ with $labels.job }}/{{ . }}{{ end }}"
    "{{ end }}",
    "{{ $a := 1 }}{{ if true }}{{ $a = 2 }}{{ $b := 3 }}{{ $b }}{{ end }}{{ $a }}"
    "{{ range $k, $v := $labels }}{{ $a = $k }}{{ end }}{{ $a }}|{{ $ }}",
    "{{ and $labels.job $labels.nope }}|{{ or $labels.nope $labels.instance }}"
    "|{{ index (args 1 2) `arg1` }}|{{ $labels.job | len }}|{{ not $labels.nope }}",
    "{{ humanizeTimestamp `1700000000` }}|{{ 1.7e9 | toTime }}|{{ humanizeTimestamp 1e-3 }}"
    "|{{ humanizeTimestamp -86400.001 }}|{{ humanizeTimestamp 9.2e9 }}"
    "|{{ humanizeTimestamp -9.2e9 }}",
    "{{ title `ünïcode wörld` }}|{{ toUpper `ﬀ ŉ ǰ ᾀ` }}|{{ toLower `ΑΣ Ǆ` }}"
    "|{{ title `ᾀa ﬀb` }}|{{ printf `%q` `\x7f\u2028😀` }}",
    # regexp syntax RE2 shares with Go, and Expand's corners (group names are Unicode words)
    "{{ reReplaceAll `\\pL+` `L` `ab1çd` }}|{{ reReplaceAll `\\PL` `_` `a1é2` }}"
    "|{{ reReplaceAll `[[:^alpha:]]+` `-` `ab12cd` }}"
    "|{{ reReplaceAll `\\p{Greek}` `g` `a\u03b2\u03b3` }}"
    "|{{ reReplaceAll `(?U)a+` `x` `aaa` }}|{{ reReplaceAll `(?i)k` `x` `kK\u212a` }}",
    "{{ reReplaceAll `(?P<n>a)|(?P<n>b)` `[$n]` `ab` }}|{{ reReplaceAll `(a)` `$1²|${1}٣|$٣` `a` }}"
    "|{{ reReplaceAll `(a)|b` `<${1}>` `ab` }}|{{ reReplaceAll `` `.` `é日` }}"
    "|{{ reReplaceAll `x*` `-` `é` }}|{{ reReplaceAll `\\b` `|` `aé b` }}"
    "|{{ reReplaceAll `[\\D]+` `#` `1a2` }}|{{ match `\\Qa.b\\E$` `xa.b` }}",
    "{{ printf `%-+8.2f|%+08d|%- 6d|%x` -1.5 42 7 -255 }}|{{ printf `% x|%#x|% #X|%#o|%#b|%x` "
    "`hi` `hi` `hi` 8 5 $externalLabels }}|{{ printf `%8x|%-8X|%.1x` `é` `é` `é` }}",
]


def _random_values() -> list[float]:
    """Seeded floats across all magnitudes, and decimal "ties" for the rounding rules."""
    rng = random.Random(20240515)
    values = [rng.choice((1, -1)) * 10 ** rng.uniform(-30, 30) for _ in range(160)]
    values += [round(rng.uniform(-1e4, 1e4), rng.randint(0, 6)) for _ in range(60)]
    values += [float(rng.randint(-(2**62), 2**62)) for _ in range(20)]
    values += [k + 0.5 for k in range(-3, 4)] + [0.125, 0.375, 2.675, 1.0005, 9.9995, 99.995]
    values += [1234.5, 12345.5, 0.00012345, 999.95, 999.9999, 0.99999, 1023.99, 59.9999]
    return values


RANDOM_VALUES = _random_values()

NUMERIC_TEMPLATES = [
    "{{ $value }}",
    "{{ humanize $value }}|{{ humanize1024 $value }}|{{ humanizePercentage $value }}",
    "{{ humanizeDuration $value }}",
    "{{ printf `%.2f|%.3e|%g|%.4g|%.10g|%.0f|%.15g|%.17g` "
    "$value $value $value $value $value $value $value $value }}",
    "{{ printf `%x|%b` $value $value }}",
]


def _promql_number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _series(metric: str, labels: dict[str, str]) -> str:
    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace('"', '\\"')

    return metric + "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


SEVERITY = "{{ if gt $value 100.0 }}page{{ else }}ticket{{ end }}"
RULE_LABELS = {"severity": SEVERITY, "value_h": "{{ humanize $value }}"}


def _build(tmp_path: Path) -> dict[str, dict[str, str]]:
    """Write rules.yml and test.yml; return {case: {annotation: expected}}."""
    rules_list, series, tests, expected = [], [], [], {}
    runs = [
        ("m", "T", TEMPLATES, VALUES, RULE_LABELS),
        ("n", "N", NUMERIC_TEMPLATES, RANDOM_VALUES, {}),
    ]
    for metric, alert, templates, values, rule_labels in runs:
        annotations = {f"a{i:03d}": t for i, t in enumerate(templates)}
        rule = {"alert": alert, "expr": metric, "labels": rule_labels, "annotations": annotations}
        rules_list.append(rule)
        alerts = []
        for n, value in enumerate(values):
            labels = {"case": f"{metric}{n:03d}", **LABEL_SETS[n % len(LABEL_SETS)]}
            series.append({"series": _series(metric, labels), "values": _promql_number(value)})
            ctx = {
                "labels": {"__name__": metric, **labels},  # Prometheus keeps __name__ in $labels
                "value": value,
                "external_labels": EXTERNAL_LABELS,
                "external_url": EXTERNAL_URL,
            }
            exp_annotations = {k: expand(t, **ctx) for k, t in annotations.items()}
            exp_labels = {**labels, **{k: expand(t, **ctx) for k, t in rule_labels.items()}}
            alerts.append({"exp_labels": exp_labels, "exp_annotations": exp_annotations})
            expected[labels["case"]] = exp_annotations
        tests.append({"eval_time": "0m", "alertname": alert, "exp_alerts": alerts})
    rules = {"groups": [{"name": "templates", "rules": rules_list}]}
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "external_labels": EXTERNAL_LABELS,
                "external_url": EXTERNAL_URL,
                "input_series": series,
                "alert_rule_test": tests,
            }
        ],
    }
    dump = {"allow_unicode": True, "sort_keys": False, "width": 10_000}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, **dump), encoding="utf-8")
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, **dump), encoding="utf-8")
    return expected


def _go_unquote(s: str) -> str:
    """Undo strconv.Quote (how promtool prints label and annotation values)."""
    simple = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
    out, i = [], 0
    while i < len(s):
        if s[i] != "\\":
            out.append(s[i])
            i += 1
            continue
        esc = s[i + 1]
        width = {"x": 2, "u": 4, "U": 8}.get(esc)
        if width:
            out.append(chr(int(s[i + 2 : i + 2 + width], 16)))
            i += 2 + width
        else:
            out.append(simple.get(esc, esc))
            i += 2
    return "".join(out)


_QUOTED = r'"((?:[^"\\]|\\.)*)"'


def _mismatches(output: str, expected: dict[str, dict[str, str]]) -> list[str]:
    """Compare promtool's "got" alerts with what expand() produced, one line per difference."""
    got_part = output.split("got:[", 1)[-1]
    found = re.findall(r"Labels:\{(.*)\}\n\s*Annotations:\{(.*)\}", got_part)
    problems: dict[str, list[str]] = {}
    for labels_text, annotations_text in found:
        case = re.search(r"case=" + _QUOTED, labels_text)
        if case is None or case.group(1) not in expected:
            continue
        want = expected[case.group(1)]
        numeric = case.group(1).startswith("n")
        for key, raw in re.findall(r"(a\d{3})=" + _QUOTED, annotations_text):
            got = _go_unquote(raw)
            if want.get(key) != got:
                value = (RANDOM_VALUES if numeric else VALUES)[int(case.group(1)[1:])]
                template = (NUMERIC_TEMPLATES if numeric else TEMPLATES)[int(key[1:])]
                line = f"{template!r} value={value!r}: want {want.get(key)!r} got {got!r}"
                problems.setdefault(template, []).append(line)
    return [line for lines in problems.values() for line in lines[:3]]  # a few per template


@needs_promtool
def test_expand_matches_promtool(tmp_path: Path) -> None:
    expected = _build(tmp_path)
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        problems = _mismatches(output, expected)
        detail = "\n".join(problems[:60]) if problems else output[-4000:]
        pytest.fail(f"promtool disagrees:\n{detail}")


# --- fast checks that need no promtool (facts taken from promtool runs) ----------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.12, "0.12"),
        (3.0, "3"),
        (1e6, "1e+06"),
        (123456789.0, "1.23456789e+08"),
        (100000.0, "100000"),
        (1e21, "1e+21"),
        (1e-5, "1e-05"),
        (0.0001, "0.0001"),
        (0.1 + 0.2, "0.30000000000000004"),
        (-2.5, "-2.5"),
        (-0.0, "-0"),
        (math.nan, "NaN"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
    ],
)
def test_value_prints_like_go(value: float, text: str) -> None:
    assert expand("{{ $value }}", labels={}, value=value) == text


@pytest.mark.parametrize(
    ("template", "text"),
    [
        ("{{ humanize 1234567 }}", "1.235M"),
        ("{{ humanize 0.0012 }}", "1.2m"),
        ("{{ humanize1024 1536 }}", "1.5ki"),
        ("{{ humanizePercentage 0.1234 }}", "12.34%"),
        ("{{ humanizeDuration 90 }}", "1m 30s"),
        ("{{ humanizeDuration 0.1234 }}", "123.4ms"),
        ("{{ humanizeDuration 90061 }}", "1d 1h 1m 1s"),
        ("{{ humanizeTimestamp -1.5 }}", "1969-12-31 23:59:58.5 +0000 UTC"),
        ("{{ printf `%d` 1.5 }}", "%!d(float64=1.5)"),
        ("{{ printf `%05s|%x` `ab` 255 }}", "000ab|ff"),
        ("{{ $labels.nope }}", ""),
        ("{{ (args 1).arg5 }}", "<no value>"),
        ("{{ title `it's a_b x.y` }}", "It'S A_b X.Y"),
        ("{{ reReplaceAll `x*` `-` `abxd` }}", "-a-b-d-"),
        ("a {{- `b` -}} \n c", "abc"),
    ],
)
def test_known_outputs(template: str, text: str) -> None:
    assert expand(template, labels={"a": "b"}, value=1.0) == text


def test_labels_and_external_data() -> None:
    text = expand(
        "{{ $labels.job }}/{{ .ExternalLabels.dc }}/{{ $externalURL }}/{{ pathPrefix }}",
        labels={"job": "node"},
        value=0.0,
        external_labels={"dc": "x"},
        external_url="http://h:9090/a%20b/",
    )
    assert text == "node/x/http://h:9090/a%20b///a b/"


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        # outside the subset
        ('{{ query "up" }}', "query"),
        ('{{ define "x" }}{{ end }}', "define"),
        ('{{ template "x" }}', "template"),
        ("{{ range $i, $e := $labels }}{{ break }}{{ end }}", "break"),
        ("{{ 'a' }}", "character constants"),
        ("{{ 1i }}", "not supported"),
        ("{{ printf `%*d` 3 1 }}", "'*'"),
        ("{{ printf `%[1]d` 1 }}", "argument indexes"),
        ("{{ printf `%#v` 1 }}", "'#'"),
        ('{{ js "x" }}', "js"),
        ("{{ (toTime 1).Unix }}", "toTime"),
        # what Go's regexp refuses (RE2 syntax), in Go's words
        ("{{ match `(?=x)` `x` }}", "error parsing regexp: invalid or unsupported Perl syntax"),
        ("{{ match `(a)\\1` `aa` }}", "error parsing regexp: invalid escape sequence: `\\1`"),
        ("{{ match `\\C` `aa` }}", "invalid escape sequence: `\\C`"),  # C++ RE2 takes \C
        ("{{ match `(?<n>a)` `a` }}", "invalid or unsupported Perl syntax: `(?<`"),
        ("{{ match `(?P<é>a)` `a` }}", "invalid named capture: `(?P<é>`"),
        ("{{ reReplaceAll `a{1001}` `` `a` }}", "invalid repeat count: `{1001}`"),
        ("{{ reReplaceAll `a**` `` `a` }}", "invalid nested repetition operator: `**`"),
        # malformed
        ("{{ $value", "unclosed action"),
        ("{{ if true }}x", "unexpected EOF"),
        ("{{ end }}", "unexpected {{end}}"),
        ("{{ else }}", "unexpected {{else}}"),
        ("{{ nosuchfunc }}", "not defined"),
        ("{{ $undefined }}", "undefined variable"),
        ("{{ }}", "missing value"),
        ('{{ "unterminated }}', "unterminated"),
        ("{{ (1 }}", "unclosed left paren"),
        ("{{ 1) }}", "unexpected right paren"),
        ("{{ $value | 3 }}", "non executable command"),
        ("{{ nil }}", "nil is not a command"),
        ("{{ /* not a comment */ }}", "unexpected '/'"),
        ("{{/* unclosed }}", "unclosed comment"),
        ("{{ with $labels.x }}{{ else if true }}{{ end }}", "else if"),
        # always fails when run in Go (Prometheus would show "<error expanding template>")
        ("{{ .Labels.a.b }}", "can't evaluate field b"),
        ("{{ .Nope }}", "Nope"),
        ("{{ humanize }}", "wrong number of args"),
        ("{{ toUpper $value }}", "expected string; got float64"),
        ("{{ toUpper 3 }}", "expected string; found 3"),
        ("{{ gt $value 80 }}", "write 80 as 80.0"),
        ("{{ eq $labels.job 1 }}", "incompatible types"),
        ("{{ lt true false }}", "invalid type for comparison"),
        ("{{ humanize $labels }}", "can't convert"),
        ('{{ humanize "abc" }}', "invalid syntax"),
        ('{{ parseDuration "1.5h" }}', "not a valid duration"),
        ('{{ match "(" "x" }}', "regexp"),
        ("{{ $labels.job 1 }}", "non-function"),
        ("{{ range $value }}{{ end }}", "range can't iterate"),
    ],
)
def test_check_rejects(template: str, fragment: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(fragment)):
        check(template)


def test_check_error_names_the_column() -> None:
    with pytest.raises(TemplateError, match=r"line 2, column 8: function 'query'"):
        check('abc\nxyz {{ query "up" }}')


@pytest.mark.parametrize("template", [*TEMPLATES, *NUMERIC_TEMPLATES, SEVERITY])
def test_oracle_templates_pass_check(template: str) -> None:
    check(template)


@pytest.mark.parametrize(
    ("template", "labels", "value"),
    [
        ("{{ humanize $labels.job }}", {"job": "node"}, 1.0),
        ("{{ toTime $value }}", {}, math.nan),
        ("{{ reReplaceAll $labels.re `` `x` }}", {"re": "("}, 1.0),
        ("{{ humanizeTimestamp $value }}", {}, 1e300),
        ("{{ $labels.job | toUpper | printf `%s` | humanize }}", {"job": "x"}, 1.0),
    ],
)
def test_expand_raises_where_go_fails(template: str, labels: dict[str, str], value: float) -> None:
    check(template)
    with pytest.raises(TemplateError):
        expand(template, labels=labels, value=value)


# --- budgets (Go has none; a rule must not stall the evaluation thread or exhaust memory) ----


def _expand_bounded(template: str, labels: dict[str, str] | None = None) -> str:
    """expand(), asserting it stays within a few MB and a generous time bound."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        return expand(template, labels=labels or {}, value=1.0)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 8 << 20, f"peak {peak} bytes"
        assert time.monotonic() - start < 5.0


@pytest.mark.parametrize(
    "template",
    ['{{ printf "%999999999d" 1 }}', '{{ printf "%.999999999f" 1.5 }}', '{{ printf "%1001s" "" }}'],
)
def test_format_widths_over_the_limit_are_refused_at_load(template: str) -> None:
    with pytest.raises(TemplateError, match=f"over {FORMAT_WIDTH_LIMIT} is not allowed"):
        check(template)


def test_format_widths_from_data_fail_at_run_time_without_allocating() -> None:
    template = "{{ printf $labels.format 1 }}"
    check(template)
    for width in ("999999999", "9" * 6000):  # 6000 digits: beyond int()'s own digit limit
        with pytest.raises(TemplateError, match="error calling printf: a width over"):
            _expand_bounded(template, {"format": f"%{width}d"})
    text = _expand_bounded(template, {"format": f"%{FORMAT_WIDTH_LIMIT}d"})
    assert len(text) == FORMAT_WIDTH_LIMIT


def test_output_up_to_the_limit_renders_and_one_more_character_fails() -> None:
    full, rest = divmod(OUTPUT_LIMIT, 1000)
    template = '{{ printf "%1000s" "" }}' * full + f'{{{{ printf "%{rest}s" "" }}}}'
    assert len(_expand_bounded(template)) == OUTPUT_LIMIT
    with pytest.raises(TemplateError, match=f"template output exceeds {OUTPUT_LIMIT} characters"):
        _expand_bounded(template + "x")


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        # doubling a string: 2**40 characters in 40 statements
        ('{{ $x := printf "%1000s" "" }}' + "{{ $x = print $x $x }}" * 40, "print's result"),
        # a map holding itself twice, 40 deep, printed
        ("{{ $m := args 1 }}" + "{{ $m = args $m $m }}" * 40 + "{{ $m }}", "a formatted map"),
        # every empty match of a 1000-char text replaced by 100 emoji: 100,000 characters
        (
            '{{ reReplaceAll "" `' + "\U0001f600" * 100 + '` (printf "%1000s" "") }}',
            "reReplaceAll's result",
        ),
        # a replacement that expands to nothing, long, at every empty match of a 1000-char text
        (
            '{{ reReplaceAll "" `' + "$9" * 5000 + '` (printf "%1000s" "") }}',
            f"more than {BUILD_LIMIT} characters",
        ),
        # ranges nested 8 deep over 10 labels: 10**8 iterations
        ("{{ range $labels }}" * 8 + "{{ end }}" * 8, f"more than {STEP_LIMIT} steps"),
        # a 64 KB string scanned over and over
        (
            '{{ $x := printf "%1000s" "" }}{{ $x = print'
            + " $x" * 64
            + " }}"
            + '{{ match "a$" $x }}' * 10,
            f"more than {BUILD_LIMIT} characters",
        ),
    ],
)
def test_amplifiers_fail_within_the_budgets(template: str, fragment: str) -> None:
    labels = {f"l{i}": str(i) for i in range(10)}
    check(template)
    with pytest.raises(TemplateError, match=re.escape(fragment)):
        _expand_bounded(template, labels)


def test_nesting_up_to_the_limit_runs_and_one_level_more_is_refused_at_load() -> None:
    deep = "{{ " + "(" * NESTING_LIMIT + "1" + ")" * NESTING_LIMIT + " }}"
    assert _expand_bounded(deep) == "1"
    deep_if = "{{ if true }}" * NESTING_LIMIT + "x" + "{{ end }}" * NESTING_LIMIT
    assert _expand_bounded(deep_if) == "x"
    for template in ("{{ (" + deep[3:-3] + ") }}", "{{ if true }}" + deep_if + "{{ end }}"):
        with pytest.raises(TemplateError, match=f"nests deeper than {NESTING_LIMIT} levels"):
            check(template)


def test_regexp_errors_read_as_prometheus_renders_them() -> None:
    with pytest.raises(TemplateError) as info:
        expand("{{ reReplaceAll $labels.re `` `x` }}", labels={"re": "a("}, value=1.0)
    assert str(info.value) == (
        "line 1, column 4: error calling reReplaceAll: regexp: Compile(`a(`): "
        "error parsing regexp: missing closing ): `a(`"
    )
    with pytest.raises(TemplateError) as info:
        expand("{{ match $labels.re `x` }}", labels={"re": "a("}, value=1.0)
    assert str(info.value) == (
        "line 1, column 4: error calling match: error parsing regexp: missing closing ): `a(`"
    )
