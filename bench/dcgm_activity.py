"""The DCGM source: what reading activity from DCGM costs a tick on a node without GPM.

The same simulated A100 node (`pre-hopper-dcgm`: 4 whole GPUs and one in MIG mode with 4 GPU
instances, a DCGM host engine) runs with
`dcgm.mode` auto and off, in this process on the manual clock (`bench.inproc`) with the shipped
rules, in alternating rounds so that drift on the machine hits both alike. The process CPU
includes the DCGM worker thread and the fake libdcgm itself, which is Python here (a real
libdcgm answers from the host engine's cache in C), so the ratio overstates what DCGM costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.inproc import build
from bench.scaling import measure_ticks
from bench.stats import ratio
from gpu_exporter.model.snapshot import DeviceSample

SCENARIO = "pre-hopper-dcgm"


@dataclass(frozen=True)
class DcgmSettings:
    rounds: int = 6
    ticks_per_round: int = 30

    @classmethod
    def quick(cls) -> DcgmSettings:
        return cls(rounds=2, ticks_per_round=3)


def _tick_cpu(mode: str, ticks: int) -> tuple[float, bool]:
    """CPU per tick with `dcgm.mode` = `mode`, after the ticks that learn GPM is missing and
    make the first watch cycle; and whether the activity was there (from DCGM) at the end."""
    pipeline = build(SCENARIO, dcgm_mode=mode)
    try:
        for _ in range(3):
            pipeline.tick()
        cpu: float = measure_ticks(pipeline, ticks)["cpu_seconds_per_tick"]
        snapshot = pipeline.sampler.latest
        assert snapshot is not None
        measured = all(_has_activity(d) for d in snapshot.devices)
        return cpu, measured
    finally:
        pipeline.close()


def _has_activity(device: DeviceSample) -> bool:
    """A whole GPU's SM activity, or on a MIG GPU every instance's."""
    if device.mig_enabled:
        return bool(device.instances) and all(
            i.value("gpu_sm_active_ratio") is not None for i in device.instances
        )
    return device.value("gpu_sm_active_ratio") is not None


def run(settings: DcgmSettings, workdir: Path) -> dict[str, Any]:
    del workdir  # nothing written: the pipelines run in this process
    off: list[float] = []
    on: list[float] = []
    activity = []
    for _ in range(settings.rounds):
        off.append(_tick_cpu("off", settings.ticks_per_round)[0])
        cpu, measured = _tick_cpu("auto", settings.ticks_per_round)
        on.append(cpu)
        activity.append(measured)
    off_mean, on_mean = sum(off) / len(off), sum(on) / len(on)
    return {
        "scenario": SCENARIO,
        "tick_cpu_off": off,
        "tick_cpu_on": on,
        "tick_cpu_off_mean": off_mean,
        "tick_cpu_on_mean": on_mean,
        "on_vs_off": ratio(on_mean, off_mean),
        "activity_from_dcgm": all(activity),
    }
