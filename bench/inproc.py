"""The daemon's tick pipeline in this process, on a manual clock (no HTTP server).

`build` wires the production classes as `gpu_exporter.cli.serve` does, through
`gpu_exporter.pipeline.assembly` (NvmlSource with topology -> Sampler with the classifier ->
the rule manager as listener and producer -> Notifier), but the fake NVML, the source, the sampler's
timestamps and the rule engine all
read one manual clock that `Pipeline.tick` advances by the interval before each tick. Ticks
then run back to back: the scenario and the rule engine see a 1 s cadence while the
benchmark spends only the CPU time the ticks need. With `node=True` the pipeline also has
pod attribution and per-process attribution as `serve --simulate` wires them for a scenario
with `pods:` and `processes:` (their refresh threads wait in real time, like the XID thread).
Also here: `FakeCpuMeter`, which measures the CPU time spent inside the fake NVML itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpu_exporter import sim
from gpu_exporter.alerting.rules.manager import RuleManager, store_samples
from gpu_exporter.alerting.store import SeriesStore
from gpu_exporter.cli import _simulated_kubelet, _simulated_processes
from gpu_exporter.collect import dcgm
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.nvml.topology import read_topology
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.config.load import Config, load_config
from gpu_exporter.model.series import SeriesSet
from gpu_exporter.pipeline.assembly import Assembly, assemble
from gpu_exporter.pipeline.sampler import Sampler
from gpu_exporter.sim.clock import ManualClock
from gpu_exporter.sim.fake_nvml import FakeNvmlLib, implemented_functions
from gpu_exporter.web.dcgm_compat.endpoint import DcgmCompat


@dataclass
class Pipeline:
    fake: FakeNvmlLib
    clock: ManualClock
    source: NvmlSource
    sampler: Sampler
    interval: float
    manager: RuleManager | None = None
    notifier: Any = None
    dcgm_compat: DcgmCompat | None = None
    assembly: Assembly | None = None
    kubelet: Any = None  # the fake kubelet of `build(node=True)`
    config: Config | None = None  # what the pipeline was assembled from
    _closed: bool = field(default=False, repr=False)

    def tick(self) -> None:
        self.clock.advance(self.interval)
        self.sampler.tick()

    def prefill(self, seconds: float) -> int:
        """Give the rule engine `seconds` of history at once (see `backfill`); needs two
        ticks first (GPM activity needs two samples). Returns the history steps written."""
        series_set = self.sampler.series
        if self.manager is None or series_set is None:
            return 0
        return backfill(self.manager.store, series_set, seconds, self.interval)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.notifier is not None:
            self.notifier.stop(timeout=2.0)
        if self.assembly is not None:
            if self.assembly.processes is not None:
                self.assembly.processes.stop()
            if self.assembly.attribution is not None:
                self.assembly.attribution.stop()
        if self.kubelet is not None:
            self.kubelet.close()
        self.source.close()
        sim.uninstall()


def backfill(store: SeriesStore, series_set: SeriesSet, seconds: float, interval: float) -> int:
    """Rewrite the rule engine's store as if the daemon had been running for `seconds`.

    The store is emptied, then the tick's series (as `store_samples` gives them to the rule
    engine) are written once per `interval` up to and including the tick's own
    timestamp; later ticks continue from there. Range functions then read full windows, so
    evaluation costs what it costs at steady state, without minutes of ticking. The history
    is flat (every value as in `series_set`), and recording rules' outputs get none: they are
    written only by evaluations. Returns the number of steps written.
    """
    steps = int(seconds / interval)
    samples = list(store_samples(series_set))
    store.clear()  # presence too: the next real ingest marks no backfilled series stale
    for step in range(steps, -1, -1):
        store.ingest(series_set.timestamp - step * interval, samples, group="backfill")
    return steps


def build(
    scenario: Mapping[str, Any] | str,
    *,
    interval: float = 1.0,
    rules: list[str] | None = None,
    alertmanager_url: str | None = None,
    xid_events: bool = False,
    start: float = 0.0,
    dcgm_compat: bool = False,
    dcgm_mode: str = "off",
    node: bool = False,
    processes: bool = True,
    settings: Mapping[str, Any] | None = None,
) -> Pipeline:
    """The daemon's tick pipeline, wired by the CLI's own helpers from a configuration built
    as `serve`'s flags would build it. `rules=None`: the shipped pack; `rules=[]`: none.
    The XID thread is off by default (it waits in real time; see `overhead.xid_polling_cpu`).
    `dcgm_compat`: serve's --dcgm-compat (the listener that keeps the ticks' series).
    `dcgm_mode`: serve's --dcgm (the DCGM source, on the scenario's fake libdcgm if it has one).
    `node`: the node around the GPUs as `serve --simulate` has it (`cli._simulated_kubelet`,
    `cli._simulated_processes`): for the scenario's `pods:` a fake kubelet and pod attribution,
    for its `processes:` per-process attribution on the simulated /proc and CRI runtime
    (`processes=False`: `kubernetes.processes.enabled: false` given, as a user who leaves it
    off); their refresh threads started as the daemon starts them. Off by default: the other
    benchmarks measure no attribution, whatever pods their scenarios declare.
    `settings`: further configuration by dotted name (`{"kubernetes.refresh_seconds": 1}`),
    as flags give it, over the arguments above.
    """
    clock = ManualClock(start)
    fake = sim.install(scenario, clock=clock)
    flags: dict[str, Any] = {"interval_seconds": interval, "nvml.xid_events": xid_events}
    if rules == []:
        flags["rules.enabled"] = False
    elif rules is not None:
        flags["rules.files"] = rules
    if alertmanager_url:
        flags["alerting.alertmanagers"] = [alertmanager_url]
    if dcgm_compat:
        flags["dcgm_compat.enabled"] = True
    flags["dcgm.mode"] = dcgm_mode
    if node and not processes:
        flags["kubernetes.processes.enabled"] = False
    flags.update(settings or {})
    config = load_config(None, flags, environ={})
    kubelet = None
    if node:
        kubelet, config = _simulated_kubelet(fake.scenario, config, fake.clock)
        config = _simulated_processes(fake, config)
    errors = ErrorLog()
    source = NvmlSource(
        settings=config.nvml,
        interval_seconds=interval,
        errors=errors,
        clock=clock,
        topology_reader=read_topology,
        dcgm=dcgm.configured(config.dcgm, errors, interval, clock),
    )
    source.start()
    epoch = time.time() - start
    assembly = assemble(config, source, errors, wall_clock=lambda: epoch + clock())
    if assembly.notifier is not None:
        assembly.notifier.start()
    if assembly.attribution is not None:
        assembly.attribution.start()
    if assembly.processes is not None:
        assembly.processes.start()
    return Pipeline(
        fake,
        clock,
        source,
        assembly.sampler,
        interval,
        assembly.rules,
        assembly.notifier,
        assembly.dcgm_compat,
        assembly,
        kubelet,
        config,
    )


class FakeCpuMeter:
    """Thread CPU time spent inside the fake's C-symbol entry points (sleeps excluded).

    Wraps the instance's entry points and clears pynvml's function-pointer cache, so every
    later pynvml call goes through the wrapper. The wrapper's own cost (two
    `time.thread_time()` calls) lands outside the measured part.
    """

    def __init__(self, fake: FakeNvmlLib, names: Iterable[str] | None = None) -> None:
        """`names`: only these entry points (default: every one the fake implements)."""
        self.seconds = 0.0
        self.calls = 0
        self._lock = threading.Lock()
        for name in implemented_functions() if names is None else names:
            entry = getattr(fake, name, None)
            if entry is not None:
                setattr(fake, name, self._wrap(entry))
        with pynvml.libLoadLock:
            pynvml._nvmlGetFunctionPointer_cache.clear()

    def _wrap(self, entry: Callable[..., int]) -> Callable[..., int]:
        def measured(*args: Any) -> int:
            started = time.thread_time()
            try:
                return entry(*args)
            finally:
                spent = time.thread_time() - started
                with self._lock:
                    self.seconds += spent
                    self.calls += 1

        return measured

    def reset(self) -> None:
        with self._lock:
            self.seconds, self.calls = 0.0, 0
