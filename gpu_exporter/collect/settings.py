"""The settings of what reads the GPUs, one pydantic model per section of the configuration,
each default with its reason.

Light on purpose (pydantic and this folder's tables, no pynvml, libdcgm or grpc): the
configuration (`gpu_exporter/config/load.py`) composes these models, and the sources are built
from the validated sections themselves.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pydantic import Field, model_validator

from gpu_exporter.model.activity import BY_DCGM_FIELD
from gpu_exporter.support.validation import SettingsModel

# How long a tick waits for a GPU's reads when no deadline is set (`default_deadline`): most of
# the default one-second interval, so that a slow GPU still makes its tick.
DEFAULT_DEVICE_DEADLINE_SECONDS = 0.8
# The default deadline is also capped at this share of the sampling interval, so a tick's reads
# always finish before the next tick starts.
DEADLINE_SHARE_OF_INTERVAL = 0.8


def default_deadline(interval_seconds: float) -> float:
    """The per-GPU deadline when none is configured: the default, or less for short intervals."""
    return min(DEFAULT_DEVICE_DEADLINE_SECONDS, DEADLINE_SHARE_OF_INTERVAL * interval_seconds)


# `Field(default=...)` by keyword throughout: type checkers read a field's default from that
# keyword only (PEP 681), so a positional default would make the field look required.


class NvmlConfig(SettingsModel):
    """`nvml:`, the NVML source's settings (gpu_exporter/collect/nvml/source.py)."""

    # A GPU that has not answered its reads by then is down for this tick, so one hung GPU
    # cannot hold up the others. None: `default_deadline` of the sampling interval (`deadline`);
    # the configuration refuses one that is not shorter than the interval.
    device_deadline_seconds: float | None = Field(default=None, gt=0, le=60)
    # What changes only when an administrator changes it (max clocks, PCIe max link, ECC mode,
    # NVLink state, retired pages) is read this often, not every tick.
    slow_refresh_seconds: float = Field(default=30.0, ge=1, le=86400)
    # After a lost GPU or driver (GPU_IS_LOST): NVML is initialised again after this, doubling
    # up to the maximum, so a GPU gone for good costs one re-init every 5 minutes, not one a
    # tick.
    recovery_initial_backoff_seconds: float = Field(default=2.0, gt=0, le=3600)
    recovery_max_backoff_seconds: float = Field(default=300.0, gt=0, le=86400)
    # A call that hung past the deadline is skipped on that GPU for this long (its thread is
    # abandoned: a ctypes call cannot be cancelled); also how long NVML's start is waited for
    # before it is tried again (nvmlInit without persistence mode takes seconds per GPU).
    hang_quarantine_seconds: float = Field(default=60.0, gt=0, le=86400)
    gpm: bool = True  # the gpm collector: SM/Tensor/DRAM activity from GPM (Hopper and newer)
    # The pcie collector's 20 ms throughput call, on drivers without PCIe byte counters.
    pcie_throughput_fallback: bool = True
    xid_events: bool = True  # the xid collector and its event thread
    # More GPUs than this is refused at start with a clear error (each GPU costs a reader thread).
    max_devices: int = Field(default=64, ge=1, le=4096)

    @model_validator(mode="after")
    def _backoff_order(self) -> NvmlConfig:
        if self.recovery_max_backoff_seconds < self.recovery_initial_backoff_seconds:
            raise ValueError(
                "recovery_max_backoff_seconds is below recovery_initial_backoff_seconds"
            )
        return self

    def deadline(self, interval_seconds: float) -> float:
        """The per-GPU deadline at this sampling interval: the one set, else the default."""
        if self.device_deadline_seconds is not None:
            return self.device_deadline_seconds
        return default_deadline(interval_seconds)


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
