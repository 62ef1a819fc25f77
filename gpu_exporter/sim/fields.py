"""The value types of a scenario file, in the words its errors have always used.

Every scalar of a scenario is checked by a validator made here (pydantic would say "Input
should be a valid number"); each raises `PydanticCustomError` with the exact sentence, so
`support.validation` prints it as `file:line: field: message`.

`nested` and `each` validate one part of the file with a model and a context of its own (a
device's index, a MIG instance's position: pydantic tells a validator neither), its errors
worded and placed where they are in the file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainValidator, ValidationError
from pydantic import ValidationInfo as Info
from pydantic_core import PydanticCustomError

from gpu_exporter.sim.limits import SECONDS, Limit
from gpu_exporter.support.validation import Wording, explain, kind_of
from gpu_exporter.support.yamlfile import Path_

__all__ = [
    "WORDING",
    "DeviceIndex",
    "Flag",
    "Info",
    "Integer",
    "NonNegative",
    "Number",
    "OrNone",
    "Seconds",
    "Strict",
    "Text",
    "Until",
    "choice",
    "context_of",
    "each",
    "error",
    "error_at",
    "errors",
    "flag",
    "int_in",
    "integer",
    "key_in",
    "nested",
    "nonempty",
    "number",
    "number_in",
    "one_of",
    "reworded",
    "settle",
    "string",
]

M = TypeVar("M", bound=BaseModel)

# How scenario files word pydantic's structural errors.
WORDING = Wording(
    unknown_key="unknown key {key!r} (known: {known})",
    missing_key="missing required key {key!r}",
)


class Strict(BaseModel):
    """A mapping of a scenario file: unknown keys are errors; frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def settle(model: BaseModel, **values: Any) -> None:
    """Fill in, from the model's own validator, what the file leaves to be derived (a default
    that depends on other keys) and what it cannot write (a device's index). The latter are
    not fields, so no file can set them and "known:" does not list them; like a
    functools.cached_property they live beside the fields (pydantic compares, prints and
    dumps fields only). Frozen to everyone else."""
    model.__dict__.update(values)


def context_of(info: Info) -> dict[str, Any]:
    """The validation context (the loader always passes one)."""
    if info.context is None:
        raise RuntimeError("a scenario is validated with a context (sim.scenario.load_scenario)")
    context: dict[str, Any] = info.context
    return context


# ---------------------------------------------------------------------------------------------
# Errors


def error(message: str) -> PydanticCustomError:
    """A problem with the value being validated."""
    return PydanticCustomError("scenario", message)


def until_after_from(until: float | None, info: Info) -> float | None:
    """A field validator of `until`: an entry that ends must end after it starts (`from`)."""
    start = info.data.get("start")
    if until is not None and start is not None and until <= start:
        raise error("`until` must be after `from`")
    return until


def error_at(loc: Path_, message: str, value: Any = None) -> ValidationError:
    """A problem at `loc` below the value being validated (a sibling key, a list item)."""
    return errors([(loc, message, value)])


def errors(problems: Iterable[tuple[Path_, str, Any]]) -> ValidationError:
    """Problems, each (where below the value being validated, message, the value)."""
    return ValidationError.from_exception_data(
        "scenario",
        [{"type": error(message), "loc": loc, "input": value} for loc, message, value in problems],
    )


def reworded(
    exc: ValidationError, data: Any, model: type[BaseModel], at: Path_ = ()
) -> list[tuple[Path_, str, Any]]:
    """`exc`'s problems worded for `model` (which `data` was validated as), each at its path
    in `data`, below `at`: the words need the model, which the outer validators do not know."""
    out: list[tuple[Path_, str, Any]] = []
    for err in exc.errors(include_url=False):
        path, message = explain(err, data, model, WORDING)
        problem = ((*at, *path), message, err.get("input"))
        if problem[:2] not in [p[:2] for p in out]:
            out.append(problem)
    return out


def nested(model: type[M], data: Any, context: Mapping[str, Any]) -> M:
    """`data` validated as `model` with `context`; raised from a validator, the problems
    land below the value it validates."""
    try:
        return model.model_validate(data, context=dict(context))
    except ValidationError as exc:
        raise errors(reworded(exc, data, model)) from None


def each(
    model: type[M],
    data: Any,
    context: Mapping[str, Any],
    position: Callable[[int], Mapping[str, Any]],
) -> tuple[M, ...]:
    """A list of `model`s, the i-th validated with `context` and `position(i)` (every item is
    checked, so each problem is reported)."""
    if not isinstance(data, list):
        raise error(f"expected a list, got {kind_of(data)}")
    items: list[M] = []
    problems: list[tuple[Path_, str, Any]] = []
    for i, item in enumerate(data):
        try:
            items.append(model.model_validate(item, context={**context, **position(i)}))
        except ValidationError as exc:
            problems += reworded(exc, item, model, (i,))
    if problems:
        raise errors(problems)
    return tuple(items)


# ---------------------------------------------------------------------------------------------
# Scalars

# PyYAML (YAML 1.1) reads `1.0e9` as a string; YAML 1.2 reads a number.
_YAML12_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past a float's range
        return False


def number(value: Any, lo: float | None = None, hi: float | Limit | None = None) -> float:
    """A finite number within [lo, hi]; a `Limit` says why it is the most there can be."""
    if isinstance(value, str) and _YAML12_FLOAT.fullmatch(value):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
        raise error(f"expected a number, got {kind_of(value)}")
    if lo is not None and value < lo:
        raise error(f"must be >= {lo:g}, got {value:g}")
    if isinstance(hi, Limit):
        if value > hi.value:  # exact, int against int: 2^64 is past 2^64-1
            raise error(hi.problem(value))
    elif hi is not None and value > hi:
        raise error(f"must be <= {hi:g}, got {value:g}")
    return float(value)


def integer(value: Any, lo: int | None = None, hi: int | Limit | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"expected an integer, got {kind_of(value)}")
    number(value, lo, hi)
    return value


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise error(f"expected a string, got {kind_of(value)}")
    return value


def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise error(f"expected true or false, got {kind_of(value)}")
    return value


def choice(value: Any, options: Collection[str]) -> str:
    name = string(value)
    if name not in options:
        raise error(f"unknown value {name!r} (known: {', '.join(sorted(options))})")
    return name


def _device_index(value: Any, info: Info) -> int:
    # Unknown while the devices do not validate (their problems are reported).
    devices = context_of(info).get("devices")
    return integer(value, lo=0, hi=len(devices) - 1 if devices is not None else None)


def number_in(lo: float | None = None, hi: float | Limit | None = None) -> PlainValidator:
    return PlainValidator(lambda value: number(value, lo, hi))


def int_in(lo: int | None = None, hi: int | Limit | None = None) -> PlainValidator:
    return PlainValidator(lambda value: integer(value, lo, hi))


def one_of(options: Collection[str]) -> PlainValidator:
    """A string among `options` (a mapping's keys: its values are looked up by the model)."""
    return PlainValidator(lambda value: choice(value, options))


def key_in(options: Collection[str]) -> PlainValidator:
    """A mapping's key among `options` (for a mapping whose keys are data, not fields)."""

    def check(value: Any) -> str:
        if value not in options:
            known = ", ".join(sorted(options))
            raise error(f"unknown key {value!r} (known: {known})")
        return str(value)

    return PlainValidator(check)


def _nonempty(value: Any) -> Any:
    if isinstance(value, list) and not value:
        raise error("expected a non-empty list")
    return value


def _none_is_empty(value: Any) -> Any:
    return [] if value is None else value


nonempty = BeforeValidator(_nonempty)
OrNone = BeforeValidator(_none_is_empty)  # a list key written empty (`faults:`) is no items

Number = Annotated[float, number_in()]
NonNegative = Annotated[float, number_in(lo=0)]
# Scenario time (`at`, `from`, `until`, a step's time) and durations, in seconds.
Seconds = Annotated[float, number_in(lo=0, hi=SECONDS)]
Until = Annotated[float | None, number_in(lo=0, hi=SECONDS)]  # None: for the rest of the run
Integer = Annotated[int, int_in()]
Text = Annotated[str, PlainValidator(string)]
Flag = Annotated[bool, PlainValidator(flag)]
# A GPU of the scenario, by index (the devices are validated first and put in the context).
DeviceIndex = Annotated[int, PlainValidator(_device_index)]
