"""Scaling: tick and scrape cost at 1, 8 and 64 devices, with 1, 100 and 1,000 rule series and
with 100 subquery-heavy rules.

A device is a series-producing unit: a whole GPU, a MIG parent or a MIG instance. "64gpu" is
64 full GPUs (the device mix of `mixed`, repeated); "8gpu-mig-7x1g" is 8 H200s each
partitioned as 7 x 1g.18gb, so 64 devices too (8 parents + 56 instances; see
`scenarios.generate_mig`). A "rule series" is one alerting rule selecting one series of one GPU
(see `scenarios.rule_file`). "8gpu-subquery-rules" is 100 alerting rules as users write them
with subqueries and the functions past plain selectors and `rate` (`*_over_time` of
subqueries, `predict_linear`, `quantile_over_time`, `deriv`, `label_replace`, `topk`, ...;
see `scenarios.subquery_rule_file`): as many rules as the 100-rule-series file. Two more
configurations check two claims: scrape cost does not depend on NVML latency (0.36 ms per
call), and a tick stays well inside the interval when the driver lacks PCIe byte counters
and each PCIe throughput call takes its 20 ms.

Tick cost is measured in this process (`bench.inproc`, manual clock): "young" over the first
ticks, and "steady" after the rule engine's store was given a full history (`prefill`), since
range functions cost in proportion to the samples in their window. Scrape cost is measured on
the real daemon (`gpu-exporter serve`) with the same scenario and rules.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import loadgen, scenarios
from bench.inproc import build
from bench.procs import OUR_TICK_FAMILY, OURS, free_port, our_command, running
from bench.stats import summarize


@dataclass(frozen=True)
class Config:
    name: str
    devices: int = 8
    # "shipped", "none", "subquery" (scenarios.subquery_rule_file) or a number of generated
    # rule series (scenarios.rule_file)
    rules: str = "shipped"
    latency: str = "mixed"  # "mixed" (scenario's own) or "nvml-like"
    pcie_byte_fields: bool = True
    mig_instances: int = 0  # per GPU, each a 1g.18gb; 0: MIG off

    @property
    def series_devices(self) -> int:
        """GPUs plus MIG instances: every unit that has series of its own."""
        return self.devices * (1 + self.mig_instances)

    def scenario(self) -> dict[str, Any]:
        latency = scenarios.NVML_LIKE_LATENCY if self.latency == "nvml-like" else None
        if self.mig_instances:
            return scenarios.generate_mig(
                self.devices,
                self.mig_instances,
                name=f"bench-{self.name}",
                latency=latency,
                pcie_byte_fields=self.pcie_byte_fields,
            )
        return scenarios.generate(
            self.devices,
            name=f"bench-{self.name}",
            latency=latency,
            pcie_byte_fields=self.pcie_byte_fields,
        )

    def rule_files(self, workdir: Path) -> list[str] | None:
        """None: the shipped pack; []: no rules; else generated files."""
        if self.rules == "shipped":
            return None
        if self.rules == "none":
            return []
        path = workdir / f"rules-{self.rules}.yaml"
        if self.rules == "subquery":
            rules = scenarios.subquery_rule_file(self.devices)
        else:
            rules = scenarios.rule_file(int(self.rules), self.devices)
        scenarios.write_yaml(rules, path)
        return [str(path)]


CONFIGS = (
    Config("1gpu", devices=1),
    Config("8gpu", devices=8),
    Config("64gpu", devices=64),
    Config("8gpu-no-rules", rules="none"),
    Config("8gpu-1-rule-series", rules="1"),
    Config("8gpu-100-rule-series", rules="100"),
    Config("8gpu-1000-rule-series", rules="1000"),
    Config("8gpu-subquery-rules", rules="subquery"),
    Config("8gpu-nvml-latency", latency="nvml-like"),
    Config("8gpu-pcie-20ms-call", pcie_byte_fields=False),
    Config("8gpu-mig-7x1g", mig_instances=7),
)
DEVICE_SERIES = ("1gpu", "8gpu", "64gpu")
MIG_CONFIG = "8gpu-mig-7x1g"


@dataclass(frozen=True)
class ScalingSettings:
    young_ticks: int = 10
    steady_ticks: int = 10
    history_seconds: float = 960.0  # the shipped rules' longest window plus lookback
    single_requests: int = 100
    concurrent_scrapers: int = 32
    concurrent_requests_each: int = 5
    configs: tuple[str, ...] = tuple(c.name for c in CONFIGS)

    @classmethod
    def quick(cls) -> ScalingSettings:
        return cls(
            young_ticks=3,
            steady_ticks=2,
            history_seconds=60.0,
            single_requests=10,
            concurrent_requests_each=1,
            configs=("1gpu", "8gpu", "8gpu-1-rule-series", "8gpu-subquery-rules", MIG_CONFIG),
        )


def measure_ticks(pipeline: Any, count: int) -> dict[str, Any]:
    walls = []
    gc.collect()
    cpu0 = time.process_time()
    for _ in range(count):
        started = time.perf_counter()
        pipeline.tick()
        walls.append(time.perf_counter() - started)
    return {
        "wall": summarize(walls),
        "cpu_seconds_per_tick": (time.process_time() - cpu0) / max(count, 1),
    }


def tick_cost(config: Config, settings: ScalingSettings, workdir: Path) -> dict[str, Any]:
    pipeline = build(config.scenario(), rules=config.rule_files(workdir))
    try:
        pipeline.tick()
        pipeline.tick()
        young = measure_ticks(pipeline, settings.young_ticks)
        steps = pipeline.prefill(settings.history_seconds)
        pipeline.tick()  # the first evaluation over the full history
        steady = measure_ticks(pipeline, settings.steady_ticks)
        store = pipeline.manager.store if pipeline.manager is not None else None
        return {
            "young": young,
            "steady": steady,
            "exposition": exposition_cost(pipeline),
            "history_steps": steps,
            "store_series": store.series_count() if store else 0,
            "store_samples": store.sample_count() if store else 0,
        }
    finally:
        pipeline.close()


def exposition_cost(pipeline: Any) -> dict[str, float]:
    """CPU to write one tick's exposition as a scrape does it (lazily, on the first scrape
    of a tick), in the form Prometheus asks for (OpenMetrics, gzip) and as plain text, with
    the writer's caches as an earlier scrape left them; and its size."""
    pipeline.sampler.rendered.body(True, True)  # an earlier scrape
    pipeline.tick()
    rendered = pipeline.sampler.rendered
    cpu0 = time.process_time()
    text = rendered.body(False, False)
    cpu1 = time.process_time()
    rendered.body(True, True)
    cpu2 = time.process_time()
    return {
        "text_cpu_seconds": cpu1 - cpu0,
        "openmetrics_gzip_cpu_seconds": cpu2 - cpu1,
        "text_bytes": float(len(text)),
    }


def scrape_cost(config: Config, settings: ScalingSettings, workdir: Path) -> dict[str, Any]:
    scenario = scenarios.write_yaml(config.scenario(), workdir / f"{config.name}.yaml")
    files = config.rule_files(workdir)
    extra: list[str] = []
    for path in files or []:
        extra += ["--rules", path]
    env = {"GPU_EXPORTER_RULES__ENABLED": "false"} if files == [] else None
    port = free_port()
    argv = our_command(scenario, port, 1.0, extra)
    with running(OURS, argv, port, workdir, OUR_TICK_FAMILY, env) as target:
        target.wait_ready(ticks=3)
        single = loadgen.run_scrape_load(target.url, 1, settings.single_requests)
        many = loadgen.run_scrape_load(
            target.url, settings.concurrent_scrapers, settings.concurrent_requests_each
        )
        counters = target.counters()
        memory = target.memory()
    one, more = summarize(single.latencies), summarize(many.latencies)
    return {
        "scrape_1_p50": one["p50"],
        "scrape_1_p99": one["p99"],
        "scrape_32_p50": more["p50"],
        "scrape_32_p99": more["p99"],
        "errors": single.errors + many.errors,
        "bytes_per_scrape": single.bytes_received / max(len(single.latencies), 1),
        "daemon_young_tick_mean": counters.tick_sum / counters.tick_count
        if counters.tick_count
        else None,
        "rss_mib": memory.rss_mib,
    }


def bytes_per_device(results: dict[str, Any]) -> dict[str, float]:
    """Text exposition bytes divided by the device count, for the 1/8/64-device runs."""
    return {
        str(cfg.devices): results[cfg.name]["tick"]["exposition"]["text_bytes"] / cfg.devices
        for cfg in CONFIGS
        if cfg.name in DEVICE_SERIES and cfg.name in results
    }


def growth(results: dict[str, Any], phase: str = "steady") -> dict[str, float]:
    """CPU per tick divided by the device count, for each of the 1/8/64-device runs: flat
    when cost is linear in devices, rising when it grows faster."""
    return {
        str(cfg.devices): results[cfg.name]["tick"][phase]["cpu_seconds_per_tick"] / cfg.devices
        for cfg in CONFIGS
        if cfg.name in DEVICE_SERIES and cfg.name in results
    }


def mig_per_device(results: dict[str, Any], phase: str = "steady") -> dict[str, float]:
    """The MIG configuration's CPU per tick per device (GPU or instance) and per GPU."""
    config = next(c for c in CONFIGS if c.name == MIG_CONFIG)
    if config.name not in results:
        return {}
    cpu = results[config.name]["tick"][phase]["cpu_seconds_per_tick"]
    return {
        "devices": float(config.series_devices),
        "cpu_seconds_per_device": cpu / config.series_devices,
        "cpu_seconds_per_gpu": cpu / config.devices,
    }


def run(settings: ScalingSettings, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for config in CONFIGS:
        if config.name not in settings.configs:
            continue
        results[config.name] = {
            "config": config.__dict__ | {"series_devices": config.series_devices},
            "tick": tick_cost(config, settings, workdir),
            "scrape": scrape_cost(config, settings, workdir),
        }
    return {
        "settings": settings.__dict__ | {"configs": list(settings.configs)},
        "configs": results,
        "growth_steady": growth(results, "steady"),
        "growth_young": growth(results, "young"),
        "bytes_per_device": bytes_per_device(results),
        "mig_per_device": mig_per_device(results),
        "note": (
            "A device is a whole GPU, a MIG parent or a MIG instance: 64gpu is 64 full GPUs, "
            "8gpu-mig-7x1g 8 parents + 56 instances."
        ),
    }
