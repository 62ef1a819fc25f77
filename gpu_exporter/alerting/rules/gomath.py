"""Go's own trigonometry (math/sin.go, tan.go, asin.go, atan.go), which PromQL's sin, cos,
tan, asin, acos and atan call.

Go computes these with Cephes' polynomials in pure Go on amd64, not with the C library, so
libm's (correctly rounded) answers differ from Prometheus' in the last bit for many inputs.
The algorithms and coefficients below are those published with Cephes (S. L. Moshier) that Go
uses; each result was compared with promtool 2.42's on hundreds of inputs
(tests/test_gomath.py). Arguments of 2**29 and more, for which Go reduces with a Payne-Hanek
table, are left to libm (Go's and libm's reductions both are exact there; the polynomials
can still differ in the last bit).
"""

from __future__ import annotations

import math

__all__ = ["acos", "asin", "atan", "cos", "sin", "tan"]

# Cephes sin.c / tan.c coefficients.
_SIN = (
    1.58962301576546568060e-10,
    -2.50507477628578072866e-8,
    2.75573136213857245213e-6,
    -1.98412698295895385996e-4,
    8.33333333332211858878e-3,
    -1.66666666666666307295e-1,
)
_COS = (
    -1.13585365213876817300e-11,
    2.08757008419747316778e-9,
    -2.75573141792967388112e-7,
    2.48015872888517045348e-5,
    -1.38888888888730564116e-3,
    4.16666666666665929218e-2,
)
_TAN_P = (-1.30936939181383777646e4, 1.15351664838587416140e6, -1.79565251976484877988e7)
_TAN_Q = (
    1.36812963470692954678e4,
    -1.32089234440210967447e6,
    2.50083801823357915839e7,
    -5.38695755929454629881e7,
)
# Pi/4 in three parts, for extended-precision reduction.
_PI4A = 7.85398125648498535156e-1
_PI4B = 3.77489470793079817668e-8
_PI4C = 2.69515142907905952645e-15
# Go's 4/Pi is computed exactly and rounded once; 4 / math.pi would round twice.
_FOUR_OVER_PI = 1.2732395447351626861510701069801148962756771659236515899813387524711743810738
_REDUCE_THRESHOLD = float(1 << 29)


def _octant(x: float) -> tuple[int, float]:
    """(octant, reduced argument) of x >= 0: zeros mapped to the origin."""
    j = int(x * _FOUR_OVER_PI)
    y = float(j)
    if j & 1:
        j += 1
        y += 1
    z = ((x - y * _PI4A) - y * _PI4B) - y * _PI4C
    return j, z


def _sin_poly(z: float, zz: float) -> float:
    s = _SIN
    return z + z * zz * ((((((s[0] * zz) + s[1]) * zz + s[2]) * zz + s[3]) * zz + s[4]) * zz + s[5])


def _cos_poly(zz: float) -> float:
    c = _COS
    return (
        1.0
        - 0.5 * zz
        + zz * zz * ((((((c[0] * zz) + c[1]) * zz + c[2]) * zz + c[3]) * zz + c[4]) * zz + c[5])
    )


def sin(x: float) -> float:
    if x == 0 or math.isnan(x):
        return x
    if math.isinf(x):
        return math.nan
    negative = x < 0
    x = abs(x)
    if x >= _REDUCE_THRESHOLD:
        return math.sin(-x if negative else x)
    j, z = _octant(x)
    j &= 7
    if j > 3:
        negative = not negative
        j -= 4
    zz = z * z
    y = _cos_poly(zz) if j in (1, 2) else _sin_poly(z, zz)
    return -y if negative else y


def cos(x: float) -> float:
    if math.isnan(x) or math.isinf(x):
        return math.nan
    x = abs(x)
    if x >= _REDUCE_THRESHOLD:
        return math.cos(x)
    j, z = _octant(x)
    j &= 7
    negative = False
    if j > 3:
        j -= 4
        negative = not negative
    if j > 1:
        negative = not negative
    zz = z * z
    y = _sin_poly(z, zz) if j in (1, 2) else _cos_poly(zz)
    return -y if negative else y


def tan(x: float) -> float:
    if x == 0 or math.isnan(x):
        return x
    if math.isinf(x):
        return math.nan
    negative = x < 0
    x = abs(x)
    if x >= _REDUCE_THRESHOLD:
        return math.tan(-x if negative else x)
    j, z = _octant(x)
    zz = z * z
    if zz > 1e-14:
        p, q = _TAN_P, _TAN_Q
        y = z + z * (
            zz
            * (((p[0] * zz) + p[1]) * zz + p[2])
            / ((((zz + q[0]) * zz + q[1]) * zz + q[2]) * zz + q[3])
        )
    else:
        y = z
    if j & 2:
        y = -1 / y
    return -y if negative else y


# Cephes atan.c, as Go's atan.go.
_ATAN_P = (
    -8.750608600031904122785e-01,
    -1.615753718733365076637e01,
    -7.500855792314704667340e01,
    -1.228866684490136173410e02,
    -6.485021904942025371773e01,
)
_ATAN_Q = (
    2.485846490142306297962e01,
    1.650270098316988542046e02,
    4.328810604912902668951e02,
    4.853903996359136964868e02,
    1.945506571482613964425e02,
)
_MORE_BITS = 6.123233995736765886130e-17  # pi/2 = PIO2 + _MORE_BITS
_TAN_3PI_8 = 2.41421356237309504880


def _xatan(x: float) -> float:
    p, q = _ATAN_P, _ATAN_Q
    z = x * x
    z = (
        z
        * ((((p[0] * z + p[1]) * z + p[2]) * z + p[3]) * z + p[4])
        / (((((z + q[0]) * z + q[1]) * z + q[2]) * z + q[3]) * z + q[4])
    )
    return x * z + x


def _satan(x: float) -> float:
    """atan of x >= 0, reduced to [0, 0.66]."""
    if x <= 0.66:
        return _xatan(x)
    if x > _TAN_3PI_8:
        return math.pi / 2 - _xatan(1 / x) + _MORE_BITS
    return math.pi / 4 + _xatan((x - 1) / (x + 1)) + 0.5 * _MORE_BITS


def atan(x: float) -> float:
    if x == 0 or math.isnan(x):
        return x
    return _satan(x) if x > 0 else -_satan(-x)


def asin(x: float) -> float:
    if x == 0 or math.isnan(x):
        return x
    negative = x < 0
    x = abs(x)
    if x > 1:
        return math.nan
    root = math.sqrt(1 - x * x)
    result = math.pi / 2 - _satan(root / x) if x > 0.7 else _satan(x / root)
    return -result if negative else result


def acos(x: float) -> float:
    return math.pi / 2 - asin(x)


# FreeBSD's e_log.c, as Go's log.go (its amd64 assembly computes the same); Log2 and Log10
# are Go's: Log of the mantissa (or of x) times the exactly rounded 1/Ln2 (1/Ln10).
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LG = (
    6.666666666666735130e-01,
    3.999999999940941908e-01,
    2.857142874366239149e-01,
    2.222219843214978396e-01,
    1.818357216161805012e-01,
    1.531383769920937332e-01,
    1.479819860511658591e-01,
)
_INV_LN2 = 1.4426950408889634073599246810018921374266459541529859341354494069
_INV_LN10 = 0.43429448190325182765112891891660508229439700580366656611445378316586
_HALF_SQRT2 = math.sqrt(2) / 2


def log(x: float) -> float:
    if math.isnan(x) or x == math.inf:
        return x
    if x < 0:
        return math.nan
    if x == 0:
        return -math.inf
    fraction, exponent = math.frexp(x)
    if fraction < _HALF_SQRT2:
        fraction *= 2
        exponent -= 1
    f = fraction - 1
    k = float(exponent)
    s = f / (2 + f)
    s2 = s * s
    s4 = s2 * s2
    lg = _LG
    t1 = s2 * (lg[0] + s4 * (lg[2] + s4 * (lg[4] + s4 * lg[6])))
    t2 = s4 * (lg[1] + s4 * (lg[3] + s4 * lg[5]))
    r = t1 + t2
    hfsq = 0.5 * f * f
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + k * _LN2_LO)) - f)


def log2(x: float) -> float:
    fraction, exponent = math.frexp(x)
    if fraction == 0.5:  # exact powers of two are exact
        return float(exponent - 1)
    return log(fraction) * _INV_LN2 + exponent


def log10(x: float) -> float:
    return log(x) * _INV_LN10
