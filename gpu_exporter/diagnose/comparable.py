"""Is the workload steady and comparable? The second question of a diagnosis, after health.

A measurement is only reproducible, and two GPUs' numbers only comparable, with the same
software and the same settings: one driver, and on GPUs of one model the same power limit,
maximum and application clocks, persistence, ECC, MIG and compute mode; none of them changing
while the profile measured; clocks that held steady while the GPU was busy. From the profile's
ticks (`SettingsWatch`, fed each tick's series as the daemon exports them) and the settings
read once after it (gpu_exporter/collect/nvml/device_config.py) this module finds:

- drift between GPUs: a setting that differs between GPUs of the same model, or the driver
  between any two: a job spread over them runs at the pace of the slowest and their numbers
  measure different things (a warning; MIG and compute mode differ by design on a partitioned
  node, so for them a note);
- drift over the profile: a setting that changed while it measured (each tick's enforced
  power limit, management limit, ECC and MIG mode, maximum SM clock and driver; the settings
  read after the profile against the last tick's): the numbers mix two set-ups (a warning);
- an SM clock that moved by more than CLOCK_SPREAD of its maximum while the GPU was busy, or
  ran below CLOCK_BELOW of it (notes: boost follows power and temperature, so timings follow
  it; throttling itself is the classifier's `throttled`);
- GPUs of different models (a note: compare each with its own kind).

What cannot be read is said, never assumed equal: a setting NVML did not answer for a GPU is
listed as not read and left out of the comparison, and the node-wide NOT_READ lists what the
daemon does not read at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter.collect.nvml.device_config import DeviceConfig
from gpu_exporter.model.series import DeviceView

WARNING = "warning"
NOTE = "note"
# An SM clock that moved by more than this share of its maximum over the busy ticks is not
# steady: at 10 % a timing taken at one end is a tenth off one taken at the other.
CLOCK_SPREAD = 0.10
# A busy GPU whose mean SM clock stays under this share of its maximum runs slower than one at
# full boost (a power cap, a lowered limit, locked or application clocks).
CLOCK_BELOW = 0.90
# Clock-event reasons that say why a busy GPU's clock is where it is (gpu_idle is not one: an
# idle tick's clock is parked and left out).
IDLE_REASON = "gpu_idle"

# What the daemon does not read at all, whatever the GPU: said, so no one assumes it equal.
NOT_READ: tuple[str, ...] = (
    "locked clocks (`nvidia-smi -lgc` / `-lmc`): a locked clock shows here only as an SM clock "
    "that is steady below its maximum",
    "VBIOS and InfoROM versions: GPUs of one model on different firmware are not told apart",
    "the workload's own version and inputs (framework, model, batch, data): outside the GPU; "
    "pin them before comparing runs",
)


@dataclass(frozen=True)
class Setting:
    """One setting compared between GPUs: `key` in the JSON, `label` for people, `same_model`
    whether only GPUs of one model must agree, `level` of a difference, `show` its value."""

    key: str
    label: str
    same_model: bool
    level: str
    show: Callable[[Any], str]


def _watts(value: Any) -> str:
    return f"{value:g} W"


def _megahertz(value: Any) -> str:
    return f"{value:g} MHz"


def _hertz(value: Any) -> str:
    return f"{value / 1e6:.0f} MHz"


def _on_off(value: Any) -> str:
    return "on" if value else "off"


def _text(value: Any) -> str:
    return str(value)


SETTINGS: tuple[Setting, ...] = (
    Setting("driver_version", "driver version", False, WARNING, _text),
    Setting("power_management_limit_watts", "power limit", True, WARNING, _watts),
    Setting("sm_clock_max_hz", "maximum SM clock", True, WARNING, _hertz),
    Setting("application_sm_clock_mhz", "application SM clock", True, WARNING, _megahertz),
    Setting("application_memory_clock_mhz", "application memory clock", True, WARNING, _megahertz),
    Setting("persistence_mode", "persistence mode", True, WARNING, _on_off),
    Setting("ecc_enabled", "ECC mode", True, WARNING, _on_off),
    Setting("mig_mode", "MIG mode", True, NOTE, _on_off),
    Setting("compute_mode", "compute mode", True, NOTE, _text),
)
_BY_KEY = {s.key: s for s in SETTINGS}
# Settings each tick shows (a change between ticks is drift over the profile), and the series
# each comes from; the enforced power limit moves with other limiters too, so it is watched
# but not compared between GPUs.
ENFORCED_LIMIT = Setting("enforced_power_limit_watts", "enforced power limit", True, WARNING,
                         _watts)  # fmt: skip
# (the setting, its series, the series' labels, the setting's value from the series' value)
_TICK_SERIES: tuple[tuple[Setting, str, dict[str, str], Callable[[float], Any]], ...] = (
    (ENFORCED_LIMIT, "gpu_power_limit_watts", {}, float),
    (_BY_KEY["power_management_limit_watts"], "gpu_power_management_limit_watts", {}, float),
    (_BY_KEY["ecc_enabled"], "gpu_ecc_enabled", {}, bool),
    (_BY_KEY["mig_mode"], "gpu_mig_mode", {"state": "current"}, bool),
    (_BY_KEY["sm_clock_max_hz"], "gpu_clock_max_hertz", {"clock": "sm"}, float),
)


@dataclass
class _Trace:
    """One GPU over the profile's ticks."""

    ticks: int = 0
    idle_ticks: int = 0  # ticks with the gpu_idle clock event: their clock is parked
    sm_clocks: list[float] = field(default_factory=list)  # Hz, on the other ticks
    reasons: set[str] = field(default_factory=set)  # clock events active on those ticks
    seen: dict[str, list[Any]] = field(default_factory=dict)  # setting -> values in order

    def saw(self, key: str, value: Any) -> None:
        values = self.seen.setdefault(key, [])
        if not values or values[-1] != value:
            values.append(value)


class SettingsWatch:
    """What each tick showed of every GPU's clocks and settings (`observe` each DeviceView)."""

    def __init__(self) -> None:
        self._traces: dict[int, _Trace] = {}

    def observe(self, view: DeviceView) -> None:
        if not view.up:  # a GPU that is down shows no values, and none have changed
            return
        trace = self._traces.setdefault(view.index, _Trace())
        trace.ticks += 1
        active = {
            dict(r.labels).get("reason", "")
            for r in view.readings
            if r.family == "gpu_clock_event_active" and r.value
        }
        sm = view.value("gpu_clock_hertz", clock="sm")
        if IDLE_REASON in active:
            trace.idle_ticks += 1
        elif sm is not None:
            trace.sm_clocks.append(sm)
            trace.reasons |= active
        driver = view.info.get("driver_version")
        if driver:
            trace.saw("driver_version", driver)
        for setting, family, labels, convert in _TICK_SERIES:
            value = view.value(family, **labels)
            if value is not None:
                trace.saw(setting.key, convert(value))

    def trace(self, index: int) -> _Trace:
        return self._traces.get(index) or _Trace()


def comparable_report(
    watch: SettingsWatch,
    views: Sequence[DeviceView],
    configs: Mapping[str, DeviceConfig | str],
) -> dict[str, Any]:
    """The report's `comparable` section: per GPU its clocks and settings, the findings (drift
    between GPUs, drift over the profile, clocks, models) and what was not read."""
    gpus = [_gpu(view, watch.trace(view.index), configs.get(view.uuid)) for view in views]
    findings = _model_findings(gpus)
    findings += _drift_between(gpus)
    findings += _drift_over_profile(gpus, views, watch)
    findings += _clock_findings(gpus)
    return {"gpus": gpus, "findings": findings, "not_read": list(NOT_READ)}


def attention_findings(comparable: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The findings that need attention (warnings)."""
    return [f for f in comparable["findings"] if f["level"] == WARNING]


def _gpu(view: DeviceView, trace: _Trace, config: DeviceConfig | str | None) -> dict[str, Any]:
    settings: dict[str, Any] = {s.key: None for s in SETTINGS}
    not_read: list[str] = []
    if isinstance(config, DeviceConfig):
        settings.update(
            power_management_limit_watts=config.power_limit_watts,
            application_sm_clock_mhz=config.application_sm_clock_mhz,
            application_memory_clock_mhz=config.application_memory_clock_mhz,
            persistence_mode=config.persistence_mode,
            ecc_enabled=config.ecc_enabled,
            compute_mode=config.compute_mode,
        )
        not_read += [f"{call}: NVML answered not supported" for call in config.unsupported]
        not_read += [f"{call}: failed" for call in config.failed]
    elif view.up:
        not_read.append(f"settings after the profile: {config or 'not read'}")
    # From the ticks where the read after the profile has nothing (or does not read it).
    for key, values in trace.seen.items():
        if key in settings and settings[key] is None and values:
            settings[key] = values[-1]
    settings["power_default_limit_watts"] = (
        config.power_default_limit_watts if isinstance(config, DeviceConfig) else None
    )
    settings["enforced_power_limit_watts"] = (trace.seen.get(ENFORCED_LIMIT.key) or [None])[-1]
    if view.up and trace.ticks and not trace.sm_clocks and not trace.idle_ticks:
        not_read.append("SM clock: no tick read it")
    return {
        "index": view.index,
        "model": view.info.get("model"),
        "up": view.up,
        "sm_clock": _sm_clock(trace, settings["sm_clock_max_hz"]),
        "settings": settings,
        "not_read": not_read,
    }


def _sm_clock(trace: _Trace, max_hz: float | None) -> dict[str, Any]:
    """The SM clock over the busy ticks: its range and mean against the maximum, whether it
    held steady (None: not judged, and why)."""
    clocks = trace.sm_clocks
    out: dict[str, Any] = {
        "busy_samples": len(clocks),
        "idle_samples": trace.idle_ticks,
        "min_hz": min(clocks) if clocks else None,
        "mean_hz": sum(clocks) / len(clocks) if clocks else None,
        "max_hz": max(clocks) if clocks else None,
        "max_clock_hz": max_hz,
        "spread": None,
        "steady": None,
        "not_judged": None,
        "clock_events": sorted(trace.reasons),
    }
    if not clocks:
        out["not_judged"] = (
            "idle throughout: its clock was parked" if trace.idle_ticks else "no SM clock read"
        )
    elif max_hz is None or max_hz <= 0:
        out["not_judged"] = "its maximum SM clock was not read"
    else:
        out["spread"] = (max(clocks) - min(clocks)) / max_hz
        out["steady"] = out["spread"] <= CLOCK_SPREAD
    return out


def _where(indices: Iterable[int]) -> str:
    listed = sorted(indices)
    return f"GPU{'s' if len(listed) > 1 else ''} {', '.join(str(i) for i in listed)}"


def _finding(
    check: str, setting: str | None, level: str, gpus: Iterable[int], text: str
) -> dict[str, Any]:
    return {"check": check, "setting": setting, "level": level, "gpus": sorted(gpus), "text": text}


def _model_findings(gpus: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    models: dict[str, list[int]] = {}
    for gpu in gpus:
        models.setdefault(gpu["model"] or "unknown model", []).append(gpu["index"])
    if len(models) < 2:
        return []
    groups = "; ".join(f"{model} ({_where(indices)})" for model, indices in models.items())
    return [
        _finding(
            "mixed_models",
            "model",
            NOTE,
            (g["index"] for g in gpus),
            f"GPUs of {len(models)} models: {groups}. Compare each GPU's numbers with those of "
            "its own model only; settings are compared within a model.",
        )
    ]


def _drift_between(gpus: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each setting whose value differs between GPUs that should agree (same model, or any for
    the driver); GPUs that did not answer for it are left out, not counted as different."""
    out = []
    for setting in SETTINGS:
        groups: dict[str, list[Mapping[str, Any]]] = {}
        for gpu in gpus:
            if gpu["up"] and gpu["settings"][setting.key] is not None:
                key = (gpu["model"] or "") if setting.same_model else ""
                groups.setdefault(key, []).append(gpu)
        for model, members in groups.items():
            values: dict[Any, list[int]] = {}
            for gpu in members:
                values.setdefault(gpu["settings"][setting.key], []).append(gpu["index"])
            if len(values) < 2:
                continue
            # The most common value first: the GPUs that differ from it are the odd ones out.
            ordered = sorted(values.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
            parts = "; ".join(f"{_where(i)} {setting.show(v)}" for v, i in ordered)
            among = f"the {model} GPUs" if model else "the GPUs"
            why = (
                "a job spread over them runs at the pace of the slowest, and their numbers "
                "measure different set-ups"
                if setting.level == WARNING
                else "a choice of partitioning, not a fault: compare like with like"
            )
            out.append(
                _finding(
                    "drift_between_gpus",
                    setting.key,
                    setting.level,
                    (i for _, indices in ordered[1:] for i in indices),
                    f"{setting.label} differs between {among}: {parts}: {why}",
                )
            )
    return out


def _drift_over_profile(
    gpus: Sequence[Mapping[str, Any]], views: Sequence[DeviceView], watch: SettingsWatch
) -> list[dict[str, Any]]:
    """Settings that changed while the profile measured: between its ticks, or between the last
    tick and the read after it."""
    out = []
    by_index = {g["index"]: g for g in gpus}
    for view in views:
        trace = watch.trace(view.index)
        gpu = by_index[view.index]
        for key, seen in trace.seen.items():
            setting = _BY_KEY.get(key) or ENFORCED_LIMIT
            values = list(seen)
            after = gpu["settings"].get(key) if key in _BY_KEY else None
            if after is not None and values and after != values[-1]:
                values.append(after)
            if len(values) < 2:
                continue
            steps = " -> ".join(setting.show(v) for v in values)
            out.append(
                _finding(
                    "changed_during_profile",
                    key,
                    WARNING,
                    [view.index],
                    f"GPU {view.index}'s {setting.label} changed while the profile measured "
                    f"({steps}): its numbers mix two set-ups; measure again once it holds",
                )
            )
    return out


def _clock_findings(gpus: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for gpu in gpus:
        clock = gpu["sm_clock"]
        if clock["steady"] is None:
            continue
        top = clock["max_clock_hz"]
        events = [e for e in clock["clock_events"] if e != IDLE_REASON]
        why = f" (clock events: {', '.join(events)})" if events else ""
        if not clock["steady"]:
            out.append(
                _finding(
                    "clock_not_steady",
                    "sm_clock",
                    NOTE,
                    [gpu["index"]],
                    f"GPU {gpu['index']}'s SM clock moved between {_hertz(clock['min_hz'])} and "
                    f"{_hertz(clock['max_hz'])} (max {_hertz(top)}) while busy{why}: timings "
                    "follow it; for benchmarks hold it (`nvidia-smi -lgc`) or compare at equal "
                    "clocks",
                )
            )
        if clock["mean_hz"] < CLOCK_BELOW * top:
            out.append(
                _finding(
                    "clock_below_max",
                    "sm_clock",
                    NOTE,
                    [gpu["index"]],
                    f"GPU {gpu['index']} ran at a mean SM clock of {_hertz(clock['mean_hz'])}, "
                    f"{clock['mean_hz'] / top:.0%} of its {_hertz(top)} maximum, while busy"
                    f"{why}: its numbers do not compare with a GPU at full boost",
                )
            )
    return out
