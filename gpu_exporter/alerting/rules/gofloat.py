"""Go's float64 semantics where PromQL's results depend on them and Python's differ.

Prometheus is written in Go: its division by zero, `%`, `^`, min/max and the text of numbers
(`strconv.ParseFloat` for `le` labels, `strconv.FormatFloat` for `count_values`, `%v` in
error messages) follow Go's math and strconv packages, whose special cases are not Python's.
Each function names the Go function it follows.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "format_float",
    "format_g",
    "go_div",
    "go_max",
    "go_min",
    "go_mod",
    "go_pow",
    "parse_float",
]


def go_div(a: float, b: float) -> float:
    """a / b as Go divides floats: ±Inf or NaN for a zero divisor, never an exception."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def go_mod(a: float, b: float) -> float:
    """math.Mod: NaN for x = ±Inf, y = 0 or a NaN operand; x for y = ±Inf."""
    if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan
    return math.fmod(a, b)


def _is_odd_int(x: float) -> bool:
    if abs(x) >= 1 << 53 or math.isinf(x) or math.isnan(x):
        return False
    return x == int(x) and int(x) % 2 == 1


def go_pow(x: float, y: float) -> float:
    """math.Pow: its special cases, then x**yf * x**yi by repeated squaring."""
    special = _pow_special(x, y)
    if special is not None:
        return special
    yf, yi = math.modf(abs(y))
    if yf != 0 and x < 0:
        return math.nan
    if yi >= 1 << 63:  # overflows or underflows for every x but -1 (1 was handled)
        if x == -1:
            return 1.0
        return 0.0 if (abs(x) < 1) == (y > 0) else math.inf
    a1, ae = 1.0, 0
    if yf != 0:
        if yf > 0.5:
            yf -= 1
            yi += 1
        a1 = math.exp(yf * math.log(x))  # libm here, Go's own Exp/Log there: may differ by 1ulp
    x1, xe = math.frexp(x)
    i = int(yi)
    while i != 0:
        if not -(1 << 12) <= xe <= 1 << 12:
            ae += xe  # catastrophic over/underflow: leave it to ldexp
            break
        if i & 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    if y < 0:
        a1 = 1 / a1
        ae = -ae
    try:
        return math.ldexp(a1, ae)
    except OverflowError:
        return math.copysign(math.inf, a1)


def _pow_special(x: float, y: float) -> float | None:
    if y == 0 or x == 1:
        return 1.0
    if y == 1:
        return x
    if math.isnan(x) or math.isnan(y):
        return math.nan
    if x == 0:
        odd_negative_zero = math.copysign(1.0, x) < 0 and _is_odd_int(y)
        if y < 0:
            return -math.inf if odd_negative_zero else math.inf
        return x if odd_negative_zero else 0.0
    if math.isinf(y):
        if x == -1:
            return 1.0
        return 0.0 if (abs(x) < 1) == (y > 0) else math.inf
    if math.isinf(x):
        if x < 0:
            return go_pow(-0.0, -y)
        return 0.0 if y < 0 else math.inf
    if y == 0.5:
        return math.sqrt(x) if x >= 0 else math.nan
    if y == -0.5:
        return 1 / math.sqrt(x) if x >= 0 else math.nan
    return None


def go_max(a: float, b: float) -> float:
    """math.Max: +Inf wins over NaN, NaN over every other number, +0 over -0."""
    if (math.isinf(a) and a > 0) or (math.isinf(b) and b > 0):
        return math.inf
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == 0 and b == 0:
        return b if math.copysign(1.0, a) < 0 else a
    return a if a > b else b


def go_min(a: float, b: float) -> float:
    """math.Min: -Inf wins over NaN, NaN over every other number, -0 over +0."""
    if (math.isinf(a) and a < 0) or (math.isinf(b) and b < 0):
        return -math.inf
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == 0 and b == 0:
        return a if math.copysign(1.0, a) < 0 else b
    return a if a < b else b


# strconv.ParseFloat's syntax: decimal (no underscores without a base prefix), hexadecimal
# with a mandatory p exponent (underscores allowed between digits), inf/infinity with an
# optional sign and nan without one, case-insensitive.
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_HEX = re.compile(r"[+-]?0[xX](?:_?[0-9a-fA-F])*(?:\.(?:[0-9a-fA-F]_?)*)?[pP][+-]?\d+")
_SPECIAL = {"inf": math.inf, "infinity": math.inf, "nan": math.nan}


def parse_float(text: str) -> float | None:
    """strconv.ParseFloat(text, 64), None where it returns an error (bad syntax, or a finite
    number too large for a float64: Go returns ±Inf with ErrRange)."""
    lowered = text.lower()
    unsigned = lowered.lstrip("+-") if lowered[:1] in "+-" and len(lowered) > 1 else lowered
    if unsigned in _SPECIAL and (unsigned != "nan" or unsigned == lowered):
        value = _SPECIAL[unsigned]
        return -value if lowered.startswith("-") else value
    if _DECIMAL.fullmatch(text):
        value = float(text)
    elif _HEX.fullmatch(text) and "__" not in text:
        value = float.fromhex(text.replace("_", ""))
    else:
        return None
    return None if math.isinf(value) else value


def format_float(value: float) -> str:
    """strconv.FormatFloat(value, 'f', -1, 64): the shortest digits that read back exactly,
    never in exponent form; NaN, +Inf and -Inf as Go writes them."""
    if not math.isfinite(value):
        return _non_finite(value)
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    digits, point = _shortest_digits(abs(value))
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def format_g(value: float) -> str:
    """fmt's %v of a float64, strconv.FormatFloat(value, 'g', -1, 64): the shortest digits,
    in exponent form when the exponent is below -4 or at least 6 (1e+06, 1.5e-05)."""
    if not math.isfinite(value):
        return _non_finite(value)
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    digits, point = _shortest_digits(abs(value))
    exponent = point - 1
    if value != 0 and (exponent < -4 or exponent >= 6):
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    return format_float(value)


def _non_finite(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def _shortest_digits(value: float) -> tuple[str, int]:
    """(digits, decimal point position) of the shortest round-tripping form of value >= 0:
    value = 0.DIGITS x 10**point. repr() finds the same digits Go's shortest mode does."""
    if value == 0:
        return "0", 1
    text = repr(value)
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text) if exp_text else 0
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    point = len(whole) + exponent - (len(whole + fraction) - len((whole + fraction).lstrip("0")))
    digits = digits.rstrip("0") or "0"
    return digits, point
