"""Pod attribution's default settings, written once and importable without grpc.

`gpu_exporter.collect.k8s.attribution.AttributionSettings` and the `kubernetes:` section of the
configuration (`gpu_exporter/config/load.py`) both take their defaults from here; the config layer
must not import grpc just to know them.
"""

from __future__ import annotations

SOCKET_PATH = "/var/lib/kubelet/pod-resources/kubelet.sock"
RESOURCE_NAMES: tuple[str, ...] = ("nvidia.com/gpu",)
RESOURCE_PREFIXES: tuple[str, ...] = ("nvidia.com/mig-",)  # every MIG profile's resource
REFRESH_SECONDS = 10.0
TIMEOUT_SECONDS = 2.0
# After a failed refresh the last known pods stay on their GPUs until this many refresh
# intervals after the last success: one kubelet hiccup must not drop every pod label at once
# (each series would end and start again), while a pod that finished during a long outage
# must not stay attributed for long.
STALE_AFTER_REFRESHES = 3
