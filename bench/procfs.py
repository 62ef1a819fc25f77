"""CPU time, resident memory, threads and open file descriptors of a process, from
/proc/<pid>/stat, /proc/<pid>/status and /proc/<pid>/fd (proc(5))."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
KIB = 1024


@dataclass(frozen=True)
class CpuTimes:
    user_seconds: float
    system_seconds: float

    @property
    def total(self) -> float:
        return self.user_seconds + self.system_seconds


@dataclass(frozen=True)
class Memory:
    rss_bytes: int  # VmRSS
    hwm_bytes: int  # VmHWM: peak resident set size

    @property
    def rss_mib(self) -> float:
        return self.rss_bytes / KIB / KIB

    @property
    def hwm_mib(self) -> float:
        return self.hwm_bytes / KIB / KIB


def parse_stat(text: str, clock_ticks: int = CLOCK_TICKS) -> CpuTimes:
    """utime and stime (fields 14 and 15 of proc(5)) in seconds.

    The command name (field 2) is in parentheses and may itself contain spaces and
    parentheses, so the fields are counted from the last ')'.
    """
    _, paren, rest = text.rpartition(")")
    if not paren:
        raise ValueError("not a /proc/<pid>/stat line: no ')'")
    fields = rest.split()  # fields[0] is field 3 (state)
    if len(fields) < 13:
        raise ValueError(f"not a /proc/<pid>/stat line: {len(fields) + 2} fields")
    utime, stime = int(fields[11]), int(fields[12])
    return CpuTimes(utime / clock_ticks, stime / clock_ticks)


def parse_status(text: str) -> Memory:
    """VmRSS and VmHWM from /proc/<pid>/status (given in kB, i.e. KiB)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if sep and key in ("VmRSS", "VmHWM"):
            number, _, unit = rest.strip().partition(" ")
            if unit.strip() != "kB":
                raise ValueError(f"{key}: unexpected unit {unit!r}")
            values[key] = int(number) * KIB
    missing = {"VmRSS", "VmHWM"} - values.keys()
    if missing:
        raise ValueError(f"missing from status: {', '.join(sorted(missing))}")
    return Memory(values["VmRSS"], values["VmHWM"])


def parse_threads(text: str) -> int:
    """The `Threads:` line of /proc/<pid>/status: the process' thread count."""
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if sep and key == "Threads":
            return int(rest.strip())
    raise ValueError("missing from status: Threads")


@dataclass(frozen=True)
class Probe:
    """Reads one process' counters; `pid` may be "self"."""

    pid: int | str
    root: Path = Path("/proc")

    def cpu(self) -> CpuTimes:
        return parse_stat((self.root / str(self.pid) / "stat").read_text())

    def memory(self) -> Memory:
        return parse_status((self.root / str(self.pid) / "status").read_text())

    def threads(self) -> int:
        return parse_threads((self.root / str(self.pid) / "status").read_text())

    def open_fds(self) -> int:
        """Entries of /proc/<pid>/fd: one per open file descriptor (sockets and pipes too).
        Listing our own process' folder shows the descriptor the listing itself holds open
        while it reads; that one is not counted."""
        entries = len(os.listdir(self.root / str(self.pid) / "fd"))
        own = self.root == Path("/proc") and self.pid in ("self", os.getpid())
        return entries - 1 if own else entries
