"""Settings an administrator changed and may have forgotten, read once from NVML after the
profile (gpu_exporter/collect/nvml/device_config.py): each check says what is set, what the board's
default is, and why it matters. A warning needs attention (exit status 1); a note is context.

The NVML calls behind them were verified only against nvml.h, not on hardware.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_exporter.collect.nvml.device_config import DeviceConfig

WARNING = "warning"
NOTE = "note"


@dataclass(frozen=True)
class ConfigFinding:
    setting: str
    level: str  # WARNING or NOTE
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"setting": self.setting, "level": self.level, "text": self.text}


def check_config(
    config: DeviceConfig, mig: dict[str, bool] | None, gpu: int
) -> list[ConfigFinding]:
    """The findings for one GPU's settings (`mig`: gpu_mig_mode's current and pending)."""
    out: list[ConfigFinding] = []
    out += _power_limit(config)
    if config.persistence_mode is False:
        out.append(
            ConfigFinding(
                "persistence_mode",
                WARNING,
                "persistence mode is off: the driver tears the GPU's state down whenever no "
                "process holds it, so each job's start waits for it again and settings can be "
                "lost; run nvidia-persistenced (or `sudo nvidia-smi -pm 1`)",
            )
        )
    if config.ecc_enabled is not None and config.ecc_pending is not None:
        if config.ecc_pending != config.ecc_enabled:
            now, then = _on(config.ecc_enabled), _on(config.ecc_pending)
            out.append(
                ConfigFinding(
                    "ecc_mode",
                    WARNING,
                    f"ECC is {now} but set to {then} at the next reboot: memory protection "
                    "and usable memory change then (`nvidia-smi -q -d ECC`)",
                )
            )
        elif not config.ecc_enabled:
            out.append(ConfigFinding("ecc_mode", NOTE, "ECC is off: memory errors go undetected"))
    out += _application_clocks(config, gpu)
    if mig is not None and mig["current"] != mig["pending"]:
        out.append(
            ConfigFinding(
                "mig_mode",
                WARNING,
                f"MIG mode is {_on(mig['current'])} but {_on(mig['pending'])} is pending: it "
                "takes effect at the next GPU reset or reboot",
            )
        )
    mode = config.compute_mode
    if mode == "prohibited":
        out.append(
            ConfigFinding(
                "compute_mode",
                WARNING,
                "compute mode is Prohibited: no CUDA process can use this GPU "
                f"(`sudo nvidia-smi -c DEFAULT -i {gpu}`)",
            )
        )
    elif mode not in (None, "default"):
        out.append(
            ConfigFinding(
                "compute_mode",
                NOTE,
                f"compute mode is {mode}: one process at a time (time-slicing several pods "
                "needs Default; MPS needs Exclusive_Process)",
            )
        )
    return out


def _power_limit(config: DeviceConfig) -> list[ConfigFinding]:
    limit, default = config.power_limit_watts, config.power_default_limit_watts
    top = config.power_max_limit_watts
    if limit is None or default is None:
        return []
    if limit < default:
        most = f", the board allows up to {top:g} W" if top is not None else ""
        return [
            ConfigFinding(
                "power_limit",
                WARNING,
                f"power limit lowered to {limit:g} W below its default {default:g} W{most}: "
                "busy work runs at lower clocks (`nvidia-smi -q -d POWER`; "
                f"`sudo nvidia-smi -pl {default:g}` restores it)",
            )
        ]
    if limit > default:
        return [
            ConfigFinding(
                "power_limit",
                NOTE,
                f"power limit raised to {limit:g} W above its default {default:g} W",
            )
        ]
    return []


def _application_clocks(config: DeviceConfig, gpu: int) -> list[ConfigFinding]:
    pairs = (
        ("SM", config.application_sm_clock_mhz, config.default_application_sm_clock_mhz),
        (
            "memory",
            config.application_memory_clock_mhz,
            config.default_application_memory_clock_mhz,
        ),
    )
    changed = [
        f"{name} {now} MHz (default {default} MHz)"
        for name, now, default in pairs
        if now is not None and default is not None and now != default
    ]
    if not changed:
        return []
    return [
        ConfigFinding(
            "application_clocks",
            WARNING,
            f"application clocks changed from their defaults: {', '.join(changed)}; the GPU "
            f"boosts from these (`sudo nvidia-smi -rac -i {gpu}` resets them)",
        )
    ]


def _on(enabled: bool) -> str:
    return "on" if enabled else "off"


def config_json(config: DeviceConfig | str | None, findings: list[ConfigFinding]) -> Any:
    """The report's `config` entry: the settings read (or why none were) and the findings."""
    if config is None or isinstance(config, str):
        return {"settings": None, "unavailable": config or "not read", "findings": []}
    return {
        "settings": config.to_dict(),
        "unavailable": None,
        "findings": [f.to_dict() for f in findings],
    }
