"""The notifier's counters as series (one per Alertmanager URL), names from the catalog."""

from __future__ import annotations

from collections.abc import Iterator

from gpu_exporter.notify.alertmanager import Notifier
from gpu_exporter.series import Producer, Series, series

# catalog family -> the TargetStats attribute it reports
_FAMILIES = (
    ("gpu_exporter_notifications_sent_total", "sent_total"),
    ("gpu_exporter_notifications_errors_total", "failed_total"),
    ("gpu_exporter_notifications_dropped_total", "dropped_total"),
    ("gpu_exporter_notifications_rejected_total", "rejected_total"),
    ("gpu_exporter_notifications_queue_length", "queue_length"),
)


def notifier_series(notifier: Notifier) -> Iterator[Series]:
    targets = notifier.stats().targets.values()
    for family, attribute in _FAMILIES:
        for target in targets:
            yield series(family, getattr(target, attribute), (("alertmanager", target.url),))


def notifier_producer(notifier: Notifier) -> Producer:
    return Producer("notifier", lambda: notifier_series(notifier), frozenset({"notifier"}))
