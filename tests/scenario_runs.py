"""A built-in scenario run in this process as `gpu-exporter serve --simulate` runs it: the same
configuration, the simulated kubelet, API server, DCGM host engine and processes the scenario
has, the daemon assembled by `gpu_exporter.pipeline.assembly`, on a manual clock ticked as fast
as the machine goes (minutes of scenario time in seconds)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_exporter import sim
from gpu_exporter.cli import (
    _simulated_api_server,
    _simulated_dcgm,
    _simulated_kubelet,
    _simulated_processes,
)
from gpu_exporter.collect import dcgm
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.nvml.topology import read_topology
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.config.load import load_config
from gpu_exporter.pipeline.assembly import Assembly, assemble
from gpu_exporter.sim.clock import ManualClock

EPOCH = 1_767_225_600.0  # scenario t=0 at a fixed wall time


@dataclass
class Run:
    assembly: Assembly
    clock: ManualClock
    interval: float

    def tick(self, count: int = 1) -> None:
        for _ in range(count):
            self.clock.advance(self.interval)
            self.assembly.sampler.tick()

    def metrics(self, openmetrics: bool = False) -> str:
        """This tick's /metrics."""
        rendered = self.assembly.sampler.rendered
        assert rendered is not None, "no tick yet"
        return rendered.body(openmetrics, False).decode()

    def compat(self) -> str:
        """This tick's /metrics/dcgm (dcgm_compat.enabled)."""
        compat, series = self.assembly.dcgm_compat, self.assembly.sampler.series
        assert compat is not None and series is not None
        return compat.body(series).decode()


@contextmanager
def running(
    scenario: str | Path,
    flags: Mapping[str, Any] | None = None,
    interval: float = 5.0,
    prepare: Callable[[Assembly], None] = lambda _: None,
) -> Iterator[Run]:
    """The daemon of `serve --simulate scenario` with `flags` (setting -> value, as flags set
    them), assembled, changed by `prepare` and started; the caller ticks it."""
    clock = ManualClock()
    loaded = sim.load_scenario(str(scenario))
    simulator = sim.install(loaded, clock=clock)
    with ExitStack() as stack:
        stack.callback(sim.uninstall)
        settings = {"interval_seconds": interval, **(flags or {})}
        config = load_config(None, settings, environ={})
        kubelet, config = _simulated_kubelet(loaded, config, clock)
        if kubelet is not None:
            stack.callback(kubelet.close)
        api_server, config = _simulated_api_server(loaded, config, clock)
        if api_server is not None:
            stack.callback(api_server.close)
        config = _simulated_dcgm(loaded, config)
        config = _simulated_processes(simulator, config)
        errors = ErrorLog()
        source = NvmlSource(
            settings=config.nvml,
            interval_seconds=config.interval_seconds,
            errors=errors,
            clock=clock,
            topology_reader=read_topology,
            dcgm=dcgm.configured(config.dcgm, errors, config.interval_seconds),
        )
        source.start()
        stack.callback(source.close)
        wall = lambda: EPOCH + clock()  # noqa: E731
        assembly = assemble(config, source, errors, wall_clock=wall)
        stack.callback(assembly.stop)
        if assembly.attribution is not None:
            assert assembly.attribution.refresh(), "the simulated kubelet did not answer"
        for helper in (assembly.dra, assembly.processes):
            if helper is not None:
                helper.start()  # their own threads, as serve has them
        prepare(assembly)
        deadline = time.monotonic() + 30
        while not _started(assembly):
            assert time.monotonic() < deadline, f"{scenario}: the simulated node did not start"
            time.sleep(0.05)
        yield Run(assembly, clock, interval)


def _started(assembly: Assembly) -> bool:
    """Whether the ResourceSlices (a scenario with a DRA driver) were listed."""
    return assembly.dra is None or assembly.dra.slices.up
