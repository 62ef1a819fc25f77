"""Wiring the tick pipeline from a validated configuration: the sampler, its processors and
producers, pod attribution, the rule manager and the notifier.

`serve`, the benchmarks and the golden-exposition tests all assemble the daemon here, so what
they measure or pin is what runs in production.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_exporter.alerting.notify import Notifier
from gpu_exporter.alerting.rules import promql
from gpu_exporter.alerting.rules.manager import RuleManager
from gpu_exporter.alerting.rules.promql_values import NAME
from gpu_exporter.collect.activity_time import ActivityTime
from gpu_exporter.collect.classify import Classifier
from gpu_exporter.collect.health_latch import HealthLatch
from gpu_exporter.collect.source import ErrorLog, Source
from gpu_exporter.config.dedup import warn_label_mismatches
from gpu_exporter.config.load import node_name, rule_manager
from gpu_exporter.model.profile import ExportFilter, family_of
from gpu_exporter.pipeline.sampler import Sampler
from gpu_exporter.web.settings import DcgmCompatConfig

if TYPE_CHECKING:  # h2 and protobuf cost about 4 MiB: imported only when attribution is on
    from gpu_exporter.collect.k8s.attribution import PodAttribution
    from gpu_exporter.collect.k8s.dra_attribution import DraAttribution
    from gpu_exporter.collect.k8s.process_attribution import ProcessAttribution
    from gpu_exporter.web.dcgm_compat.endpoint import DcgmCompat

log = logging.getLogger("gpu_exporter")


@dataclass
class Assembly:
    sampler: Sampler
    attribution: PodAttribution | None = None
    rules: RuleManager | None = None
    notifier: Notifier | None = None
    dcgm_compat: DcgmCompat | None = None  # /metrics/dcgm, when dcgm_compat.enabled
    processes: ProcessAttribution | None = None  # when kubernetes.processes.enabled
    dra: DraAttribution | None = None  # when kubernetes.dra.enabled
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopped: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        """Background work: rule evaluation, attribution refreshes, notifier delivery, the
        scheduled tick."""
        self._start_helpers()
        self.sampler.start()

    def start_when(self, ready: Callable[[float], bool]) -> None:
        """Start what needs no GPU now, and the tick once `ready(timeout)` is true (waited for
        on a thread of its own; never after `stop`): the sampler must not tick, and the rules
        must not see an empty node, before the source knows its GPUs."""
        self._start_helpers()

        def wait_then_tick() -> None:
            while not self._stopped.is_set():
                if ready(0.5):
                    with self._lock:
                        if not self._stopped.is_set():
                            self.sampler.start()
                    return

        threading.Thread(target=wait_then_tick, name="start-sampler", daemon=True).start()

    def _start_helpers(self) -> None:
        if self.rules is not None:
            self.rules.start()  # its own thread: rules never hold up the tick
        if self.attribution is not None:
            self.attribution.start()
        if self.dra is not None:
            self.dra.start()
        if self.processes is not None:
            self.processes.start()
        if self.notifier is not None:
            self.notifier.start()

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
        self.sampler.stop()
        if self.rules is not None:
            self.rules.stop()
        if self.processes is not None:
            self.processes.stop()
        if self.notifier is not None:
            self.notifier.stop()
        if self.dra is not None:
            self.dra.stop()
        if self.attribution is not None:
            self.attribution.stop()


def assemble(
    config: Any,
    source: Source,
    errors: ErrorLog,
    wall_clock: Callable[[], float] = time.time,
) -> Assembly:
    """The daemon's pipeline for `config` (a `gpu_exporter.config.load.Config`); nothing started.

    Raises ValueError for broken input: RuleFileError, bad Alertmanager settings, and (first,
    before anything is built) CountersFileError for dcgm_compat.counters_file.
    """
    compat = _dcgm_compat(config)
    metrics = config.metrics
    export = ExportFilter(metrics.profile, metrics.include, metrics.exclude)
    sampler = Sampler(
        source, errors, interval=config.interval_seconds, wall_clock=wall_clock, export=export
    )
    sampler.add_processor("activity_time", ActivityTime().process)
    sampler.add_processor("classifier", classifier(config).process)
    # Reads only the NVML readings (XIDs, ECC, remapping, recovery action, fabric, up): its place
    # among the processors does not matter; before pod_info, like the other per-GPU families.
    sampler.add_processor("health_verdict", HealthLatch().process)
    dcgm = getattr(source, "dcgm", None)  # the NVML source's DCGM supplement, if any
    if dcgm is not None:
        sampler.add_producer(dcgm.producer())
    attribution = _attribution(config, wall_clock)
    pods = dra = None
    if attribution is not None:
        from gpu_exporter.collect.k8s.labels import PodsOfTick

        dra = _dra(config, attribution, wall_clock)
        pods = PodsOfTick(attribution) if dra is None else PodsOfTick(attribution, dra.resolved)
        sampler.add_processor("pod_info", pods.process)
        sampler.add_producer(attribution.producer())
        if dra is not None:
            sampler.add_producer(dra.producer())
        if config.kubernetes.mode == "labels":
            sampler.set_device_labels(pods.labels)
    processes = None
    if config.kubernetes.processes.enabled:
        from gpu_exporter.collect.k8s.process_attribution import ProcessAttribution

        # After pod_info: the holders are the ones this tick's pod labels come from.
        processes = ProcessAttribution(
            config.kubernetes.processes, pods.holders if pods is not None else dict
        )
        sampler.add_processor("pod_use", processes.process)
        sampler.add_producer(processes.producer())
        log.info(
            "per-process attribution from %s and the container runtime at %s",
            config.kubernetes.processes.proc_root,
            processes.runtime.socket,
        )
    rules, notifier = _alerting(config, sampler, export)
    if compat is not None:
        sampler.add_listener(compat)
    return Assembly(sampler, attribution, rules, notifier, compat, processes, dra)


def _dcgm_compat(config: Any) -> DcgmCompat | None:
    """/metrics/dcgm's renderer, when dcgm_compat.enabled: the default families, or those of
    its counters file (each row it does not serve logged once)."""
    if not config.dcgm_compat.enabled:
        return None
    from gpu_exporter.web.dcgm_compat.endpoint import DcgmCompat
    from gpu_exporter.web.dcgm_compat.selection import load_selection

    settings = config.dcgm_compat
    selection = load_selection(settings.counters_file, settings.strict)
    return DcgmCompat(compat_hostname(settings), selection)


def classifier(config: Any) -> Classifier:
    settings = config.classifier
    return Classifier(settings, window_seconds=settings.window(config.interval_seconds))


def compat_hostname(
    settings: DcgmCompatConfig, environ: Mapping[str, str] | None = None
) -> tuple[str, str] | None:
    """The node's label on /metrics/dcgm, as (name, value): the configured name, and
    $NODE_NAME, else the host's name, as its value; None when the label is left out."""
    if settings.hostname_label == "none":
        return None
    environ = os.environ if environ is None else environ
    return settings.hostname_label, node_name(environ) or socket.gethostname()


def _attribution(config: Any, clock: Callable[[], float]) -> PodAttribution | None:
    """kubelet PodResources client (refreshed on its own thread once started)."""
    if not config.kubernetes.active():
        return None
    from gpu_exporter.collect.k8s.attribution import PodAttribution

    k8s = config.kubernetes
    attribution = PodAttribution(k8s, clock=clock)
    log.info("pod attribution from %s (%s mode)", k8s.socket_path, k8s.mode)
    return attribution


def _dra(
    config: Any, attribution: PodAttribution, clock: Callable[[], float]
) -> DraAttribution | None:
    """DRA claims resolved through the node's ResourceSlices (read on their own thread once
    started), when `kubernetes.dra.enabled`."""
    settings = config.kubernetes.dra
    if not settings.enabled:
        return None
    from gpu_exporter.collect.k8s.dra_attribution import DraAttribution
    from gpu_exporter.collect.k8s.resource_slices import ResourceSlices

    slices = ResourceSlices(settings, config.kubernetes.grace_seconds, clock=clock)
    log.info("DRA attribution: ResourceSlices of drivers %s", ", ".join(settings.drivers))
    return DraAttribution(slices, config.kubernetes.grace_seconds)


def warn_unexported_reads(manager: RuleManager, export: ExportFilter) -> None:
    """A rule reading a family, or the part of one, that the metrics profile does not export
    sees none of it, as a Prometheus scraping /metrics would not: said once at start, naming
    the rule and what it misses."""
    for group in manager.evaluator.groups:
        for rule in (state.rule for state in group.rules):
            selectors = [
                (family, {m.name: m.value for m in matchers if m.op == "=" and m.name != NAME})
                for metric, matchers in promql.referenced_selectors(rule.expr)
                if metric is not None and (family := family_of(metric)) is not None
            ]
            read = {family for family, _ in selectors}
            misses = sorted(
                {
                    f"{family}{_shown(equal)} ({why})"
                    for family, equal in selectors
                    if (why := export.unexported_read(family, equal, read)) is not None
                }
            )
            if misses:
                log.warning(
                    "rule %s (%s) reads what metrics.profile %s does not export, and sees none "
                    "of it: %s (metrics.include exports a family whole whatever the profile)",
                    rule.name, rule.location, export.profile, "; ".join(misses),
                )  # fmt: skip


def _shown(equal: dict[str, str]) -> str:
    """The equality matchers of a selector, as PromQL writes them ("" for none)."""
    shown = ", ".join(f'{name}="{value}"' for name, value in sorted(equal.items()))
    return f"{{{shown}}}" if shown else ""


def _alerting(
    config: Any, sampler: Sampler, export: ExportFilter
) -> tuple[RuleManager | None, Notifier | None]:
    """Rule manager (if rules are enabled) and notifier (if Alertmanagers are configured)."""
    if not config.rules.enabled:
        return None, None
    notifier = None
    if config.alerting.alertmanagers:
        warn_label_mismatches(config.alerting.external_labels)
        notifier = Notifier(config.alerting, external_labels=config.external_labels())
    manager = rule_manager(config, notifier)
    manager.load()
    warn_unexported_reads(manager, export)
    sampler.add_listener(manager, exported_only=True)  # the rules see what Prometheus scrapes
    sampler.add_late_producer(manager.producer())
    if notifier is not None:
        from gpu_exporter.alerting.notify.metrics import notifier_producer

        sampler.add_late_producer(notifier_producer(notifier))
    if threading.current_thread() is threading.main_thread():
        # SIGHUP asks for a reload at the next tick (no work in the signal handler).
        signal.signal(signal.SIGHUP, lambda *_: manager.request_reload())
    return manager, notifier
