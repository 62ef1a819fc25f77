"""The NVML source's settings and their defaults, written once.

Importable without pynvml: the configuration layer (`gpu_exporter/config/load.py`) takes its `nvml:`
defaults from this dataclass, and tests/test_config.py fails if the two ever disagree.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gpu_exporter.model.activity import BY_DCGM_FIELD

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


# DCGM profiling field ids the exporter can watch, and the default set, in id order: the
# activity table's (model/activity.py, which says why some are opt-in).
DCGM_FIELDS = tuple(BY_DCGM_FIELD)
DCGM_DEFAULT_FIELDS = tuple(f for f, activity in BY_DCGM_FIELD.items() if activity.dcgm_default)
DCGM_MODES = ("off", "auto", "standalone", "embedded")  # config.DcgmConfig.mode spells them too


@dataclass(frozen=True)
class DcgmSettings:
    # off: never; auto: a host engine at `address` for GPUs without GPM, if libdcgm and the host
    # engine are there; standalone: the same, libdcgm required; embedded: a host engine inside
    # this process (root and CAP_SYS_ADMIN).
    mode: str = "off"
    # nv-hostengine's address: host, host:port (DCGM_HE_PORT_NUMBER 5555 by default) or
    # unix:/path/to/socket.
    address: str = "localhost:5555"
    fields: tuple[int, ...] = DCGM_DEFAULT_FIELDS
    connect_timeout_seconds: float = 1.0
    reconnect_initial_backoff_seconds: float = 2.0
    reconnect_max_backoff_seconds: float = 60.0


def add_dcgm_arguments(parser: argparse.ArgumentParser, address_default: str | None) -> None:
    """`--dcgm MODE` and `--dcgm-address`, for serve (None: the configuration's address) and
    diagnose."""
    parser.add_argument(
        "--dcgm",
        choices=DCGM_MODES,
        help="SM/Tensor/DRAM activity from DCGM for GPUs without GPM (dcgm.mode, "
        "docs/kubernetes.md); default off, auto on a simulated node with a DCGM host engine",
    )
    parser.add_argument(
        "--dcgm-address",
        default=address_default,
        metavar="ADDRESS",
        help=f"nv-hostengine address: host, host:port or unix:/path (default "
        f"{DcgmSettings.address})",
    )
