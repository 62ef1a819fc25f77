"""The choke point every NVML call goes through, and NVML's error semantics as the exporter's.

`NvmlCalls` (the source's own calls, the topology reader and the XID thread) and
`DeviceReader.call` (per GPU, `device.py`) follow one rule for counting a failure in
gpu_exporter_errors_total (`count_failure`):
- NOT_SUPPORTED is an answer, not a failure: never counted; the quantity is then absent, never 0.
- NOT_SUPPORTED / FUNCTION_NOT_FOUND / NO_PERMISSION / ARGUMENT_VERSION_MISMATCH will not
  change while the driver stays loaded: a GPU's reader learns them once and never asks again.
- GPU_IS_LOST aborts the GPU's tick (DeviceLostError); the driver gone or replaced under us
  (LibRmVersionMismatch, Uninitialized, DriverNotLoaded) aborts it too (DriverGoneError), and
  the source re-initialises NVML.
- anything else is counted and skipped for this tick only.

The count's `source` label: "nvml", the field naming the call, for every call of the GPUs'
readers, the source's start and recovery and the XID thread; "gpm" for a GPM metric that
failed inside a successful nvmlGpmMetricsGet; "topology" for the topology reader's calls
(`topology.py`). The topology reader keeps a source of its own on purpose: its keys (pci_info,
nvlink_state, ...) are also the per-GPU readers' keys, and it runs only at start and after a
re-init, so under "nvml" its one-off failures would be indistinguishable from a GPU's per-tick
ones. A topology reader that raises as a whole is counted by the source as source="nvml",
field="topology", error="exception".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml as N

from gpu_exporter.collect.nvml.values import error_name
from gpu_exporter.collect.source import ErrorLog

SOURCE = "nvml"


# Errors that will not change while the driver stays loaded: learn them, stop asking.
# A struct-version mismatch means this driver wants an older struct: same as a missing call.
PERMANENT = (
    N.NVMLError_NotSupported,
    N.NVMLError_FunctionNotFound,
    N.NVMLError_NoPermission,
    N.NVMLError_ArgumentVersionMismatch,
)


# Errors that mean the driver itself is gone or was replaced under us (nvml.h: a reload needs a
# fresh nvmlInit): no device can answer until NVML is shut down and initialised again.
DRIVER_GONE = (
    N.NVMLError_LibRmVersionMismatch,
    N.NVMLError_Uninitialized,
    N.NVMLError_DriverNotLoaded,
)


class DeviceReadAborted(Exception):
    """The choke point's control flow: this GPU's tick ends here (not a collector's bug)."""


class DeviceLostError(DeviceReadAborted):
    """NVML answered GPU_IS_LOST: the GPU fell off the bus or the driver lost it."""

    def __init__(self, call: str) -> None:
        super().__init__(f"GPU lost (NVML GPU_IS_LOST from {call})")
        self.call = call


class DriverGoneError(DeviceLostError):
    """The driver was unloaded or upgraded under the process: re-initialise NVML."""

    def __init__(self, call: str, error: str) -> None:
        Exception.__init__(self, f"NVML driver unavailable ({error} from {call})")
        self.call = call


class DeviceUnresponsiveError(DeviceReadAborted):
    """Every call of a tick failed: the GPU is not really answering."""


class GoneError(Exception):
    """A call answered an error its caller named as meaning "not there" (`gone`): an empty MIG
    slot, a MIG device handle a reconfiguration destroyed. Not counted, not learned: the caller
    acts on it."""

    def __init__(self, key: str, error: str) -> None:
        super().__init__(f"{error} from {key}")
        self.key, self.error = key, error


class TickAbandonedError(DeviceReadAborted):
    """This tick missed its deadline and a newer tick owns the device now."""


def count_failure(errors: ErrorLog, source: str, key: str, exc: N.NVMLError) -> None:
    """The one rule for counting a failed NVML call in gpu_exporter_errors_total."""
    if not isinstance(exc, N.NVMLError_NotSupported):  # an answer, not a failure
        errors.add(source, key, error_name(exc))


class NvmlCalls:
    """The choke point for calls outside a GPU's tick: the source's start and recovery, the
    topology reader, the XID thread. Never learns or quarantines (these calls are rare)."""

    def __init__(self, errors: ErrorLog, source: str = SOURCE) -> None:
        self.errors = errors
        self.source = source

    def attempt(
        self,
        key: str,
        fn: Callable[..., Any] | None,
        *args: Any,
        expected: tuple[type[N.NVMLError], ...] = (),
    ) -> tuple[Any, str]:
        """(result, "") on success, else (None, the error's name); `expected` errors are part
        of the protocol (a wait timing out, probing past the last link) and not counted."""
        if fn is None:  # this nvidia-ml-py predates the call: same as an old driver
            return None, "FunctionNotFound"
        try:
            return fn(*args), ""
        except expected as exc:
            return None, error_name(exc)
        except N.NVMLError as exc:
            count_failure(self.errors, self.source, key, exc)
            return None, error_name(exc)

    def call(self, key: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """The result, or None when the call failed (counted as `count_failure` says)."""
        return self.attempt(key, fn, *args)[0]

    def run(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """The result; a failure is counted, then raised for a caller that must stop there."""
        try:
            return fn(*args)
        except N.NVMLError as exc:
            count_failure(self.errors, self.source, key, exc)
            raise
