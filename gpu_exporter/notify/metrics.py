"""The notifier's counters as Prometheus families (one series per Alertmanager URL)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpu_exporter.catalog import BY_NAME
from gpu_exporter.notify.alertmanager import Notifier

_COUNTERS = (
    ("gpu_exporter_notifications_sent_total", "sent_total"),
    ("gpu_exporter_notifications_errors_total", "failed_total"),
    ("gpu_exporter_notifications_dropped_total", "dropped_total"),
    ("gpu_exporter_notifications_rejected_total", "rejected_total"),
)


@dataclass(eq=False)  # registries key collectors by identity
class NotifierCollector:
    notifier: Notifier

    def collect(self) -> Iterator[Metric]:
        targets = self.notifier.stats().targets.values()
        for name, attribute in _COUNTERS:
            family = CounterMetricFamily(
                name.removesuffix("_total"), BY_NAME[name].help, labels=["alertmanager"]
            )
            for target in targets:
                family.add_metric([target.url], getattr(target, attribute))
            yield family
        queue = GaugeMetricFamily(
            "gpu_exporter_notifications_queue_length",
            BY_NAME["gpu_exporter_notifications_queue_length"].help,
            labels=["alertmanager"],
        )
        for target in targets:
            queue.add_metric([target.url], target.queue_length)
        yield queue
