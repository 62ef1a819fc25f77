"""A pod's container, as the kubelet's PodResources API names it: the holder of a device.

Its own module so that both the device-plugin map (attribution.py) and the DRA types (dra.py),
which attribution.py reads, can name it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class PodRef:
    namespace: str
    pod: str
    container: str
