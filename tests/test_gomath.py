"""Go's trigonometry and logarithms (gpu_exporter/alerting/rules/gomath.py) against promtool
2.42's own: the daemon's answers are written as expected values and promtool, comparing
exactly, must agree with every one."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gpu_exporter.alerting.rules import gomath
from tests.support import promtool

FUNCTIONS: dict[str, Callable[[float], float]] = {
    "sin": gomath.sin,
    "cos": gomath.cos,
    "tan": gomath.tan,
    "asin": gomath.asin,
    "acos": gomath.acos,
    "atan": gomath.atan,
    "ln": gomath.log,
    "log2": gomath.log2,
    "log10": gomath.log10,
}
LIBM: dict[str, Callable[[float], float]] = {
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "atan": math.atan,
    "ln": lambda x: math.log(x) if x > 0 else gomath.log(x),  # libm raises where Go has NaN
}  # fmt: skip


def _inputs() -> list[float]:
    rng = random.Random(2042)
    values = [0.1 * i for i in range(-60, 61)]
    values += [rng.uniform(-1, 1) for _ in range(120)]
    values += [rng.uniform(-60, 60) for _ in range(120)]
    values += [rng.uniform(1e3, 5e8) for _ in range(60)]
    values += [0.66, 0.7, 2.414, 1e-9, -1e-9, 1.0, -1.0, 2.0, 1024.0, 0.5]
    return values


def _test_file(path: Path, values: list[float]) -> None:
    series = [{"series": f'v{{i="{i}"}}', "values": repr(v)} for i, v in enumerate(values)]
    cases = []
    for name, function in FUNCTIONS.items():
        samples = [
            {"labels": f'{{i="{i}"}}', "value": function(v)}
            for i, v in enumerate(values)
            if not math.isnan(function(v)) and not math.isinf(function(v))
        ]
        # Inputs with no finite answer (asin(2), ln(-1)) are filtered out of the query too.
        expr = f"{name}(v) < +Inf > -Inf"
        cases.append({"expr": expr, "eval_time": "0s", "exp_samples": samples})
    spec = {"tests": [{"interval": "1m", "input_series": series, "promql_expr_test": cases}]}
    path.write_text(yaml.safe_dump(spec))


def test_every_value_is_the_one_prometheus_computes(tmp_path: Path) -> None:
    path = tmp_path / "gomath.test.yaml"
    _test_file(path, _inputs())
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout[-3000:]


def test_the_check_would_see_a_last_bit_difference(tmp_path: Path) -> None:
    # libm's answers differ from Go's for some of these inputs, so the test above has teeth.
    values = _inputs()
    assert all(any(LIBM[n](v) != FUNCTIONS[n](v) for v in values) for n in LIBM)
    path = tmp_path / "libm.test.yaml"
    saved = dict(FUNCTIONS)
    try:
        FUNCTIONS.update(LIBM)
        _test_file(path, values)
    finally:
        FUNCTIONS.update(saved)
    assert promtool("test", "rules", str(path)).returncode != 0


@pytest.mark.parametrize(
    ("name", "x", "expected"),
    [
        ("sin", -0.0, -0.0), ("sin", math.inf, math.nan), ("cos", math.nan, math.nan),
        ("tan", 0.0, 0.0), ("asin", 1.5, math.nan), ("acos", 1.0, 0.0),
        ("ln", 0.0, -math.inf), ("ln", -1.0, math.nan), ("ln", math.inf, math.inf),
        ("log2", 8.0, 3.0), ("log10", 0.0, -math.inf), ("atan", math.inf, math.pi / 2),
    ],
)  # fmt: skip
def test_special_cases_as_go(name: str, x: float, expected: float) -> None:
    got = FUNCTIONS[name](x)
    assert got == expected or (math.isnan(got) and math.isnan(expected))
    assert math.copysign(1, got) == math.copysign(1, expected) or math.isnan(expected)
