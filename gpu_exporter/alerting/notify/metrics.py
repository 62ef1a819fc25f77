"""The notifier's counters as series (one per Alertmanager URL), names from the catalog."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from gpu_exporter.alerting.notify.alertmanager import Notifier, TargetStats
from gpu_exporter.model.series import Producer, Series, series

# catalog family -> the TargetStats attribute it reports
_FAMILIES = (
    ("gpu_exporter_notifications_sent_total", "sent_total"),
    ("gpu_exporter_notifications_dropped_total", "dropped_total"),
    ("gpu_exporter_notifications_queue_length", "queue_length"),
)
# catalog family with a `reason` label -> the TargetStats mapping (reason -> count) it reports
_BY_REASON = (
    ("gpu_exporter_notifications_errors_total", "failed_by_reason"),
    ("gpu_exporter_notifications_rejected_total", "rejected_by_reason"),
)


def notifier_series(notifier: Notifier) -> Iterator[Series]:
    targets = notifier.stats().targets.values()
    for family, attribute in _FAMILIES:
        for target in targets:
            yield series(family, getattr(target, attribute), (("alertmanager", target.url),))
    for family, attribute in _BY_REASON:
        for target in targets:
            yield from _by_reason(family, target, getattr(target, attribute))


def _by_reason(family: str, target: TargetStats, counts: Mapping[str, int]) -> Iterator[Series]:
    # Every reason from the start, at 0 until it happens, so rate() sees the first one.
    for reason, count in counts.items():
        yield series(family, count, (("alertmanager", target.url), ("reason", reason)))


def notifier_producer(notifier: Notifier) -> Producer:
    return Producer("notifier", lambda: notifier_series(notifier), frozenset({"notifier"}))
