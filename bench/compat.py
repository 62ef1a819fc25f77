"""dcgm-exporter compatibility: what it costs a tick when nobody scrapes /metrics/dcgm, and
what the first scrape of a tick costs.

With `dcgm_compat.enabled` the sampler hands each tick's series list to the compat endpoint
(a reference kept, nothing rendered); the compat text is written on a tick's first scrape of
/metrics/dcgm. So the tick should cost the same with compat on as off, and a scrape what the
renderer costs. Both pipelines run in this process on the manual clock (`bench.inproc`) with
the shipped rules, in alternating rounds so that drift on the machine hits both alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.inproc import build
from bench.scaling import CONFIGS, MIG_CONFIG, measure_ticks
from bench.stats import ratio, summarize

_BY_NAME = {config.name: config for config in CONFIGS}


@dataclass(frozen=True)
class CompatSettings:
    rounds: int = 6
    ticks_per_round: int = 30
    renders: int = 10
    configs: tuple[str, ...] = ("8gpu", MIG_CONFIG)

    @classmethod
    def quick(cls) -> CompatSettings:
        return cls(rounds=2, ticks_per_round=3, renders=2, configs=("8gpu",))


def _tick_cpu(compat: bool, scenario: dict[str, Any], ticks: int) -> float:
    """CPU per tick of a pipeline with compat on or off, after its first two ticks."""
    pipeline = build(scenario, dcgm_compat=compat)
    try:
        pipeline.tick()
        pipeline.tick()
        cpu: float = measure_ticks(pipeline, ticks)["cpu_seconds_per_tick"]
        return cpu
    finally:
        pipeline.close()


def _scrape_cpu(scenario: dict[str, Any], renders: int) -> dict[str, Any]:
    """CPU of a tick's first /metrics/dcgm body, and of its first native text body."""
    pipeline = build(scenario, dcgm_compat=True)
    compat_cpu, native_cpu, sizes = [], [], (0, 0)
    try:
        pipeline.tick()
        for _ in range(renders):
            pipeline.tick()
            published, rendered = pipeline.sampler.series, pipeline.sampler.rendered
            assert published is not None and rendered is not None
            assert pipeline.dcgm_compat is not None
            cpu0 = time.process_time()
            compat = pipeline.dcgm_compat.body(published)
            cpu1 = time.process_time()
            native = rendered.body(False, False)
            cpu2 = time.process_time()
            compat_cpu.append(cpu1 - cpu0)
            native_cpu.append(cpu2 - cpu1)
            sizes = (len(compat), len(native))
    finally:
        pipeline.close()
    return {
        "compat_render": summarize(compat_cpu),
        "native_render": summarize(native_cpu),
        "compat_bytes": sizes[0],
        "native_bytes": sizes[1],
    }


def run(settings: CompatSettings, workdir: Path) -> dict[str, Any]:
    del workdir  # nothing written: the pipelines run in this process
    results: dict[str, Any] = {}
    for name in settings.configs:
        scenario = _BY_NAME[name].scenario()
        off: list[float] = []
        on: list[float] = []
        for _ in range(settings.rounds):
            off.append(_tick_cpu(False, scenario, settings.ticks_per_round))
            on.append(_tick_cpu(True, scenario, settings.ticks_per_round))
        off_mean, on_mean = sum(off) / len(off), sum(on) / len(on)
        results[name] = {
            "tick_cpu_off": off,
            "tick_cpu_on": on,
            "tick_cpu_off_mean": off_mean,
            "tick_cpu_on_mean": on_mean,
            "on_vs_off": ratio(on_mean, off_mean),
            **_scrape_cpu(scenario, settings.renders),
        }
    return {"configs": results}
