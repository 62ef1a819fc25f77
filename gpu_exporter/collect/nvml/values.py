"""Decoding NVML's answers: error names, field-value unions, PCI bus ids.

A leaf module (pynvml only), shared by the choke point, the collectors and the topology reader.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml as N

_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


def binding(name: str) -> Callable[..., Any] | None:
    """A pynvml wrapper that older nvidia-ml-py releases lack, or None (same as an old driver)."""
    return getattr(N, name, None)


def error_name(exc: BaseException) -> str:
    """`NVMLError_NotSupported` -> `NotSupported`; an unnamed code -> `code_N`."""
    name = type(exc).__name__
    if name == "NVMLError":
        return f"code_{getattr(exc, 'value', 'unknown')}"
    return name.removeprefix("NVMLError_")


def return_code_name(code: int) -> str:
    """The error name of a bare NVML return code (per-field and per-GPM-metric results)."""
    return error_name(N.NVMLError(code))


def field_value(value: Any) -> float:
    """The union member `valueType` says is valid (c_nvmlFieldValue_t)."""
    member = _VALUE_MEMBERS.get(value.valueType, "ullVal")
    return float(getattr(value.value, member))


def normalise_bus_id(bus_id: str) -> str:
    """NVML's `00000000:18:00.0` -> sysfs/kubelet form `0000:18:00.0` (lower case)."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain[-4:]}:{rest}".lower()
