"""Delivery of the daemon's own alerts to Alertmanager (API v2)."""

from gpu_exporter.alerting.notify.alertmanager import (
    AlertmanagerTarget,
    Notifier,
    NotifierSettings,
    NotifierStats,
    OutgoingAlert,
    TargetStats,
)

__all__ = [
    "AlertmanagerTarget",
    "Notifier",
    "NotifierSettings",
    "NotifierStats",
    "OutgoingAlert",
    "TargetStats",
]
