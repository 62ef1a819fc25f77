r"""Alert templates rendered exactly as Prometheus 2.42 renders them (a subset of Go text/template).

Prometheus expands rule `annotations` and `labels` with Go's `text/template` (option
`missingkey=zero`) after prepending::

    {{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}
    {{$externalURL := .ExternalURL}}{{$value := .Value}}

`promtool test rules` compares the results byte for byte, so every output here follows Go's
formatting rules (fmt's `%v` for float64, strconv's shortest digits, `%.4g`, ...), not Python's.

Supported subset
----------------
* Text, `{{ action }}`, trim markers `{{- ` and ` -}}`, comments `{{/* ... */}}`.
* Data: `.Labels`, `.ExternalLabels`, `.ExternalURL`, `.Value`, `.` and `$`; the variables
  `$labels`, `$externalLabels`, `$externalURL`, `$value`; field chains such as `$labels.job`,
  `.Labels.job`, `(pipeline).field`. A missing label renders as "" (missingkey=zero).
* Literals: "quoted" and `raw` strings, Go integers (0x, 0o, 0b, legacy octal, `_`), floats,
  `true`/`false`, `nil` (as an argument).
* Pipelines with `|`, parentheses, function calls with arguments, variables declared with `:=`
  and reassigned with `=`.
* Control: `if` / `else if` / `else` / `end`, `with` / `else`, `range` over a map (sorted keys,
  `range $k, $v := ...`, `else`).
* Go builtins: `and or not eq ne lt le gt ge len index print printf println html urlquery`
  (`len` of strings and maps, `index` of maps).
* `printf` implements Go's fmt verbs `%v %s %d %f %F %e %E %g %G %x %X %o %b %c %q %U %t %T %%`
  for every operand type (hex and binary floats included) with flags `+ - space 0`, width and
  precision, and `#` for `%x %X` of ints and strings and `%o %b` of ints; Go's error notations
  `%!d(float64=3)`, `%!d(MISSING)`, `%!(EXTRA int=2)` and `%!(NOVERB)` are reproduced.
* Regular expressions (`match`, `reReplaceAll`) run on RE2 (`rules/regex.py`: the library Go's
  regexp follows, linear in time), on UTF-8 bytes as Go does; `match` is unanchored like
  regexp.MatchString, and `reReplaceAll` expands `$1 ${1} $name ${name} $$` and steps over empty
  matches as Regexp.ReplaceAllString does. Syntax RE2 takes but Go refuses is refused; what is
  left of the differences is in rules/regex.py.
* Prometheus functions: `humanize humanize1024 humanizeDuration humanizePercentage
  humanizeTimestamp toTime title toUpper toLower match reReplaceAll stripPort stripDomain
  safeHtml args graphLink tableLink parseDuration externalURL pathPrefix`.

Not supported (check() names them): `define template block break continue`, character
constants, complex numbers, the query functions `query first label value strvalue sortByLabel`,
`tmpl`, and the builtins `call slice js`; fmt's `*` widths, `%[n]` indexes, `%#v` and other
`#` forms, `%+q`, `%.3x` of floats; methods of `toTime`'s result. Backreferences and
lookarounds are refused as Go's regexp refuses them.

Budgets (Go has none): printf widths and precisions up to FORMAT_WIDTH_LIMIT, rendered text and
any one string up to OUTPUT_LIMIT characters, BUILD_LIMIT characters built or scanned by all
function calls, STEP_LIMIT steps and NESTING_LIMIT levels. Past one, expand() fails with
TemplateError like any run-time error; check() refuses literal widths and nesting at load.
These bound one expansion; a rule group expands many (each annotation of each alert), so
expand() also takes the group's deadline and checks it every CHECK_EVERY_STEPS steps
(template_cost.py estimates, for `rules check`, what a template may cost).

expand() raises TemplateError where Go fails at run time (e.g. `humanize` of a label that is not
a number); Prometheus renders "<error expanding template: ...>" in that case. Unicode case
mapping (`toUpper`, `toLower`, `title`) uses Python's tables and Go's per-rune simple mappings.

check() also refuses templates that Go would parse but that always fail when run, such as
`gt $value 80` (float64 vs int: Go never converts; write `80.0`), since Prometheus would then
show "<error expanding template: ...>" instead of the annotation.
"""

from __future__ import annotations

import datetime as _dt
import functools
import ipaddress
import math
import struct
import unicodedata
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter.support import regex

__all__ = [
    "BUILD_LIMIT",
    "CHECK_EVERY_STEPS",
    "FORMAT_WIDTH_LIMIT",
    "NESTING_LIMIT",
    "OUTPUT_LIMIT",
    "STEP_LIMIT",
    "TemplateError",
    "check",
    "expand",
]

# Budgets of one template. Go has none: Prometheus renders whatever a template asks for, a
# 10 MB `printf "%9999999d"` or ranges nested eight deep over every label. Here a template that
# passes one fails like any other run-time error ("<error expanding template: ...>" in the
# alert), never by truncation, which would silently cut a message; check() refuses what it can
# see at load. Together they hold one expansion to about 0.1-0.2 s of CPU and a few MB.
FORMAT_WIDTH_LIMIT = 1_000  # printf widths and precisions: far wider than any annotation line
OUTPUT_LIMIT = 65_536  # characters of rendered text, and of any one string built on the way
BUILD_LIMIT = 4 * OUTPUT_LIMIT  # characters all function calls build or scan, together
STEP_LIMIT = 10_000  # nodes, commands, range iterations and regex matches run
NESTING_LIMIT = 100  # parentheses and control structures inside each other
# An expansion given a deadline checks it this often: a step costs microseconds (a regex match
# at most a few hundred), so a stop comes well within a millisecond of the deadline.
CHECK_EVERY_STEPS = 32


class TemplateError(ValueError):
    """The template is malformed, outside the supported subset, or failed while running."""


def check(template: str) -> None:
    """Raise TemplateError if `template` is malformed or uses anything outside the subset."""
    _compile(template)


def expand(
    template: str,
    *,
    labels: Mapping[str, str],
    value: float,
    external_labels: Mapping[str, str] | None = None,
    external_url: str = "",
    check: Callable[[], None] | None = None,
) -> str:
    """Render `template` for one alert exactly as Prometheus 2.42 would. `check` (the rule
    group's deadline) is called before the first step and every CHECK_EVERY_STEPS steps; what
    it raises stops the expansion and propagates unchanged."""
    nodes = _compile(template)
    data = _Data(dict(labels), dict(external_labels or {}), external_url, float(value))
    try:
        return _Exec(data, budget=_Budget(check)).run(nodes)
    except _Error as exc:
        raise TemplateError(_describe(template, exc)) from None
    except RecursionError:  # cannot happen within NESTING_LIMIT; a failed expansion if it did
        raise TemplateError("template nests too deeply to run") from None


# --------------------------------------------------------------------------------------------
# Errors carry a position (offset into the template) when one is known.


class _Error(Exception):
    def __init__(self, msg: str, pos: int | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.pos = pos


def _describe(src: str, exc: _Error) -> str:
    if exc.pos is None:
        return exc.msg
    line = src.count("\n", 0, exc.pos) + 1
    column = exc.pos - (src.rfind("\n", 0, exc.pos) + 1) + 1
    return f"line {line}, column {column}: {exc.msg}"


class _Budget:
    """What one expansion may still spend (STEP_LIMIT, BUILD_LIMIT), and the deadline it runs
    under: the caps bound one expansion's memory and time, but not a group's many expansions
    together, so the group's time budget is checked at step granularity too."""

    def __init__(self, check: Callable[[], None] | None = None) -> None:
        self.steps_left = STEP_LIMIT
        self.chars_left = BUILD_LIMIT
        self.check = check

    def step(self) -> None:
        if self.check is not None and not (STEP_LIMIT - self.steps_left) % CHECK_EVERY_STEPS:
            self.check()  # before the first step, then every CHECK_EVERY_STEPS
        self.steps_left -= 1
        if self.steps_left < 0:
            raise _Error(f"template runs more than {STEP_LIMIT} steps")

    def work(self, chars: int) -> None:
        self.chars_left -= chars
        if self.chars_left < 0:
            raise _Error(f"template functions build or scan more than {BUILD_LIMIT} characters")


class _Builder:
    """Text assembled piece by piece, refused as soon as it passes `limit` (so never far past)."""

    def __init__(self, limit: int, what: str, *, utf8: bool = False) -> None:
        self.parts: list[Any] = []  # str, or bytes when utf8 (then up to 4 bytes a character)
        self.size = 0
        self.limit, self.what = limit, what
        self.max_size = limit * 4 if utf8 else limit

    def add(self, piece: Any) -> None:
        self.size += len(piece)
        if self.size > self.max_size:
            raise _Error(f"{self.what} exceeds {self.limit} characters")
        self.parts.append(piece)

    def text(self) -> str:
        return "".join(self.parts)


@functools.lru_cache(maxsize=1024)
def _compile(template: str) -> tuple[Any, ...]:
    try:
        nodes = _Parser(_Lexer(template).run(), len(template)).parse()
        _Checker().check_list(nodes, _T_DATA)
    except _Error as exc:
        raise TemplateError(_describe(template, exc)) from None
    return tuple(nodes)


# --------------------------------------------------------------------------------------------
# The Go values a template handles, as Python values:
#   string -> str, int -> int, float64 -> float, bool -> bool, map[string]string -> dict,
#   map[string]interface{} -> _ArgsMap, *time.Time -> _GoTime, nil interface{} -> None,
#   an invalid reflect.Value ("<no value>") -> _NO_VALUE, the template's data -> _Data.


class _NoValue:
    def __repr__(self) -> str:
        return "<no value>"


_NO_VALUE = _NoValue()
_MISSING = object()  # "no piped value" for the first command of a pipeline


class _ArgsMap(dict[str, Any]):
    """Go map[string]interface{}: missing keys yield nil, not ""."""


@dataclass(frozen=True)
class _GoTime:
    text: str  # time.Time.String(), all a template can do with it here


@dataclass(frozen=True)
class _Data:
    labels: dict[str, str]
    external_labels: dict[str, str]
    external_url: str
    value: float


_T_STRING, _T_INT, _T_FLOAT, _T_BOOL = "string", "int", "float64", "bool"
_T_LMAP, _T_AMAP = "map[string]string", "map[string]interface {}"
_T_TIME, _T_NIL = "*time.Time", "<nil>"
_T_DATA = (
    "struct { Labels map[string]string; ExternalLabels map[string]string; "
    "ExternalURL string; Value float64 }"
)
_DATA_FIELDS = {
    "Labels": ("labels", _T_LMAP),
    "ExternalLabels": ("external_labels", _T_LMAP),
    "ExternalURL": ("external_url", _T_STRING),
    "Value": ("value", _T_FLOAT),
}


def _type_name(v: Any) -> str:
    """Go's reflect type name, as fmt prints it in %T and %!verb(type=value)."""
    if v is None:
        return _T_NIL
    if isinstance(v, bool):  # before int: bool is an int in Python
        return _T_BOOL
    if isinstance(v, int):
        return _T_INT
    if isinstance(v, float):
        return _T_FLOAT
    if isinstance(v, str):
        return _T_STRING
    if isinstance(v, _ArgsMap):
        return _T_AMAP
    if isinstance(v, dict):
        return _T_LMAP
    if isinstance(v, _GoTime):
        return _T_TIME
    if isinstance(v, _Data):
        return _T_DATA
    return "invalid"


def _truth(v: Any) -> bool:
    """Go text/template's isTrue: empty values are false, NaN is true."""
    if v is None or v is _NO_VALUE:
        return False
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v != 0
    if isinstance(v, (str, dict)):
        return len(v) > 0
    return True


# --------------------------------------------------------------------------------------------
# Go's fmt package (the parts templates reach: Fprint for {{ }}, Sprintf, Sprint, Sprintln).


@dataclass
class _Spec:
    plus: bool = False
    minus: bool = False
    space: bool = False
    zero: bool = False
    sharp: bool = False
    plus_v: bool = False  # %+v: Go moves '+' here, so it only names struct fields
    width: int | None = None
    prec: int | None = None


def _shortest_digits(x: float) -> tuple[str, int]:
    """Shortest round-trip digits of |x| > 0 and the decimal point position (0.DIGITS * 10**dp).

    Python's repr and Go's strconv both produce the shortest digits that round-trip.
    """
    mantissa, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = whole + frac
    dp = len(whole) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    dp -= len(digits) - len(stripped)
    return stripped.rstrip("0"), dp


def _shortest_g(x: float) -> str:
    """strconv.FormatFloat(x, 'g', -1, 64) for x >= 0 (what fmt's %v prints)."""
    if x == 0:
        return "0"
    digits, dp = _shortest_digits(x)
    exp = dp - 1
    if exp < -4 or exp >= 6:  # shortest %g decides with precision 6 (strconv ftoa.go)
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if dp <= 0:
        return "0." + "0" * -dp + digits
    if dp >= len(digits):
        return digits + "0" * (dp - len(digits))
    return digits[:dp] + "." + digits[dp:]


def _unsupported(verb: str, spec: _Spec, t: str | None) -> str | None:
    """Why this module cannot format `t` (a Go type name, None if unknown) with the verb."""
    sharp_ok = (verb in "xX" and t in (_T_INT, _T_STRING, None)) or (verb in "ob" and t != _T_FLOAT)
    if spec.sharp and not sharp_ok:
        return f"the '#' flag with %{verb}" + (f" of {t}" if t else "")
    if t == _T_FLOAT and verb in "xXb" and spec.prec is not None:
        return f"%.N{verb} of float64"
    if t == _T_STRING and verb == "q" and spec.plus:
        return "%+q"
    if t == _T_TIME and verb not in "vsqxXT":
        return f"%{verb} of *time.Time"
    return None


def _pad(s: str, spec: _Spec, *, zero_ok: bool = True) -> str:
    """fmt's padding: width counts runes; '0' pads strings too in Go 1.19."""
    if spec.width is None or len(s) >= spec.width:
        return s
    fill = spec.width - len(s)
    if spec.minus:
        return s + " " * fill
    return ("0" if spec.zero and zero_ok else " ") * fill + s


def _fmt_float(x: float, verb: str, spec: _Spec) -> str:
    if verb not in "vfFeEgGxXb":
        return _bad_verb(x, verb, spec)
    if math.isnan(x):
        sign = "+" if spec.plus else " " if spec.space else ""
        return _pad(sign + "NaN", spec, zero_ok=False)
    if math.isinf(x):  # Go always signs infinities
        sign = "-" if x < 0 else "+" if spec.plus or not spec.space else " "
        return _pad(sign + "Inf", spec, zero_ok=False)
    negative = math.copysign(1.0, x) < 0
    sign = "-" if negative else "+" if spec.plus else " " if spec.space else ""
    body = _float_body(abs(x), verb, spec.prec)
    if spec.zero and not spec.minus and spec.width is not None:
        return sign + body.rjust(spec.width - len(sign), "0")
    return _pad(sign + body, spec)


def _float_body(x: float, verb: str, prec: int | None) -> str:
    if verb in "vgG":
        # Python's %.Ng matches Go's (same rounding, exponent form, trailing-zero removal).
        body = _shortest_g(x) if prec is None else f"{x:.{max(prec, 1)}g}"
        return body.upper() if verb == "G" else body
    if verb in "eE":
        body = f"{x:.{6 if prec is None else prec}e}"
        return body.upper() if verb == "E" else body
    if verb in "xXb":
        return _float_bits(x, verb)  # precision was refused by _unsupported
    return f"{x:.{6 if prec is None else prec}f}"


def _float_bits(x: float, verb: str) -> str:
    """strconv's 'x' (0x1.8p+01) and 'b' (6755399441055744p-52) formats of x >= 0."""
    bits = struct.unpack("<Q", struct.pack("<d", x))[0]
    biased, frac = (bits >> 52) & 0x7FF, bits & ((1 << 52) - 1)
    mant, exp = ((1 << 52) | frac, biased - 1075) if biased else (frac, -1074)
    if verb == "b":
        return f"{mant}p{exp:+d}"
    if mant == 0:
        text = "0x0p+00"
    else:
        shift = mant.bit_length() - 53  # normalise subnormals to 0x1.xxx like Go
        mant, exp = mant << -shift, exp + shift
        digits = f"{mant & ((1 << 52) - 1):013x}".rstrip("0")
        exp += 52
        text = f"0x1{'.' + digits if digits else ''}p{'-' if exp < 0 else '+'}{abs(exp):02d}"
    return text.upper() if verb == "X" else text


def _fmt_int(n: int, verb: str, spec: _Spec) -> str:
    bases = {"d": "d", "v": "d", "x": "x", "X": "X", "o": "o", "b": "b"}
    if verb == "c":
        ch = "\ufffd" if n < 0 or n > 0x10FFFF or 0xD800 <= n <= 0xDFFF else chr(n)
        return _pad(ch, spec)
    if verb == "q":
        code = n if 0 <= n <= 0x10FFFF and not 0xD800 <= n <= 0xDFFF else 0xFFFD
        return _pad(_go_quote(chr(code), "'"), spec)
    if verb == "U":
        return _pad(f"U+{n:04X}" if n >= 0 else f"U+{n & (2**64 - 1):04X}", spec)
    if verb not in bases:
        return _bad_verb(n, verb, spec)
    digits = format(abs(n), bases[verb])
    sign = "-" if n < 0 else "+" if spec.plus else " " if spec.space else ""
    if spec.prec is not None:
        if spec.prec == 0 and n == 0:
            return " " * (spec.width or 0)
        digits = digits.rjust(spec.prec, "0")
    elif spec.zero and spec.width is not None:  # Go zero-pads digits, before any 0x prefix
        digits = digits.rjust(spec.width - (1 if sign else 0), "0")
    if spec.sharp and verb == "o":
        digits = digits if digits.startswith("0") else "0" + digits
    elif spec.sharp:
        digits = {"x": "0x", "X": "0X", "b": "0b"}[verb] + digits
    return _pad(sign + digits, spec, zero_ok=False)


def _fmt_string(s: str, verb: str, spec: _Spec) -> str:
    if verb in "sv":
        return _pad(s if spec.prec is None else s[: spec.prec], spec)
    if verb == "q":
        return _pad(_go_quote(s if spec.prec is None else s[: spec.prec]), spec)
    if verb in "xX":
        return _pad(_hex_bytes(s, verb, spec), spec)
    return _bad_verb(s, verb, spec)


def _hex_bytes(s: str, verb: str, spec: _Spec) -> str:
    """fmt's %x of a string: UTF-8 bytes; ' ' separates them, '#' adds 0x (to each with ' ')."""
    data = _utf8(s)
    data = data if spec.prec is None else data[: spec.prec]
    prefix = "0" + verb if spec.sharp else ""
    digits = [f"{b:02x}" if verb == "x" else f"{b:02X}" for b in data]
    if spec.space:
        return " ".join(prefix + d for d in digits)
    return prefix + "".join(digits) if digits else ""


def _fmt_arg(arg: Any, verb: str, spec: _Spec, depth: int = 0) -> str:
    """fmt's printArg/printValue for one operand."""
    if (reason := _unsupported(verb, spec, _type_name(arg))) is not None:
        raise _Error(f"printf: {reason} is not supported")
    if verb == "T":
        return _fmt_string(_type_name(arg), "s", spec)
    if arg is None:
        if depth > 0:
            return "<nil>"
        return _pad("<nil>", spec) if verb == "v" else f"%!{verb}(<nil>)"
    if isinstance(arg, bool):
        return (
            _pad("true" if arg else "false", spec) if verb in "tv" else _bad_verb(arg, verb, spec)
        )
    if isinstance(arg, int):
        return _fmt_int(arg, verb, spec)
    if isinstance(arg, float):
        return _fmt_float(arg, verb, spec)
    if isinstance(arg, str):
        return _fmt_string(arg, verb, spec)
    if isinstance(arg, dict):  # maps print sorted by key, each element with the same verb
        # Bounded as it grows: `args` maps can hold maps, and the same map more than once.
        out = _Builder(OUTPUT_LIMIT, "a formatted map")
        out.add("map[")
        for k, key in enumerate(sorted(arg)):
            out.add((" " if k else "") + _fmt_arg(key, verb, spec, depth + 1) + ":")
            out.add(_fmt_arg(arg[key], verb, spec, depth + 1))
        out.add("]")
        return out.text()
    if isinstance(arg, _GoTime):  # a fmt.Stringer (other verbs were refused by _unsupported)
        return _fmt_string(arg.text, "s" if verb == "v" else verb, spec)
    if isinstance(arg, _Data):
        parts = []
        for name, (attr, _) in _DATA_FIELDS.items():
            text = _fmt_arg(getattr(arg, attr), verb, spec, depth + 1)
            parts.append(f"{name}:{text}" if spec.plus_v else text)
        return "{" + " ".join(parts) + "}"
    raise _Error(f"cannot format a value of type {_type_name(arg)}")


def _bad_verb(arg: Any, verb: str, spec: _Spec) -> str:
    return f"%!{verb}({_type_name(arg)}={_fmt_arg(arg, 'v', spec, 1)})"


def _sprintf(fmt: str, args: Sequence[Any]) -> str:
    """Go's fmt.Sprintf (doPrintf) for the supported verbs and flags."""
    out = _Builder(OUTPUT_LIMIT, "printf's result")
    argi, i, n = 0, 0, len(fmt)
    while i < n:
        j = fmt.find("%", i)
        if j < 0:
            out.add(fmt[i:])
            break
        out.add(fmt[i:j])
        spec, i = _parse_spec(fmt, j + 1)
        if i >= n:
            out.add("%!(NOVERB)")
            break
        verb = fmt[i]
        i += 1
        if verb == "%":  # "%%" takes no operand and ignores width and precision
            out.add("%")
        elif argi >= len(args):
            out.add(f"%!{verb}(MISSING)")
        else:
            if verb == "v":
                spec.plus_v, spec.plus = spec.plus, False
            out.add(_fmt_arg(args[argi], verb, spec))
            argi += 1
    if argi < len(args):
        out.add("%!(EXTRA ")
        for k, a in enumerate(args[argi:]):
            out.add(("" if k == 0 else ", ") + ("<nil>" if a is None else _type_name(a) + "="))
            if a is not None:
                out.add(_fmt_arg(a, "v", _Spec()))
        out.add(")")
    return out.text()


def _parse_spec(fmt: str, i: int) -> tuple[_Spec, int]:
    """Flags, width and precision after a '%'; returns the spec and the verb's index."""
    spec, n = _Spec(), len(fmt)
    while i < n and fmt[i] in "#0+- ":
        c = fmt[i]
        if c == "#":
            spec.sharp = True
        elif c == "0":
            spec.zero = not spec.minus  # Go: only pad with zeros on the left
        elif c == "+":
            spec.plus = True
        elif c == "-":
            spec.minus, spec.zero = True, False
        else:
            spec.space = True
        i += 1
    if i < n and fmt[i] in "[*":
        raise _Error("printf: '*' widths and [n] argument indexes are not supported")
    start = i
    while i < n and fmt[i].isdigit() and fmt[i].isascii():
        i += 1
    if i > start:
        spec.width = _format_number(fmt[start:i], "width")
    if i + 1 < n and fmt[i] == ".":  # Go: a '.' that ends the format is the verb
        i += 1
        if fmt[i] in "[*":
            raise _Error("printf: '*' precisions and [n] argument indexes are not supported")
        start = i
        while i < n and fmt[i].isdigit() and fmt[i].isascii():
            i += 1
        spec.prec = _format_number(fmt[start:i], "precision") if i > start else 0
    return spec, i


def _format_number(digits: str, what: str) -> int:
    """A width or precision, within FORMAT_WIDTH_LIMIT (checked before int() meets 1e6 digits)."""
    significant = digits.lstrip("0")
    if (
        len(significant) > len(str(FORMAT_WIDTH_LIMIT))
        or int(significant or "0") > FORMAT_WIDTH_LIMIT
    ):
        raise _Error(f"a {what} over {FORMAT_WIDTH_LIMIT} is not allowed")
    return int(significant or "0")


def _validate_format(fmt: str, types: Sequence[str | None]) -> None:
    """Refuse, at load time, what _sprintf would refuse for operands of these Go types."""
    i = argi = 0
    while (j := fmt.find("%", i)) >= 0:
        spec, i = _parse_spec(fmt, j + 1)
        if i >= len(fmt):
            return
        verb = fmt[i]
        i += 1
        if verb == "%":
            continue
        t = types[argi] if argi < len(types) else None
        argi += 1
        if (reason := _unsupported(verb, spec, t)) is not None:
            raise _Error(f"{reason} is not supported")


def _sprint(args: Sequence[Any]) -> str:
    """fmt.Sprint: a space between operands when neither is a string."""
    out = _Builder(OUTPUT_LIMIT, "print's result")
    prev_string = False
    for k, arg in enumerate(args):
        is_string = isinstance(arg, str)
        if k > 0 and not is_string and not prev_string:
            out.add(" ")
        out.add(_fmt_arg(arg, "v", _Spec()))
        prev_string = is_string
    return out.text()


def _sprintln(args: Sequence[Any]) -> str:
    """fmt.Sprintln: spaces between all operands and a final newline."""
    out = _Builder(OUTPUT_LIMIT, "println's result")
    for k, arg in enumerate(args):
        out.add((" " if k else "") + _fmt_arg(arg, "v", _Spec()))
    out.add("\n")
    return out.text()


def _print_value(v: Any) -> str:
    """What {{ pipeline }} writes: fmt.Fprint of the value, or "<no value>"."""
    if v is _NO_VALUE:
        return "<no value>"
    return _fmt_arg(v, "v", _Spec())


def _go_quote(s: str, quote: str = '"') -> str:
    """strconv.Quote, or QuoteRune's body with quote="'"."""
    out = [quote]
    escapes = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    escapes |= {"\v": "\\v", quote: "\\" + quote, "\\": "\\\\"}
    for ch in s:
        code = ord(ch)
        if ch in escapes:
            out.append(escapes[ch])
        elif ch.isprintable():  # Go's IsPrint: letters, marks, numbers, punct, symbols, ' '
            out.append(ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append(quote)
    return "".join(out)


# --------------------------------------------------------------------------------------------
# Other Go library behaviour the functions rely on.

# Patterns, compiled (and cached) by rules/regex.py at first use: RE2 is imported only then.
_GO_FLOAT = (
    r"[+-]?(?:(?:\d(?:_?\d)*)?(?:\.(?:\d(?:_?\d)*)?)?(?:[eE][+-]?\d(?:_?\d)*)?"
    r"|0[xX](?:_?[0-9a-fA-F])*(?:\.[0-9a-fA-F]*)?[pP][+-]?\d+)"
)
_GO_SPECIAL_FLOAT = r"(?i)[+-]?(?:inf|infinity)|nan"


def _go_parse_float(s: str) -> float:
    """strconv.ParseFloat(s, 64): Go syntax only (no spaces, no "+nan"), overflow is an error."""
    err = f"strconv.ParseFloat: parsing {_go_quote(s)}: "
    if not s.isascii():  # Go's syntax is ASCII (and RE2 takes only valid UTF-8)
        raise _Error(err + "invalid syntax")
    if regex.compile_re2(_GO_SPECIAL_FLOAT).fullmatch(s):
        return float(s)
    if not regex.compile_re2(_GO_FLOAT).fullmatch(s):
        raise _Error(err + "invalid syntax")
    text = s.replace("_", "")
    is_hex = text.lstrip("+-")[:2].lower() == "0x"
    try:
        value = float.fromhex(text) if is_hex else float(text)
    except ValueError:  # e.g. "0xp1": the pattern allows a mantissa without digits
        raise _Error(err + "invalid syntax") from None
    if math.isinf(value):
        raise _Error(err + "value out of range")
    return value


def _to_float(v: Any) -> float:
    """Prometheus' convertToFloat: float64, string and integer kinds."""
    if isinstance(v, float):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        return _go_parse_float(v)
    raise _Error(f"can't convert {_type_name(v)} to float")


def _go_int64(x: float) -> int:
    """Go's int64(float64) on amd64: truncation, MinInt64 when out of range."""
    if math.isnan(x) or not -(2.0**63) <= x < 2.0**63:
        return -(2**63)
    return int(x)


def _tdiv(a: int, b: int) -> int:
    """Go's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _tmod(a: int, b: int) -> int:
    return a - b * _tdiv(a, b)


_EPOCH = _dt.datetime(1970, 1, 1)


def _go_time(seconds: float) -> str:
    """time.Time.String() of model.TimeFromUnixNano(int64(seconds*1e9)) in UTC (ms precision)."""
    ns = seconds * 1e9
    if ns > 2.0**63 or ns < -(2.0**63):
        raise _Error(
            f"{_fmt_float(seconds, 'v', _Spec())} cannot be represented as a nanoseconds timestamp "
            "since it overflows int64"
        )
    ms = _tdiv(_go_int64(ns), 1_000_000)
    t = _EPOCH + _dt.timedelta(milliseconds=ms)
    text = t.strftime("%Y-%m-%d %H:%M:%S")
    if t.microsecond:
        text += "." + f"{t.microsecond:06d}".rstrip("0")
    return text + " +0000 UTC"


def _go_split_host_port(hostport: str) -> tuple[str, str] | None:
    """net.SplitHostPort; None where Go returns an error."""
    i = hostport.rfind(":")
    if i < 0:
        return None
    j = k = 0
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0 or end + 1 != i:
            return None
        host = hostport[1:end]
        j, k = 1, end + 1
    else:
        host = hostport[:i]
        if ":" in host:
            return None
    if "[" in hostport[j:] or "]" in hostport[k:]:
        return None
    return host, hostport[i + 1 :]


def _go_is_ip(host: str) -> bool:
    """net.ParseIP(host) != nil (no zones, no leading zeros in IPv4)."""
    if "%" in host:
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


_DURATION = r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?"
_DURATION_MS = (365 * 86400_000, 7 * 86400_000, 86400_000, 3600_000, 60_000, 1000, 1)


def _parse_duration(s: str) -> float:
    """model.ParseDuration (prometheus/common) as float seconds."""
    if s == "0":
        return 0.0
    if s == "":
        raise _Error("empty duration string")
    m = regex.compile_re2(_DURATION).fullmatch(s) if s.isascii() else None
    if m is None:
        raise _Error(f"not a valid duration string: {_go_quote(s)}")
    ms = sum(int(g) * mult for g, mult in zip(m.groups(), _DURATION_MS, strict=True) if g)
    if ms * 1_000_000 > 2**63 - 1:
        raise _Error("duration out of range")
    return float(ms * 1_000_000) / 1e9


# --------------------------------------------------------------------------------------------
# Go regexp on RE2 (rules/regex.py): MatchString and Regexp.ReplaceAllString, on UTF-8 bytes
# as Go matches them, so offsets, empty-match steps and group text are Go's.


def _go_regexp(pattern: str) -> regex.GoRegexp:
    try:
        return regex.compile_go(pattern)
    except regex.RegexError as exc:
        raise _Error(exc.go_message) from None


def _utf8(s: str) -> bytes:
    # A lone surrogate (not UTF-8) passes as the invalid bytes that Go would carry along.
    return s.encode("utf-8", "surrogatepass")


def _from_utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:  # a group boundary split a passed-through surrogate
        return data.decode("utf-8", "replace")


def _go_can_backquote(s: str) -> bool:
    """strconv.CanBackquote: no control character but tab, no '`', DEL or BOM, valid UTF-8."""
    for ch in s:
        if ch == "\ufeff" or "\ud800" <= ch <= "\udfff":
            return False
        if ch < "\x80" and ((ch < " " and ch != "\t") or ch in "`\x7f"):
            return False
    return True


def _re_replace_all(budget: _Budget, pattern: str, repl: str, text: str) -> str:
    """Regexp.ReplaceAllString (regexp.go replaceAll and expand), Go's empty matches included."""
    try:
        rx = regex.compile_go(pattern)
    except regex.RegexError as exc:  # Prometheus calls MustCompile: its panic text
        shown = f"`{pattern}`" if _go_can_backquote(pattern) else _go_quote(pattern)
        raise _Error(f"regexp: Compile({shown}): {exc.go_message}") from None
    src = _utf8(text)
    budget.work(len(text))
    out = _Builder(OUTPUT_LIMIT, "reReplaceAll's result", utf8=True)
    last_end = search = 0
    while search <= len(src):
        budget.step()
        spans = rx.search(src, search)
        if spans is None:
            break
        start, end = spans[0]
        out.add(src[last_end:start])
        # Go skips an empty match right after the previous match.
        if end > last_end or start == 0:
            budget.work(len(repl))  # a replacement of "$9$9..." costs its length, adding nothing
            regex.expand(out.add, repl, src, spans, rx.names)
        last_end = end
        width = _rune_width(src, search)
        if search + width > end:
            search += width
        elif search + 1 > end:  # only at the end of the input, where the width is 0
            search += 1
        else:
            search = end
    out.add(src[last_end:])
    return _from_utf8(b"".join(out.parts))


def _rune_width(src: bytes, i: int) -> int:
    """Bytes utf8.DecodeRune takes at i: 0 at the end, 1 for a byte that starts no rune."""
    if i >= len(src):
        return 0
    lead = src[i]
    width = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    tail = src[i + 1 : i + width]
    return width if len(tail) == width - 1 and all(0x80 <= b < 0xC0 for b in tail) else 1


def _match_string(budget: _Budget, pattern: str, text: str) -> bool:
    """regexp.MatchString: unanchored."""
    rx = _go_regexp(pattern)
    budget.work(len(text))
    return rx.search(_utf8(text)) is not None


# --------------------------------------------------------------------------------------------
# Unicode case mapping per rune, as Go's unicode.ToUpper/ToLower/ToTitle (simple mappings).


def _simple_case(ch: str, mapped: str, fallback: str) -> str:
    if len(mapped) == 1:
        return mapped
    return fallback if len(fallback) == 1 else ch


def _to_upper(s: str) -> str:
    return "".join(_simple_case(ch, ch.upper(), ch.title()) for ch in s)


def _to_lower(s: str) -> str:
    return "".join(_simple_case(ch, ch.lower(), "i" if ch == "\u0130" else ch) for ch in s)


def _is_separator(ch: str) -> bool:
    """strings.Title's word separators."""
    if ch.isascii():
        return not (ch.isalnum() or ch == "_")
    if ch.isalpha() or unicodedata.category(ch) == "Nd":
        return False
    return ch.isspace()


def _title(s: str) -> str:
    """strings.Title (Prometheus 2.42): upper-case the first letter after a separator."""
    out: list[str] = []
    prev = " "
    for ch in s:
        out.append(_simple_case(ch, ch.title(), ch.upper()) if _is_separator(prev) else ch)
        prev = ch
    return "".join(out)


# --------------------------------------------------------------------------------------------
# Prometheus template functions (template/template.go) and the Go builtins.


def _fmt4g(v: float, suffix: str = "") -> str:
    return _fmt_float(v, "g", _Spec(prec=4)) + suffix


def _humanize(arg: Any) -> str:
    v = _to_float(arg)
    if v == 0 or math.isnan(v) or math.isinf(v):
        return _fmt4g(v)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return _fmt4g(v, prefix)
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return _fmt4g(v, prefix)


def _humanize1024(arg: Any) -> str:
    v = _to_float(arg)
    if abs(v) <= 1 or math.isnan(v) or math.isinf(v):
        return _fmt4g(v)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return _fmt4g(v, prefix)


def _humanize_duration(arg: Any) -> str:
    v = _to_float(arg)
    if math.isnan(v) or math.isinf(v):
        return _fmt4g(v)
    if v == 0:
        return _fmt4g(v, "s")
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        d = _go_int64(v)
        seconds, minutes = _tmod(d, 60), _tmod(_tdiv(d, 60), 60)
        hours, days = _tmod(_tdiv(d, 3600), 24), _tdiv(d, 86400)
        if days != 0:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours != 0:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes != 0:
            return f"{sign}{minutes}m {seconds}s"
        return sign + _fmt4g(v, "s")
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return _fmt4g(v, prefix + "s")


def _humanize_percentage(arg: Any) -> str:
    return _fmt4g(_to_float(arg) * 100, "%")


def _humanize_timestamp(arg: Any) -> str:
    v = _to_float(arg)
    if math.isnan(v) or math.isinf(v):
        return _fmt4g(v)
    return _go_time(v)


def _to_time(arg: Any) -> _GoTime:
    v = _to_float(arg)
    if math.isnan(v) or math.isinf(v):
        raise _Error("value is NaN or Inf")
    return _GoTime(_go_time(v))


def _strip_port(hostport: str) -> str:
    parts = _go_split_host_port(hostport)
    return hostport if parts is None else parts[0]


def _strip_domain(hostport: str) -> str:
    parts = _go_split_host_port(hostport)
    host, port = (hostport, "") if parts is None else parts
    if _go_is_ip(host):
        return hostport
    host = host.split(".")[0]
    if port:
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return host


def _query_escape(s: str) -> str:
    """url.QueryEscape."""
    return urllib.parse.quote_plus(s, safe="", errors="surrogatepass")


def _args(*values: Any) -> _ArgsMap:
    return _ArgsMap({f"arg{i}": v for i, v in enumerate(values)})


def _basic_kind(v: Any) -> str | None:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    return None


def _eq(a: Any, *others: Any) -> bool:
    if not others:
        raise _Error("missing argument for comparison")
    ka = _basic_kind(a)
    for b in others:
        kb = _basic_kind(b)
        if ka != kb:
            if a is not None and b is not None:
                raise _Error("incompatible types for comparison")
            truth = False
        elif ka is None:
            if a is not None or b is not None:
                raise _Error(f"uncomparable type {_type_name(a)}")
            truth = True
        else:
            truth = a == b
        if truth:
            return True
    return False


def _lt(a: Any, b: Any) -> bool:
    ka, kb = _basic_kind(a), _basic_kind(b)
    if ka is None or kb is None or ka == "bool" or kb == "bool":
        raise _Error("invalid type for comparison")
    if ka != kb:
        raise _Error("incompatible types for comparison")
    return bool(a < b)


def _le(a: Any, b: Any) -> bool:
    return _lt(a, b) or _eq(a, b)


def _len(v: Any) -> int:
    if isinstance(v, str):
        return len(_utf8(v))
    if isinstance(v, dict):
        return len(v)
    raise _Error(f"len of type {_type_name(v)}")


def _index(item: Any, *keys: Any) -> Any:
    for key in keys:
        if not isinstance(item, dict):
            raise _Error(f"can't index item of type {_type_name(item)}")
        if not isinstance(key, str):
            raise _Error(f"value has type {_type_name(key)}; should be string")
        item = item.get(key, None if isinstance(item, _ArgsMap) else "")
    return item


def _eval_args(values: Sequence[Any]) -> str:
    """text/template's evalArgs, used by html and urlquery."""
    if len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return _sprint(["<no value>" if v is None else v for v in values])


def _html(*values: Any) -> str:
    text = _eval_args(values)
    table = {"&": "&amp;", "'": "&#39;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "\0": "\ufffd"}
    return "".join(table.get(ch, ch) for ch in text)


@dataclass(frozen=True)
class _Func:
    params: tuple[str, ...]  # per fixed parameter: "string", "any" (interface{}), "value"
    variadic: str | None  # kind of the extra arguments, None when not variadic
    result: str | None  # Go result type when fixed (for check()), None when it varies
    impl: Callable[..., Any]


def _fn(
    params: str, result: str | None, impl: Callable[..., Any], variadic: str | None = None
) -> _Func:
    return _Func(tuple(params.split()), variadic, result, impl)


_FUNCS: dict[str, _Func] = {
    # Go text/template builtins.
    "and": _fn("value", None, lambda *a: a[-1], "value"),  # evaluated lazily by _Exec
    "or": _fn("value", None, lambda *a: a[-1], "value"),
    "not": _fn("value", _T_BOOL, lambda a: not _truth(a)),
    "eq": _fn("value", _T_BOOL, _eq, "value"),
    "ne": _fn("value value", _T_BOOL, lambda a, b: not _eq(a, b)),
    "lt": _fn("value value", _T_BOOL, _lt),
    "le": _fn("value value", _T_BOOL, _le),
    "gt": _fn("value value", _T_BOOL, lambda a, b: not _le(a, b)),
    "ge": _fn("value value", _T_BOOL, lambda a, b: not _lt(a, b)),
    "len": _fn("value", _T_INT, _len),
    "index": _fn("value", None, _index, "value"),
    "print": _fn("", _T_STRING, lambda *a: _sprint(a), "any"),
    "println": _fn("", _T_STRING, lambda *a: _sprintln(a), "any"),
    "printf": _fn("string", _T_STRING, lambda f, *a: _sprintf(f, a), "any"),
    "html": _fn("", _T_STRING, _html, "any"),
    "urlquery": _fn("", _T_STRING, lambda *a: _query_escape(_eval_args(a)), "any"),
    # Prometheus (template/template.go).
    "humanize": _fn("any", _T_STRING, _humanize),
    "humanize1024": _fn("any", _T_STRING, _humanize1024),
    "humanizeDuration": _fn("any", _T_STRING, _humanize_duration),
    "humanizePercentage": _fn("any", _T_STRING, _humanize_percentage),
    "humanizeTimestamp": _fn("any", _T_STRING, _humanize_timestamp),
    "toTime": _fn("any", _T_TIME, _to_time),
    "title": _fn("string", _T_STRING, _title),
    "toUpper": _fn("string", _T_STRING, _to_upper),
    "toLower": _fn("string", _T_STRING, _to_lower),
    # These two take the expansion's _Budget first; _Exec binds it.
    "match": _fn("string string", _T_BOOL, _match_string),
    "reReplaceAll": _fn("string string string", _T_STRING, _re_replace_all),
    "stripPort": _fn("string", _T_STRING, _strip_port),
    "stripDomain": _fn("string", _T_STRING, _strip_domain),
    "safeHtml": _fn("string", _T_STRING, lambda s: s),
    "args": _fn("", _T_AMAP, _args, "any"),
    "graphLink": _fn("string", _T_STRING, lambda e: f"/graph?g0.expr={_query_escape(e)}&g0.tab=0"),
    "tableLink": _fn("string", _T_STRING, lambda e: f"/graph?g0.expr={_query_escape(e)}&g0.tab=1"),
    "parseDuration": _fn("string", _T_FLOAT, _parse_duration),
    # These two read the external URL; _Exec binds them.
    "externalURL": _fn("", _T_STRING, lambda: ""),
    "pathPrefix": _fn("", _T_STRING, lambda: ""),
}

_UNSUPPORTED_FUNCS = {
    "query": "it runs a PromQL query",
    "first": "it works on query results",
    "label": "it works on query results",
    "value": "it works on query results",
    "strvalue": "it works on query results",
    "sortByLabel": "it works on query results",
    "tmpl": "it only exists in console templates",
    "call": "templates here have no function values",
    "slice": "it is not implemented",
    "js": "it is not implemented",
}

_COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge"}
_TO_FLOAT_FUNCS = {
    "humanize",
    "humanize1024",
    "humanizeDuration",
    "humanizePercentage",
    "humanizeTimestamp",
    "toTime",
}


# --------------------------------------------------------------------------------------------
# Lexer (text/template/parse/lex.go). Positions are offsets into the template.

_SPACE = " \t\r\n"
_BASE_DIGITS = {
    "": "0123456789_",
    "x": "0123456789abcdefABCDEF_",
    "o": "01234567_",
    "b": "01_",
}
_KEYWORDS = {"if", "else", "end", "range", "with", "define", "template", "block", "break"}
_KEYWORDS |= {"continue", "nil"}


@dataclass(frozen=True)
class _Tok:
    kind: str
    value: str
    pos: int


def _is_alnum(ch: str) -> bool:
    return ch == "_" or ch.isalpha() or unicodedata.category(ch) == "Nd"


class _Lexer:
    def __init__(self, src: str) -> None:
        self.src = src
        self.pos = 0
        self.toks: list[_Tok] = []
        self.parens = 0

    def emit(self, kind: str, value: str, pos: int) -> None:
        self.toks.append(_Tok(kind, value, pos))

    def run(self) -> list[_Tok]:
        src = self.src
        while self.pos < len(src):
            left = src.find("{{", self.pos)
            if left < 0:
                self.emit("text", src[self.pos :], self.pos)
                break
            trim = self.left_trim(left + 2)
            text = src[self.pos : left]
            if trim:
                text = text.rstrip(_SPACE)
            if text:
                self.emit("text", text, self.pos)
            self.pos = left + 2 + (2 if trim else 0)
            if src.startswith("/*", self.pos):
                self.comment(left)
            else:
                self.emit("left", "{{", left)
                self.action(left)
        self.emit("eof", "", len(src))
        return self.toks

    def left_trim(self, pos: int) -> bool:
        """A "{{" followed by "- " trims the whitespace before it."""
        return (
            self.src.startswith("-", pos)
            and pos + 1 < len(self.src)
            and self.src[pos + 1] in _SPACE
        )

    def right_delim(self) -> tuple[bool, bool]:
        """(at "}}" or " -}}", with trim marker)."""
        src, p = self.src, self.pos
        if (
            p + 1 < len(src)
            and src[p] in _SPACE
            and src[p + 1] == "-"
            and src.startswith("}}", p + 2)
        ):
            return True, True
        return src.startswith("}}", p), False

    def close(self, trim: bool) -> None:
        self.pos += 4 if trim else 2
        if trim:
            while self.pos < len(self.src) and self.src[self.pos] in _SPACE:
                self.pos += 1

    def comment(self, left: int) -> None:
        end = self.src.find("*/", self.pos + 2)
        if end < 0:
            raise _Error("unclosed comment", left)
        self.pos = end + 2
        delim, trim = self.right_delim()
        if not delim:
            raise _Error("comment ends before closing delimiter", left)
        self.close(trim)

    def action(self, left: int) -> None:
        src = self.src
        while True:
            delim, trim = self.right_delim()
            if delim:
                if self.parens:
                    raise _Error("unclosed left paren", self.pos)
                self.emit("right", "}}", self.pos)
                self.close(trim)
                return
            if self.pos >= len(src):
                raise _Error("unclosed action", left)
            self.lex_one(src[self.pos])

    def lex_one(self, c: str) -> None:
        src, start = self.src, self.pos
        simple = {"=": "assign", "|": "pipe", ",": "comma"}
        if c in _SPACE:
            end = start
            while end < len(src) and src[end] in _SPACE:
                end += 1
            if src.startswith("-}}", end):  # the last space belongs to a " -}}" trim marker
                end -= 1
            self.pos = end
            self.emit("space", src[start:end], start)
        elif c in simple:
            self.pos += 1
            self.emit(simple[c], c, start)
        elif c == ":":
            if not src.startswith(":=", start):
                raise _Error("expected :=", start)
            self.pos += 2
            self.emit("declare", ":=", start)
        elif c == '"':
            self.quote(start)
        elif c == "`":
            end = src.find("`", start + 1)
            if end < 0:
                raise _Error("unterminated raw quoted string", start)
            self.pos = end + 1
            self.emit("string", src[start + 1 : end].replace("\r", ""), start)
        elif c == "$":
            self.pos += 1
            self.word(start, "var")
        elif c == "'":
            raise _Error("character constants are not supported", start)
        elif c == "." and not (start + 1 < len(src) and src[start + 1].isdigit()):
            self.pos += 1
            if self.at_terminator():
                self.emit("dot", ".", start)
            else:
                self.word(start, "field")
        elif c in "+-." or c.isdigit():
            self.number(start)
        elif _is_alnum(c):
            self.word(start, "ident")
        elif c == "(":
            self.parens += 1
            self.pos += 1
            self.emit("lparen", c, start)
        elif c == ")":
            self.parens -= 1
            if self.parens < 0:
                raise _Error("unexpected right paren", start)
            self.pos += 1
            self.emit("rparen", c, start)
        else:
            raise _Error(f"unexpected {c!r} in action", start)

    def at_terminator(self) -> bool:
        src, p = self.src, self.pos
        if p >= len(src) or src[p] in _SPACE or src[p] in ".,|:)(":
            return True
        return src.startswith("}}", p)

    def word(self, start: int, kind: str) -> None:
        src = self.src
        while self.pos < len(src) and _is_alnum(src[self.pos]):
            self.pos += 1
        if not self.at_terminator():
            raise _Error(f"bad character {src[self.pos]!r}", self.pos)
        text = src[start : self.pos]
        if kind == "ident" and text in _KEYWORDS:
            kind = "keyword"
        elif kind == "ident" and text in ("true", "false"):
            kind = "bool"
        self.emit(kind, text, start)

    def quote(self, start: int) -> None:
        src, i = self.src, start + 1
        while True:
            if i >= len(src) or src[i] == "\n":
                raise _Error("unterminated quoted string", start)
            if src[i] == "\\":
                if i + 1 >= len(src) or src[i + 1] == "\n":
                    raise _Error("unterminated quoted string", start)
                i += 2
                continue
            if src[i] == '"':
                break
            i += 1
        self.pos = i + 1
        self.emit("string", _go_unquote(src[start + 1 : i], start), start)

    def number(self, start: int) -> None:
        """scanNumber from lex.go; the parser decides what the text means."""
        src, i = self.src, start
        if src[i] in "+-":
            i += 1
        base = ""
        if src.startswith("0", i) and src[i + 1 : i + 2] in ("x", "X", "o", "O", "b", "B"):
            base = src[i + 1].lower()
            i += 2
        digits = _BASE_DIGITS[base]
        i = self.skip(i, digits)
        if src.startswith(".", i):
            i = self.skip(i + 1, digits)
        exponent = {"": "eE", "x": "pP"}.get(base)
        if exponent and src[i : i + 1] and src[i] in exponent:
            i += 2 if src[i + 1 : i + 2] in ("+", "-") else 1
            i = self.skip(i, _BASE_DIGITS[""])
        if src.startswith("i", i):  # imaginary: refused by the parser
            i += 1
        if i < len(src) and _is_alnum(src[i]):
            raise _Error(f"bad number syntax: {src[start : i + 1]!r}", start)
        self.pos = i
        self.emit("number", src[start:i], start)

    def skip(self, i: int, chars: str) -> int:
        while i < len(self.src) and self.src[i] in chars:
            i += 1
        return i


def _go_unquote(body: str, pos: int) -> str:
    """strconv.Unquote of a double-quoted literal (without the quotes)."""
    simple = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
    simple |= {"\\": "\\", '"': '"'}
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        esc = body[i + 1]
        if esc in simple:
            out.append(simple[esc])
            i += 2
            continue
        size = {"x": 2, "u": 4, "U": 8}.get(esc)
        digits = body[i + 2 : i + 2 + size] if size else body[i + 1 : i + 4]
        base = 16 if size else 8
        if size is None and esc not in "01234567":
            raise _Error(f"invalid escape \\{esc} in string", pos)
        try:
            code = int(digits, base)
        except ValueError:
            raise _Error(f"invalid escape \\{esc} in string", pos) from None
        if len(digits) != (size or 3) or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise _Error(f"invalid escape \\{esc}{digits} in string", pos)
        if esc in "x01234567" and code >= 0x80:  # a raw byte: not valid UTF-8 on its own
            raise _Error("\\x and octal escapes above 0x7f are not supported", pos)
        out.append(chr(code))
        i += 2 + size if size else 4
    return "".join(out)


def _number_value(text: str, pos: int) -> int | float:
    """What text/template makes of a number literal: int unless it looks like a float."""
    if text.endswith("i") or (text.lstrip("+-")[:2].lower() in ("0x",) and "p" in text.lower()):
        raise _Error(f"number {text} is not supported (complex or hex float)", pos)
    body = text.lstrip("+-")
    looks_float = any(c in body for c in ".eE") and body[:2].lower() != "0x"
    try:
        if looks_float:
            if "_" in body:
                raise ValueError
            value: int | float = float(text)
            if math.isinf(value):
                raise ValueError
            return value
        if len(body) > 1 and body[0] == "0" and body[1] in "0123456789_":
            value = int(text[: len(text) - len(body)] + "0o" + body[1:], 0)  # legacy octal
        else:
            value = int(text, 0)
    except ValueError:
        raise _Error(f"illegal number syntax: {text!r}", pos) from None
    if not -(2**63) <= value < 2**63:
        raise _Error(f"number {text} overflows int", pos)
    return value


# --------------------------------------------------------------------------------------------
# Parser (text/template/parse/parse.go) -> a small AST.


@dataclass(frozen=True)
class _Text:
    text: str


@dataclass(frozen=True)
class _Lit:
    kind: str  # "string" | "number" | "bool" | "nil"
    value: Any
    text: str
    pos: int


@dataclass(frozen=True)
class _DotNode:
    pos: int


@dataclass(frozen=True)
class _FieldNode:  # .A.B, relative to dot
    names: tuple[str, ...]
    pos: int


@dataclass(frozen=True)
class _VarNode:  # $x.A.B
    name: str
    names: tuple[str, ...]
    pos: int


@dataclass(frozen=True)
class _FuncNode:
    name: str
    pos: int


@dataclass(frozen=True)
class _ChainNode:  # (pipeline).A.B
    node: Any
    names: tuple[str, ...]
    pos: int


@dataclass(frozen=True)
class _Cmd:
    args: tuple[Any, ...]
    pos: int


@dataclass(frozen=True)
class _Pipe:
    decl: tuple[str, ...]
    assign: bool
    cmds: tuple[_Cmd, ...]
    pos: int


@dataclass(frozen=True)
class _Action:
    pipe: _Pipe
    pos: int


@dataclass(frozen=True)
class _Control:
    kind: str  # "if" | "with" | "range"
    pipe: _Pipe
    body: tuple[Any, ...]
    else_body: tuple[Any, ...] | None
    pos: int


@dataclass(frozen=True)
class _End:
    pos: int


@dataclass(frozen=True)
class _Else:
    pos: int
    chained_if: bool  # "{{else if ...": the "if" token is still pending


_ROOT_VARS = ("$", "$labels", "$externalLabels", "$externalURL", "$value")
_OPERAND_START = {"bool", "dot", "field", "ident", "number", "keyword", "string", "var", "lparen"}


class _Parser:
    def __init__(self, toks: list[_Tok], end: int) -> None:
        self.toks = toks
        self.i = 0
        self.end = end
        self.vars: list[str] = list(_ROOT_VARS)
        self.depth = 0

    # -- token helpers
    def peek(self) -> _Tok:
        return self.toks[self.i]

    def next(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def skip_spaces(self) -> None:
        while self.toks[self.i].kind == "space":
            self.i += 1

    def next_non_space(self) -> _Tok:
        self.skip_spaces()
        return self.next()

    def peek_non_space(self) -> _Tok:
        self.skip_spaces()
        return self.peek()

    @staticmethod
    def unexpected(tok: _Tok, context: str) -> _Error:
        shown = {"eof": "EOF", "right": '"}}"', "left": '"{{"'}.get(tok.kind, repr(tok.value))
        return _Error(f"unexpected {shown} in {context}", tok.pos)

    def expect_right(self, context: str) -> None:
        tok = self.next_non_space()
        if tok.kind != "right":
            raise self.unexpected(tok, context)

    # -- structure
    def parse(self) -> list[Any]:
        nodes: list[Any] = []
        while self.peek().kind != "eof":
            node = self.text_or_action()
            if isinstance(node, (_End, _Else)):
                word = "end" if isinstance(node, _End) else "else"
                raise _Error(f"unexpected {{{{{word}}}}}", node.pos)
            nodes.append(node)
        return nodes

    def text_or_action(self) -> Any:
        tok = self.next_non_space()
        if tok.kind == "text":
            return _Text(tok.value)
        if tok.kind == "left":
            return self.action()
        raise self.unexpected(tok, "input")

    def action(self) -> Any:
        tok = self.next_non_space()
        if tok.kind == "keyword" and tok.value != "nil":
            if tok.value in ("if", "with", "range"):
                return self.control(tok.value, tok.pos)
            if tok.value == "else":
                if self.peek_non_space().kind == "keyword" and self.peek().value == "if":
                    return _Else(tok.pos, chained_if=True)
                self.expect_right("else")
                return _Else(tok.pos, chained_if=False)
            if tok.value == "end":
                self.expect_right("end")
                return _End(tok.pos)
            raise _Error(f"{{{{{tok.value}}}}} is not supported", tok.pos)
        self.i -= 1
        return _Action(self.pipeline("command", "right"), tok.pos)

    def nest(self, pos: int) -> None:
        """One level deeper; every level costs a few Python frames when the template runs."""
        self.depth += 1
        if self.depth > NESTING_LIMIT:
            raise _Error(f"template nests deeper than {NESTING_LIMIT} levels", pos)

    def control(self, kind: str, pos: int) -> _Control:
        self.nest(pos)  # an {{else if}} nests too: it is an {{if}} inside the {{else}}
        mark = len(self.vars)  # variables declared inside go out of scope at {{end}}
        pipe = self.pipeline(kind, "right")
        body, nxt = self.item_list()
        else_body: tuple[Any, ...] | None = None
        if isinstance(nxt, _Else):
            if nxt.chained_if:
                if kind != "if":
                    raise _Error(f"{{{{else if}}}} is not allowed in {{{{{kind}}}}}", nxt.pos)
                if_tok = self.next_non_space()
                else_body = (self.control("if", if_tok.pos),)  # shares our {{end}}
            else:
                else_body, nxt = self.item_list()
                if not isinstance(nxt, _End):
                    raise _Error("expected {{end}}; found {{else}}", nxt.pos)
        del self.vars[mark:]
        self.depth -= 1
        return _Control(kind, pipe, tuple(body), else_body, pos)

    def item_list(self) -> tuple[tuple[Any, ...], _End | _Else]:
        nodes: list[Any] = []
        while self.peek_non_space().kind != "eof":
            node = self.text_or_action()
            if isinstance(node, (_End, _Else)):
                return tuple(nodes), node
            nodes.append(node)
        raise _Error("unexpected EOF (missing {{end}})", self.end)

    # -- pipelines
    def pipeline(self, context: str, end: str) -> _Pipe:
        start = self.peek_non_space()
        decl, assign = self.declarations(context)
        cmds: list[_Cmd] = []
        while True:
            tok = self.next_non_space()
            if tok.kind == end:
                break
            if tok.kind not in _OPERAND_START:
                raise self.unexpected(tok, context)
            self.i -= 1
            cmds.append(self.command())
        if not cmds:
            raise _Error(f"missing value for {context}", start.pos)
        for stage, cmd in enumerate(cmds[1:], start=2):
            if isinstance(cmd.args[0], (_Lit, _DotNode)):
                raise _Error(f"non executable command in pipeline stage {stage}", cmd.pos)
        return _Pipe(decl, assign, tuple(cmds), start.pos)

    def declarations(self, context: str) -> tuple[tuple[str, ...], bool]:
        """`$x :=`, `$x =`, or in range `$k, $v :=`."""
        save = self.i
        var = self.next_non_space()
        if var.kind != "var":
            self.i = save
            return (), False
        after = self.peek_non_space()
        if after.kind in ("declare", "assign"):
            self.next()
            if after.kind == "assign" and var.value not in self.vars:
                raise _Error(f"undefined variable {var.value!r}", var.pos)
            if after.kind == "declare":
                self.vars.append(var.value)
            return (var.value,), after.kind == "assign"
        if after.kind == "comma":
            if context != "range":
                raise _Error(f"too many declarations in {context}", after.pos)
            self.next()
            second = self.next_non_space()
            if second.kind != "var" or self.next_non_space().kind != "declare":
                raise _Error("range can only initialize variables with $k, $v :=", second.pos)
            self.vars += [var.value, second.value]
            return (var.value, second.value), False
        self.i = save
        return (), False

    def command(self) -> _Cmd:
        pos = self.peek_non_space().pos
        args: list[Any] = []
        while True:
            self.skip_spaces()
            operand = self.operand()
            if operand is not None:
                args.append(operand)
            tok = self.next()
            if tok.kind == "space":
                continue
            if tok.kind in ("right", "rparen"):
                self.i -= 1
            elif tok.kind != "pipe":
                raise self.unexpected(tok, "operand")
            break
        if not args:
            raise _Error("empty command", pos)
        return _Cmd(tuple(args), pos)

    def operand(self) -> Any:
        node = self.term()
        if node is None or self.peek().kind != "field":
            return node
        names: list[str] = []
        while self.peek().kind == "field":
            names.append(self.next().value[1:])
        if isinstance(node, _FieldNode):
            return _FieldNode(node.names + tuple(names), node.pos)
        if isinstance(node, _VarNode):
            return _VarNode(node.name, tuple(names), node.pos)
        if isinstance(node, (_Lit, _DotNode)):
            raise _Error("unexpected . after term", node.pos)
        return _ChainNode(node, tuple(names), node.pos)

    def term(self) -> Any:
        tok = self.next_non_space()
        kind, text, pos = tok.kind, tok.value, tok.pos
        if kind == "ident":
            if text in _FUNCS:
                return _FuncNode(text, pos)
            if text in _UNSUPPORTED_FUNCS:
                raise _Error(f"function {text!r} is not supported: {_UNSUPPORTED_FUNCS[text]}", pos)
            raise _Error(f"function {text!r} not defined", pos)
        if kind == "dot":
            return _DotNode(pos)
        if kind == "keyword" and text == "nil":
            return _Lit("nil", None, "nil", pos)
        if kind == "var":
            if text not in self.vars:
                raise _Error(f"undefined variable {text!r}", pos)
            return _VarNode(text, (), pos)
        if kind == "field":
            return _FieldNode((text[1:],), pos)
        if kind == "bool":
            return _Lit("bool", text == "true", text, pos)
        if kind == "number":
            return _Lit("number", _number_value(text, pos), text, pos)
        if kind == "string":
            return _Lit("string", text, text, pos)
        if kind == "lparen":
            self.nest(pos)
            pipe = self.pipeline("parenthesized pipeline", "rparen")
            self.depth -= 1
            return pipe
        self.i -= 1
        return None


# --------------------------------------------------------------------------------------------
# Load-time checks: a light static typing of the AST, to refuse templates that could only
# fail when run (Prometheus would render "<error expanding template: ...>" instead).


def _lit_type(node: _Lit) -> str:
    if node.kind == "number":
        return _T_INT if isinstance(node.value, int) else _T_FLOAT
    return {"string": _T_STRING, "bool": _T_BOOL, "nil": _T_NIL}[node.kind]


_KIND_OF_TYPE = {_T_STRING: "string", _T_INT: "int", _T_FLOAT: "float", _T_BOOL: "bool"}


class _Checker:
    def __init__(self) -> None:
        root: list[tuple[str, str | None]] = [("$", _T_DATA), ("$labels", _T_LMAP)]
        root += [("$externalLabels", _T_LMAP), ("$externalURL", _T_STRING)]
        self.vars = [*root, ("$value", _T_FLOAT)]

    def check_list(self, nodes: Sequence[Any], dot: str | None) -> None:
        for node in nodes:
            if isinstance(node, _Action):
                self.pipe(node.pipe, dot)
            elif isinstance(node, _Control):
                self.control(node, dot)

    def control(self, node: _Control, dot: str | None) -> None:
        mark = len(self.vars)
        t = self.pipe(node.pipe, dot)
        body_dot = dot if node.kind == "if" else t
        if node.kind == "range":
            if t not in (_T_LMAP, _T_AMAP, None):
                raise _Error(f"range can't iterate over a value of type {t}", node.pos)
            body_dot = _T_STRING if t == _T_LMAP else None
            names = node.pipe.decl
            if names:  # the pipeline pushed them with the map's type
                del self.vars[len(self.vars) - len(names) :]
                types = [body_dot] if len(names) == 1 else [_T_STRING, body_dot]
                self.vars += list(zip(names, types, strict=True))
        self.check_list(node.body, body_dot)
        if node.else_body is not None:
            self.check_list(node.else_body, dot)
        del self.vars[mark:]

    def var_type(self, name: str) -> str | None:
        for n, t in reversed(self.vars):
            if n == name:
                return t
        return None

    def pipe(self, pipe: _Pipe, dot: str | None) -> str | None:
        t: Any = _MISSING
        for cmd in pipe.cmds:
            t = self.command(cmd, dot, t)
        for name in pipe.decl:
            if pipe.assign:
                self.assign(name, t)
            else:
                self.vars.append((name, t))
        return t

    def assign(self, name: str, t: str | None) -> None:
        for k in range(len(self.vars) - 1, -1, -1):
            if self.vars[k][0] == name:  # a new type makes it unknown: branches may differ
                self.vars[k] = (name, t if self.vars[k][1] == t else None)
                return

    def command(self, cmd: _Cmd, dot: str | None, final: Any) -> str | None:
        first, args = cmd.args[0], cmd.args[1:]
        if isinstance(first, _FuncNode):
            return self.call(first, args, final, dot)
        if args or final is not _MISSING:
            raise _Error("can't give argument to non-function", first.pos)
        if isinstance(first, _Lit) and first.kind == "nil":
            raise _Error("nil is not a command", first.pos)
        return self.operand(first, dot)

    def operand(self, node: Any, dot: str | None) -> str | None:
        if isinstance(node, _Lit):
            return _lit_type(node)
        if isinstance(node, _DotNode):
            return dot
        if isinstance(node, _FieldNode):
            return self.fields(dot, node.names, node.pos)
        if isinstance(node, _VarNode):
            return self.fields(self.var_type(node.name), node.names, node.pos)
        if isinstance(node, _ChainNode):
            return self.fields(self.operand(node.node, dot), node.names, node.pos)
        if isinstance(node, _Pipe):
            return self.pipe(node, dot)
        return self.call(node, (), _MISSING, dot)  # a function used as an argument

    @staticmethod
    def fields(t: str | None, names: Sequence[str], pos: int) -> str | None:
        for name in names:
            if t is None:
                return None
            if t == _T_DATA:
                if name not in _DATA_FIELDS:
                    raise _Error(f"can't evaluate field {name} in the template data", pos)
                t = _DATA_FIELDS[name][1]
            elif t == _T_LMAP:
                t = _T_STRING
            elif t == _T_AMAP:
                t = None
            elif t == _T_TIME:
                raise _Error("methods of toTime's result are not supported", pos)
            else:
                raise _Error(f"can't evaluate field {name} in type {t}", pos)
        return t

    def call(self, fn: _FuncNode, args: Sequence[Any], final: Any, dot: str | None) -> str | None:
        spec = _FUNCS[fn.name]
        count = len(args) + (final is not _MISSING)
        fixed = len(spec.params)
        if (spec.variadic is None and count != fixed) or count < fixed:
            want = f"at least {fixed}" if spec.variadic else str(fixed)
            raise _Error(f"wrong number of args for {fn.name}: want {want} got {count}", fn.pos)
        types = [self.operand(a, dot) for a in args]
        if final is not _MISSING:
            types.append(final)
        nodes: list[Any] = [*args, None]
        for k, t in enumerate(types):
            kind = spec.params[k] if k < fixed else spec.variadic
            self.check_arg(fn, kind, nodes[k], t)
        self.check_special(fn, nodes[: len(args)], types)
        if fn.name in ("and", "or"):
            return types[0] if len(set(types)) == 1 else None
        if fn.name == "index":
            return _T_STRING if types[0] == _T_LMAP and len(types) == 2 else None
        return spec.result

    @staticmethod
    def check_arg(fn: _FuncNode, kind: str | None, node: Any, t: str | None) -> None:
        if isinstance(node, _Lit) and node.kind == "nil" and kind in ("string", "value"):
            raise _Error(f"{fn.name}: cannot use nil here", node.pos)
        if kind != "string":
            return
        if isinstance(node, _Lit) and node.kind != "string":
            raise _Error(f"{fn.name}: expected string; found {node.text}", node.pos)
        if t is not None and t != _T_STRING:
            raise _Error(f"{fn.name}: wrong type for value; expected string; got {t}", fn.pos)

    def check_special(
        self, fn: _FuncNode, args: Sequence[Any], types: Sequence[str | None]
    ) -> None:
        """Function-specific load-time checks (literal arguments, comparable types)."""
        name, pos = fn.name, fn.pos
        literal = [a.value if isinstance(a, _Lit) and a.kind == "string" else None for a in args]
        try:
            if name in _COMPARISONS:
                self.check_comparison(name, args, types)
            elif name in _TO_FLOAT_FUNCS:
                if types[0] in (_T_BOOL, _T_LMAP, _T_AMAP, _T_DATA, _T_TIME, _T_NIL):
                    raise _Error(f"can't convert {types[0]} to float")
                if literal and literal[0] is not None:
                    _go_parse_float(literal[0])
            elif name in ("match", "reReplaceAll") and literal and literal[0] is not None:
                _go_regexp(literal[0])
            elif name == "parseDuration" and literal and literal[0] is not None:
                _parse_duration(literal[0])
            elif name == "printf" and literal and literal[0] is not None:
                _validate_format(literal[0], types[1:])
            elif name == "len" and types[0] not in (_T_STRING, _T_LMAP, _T_AMAP, None):
                raise _Error(f"len of type {types[0]}")
            elif name == "index":
                if types[0] not in (_T_LMAP, _T_AMAP, None):
                    raise _Error(f"index of type {types[0]} is not supported")
                if any(t not in (_T_STRING, None) for t in types[1:]):
                    raise _Error("map keys are strings")
        except _Error as exc:
            raise _Error(f"{name}: {exc.msg}", pos) from None

    @staticmethod
    def check_comparison(name: str, args: Sequence[Any], types: Sequence[str | None]) -> None:
        if name == "eq" and len(types) < 2:
            raise _Error("missing argument for comparison")
        first = types[0]
        for other in types[1:]:
            if first is None or other is None:
                continue
            k1, k2 = _KIND_OF_TYPE.get(first), _KIND_OF_TYPE.get(other)
            if k1 is None or k2 is None or (name not in ("eq", "ne") and "bool" in (k1, k2)):
                raise _Error(f"invalid type for comparison ({first}, {other})")
            if k1 != k2:
                hint = ""
                if {k1, k2} == {"int", "float"}:
                    ints = [a.text for a in args if isinstance(a, _Lit) and _lit_type(a) == _T_INT]
                    fix = f"write {ints[0]} as {ints[0]}.0" if ints else "convert neither"
                    hint = f" (Go does not convert int to float64: {fix})"
                raise _Error(f"incompatible types for comparison: {first} and {other}{hint}")


# --------------------------------------------------------------------------------------------
# Evaluator (text/template/exec.go).


@dataclass
class _Exec:
    data: _Data
    vars: list[tuple[str, Any]] = field(default_factory=list)
    out: _Builder = field(default_factory=lambda: _Builder(OUTPUT_LIMIT, "template output"))
    budget: _Budget = field(default_factory=_Budget)

    def run(self, nodes: Sequence[Any]) -> str:
        d = self.data
        self.vars = [("$", d), ("$labels", d.labels), ("$externalLabels", d.external_labels)]
        self.vars += [("$externalURL", d.external_url), ("$value", d.value)]
        self.walk_list(nodes, d)
        return self.out.text()

    def walk_list(self, nodes: Sequence[Any], dot: Any) -> None:
        for node in nodes:
            self.budget.step()
            if isinstance(node, _Text):
                self.out.add(node.text)
            elif isinstance(node, _Action):
                value = self.pipe(node.pipe, dot)
                if not node.pipe.decl:
                    self.out.add(_print_value(value))
            elif node.kind == "range":
                self.range(node, dot)
            else:
                self.if_or_with(node, dot)

    def if_or_with(self, node: _Control, dot: Any) -> None:
        mark = len(self.vars)
        value = self.pipe(node.pipe, dot)
        if _truth(value):
            self.walk_list(node.body, dot if node.kind == "if" else value)
        elif node.else_body is not None:
            self.walk_list(node.else_body, dot)
        del self.vars[mark:]

    def range(self, node: _Control, dot: Any) -> None:
        mark = len(self.vars)
        value = self.pipe(node.pipe, dot)
        if isinstance(value, dict) and value:
            names = node.pipe.decl
            inner = len(self.vars)
            for key in sorted(value):
                self.budget.step()
                elem = value[key]
                if names:
                    self.vars[-1] = (names[-1], elem)
                if len(names) > 1:
                    self.vars[-2] = (names[0], key)
                self.walk_list(node.body, elem)
                del self.vars[inner:]
        elif not isinstance(value, dict) and value is not _NO_VALUE:
            raise _Error(f"range can't iterate over {_print_value(value)}", node.pos)
        elif node.else_body is not None:
            self.walk_list(node.else_body, dot)
        del self.vars[mark:]

    def pipe(self, pipe: _Pipe, dot: Any) -> Any:
        value: Any = _MISSING
        for cmd in pipe.cmds:
            value = self.command(cmd, dot, value)
            if value is None:  # Go digs a nil interface{} down to an invalid value
                value = _NO_VALUE
        for name in pipe.decl:
            if pipe.assign:
                self.set_var(name, value)
            else:
                self.vars.append((name, value))
        return value

    def command(self, cmd: _Cmd, dot: Any, final: Any) -> Any:
        self.budget.step()
        first, args = cmd.args[0], cmd.args[1:]
        if isinstance(first, _FuncNode):
            return self.call(first, args, final, dot)
        if args or final is not _MISSING:
            raise _Error("can't give argument to non-function", first.pos)
        if isinstance(first, _Lit) and first.kind == "nil":
            raise _Error("nil is not a command", first.pos)
        return self.operand(first, dot)

    def operand(self, node: Any, dot: Any) -> Any:
        """An operand's raw value (_NO_VALUE and nil included)."""
        if isinstance(node, _Lit):
            return node.value
        if isinstance(node, _DotNode):
            return dot
        if isinstance(node, _FieldNode):
            return self.fields(dot, node.names, node.pos)
        if isinstance(node, _VarNode):
            return self.fields(self.var(node.name, node.pos), node.names, node.pos)
        if isinstance(node, _ChainNode):
            return self.fields(self.operand(node.node, dot), node.names, node.pos)
        if isinstance(node, _Pipe):
            return self.pipe(node, dot)
        return self.call(node, (), _MISSING, dot)

    def var(self, name: str, pos: int) -> Any:
        for n, v in reversed(self.vars):
            if n == name:
                return v
        raise _Error(f"undefined variable: {name}", pos)

    def set_var(self, name: str, value: Any) -> None:
        for k in range(len(self.vars) - 1, -1, -1):
            if self.vars[k][0] == name:
                self.vars[k] = (name, value)
                return
        raise _Error(f"undefined variable: {name}")

    @staticmethod
    def fields(receiver: Any, names: Sequence[str], pos: int) -> Any:
        for name in names:
            if receiver is _NO_VALUE:  # Go yields no value, silently
                return _NO_VALUE
            if receiver is None:
                raise _Error(f"nil pointer evaluating interface {{}}.{name}", pos)
            if isinstance(receiver, _Data) and name in _DATA_FIELDS:
                receiver = getattr(receiver, _DATA_FIELDS[name][0])
            elif isinstance(receiver, _ArgsMap):
                receiver = receiver.get(name)
            elif isinstance(receiver, dict):
                receiver = receiver.get(name, "")  # missingkey=zero
            else:
                raise _Error(f"can't evaluate field {name} in type {_type_name(receiver)}", pos)
        return receiver

    def arg(self, node: Any, dot: Any, kind: str) -> Any:
        """Evaluate an argument for a parameter of the given kind (evalArg)."""
        if isinstance(node, _Lit):
            if node.kind == "nil" and kind != "any":
                raise _Error(f"cannot assign nil to {kind}", node.pos)
            if kind == "string" and node.kind != "string":
                raise _Error(f"expected string; found {node.text}", node.pos)
            return node.value
        return self.convert(self.operand(node, dot), kind, node.pos)

    @staticmethod
    def convert(value: Any, kind: str, pos: int | None) -> Any:
        if kind == "string":
            if value is _NO_VALUE:
                raise _Error("invalid value; expected string", pos)
            if not isinstance(value, str):
                got = "interface {}" if value is None else _type_name(value)
                raise _Error(f"wrong type for value; expected string; got {got}", pos)
            return value
        if kind == "value" and value is _NO_VALUE:
            raise _Error("invalid value; expected reflect.Value", pos)
        return None if value is _NO_VALUE else value

    def call(self, fn: _FuncNode, args: Sequence[Any], final: Any, dot: Any) -> Any:
        spec = _FUNCS[fn.name]
        count = len(args) + (final is not _MISSING)
        fixed = len(spec.params)
        if (spec.variadic is None and count != fixed) or count < fixed:
            raise _Error(f"wrong number of args for {fn.name}: got {count}", fn.pos)
        kinds = [*spec.params, *[spec.variadic or "any"] * (count - fixed)]
        if fn.name in ("and", "or"):
            return self.short_circuit(fn, args, final, dot)
        values = [self.arg(node, dot, kind) for node, kind in zip(args, kinds, strict=False)]
        if final is not _MISSING:
            values.append(self.convert(final, kinds[-1], fn.pos))
        if fn.name in ("match", "reReplaceAll"):
            values.insert(0, self.budget)
        impl = {"externalURL": self.external_url, "pathPrefix": self.path_prefix}.get(
            fn.name, spec.impl
        )
        try:
            result = impl(*values)
            if isinstance(result, str):
                if len(result) > OUTPUT_LIMIT:  # html, toUpper...: a few times their input
                    raise _Error(f"its result exceeds {OUTPUT_LIMIT} characters")
                self.budget.work(len(result))
        except _Error as exc:
            raise _Error(f"error calling {fn.name}: {exc.msg}", fn.pos) from None
        return result

    def short_circuit(self, fn: _FuncNode, args: Sequence[Any], final: Any, dot: Any) -> Any:
        """Go 1.18+ `and`/`or`: stop at the deciding operand and return it."""
        result: Any = None
        for node in args:
            result = self.arg(node, dot, "value")
            if _truth(result) == (fn.name == "or"):
                return result
        if final is not _MISSING:
            result = self.convert(final, "value", fn.pos)
        return result

    def external_url(self) -> str:
        return self.data.external_url

    def path_prefix(self) -> str:
        return urllib.parse.unquote(urllib.parse.urlsplit(self.data.external_url).path)
