"""The time-varying quantities of a simulated GPU: a device's `values` (docs/scenarios.md).

Each quantity is a `ValueSpec` whose `value_at(t)` the fake NVML calls on every read, so it is
a small dataclass, built by the validators here from the forms a file writes: a number, a list
of clock-event reasons, or a mapping (`_Form`: steps, ramp, pattern or sine, with noise, min and
max). A device's table is complete: quantities the file leaves out get defaults (`complete`).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    PlainValidator,
    TypeAdapter,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gpu_exporter.model import nvml_facts as facts
from gpu_exporter.sim import limits
from gpu_exporter.sim.fields import (
    Info,
    Number,
    Seconds,
    Strict,
    choice,
    context_of,
    error,
    error_at,
    errors,
    nested,
    nonempty,
    number,
    number_in,
    one_of,
)
from gpu_exporter.sim.limits import SECONDS, Limit
from gpu_exporter.support.yamlfile import Path_

__all__ = [
    "CLOCK_EVENT_REASONS",
    "GIB",
    "MIB",
    "QUANTITIES",
    "RECOVERY_ACTIONS",
    "ValueSpec",
    "complete",
    "constant",
    "value_spec",
    "value_table",
]

GIB = 1024**3
MIB = 1024**2

# Every reason pynvml knows, the two it alone defines included (a scenario may set them).
CLOCK_EVENT_REASONS: Mapping[str, int] = MappingProxyType(
    {reason.name: reason.bit for reason in facts.ALL_CLOCK_EVENT_REASONS}
)


@dataclass(frozen=True)
class _Quantity:
    lo: float  # clamp bounds applied after noise
    hi: float | Limit  # a plain bound, or the most its C type holds (limits.py: why)
    fallback: str | None = None  # quantity whose spec is reused when this one is absent

    @property
    def top(self) -> float:
        """`hi` as the clamp: the largest float its type holds."""
        return self.hi.clamp if isinstance(self.hi, Limit) else self.hi

    @property
    def span(self) -> float:
        return self.top - self.lo


_RATIO = _Quantity(0.0, 1.0)
_TEMP = _Quantity(-40.0, 150.0)
_BYTES = _Quantity(0.0, limits.BYTES)
_MHZ = _Quantity(0.0, limits.CLOCK_MHZ)
_COUNT = _Quantity(0.0, limits.COUNT)
_UINT = _Quantity(0.0, limits.UINT)
_FLAG = _Quantity(0.0, 1.0)

QUANTITIES: dict[str, _Quantity] = {
    "utilization": _RATIO,
    "memory_utilization": _Quantity(0.0, 1.0, fallback="dram_active"),
    "encoder_utilization": _RATIO,
    "decoder_utilization": _RATIO,
    "memory_used_bytes": _BYTES,
    "power_watts": _Quantity(0.0, limits.WATTS),
    "temperature_celsius": _TEMP,
    "memory_temperature_celsius": _Quantity(-40.0, 150.0, fallback="temperature_celsius"),
    "sm_clock_mhz": _MHZ,
    "memory_clock_mhz": _MHZ,
    "graphics_clock_mhz": _Quantity(0.0, limits.CLOCK_MHZ, fallback="sm_clock_mhz"),
    "clock_event_reasons": _COUNT,  # a mask of reason names (nvml.h: unsigned long long)
    "sm_active": _RATIO,
    "sm_occupancy": _RATIO,
    "tensor_active": _RATIO,
    # The IMMA and DFMA tensor pipes' share of it (GPM); HMMA is the rest of tensor_active.
    "tensor_imma_active": _RATIO,
    "tensor_dfma_active": _RATIO,
    "dram_active": _RATIO,
    "graphics_active": _Quantity(0.0, 1.0, fallback="utilization"),
    "fp64_active": _RATIO,
    "fp32_active": _RATIO,
    "fp16_active": _RATIO,
    "int_active": _RATIO,
    "pcie_tx_bytes_per_second": _Quantity(0.0, limits.PCIE_BYTES_PER_SECOND),
    "pcie_rx_bytes_per_second": _Quantity(0.0, limits.PCIE_BYTES_PER_SECOND),
    "nvlink_tx_bytes_per_second": _Quantity(0.0, limits.NVLINK_BYTES_PER_SECOND),
    "nvlink_rx_bytes_per_second": _Quantity(0.0, limits.NVLINK_BYTES_PER_SECOND),
    "pcie_generation": _Quantity(0.0, limits.PCIE_GENERATION),
    "pcie_width": _Quantity(0.0, limits.PCIE_WIDTH),
    "ecc_corrected_total": _COUNT,
    "ecc_uncorrected_total": _COUNT,
    # Lifetime (InfoROM) counts; unset: the same as since the driver loaded.
    "ecc_corrected_aggregate_total": _Quantity(0.0, limits.COUNT, fallback="ecc_corrected_total"),
    "ecc_uncorrected_aggregate_total": _Quantity(
        0.0, limits.COUNT, fallback="ecc_uncorrected_total"
    ),
    "pcie_replay_total": _UINT,
    "nvlink_crc_flit_errors_total": _COUNT,  # summed over links, as NVML's *_TOTAL fields
    "nvlink_crc_data_errors_total": _COUNT,
    "nvlink_replay_errors_total": _COUNT,
    "nvlink_recovery_errors_total": _COUNT,
    "remapped_rows_correctable": _UINT,
    "remapped_rows_uncorrectable": _UINT,
    "row_remap_pending": _FLAG,
    "row_remap_failure": _FLAG,
    "retired_pages_sbe": _Quantity(0.0, limits.RETIRED_PAGES),
    "retired_pages_dbe": _Quantity(0.0, limits.RETIRED_PAGES),
    "retired_pages_pending": _FLAG,
    # NVML field 230's nvmlDeviceGpuRecoveryAction_t, written as action names or numbers.
    "recovery_action": _UINT,
}

# Value specs outside a device's `values` (a process's memory and utilization, sim/processes.py),
# by kind: not device quantities, so a device's `values` refuses their names.
_OTHER: dict[str, _Quantity] = {"process_bytes": _BYTES, "process_ratio": _RATIO}
_BOUNDS: Mapping[str, _Quantity] = MappingProxyType({**QUANTITIES, **_OTHER})

_REASONS = "clock_event_reasons"  # takes lists of reason names where others take numbers
_ACTION = "recovery_action"  # takes action names (or their numbers) where others take numbers
# Quantities of named, discrete values: steps or pattern only (no ramp, sine, noise, min, max).
_DISCRETE = (_REASONS, _ACTION)
# The action names a file may write: nvml_facts' but "unknown", which is no NVML value (a
# number past the known ones is how a file writes an action this exporter does not know).
RECOVERY_ACTIONS: Mapping[str, int] = MappingProxyType(
    {name: value for value, name in enumerate(facts.RECOVERY_ACTIONS[:-1])}
)
_UINT_MAX = 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# The runtime object


@dataclass(frozen=True)
class ValueSpec:
    """One time-varying quantity. `value_at(t)` is pure: same t, same value."""

    kind: str  # constant | steps | ramp | pattern | sine
    constant: float = 0.0
    points: tuple[tuple[float, float], ...] = ()  # (time or duration, value)
    sine: tuple[float, float, float] = (0.0, 0.0, 1.0)  # mean, amplitude, period
    noise: float = 0.0
    lo: float | None = None
    hi: float | None = None
    noise_key: str = ""  # "seed:device:quantity", so noise differs per series

    @property
    def is_constant(self) -> bool:
        """True when the value never changes, so integrals are exact products."""
        return self.kind == "constant" and self.noise == 0.0

    def value_at(self, t: float) -> float:
        v = self._base(t)
        if self.noise:
            v += self.noise * _unit_noise(self.noise_key, t)
        if self.lo is not None:
            v = max(self.lo, v)
        if self.hi is not None:
            v = min(self.hi, v)
        return v

    def _base(self, t: float) -> float:
        if self.kind == "constant":
            return self.constant
        if self.kind == "steps":
            return _steps_at(self.points, t)
        if self.kind == "ramp":
            return _ramp_at(self.points, t)
        if self.kind == "pattern":
            return _pattern_at(self.points, t)
        mean, amplitude, period = self.sine
        return mean + amplitude * math.sin(2.0 * math.pi * t / period)


def _unit_noise(key: str, t: float) -> float:
    """Deterministic uniform noise in [-1, 1), constant over 100 ms slots."""
    digest = hashlib.blake2b(f"{key}:{math.floor(t * 10)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**63 - 1.0


def _steps_at(points: tuple[tuple[float, float], ...], t: float) -> float:
    value = points[0][1]
    for start, v in points:
        if t < start:
            break
        value = v
    return value


def _ramp_at(points: tuple[tuple[float, float], ...], t: float) -> float:
    if t <= points[0][0]:
        return points[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t < t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def _pattern_at(points: tuple[tuple[float, float], ...], t: float) -> float:
    total = sum(d for d, _ in points)
    offset = t % total
    for duration, v in points:
        if offset < duration:
            return v
        offset -= duration
    return points[-1][1]


def constant(value: float, kind: str) -> ValueSpec:
    """A constant of that kind of value spec (`value_spec`'s), as a file writing it would get."""
    bounds = _BOUNDS[kind]
    return _constant(value, bounds.lo, bounds.top)


@functools.lru_cache(maxsize=1024)
def _constant(value: float, lo: float | None = None, hi: float | None = None) -> ValueSpec:
    """Constants are shared: every GPU of a scenario has some fifty, mostly the same."""
    return ValueSpec("constant", constant=value, lo=lo, hi=hi)


# ---------------------------------------------------------------------------------------------
# The forms a file writes


_REASON_NAMES = TypeAdapter(tuple[Annotated[str, one_of(CLOCK_EVENT_REASONS)], ...])


def _reason_mask(value: Any) -> float:
    mask = 0
    for name in _REASON_NAMES.validate_python(value):
        mask |= CLOCK_EVENT_REASONS[name]
    return float(mask)


def _action_value(value: Any) -> float:
    """A recovery action: its name (RECOVERY_ACTIONS) or the enum's number (any unsigned int:
    a number past the known actions is one this exporter does not know)."""
    if isinstance(value, str):
        return float(RECOVERY_ACTIONS[choice(value, RECOVERY_ACTIONS)])
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT_MAX:
        raise error(f"expected a recovery action name or a number 0-{_UINT_MAX}, got {value!r}")
    return float(value)


def _point_value(value: Any, info: Info) -> float:
    """The value of a [time, value] point: a number in the quantity's bounds, or reason names,
    or a recovery action."""
    quantity = context_of(info)["quantity"]
    if quantity == _REASONS:
        return _reason_mask(value)
    if quantity == _ACTION:
        return _action_value(value)
    bounds = _BOUNDS[quantity]
    return number(value, bounds.lo, bounds.hi)


def _duration(value: Any) -> float:
    duration = number(value, lo=0, hi=SECONDS)
    if duration <= 0:
        raise error("a pattern duration must be > 0")
    return duration


def _pair(first: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        # Not a list at all: pydantic's "expected a list".
        if isinstance(value, list) and len(value) != 2:
            raise error(f"expected a [{first}, value] pair")
        return value

    return BeforeValidator(check)


def _increasing(points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    for i, (prev, cur) in enumerate(itertools.pairwise(points), start=1):
        if cur[0] <= prev[0]:
            raise error_at((i,), f"times must increase ({cur[0]:g} after {prev[0]:g})")
    return points


_PointValue = Annotated[float, PlainValidator(_point_value)]
_Timeline = Annotated[
    tuple[Annotated[tuple[Seconds, _PointValue], _pair("time")], ...],
    nonempty,
    AfterValidator(_increasing),
]
_Duration = Annotated[float, PlainValidator(_duration)]
_Pattern = Annotated[
    tuple[Annotated[tuple[_Duration, _PointValue], _pair("duration")], ...], nonempty
]


class _Sine(Strict):
    mean: Number
    amplitude: Number
    period: Annotated[float, number_in(lo=1e-3, hi=SECONDS)]


_FORMS = ("steps", "ramp", "pattern", "sine")


def _written(expected: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        if value is None:
            raise error(f"expected {expected}, got nothing")
        return value

    return BeforeValidator(check)


class _Form(Strict):
    """A value spec written as a mapping (validated with the quantity in the context)."""

    # None: not given (a key written empty is refused, as `null` is no list or mapping)
    steps: Annotated[_Timeline | None, _written("a list")] = None
    ramp: Annotated[_Timeline | None, _written("a list")] = None
    pattern: Annotated[_Pattern | None, _written("a list")] = None
    sine: Annotated[_Sine | None, _written("a mapping")] = None
    noise: Annotated[float, number_in(lo=0)] = 0.0
    lo: Annotated[float | None, number_in()] = Field(default=None, alias="min")
    hi: Annotated[float | None, number_in()] = Field(default=None, alias="max")

    @model_validator(mode="after")
    def _one_form(self, info: Info) -> _Form:
        given = [form for form in _FORMS if form in self.model_fields_set]
        if len(given) != 1:
            raise error("expected exactly one of steps, ramp, pattern, sine")
        quantity = context_of(info)["quantity"]
        if quantity in _DISCRETE and (
            given[0] not in ("steps", "pattern") or len(self.model_fields_set) > 1
        ):
            raise error(f"{quantity} takes only steps or pattern (no noise/min/max)")
        return self

    @model_validator(mode="after")
    def _within_the_quantity(self, info: Info) -> _Form:
        """The form's own numbers are the quantity's: a level (mean, min, max) within its
        bounds, a swing (amplitude, noise) no wider than its range; past its C type, a sum
        of them would overflow where the fake converts it (limits.py)."""
        quantity = context_of(info)["quantity"]
        if quantity in _DISCRETE:
            return self  # names, no noise/min/max (_one_form)
        bounds = _BOUNDS[quantity]
        widest = bounds.hi if bounds.lo == 0 else bounds.span
        checks: list[tuple[Path_, float | None, float, float | Limit]] = [
            (("min",), self.lo, bounds.lo, bounds.hi),
            (("max",), self.hi, bounds.lo, bounds.hi),
            (("noise",), self.noise, 0.0, widest),
        ]
        if self.sine is not None:
            checks.append((("sine", "mean"), self.sine.mean, bounds.lo, bounds.hi))
            checks.append((("sine", "amplitude"), abs(self.sine.amplitude), 0.0, widest))
        problems: list[tuple[Path_, str, Any]] = []
        for loc, value, lo, hi in checks:
            try:
                if value is not None:
                    number(value, lo, hi)
            except PydanticCustomError as exc:
                problems.append((loc, exc.message(), value))
        if problems:
            raise errors(problems)
        return self

    def spec(self, quantity: str, noise_key: str) -> ValueSpec:
        bounds = _BOUNDS[quantity]
        lo, hi = bounds.lo, bounds.top
        if self.lo is not None:
            lo = max(lo, self.lo)
        if self.hi is not None:
            hi = min(hi, self.hi)
        common: dict[str, Any] = {"noise": self.noise, "lo": lo, "hi": hi, "noise_key": noise_key}
        if self.sine is not None:
            sine = (self.sine.mean, self.sine.amplitude, self.sine.period)
            return ValueSpec("sine", sine=sine, **common)
        form, points = next(
            (form, points)
            for form, points in (
                ("steps", self.steps),
                ("ramp", self.ramp),
                ("pattern", self.pattern),
            )
            if points is not None
        )
        return ValueSpec(form, points=points, **common)


def _spec_of(quantity: str, name: str | None = None) -> PlainValidator:
    """A spec of `quantity` (a device quantity or a kind of `_OTHER`); `name` keys its noise
    (default: the quantity's name)."""
    bounds = _BOUNDS[quantity]

    def check(value: Any, info: Info) -> ValueSpec:
        if isinstance(value, dict):
            form = nested(_Form, value, {"quantity": quantity})
            return form.spec(quantity, f"{context_of(info)['noise_prefix']}:{name or quantity}")
        if quantity == _REASONS:
            if not isinstance(value, list):
                raise error("expected a list of reason names or a steps/pattern mapping")
            return _constant(_reason_mask(value), bounds.lo, bounds.top)
        if quantity == _ACTION:
            return _constant(_action_value(value), bounds.lo, bounds.top)
        return _constant(number(value, bounds.lo, bounds.hi), bounds.lo, bounds.top)

    return PlainValidator(check)


def value_spec(kind: str, name: str) -> PlainValidator:
    """One value spec outside a device's `values`: `kind` gives its bounds ("process_bytes",
    "process_ratio"), `name` keys its noise beside the context's `noise_prefix`."""
    return _spec_of(kind, name)


def _table_model(quantities: Collection[str]) -> type[BaseModel]:
    """A `values` mapping as written: one optional key per quantity, each its own spec."""
    fields: dict[str, Any] = {
        name: (Annotated[ValueSpec | None, _spec_of(name)], None) for name in quantities
    }
    return create_model("values", __base__=Strict, **fields)


def value_table(quantities: Collection[str]) -> PlainValidator:
    """The specs a `values` mapping gives (noise keyed by the context's `noise_prefix`)."""
    model = _table_model(quantities)

    def check(value: Any, info: Info) -> Mapping[str, ValueSpec]:
        table = nested(model, value, context_of(info))
        return {name: getattr(table, name) for name in value}  # in the file's order

    return PlainValidator(check)


_DEFAULTS = {"memory_used_bytes": 512 * MIB, "power_watts": 60.0, "temperature_celsius": 35.0}


def complete(given: Mapping[str, ValueSpec], fixed: Mapping[str, float]) -> dict[str, ValueSpec]:
    """Every quantity: the given ones, defaults (`fixed` over the usual ones), then the
    quantities that reuse another's spec."""
    specs = dict(given)
    defaults = _DEFAULTS | dict(fixed)  # clocks at max, PCIe link at its maximum
    for name, q in QUANTITIES.items():
        if name in specs or q.fallback:
            continue
        specs[name] = _constant(float(defaults.get(name, 0.0)))
    for name, q in QUANTITIES.items():
        if name not in specs and q.fallback:
            specs[name] = specs[q.fallback]
    return specs
