"""A fake /proc for the simulated node: `<root>/<pid>/cgroup` and `<root>/<pid>/stat` of the
scenario's processes that run at the current scenario time, under a private temporary
directory (`FakeProcfs.root`), which the exporter reads as it would the host's /proc.

In step with scenario time: `sync(t)` writes the entries of time t. The fake NVML calls it at
the start of each per-process call (`FakeNvmlLib.process_listeners`), so what the exporter
maps right after a call is the /proc of the moment the call listed; the node's thread
(`sim/node.py`) also calls it a few times a second, so the tree follows the clock without
calls. An entry changes only when the process at that PID does (PID reuse) or a fault starts or
ends, so a sync between the same two such moments as the last one (and no test fault changed
since) has nothing to do and returns at once: a tick makes several per-process calls per GPU.
Each file is replaced whole (rename over it), so a reader sees an old or a new file,
never a torn one; two files of one entry may come from two processes for an instant after a
PID is reused, as on a real node (the start time in `stat` tells them apart).

Faults (scenario `proc_vanished` / `proc_unreadable`, or `vanish()` / `deny()` from tests):
a vanished file is absent (a process that exits between the exporter's reads of its two
files); a whole vanished entry is no directory at all (one that exits before the read); an
unreadable file answers EACCES (PermissionError) to every reader, root included: it is a
symlink to a write-only sysctl (/proc/sys/vm/drop_caches, mode 0200; the kernel checks
/proc/sys permissions against the owner bits even for root), else, where that is not
refused, a file of mode 000 (refused to readers without CAP_DAC_OVERRIDE).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter.collect.k8s.processes import HOST_PID_NAMESPACE
from gpu_exporter.sim.processes import PROC_FILES, USER_HZ, ProcessSpec
from gpu_exporter.sim.spec import Scenario

__all__ = ["FakeProcfs", "entries", "stat_line"]

# Write-only sysctls: opening one to read is refused (EACCES) even to root.
_DENIED_TARGETS = ("/proc/sys/vm/drop_caches", "/proc/sys/vm/compact_memory")


@dataclass(frozen=True)
class _File:
    text: str | None  # None: absent
    denied: bool = False


def stat_line(proc: ProcessSpec) -> str:
    """/proc/<pid>/stat of a process, as proc(5) lays it out (52 fields); field 22 is its start
    time in clock ticks since boot. The other numbers are those of a sleeping multi-threaded
    Python process; the command name is in parentheses as the kernel writes it (it may hold
    spaces and parentheses itself: a reader splits at the last ')')."""
    pid = proc.pid
    fields: list[object] = [
        pid, f"({proc.name})", "S", 1, pid, pid, 0, -1, 4194560,  # ppid, pgrp, session, tty..
        48213, 0, 12, 0,  # minflt, cminflt, majflt, cmajflt
        31 * USER_HZ, 4 * USER_HZ, 0, 0,  # utime, stime, cutime, cstime
        20, 0, 42, 0,  # priority, nice, num_threads, itrealvalue
        proc.start_time,  # 22: starttime
        38_654_705_664, 524_288, 18_446_744_073_709_551_615,  # vsize, rss (pages), rsslim
        1, 1, 0, 0, 0,  # startcode, endcode, startstack, kstkesp, kstkeip
        0, 0, 16_781_312, 134_235_650, 0,  # signal, blocked, sigignore, sigcatch, wchan
        0, 0, 17, 3, 0, 0, 0, 0, 0,  # nswap, cnswap, exit_signal, processor .. cguest_time
        0, 0, 0, 0, 0, 0, 0,  # start_data .. env_end (0 to readers that may not trace it)
        0,  # 52: exit_code
    ]  # fmt: skip
    return " ".join(map(str, fields)) + "\n"


def _denied_target() -> str | None:
    """A path that refuses this process a read with EACCES, if there is one."""
    for path in _DENIED_TARGETS:
        try:
            with open(path, "rb"):
                pass
        except PermissionError:
            return path
        except OSError:
            continue
    return None


class FakeProcfs:
    """The tree; `root` is the directory the exporter reads as /proc."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float]) -> None:
        self._scenario = scenario
        self._clock = clock
        self._base = Path(tempfile.mkdtemp(prefix="sim-proc-"))
        self.root = str(self._base / "proc")
        os.mkdir(self.root)
        self._scratch = self._base / "scratch"  # files are made here, then renamed into place
        os.mkdir(self._scratch)
        self._denied_to = _denied_target()
        self._lock = threading.Lock()
        self._written: dict[int, dict[str, _File]] = {}
        self._vanished: dict[int, frozenset[str]] = {}  # tests' faults, beside the scenario's
        self._denied: dict[int, frozenset[str]] = {}
        self._serial = 0
        self._closed = False
        self.syncs = 0
        os.makedirs(os.path.join(self.root, "self", "ns"))
        self.set_pid_namespace(HOST_PID_NAMESPACE)
        # Where the tree can change: each process's [from, until) and each proc fault's ends.
        self._changes = _change_times(scenario)
        self._tests_faults = 0  # bumped by vanish, deny and restore
        self._synced: tuple[int, int] | None = None  # (span of _changes, _tests_faults) written
        self.sync()

    # -- tests' faults ---------------------------------------------------------------------

    def vanish(self, pid: int, files: Iterable[str] = PROC_FILES) -> None:
        """Make these files of /proc/<pid> absent (all: the directory) until `restore`."""
        with self._lock:
            self._vanished[pid] = _files(files)
            self._tests_faults += 1
        self.sync()

    def deny(self, pid: int, files: Iterable[str] = PROC_FILES) -> None:
        """Make these files of /proc/<pid> answer EACCES until `restore`."""
        with self._lock:
            self._denied[pid] = _files(files)
            self._tests_faults += 1
        self.sync()

    def restore(self, pid: int) -> None:
        """Undo `vanish` and `deny` for that PID (the scenario's faults still hold)."""
        with self._lock:
            self._vanished.pop(pid, None)
            self._denied.pop(pid, None)
            self._tests_faults += 1
        self.sync()

    def set_pid_namespace(self, link: str) -> None:
        """Make `self/ns/pid` read `link`: the host's namespace, or (a test's fault) another,
        as the reader sees it from a container without hostPID."""
        staged = str(self._scratch / "ns.pid")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        os.symlink(link, staged)  # dangling, as procfs' magic links read
        os.replace(staged, os.path.join(self.root, "self", "ns", "pid"))

    @property
    def denies_root(self) -> bool:
        """Whether an unreadable file refuses root too (a write-only sysctl to point at)."""
        return self._denied_to is not None

    # -- the tree ----------------------------------------------------------------------------

    def sync(self, t: float | None = None) -> None:
        """Write the tree of scenario time `t` (default: the clock's now)."""
        t = self._clock() if t is None else t
        with self._lock:
            if self._closed:
                return  # a late caller after uninstall: nothing to write into
            self.syncs += 1
            synced = (bisect.bisect_right(self._changes, t), self._tests_faults)
            if synced == self._synced:
                return  # nothing started or ended since the last sync
            wanted = self._wanted(t)
            for pid in self._written.keys() - wanted.keys():
                self._remove(pid)
            for pid, files in wanted.items():
                if self._written.get(pid) != files:
                    self._write(pid, files)
            self._synced = synced

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._written.clear()
            shutil.rmtree(self._base, ignore_errors=True)

    def _wanted(self, t: float) -> dict[int, dict[str, _File]]:
        """pid -> file -> what it holds at `t` (an entry whose files all vanished: none)."""
        vanished = {pid: set(files) for pid, files in self._vanished.items()}
        denied = {pid: set(files) for pid, files in self._denied.items()}
        for fault in self._scenario.faults:
            if fault.kind in ("proc_vanished", "proc_unreadable") and fault.active(t):
                into = vanished if fault.kind == "proc_vanished" else denied
                into.setdefault(fault.pid, set()).update(fault.files)
        wanted: dict[int, dict[str, _File]] = {}
        for proc in self._scenario.processes:
            if not proc.running(t) or proc.pid in wanted:
                continue  # one process per PID at a time (the scenario checks it)
            gone = vanished.get(proc.pid, set())
            if gone >= set(PROC_FILES):
                continue
            texts = {"cgroup": proc.cgroup, "stat": stat_line(proc)}
            wanted[proc.pid] = {
                name: _File(None) if name in gone else _File(text, name in denied.get(proc.pid, ()))
                for name, text in texts.items()
            }
        return wanted

    def _write(self, pid: int, files: dict[str, _File]) -> None:
        directory = os.path.join(self.root, str(pid))
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)
        for name, file in files.items():
            path = os.path.join(directory, name)
            if file.text is None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            self._serial += 1
            staged = str(self._scratch / f"{pid}.{name}.{self._serial}")
            if file.denied and self._denied_to is not None:
                os.symlink(self._denied_to, staged)
            else:
                with open(staged, "w", encoding="utf-8") as out:
                    out.write(file.text)
                os.chmod(staged, 0o000 if file.denied else 0o444)
            os.replace(staged, path)  # atomic: a reader sees the old file or the new one
        self._written[pid] = files

    def _remove(self, pid: int) -> None:
        shutil.rmtree(os.path.join(self.root, str(pid)), ignore_errors=True)
        del self._written[pid]


def _change_times(scenario: Scenario) -> list[float]:
    """The scenario times at which /proc can change, sorted: processes run and proc faults hold
    in [from, until), so two times with as many of these at or before them see one tree."""
    times: set[float] = set()
    for proc in scenario.processes:
        times.add(proc.start)
        if proc.until is not None:
            times.add(proc.until)
    for fault in scenario.faults:
        if fault.kind in ("proc_vanished", "proc_unreadable"):
            times.add(fault.at)
            if fault.until is not None:
                times.add(fault.until)
    return sorted(times)


def _files(names: Iterable[str]) -> frozenset[str]:
    chosen = frozenset(names)
    unknown = chosen - set(PROC_FILES)
    if unknown or not chosen:
        raise ValueError(f"files of /proc/<pid> the fake writes: {', '.join(PROC_FILES)}")
    return chosen


def entries(root: str) -> Collection[int]:
    """The PIDs that have an entry under `root` now (for tests and tools)."""
    return sorted(int(name) for name in os.listdir(root) if name.isdigit())
