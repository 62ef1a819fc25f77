"""The NVML source's settings and their defaults, written once.

Importable without pynvml: the configuration layer (`gpu_exporter/config.py`) takes its `nvml:`
defaults from this dataclass, and tests/test_config.py fails if the two ever disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

# The default deadline is also capped at this share of the sampling interval, so a tick's reads
# always finish before the next tick starts.
DEADLINE_SHARE_OF_INTERVAL = 0.8


@dataclass
class NvmlSettings:
    device_deadline_seconds: float = 0.8
    slow_refresh_seconds: float = 30.0
    recovery_initial_backoff_seconds: float = 2.0
    recovery_max_backoff_seconds: float = 300.0
    hang_quarantine_seconds: float = 60.0
    max_abandoned_threads_per_device: int = 2
    gpm: bool = True  # the gpm collector (Hopper and newer)
    pcie_throughput_fallback: bool = True  # the pcie collector's 20 ms throughput call
    xid_events: bool = True  # the xid collector and its event thread
    # More GPUs than this is refused at start with a clear error (each GPU costs a reader thread).
    max_devices: int = 64


def default_deadline(interval_seconds: float) -> float:
    """The per-GPU deadline when none is configured: the default, or less for short intervals."""
    return min(NvmlSettings.device_deadline_seconds, DEADLINE_SHARE_OF_INTERVAL * interval_seconds)
