"""Delivery of the daemon's own alerts to Alertmanager (API v2)."""

from gpu_exporter.alerting.notify.alertmanager import (
    Delivery,
    Notifier,
    NotifierStats,
    OutgoingAlert,
    TargetStats,
)

__all__ = [
    "Delivery",
    "Notifier",
    "NotifierStats",
    "OutgoingAlert",
    "TargetStats",
]
