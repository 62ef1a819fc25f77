"""The largest value each number of a scenario may take, and why (docs/scenarios.md, "Limits").

A scenario's numbers end up in C types: NVML's unsigned ints of milliwatts, MHz and KB/s, its
unsigned long longs of bytes and counts (nvml.h), DCGM's int64 field values (dcgm_fields.h),
/proc's clock ticks, and the seconds a fake sleeps. A value past its type would overflow there
on every read (`round(inf)`, a ctypes field silently wrapping), so each is refused when the
file is loaded, the error naming the bound and the type it comes from. Where the hardware
bounds a quantity well inside its type (PCIe's generations, retired pages), that bound is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "BYTES",
    "CLOCK_MHZ",
    "COUNT",
    "CPU",
    "C_INT",
    "EVENT_DATA",
    "LATENCY_MS",
    "NUMA_NODE",
    "NVLINK_BYTES_PER_SECOND",
    "PCIE_BYTES_PER_SECOND",
    "PCIE_GENERATION",
    "PCIE_WIDTH",
    "RETIRED_PAGES",
    "SECONDS",
    "UINT",
    "WATTS",
    "Limit",
]


@dataclass(frozen=True)
class Limit:
    """The largest value a number may take (`value`, exact), and `why`: the bound in words with
    where it comes from, as the error says it ("2^64-1 bytes, NVML's unsigned long long")."""

    value: int | float
    why: str

    @property
    def clamp(self) -> float:
        """The largest float not past `value` (2^64-1 as a float is 2^64, one past the type):
        what time-varying values are clamped to after noise."""
        top = float(self.value)
        return top if top <= self.value else math.nextafter(top, 0.0)

    def problem(self, value: float) -> str:
        shown = str(value) if isinstance(value, int) else f"{value:g}"  # ints to the last digit
        return f"{shown} is more than {self.why}"


_U32 = 2**32 - 1
_U64 = 2**64 - 1

# Scenario time: seconds since the simulated driver loaded. 1e9 s (about 32 years) is past any
# driver's uptime, and keeps every time derived from it in range: DCGM's int64 microseconds
# since 1970, /proc's clock ticks, and what Python's sleep takes (about 9.2e9 s).
SECONDS = Limit(1e9, "1e9 s (about 32 years), longer than any driver stays loaded")
# A call's latency (`latency:`): one that takes longer than the daemon's longest interval
# (interval_seconds <= 3600) is a hang, which a `hang` fault simulates.
LATENCY_MS = Limit(3_600_000, "3600000 ms (an hour): a slower call is a `hang` fault")

# nvmlMemory_t's total/used, nvmlProcessInfo_t's usedGpuMemory: unsigned long long bytes.
BYTES = Limit(_U64, "2^64-1 bytes, NVML's unsigned long long")
# nvmlDeviceGetPowerUsage and the power limits: unsigned int milliwatts.
WATTS = Limit(_U32 / 1000, "4294967.295 W, NVML's unsigned int of milliwatts")
# nvmlDeviceGetClockInfo / GetMaxClockInfo: unsigned int MHz.
CLOCK_MHZ = Limit(_U32, "4294967295 MHz, NVML's unsigned int")
# nvmlDeviceGetPcieThroughput: unsigned int KB/s (read as KiB/s).
PCIE_BYTES_PER_SECOND = Limit(
    _U32 * 1024, "4398046510080 bytes/s, NVML's unsigned int of KB/s (nvmlDeviceGetPcieThroughput)"
)
# DCGM_FI_PROF_NVLINK_TX_BYTES / _RX_BYTES: int64 bytes per second (NVML's are counters that
# wrap, and GPM's doubles).
NVLINK_BYTES_PER_SECOND = Limit(
    2**63 - 1, "2^63-1 bytes/s, DCGM's int64 (DCGM_FI_PROF_NVLINK_TX_BYTES)"
)
# ECC and NVLink error counts: unsigned long long (nvmlDeviceGetTotalEccErrors, field values).
COUNT = Limit(_U64, "2^64-1, NVML's unsigned long long")
# PCIe replays, remapped rows, field ids: unsigned int.
UINT = Limit(_U32, "4294967295, NVML's unsigned int")
# nvmlSystemGetCudaDriverVersion, nvmlDeviceGetCudaComputeCapability, nvmlGpmMetricId_t: int.
C_INT = Limit(2**31 - 1, "2147483647, NVML's int")
# nvmlEventData_t's eventData (the XID): unsigned long long.
EVENT_DATA = Limit(_U64, "2^64-1, NVML's unsigned long long (nvmlEventData_t.eventData)")
# NVIDIA's A100 memory error management guide: page retirement "supported a maximum of 64
# retirements for the frame buffer" (each is listed by nvmlDeviceGetRetiredPages).
RETIRED_PAGES = Limit(64, "64, the most pages page retirement retires on a GPU")
# The current PCIe link can be no faster or wider than the device's maximum (`pcie:`).
PCIE_GENERATION = Limit(6, "6, the highest pcie.max_generation")
PCIE_WIDTH = Limit(32, "32 lanes, the widest pcie.max_width")
# Linux: NR_CPUS is at most 8192 (x86's MAXSMP), NODES_SHIFT at most 10 (1024 NUMA nodes).
CPU = Limit(8191, "8191, Linux's highest CPU number (NR_CPUS 8192 with MAXSMP)")
NUMA_NODE = Limit(1023, "1023, Linux's highest NUMA node (NODES_SHIFT 10)")
