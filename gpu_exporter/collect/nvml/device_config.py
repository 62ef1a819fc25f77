"""A GPU's administrator settings, read once on demand (for `gpu-exporter diagnose`), never
per tick: the power management limit against its default and range, persistence mode, the
ECC mode and its pending value, application clocks against their defaults, the compute mode.

Each call goes through the GPU's choke point (`DeviceReader.call`), so NVML's answers mean
what they mean elsewhere: NOT_SUPPORTED makes that setting absent (listed in `unsupported`),
any other failure leaves it absent (listed in `failed`). The calls and their semantics are
those nvml.h documents (power and application clocks: Kepler or newer fully supported devices;
ECC mode: GPUs with ECC; persistence and compute mode: all products, persistence on Linux
only). Verified only against nvml.h and the fake NVML, not on hardware.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pynvml as N

if TYPE_CHECKING:
    from gpu_exporter.collect.nvml.device import DeviceReader

# nvmlComputeMode_t (nvml.h) -> a name; EXCLUSIVE_THREAD is deprecated there.
COMPUTE_MODE_NAMES: dict[int, str] = {
    N.NVML_COMPUTEMODE_DEFAULT: "default",
    N.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_thread",
    N.NVML_COMPUTEMODE_PROHIBITED: "prohibited",
    N.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process",
}


@dataclass(frozen=True)
class DeviceConfig:
    """What one GPU answered; None where it did not (see `unsupported` / `failed`)."""

    power_limit_watts: float | None = None  # the management limit set now
    power_default_limit_watts: float | None = None
    power_min_limit_watts: float | None = None
    power_max_limit_watts: float | None = None
    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None
    ecc_pending: bool | None = None  # after the next reboot
    application_sm_clock_mhz: int | None = None
    application_memory_clock_mhz: int | None = None
    default_application_sm_clock_mhz: int | None = None
    default_application_memory_clock_mhz: int | None = None
    compute_mode: str | None = None
    unsupported: tuple[str, ...] = ()  # NVML calls that answered NOT_SUPPORTED
    failed: tuple[str, ...] = ()  # NVML calls that failed otherwise

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def read_device_config(reader: DeviceReader) -> DeviceConfig:
    """The settings of the GPU `reader` holds; run it on that GPU's worker thread."""
    h = reader.handle
    unsupported: list[str] = []
    failed: list[str] = []

    def ask(call: str, *args: Any, key_suffix: str = "") -> Any:
        # Keys of their own: what the collectors learned stays theirs.
        key = f"config_{call}{key_suffix}"
        result = reader.call(key, getattr(N, call, None), h, *args)
        if result is None and call not in unsupported + failed:
            (unsupported if reader.is_unsupported(key) else failed).append(call)
        return result

    def watts(milliwatts: Any) -> float | None:
        return None if milliwatts is None else milliwatts / 1000.0

    limit = ask("nvmlDeviceGetPowerManagementLimit")
    default = ask("nvmlDeviceGetPowerManagementDefaultLimit")
    low, high = ask("nvmlDeviceGetPowerManagementLimitConstraints") or (None, None)
    persistence = ask("nvmlDeviceGetPersistenceMode")
    ecc_current, ecc_pending = ask("nvmlDeviceGetEccMode") or (None, None)
    app_sm = ask("nvmlDeviceGetApplicationsClock", N.NVML_CLOCK_SM)
    app_memory = ask("nvmlDeviceGetApplicationsClock", N.NVML_CLOCK_MEM, key_suffix="_mem")
    default_sm = ask("nvmlDeviceGetDefaultApplicationsClock", N.NVML_CLOCK_SM)
    default_memory = ask(
        "nvmlDeviceGetDefaultApplicationsClock", N.NVML_CLOCK_MEM, key_suffix="_mem"
    )
    mode = ask("nvmlDeviceGetComputeMode")
    return DeviceConfig(
        power_limit_watts=watts(limit),
        power_default_limit_watts=watts(default),
        power_min_limit_watts=watts(low),
        power_max_limit_watts=watts(high),
        persistence_mode=None if persistence is None else persistence == N.NVML_FEATURE_ENABLED,
        ecc_enabled=None if ecc_current is None else ecc_current == N.NVML_FEATURE_ENABLED,
        ecc_pending=None if ecc_pending is None else ecc_pending == N.NVML_FEATURE_ENABLED,
        application_sm_clock_mhz=app_sm,
        application_memory_clock_mhz=app_memory,
        default_application_sm_clock_mhz=default_sm,
        default_application_memory_clock_mhz=default_memory,
        compute_mode=None if mode is None else COMPUTE_MODE_NAMES.get(mode, f"unknown ({mode})"),
        unsupported=tuple(unsupported),
        failed=tuple(failed),
    )
