"""The simulated node around the GPUs of a scenario with `processes:`: its /proc
(`sim/procfs.py`) and its container runtime's CRI socket (`sim/cri.py`), kept in step with the
fake NVML's clock. `sim.install` starts one for such a scenario and `sim.uninstall` closes it;
the exporter is pointed at `proc_root` and `cri_socket_path` (also on the installed fake NVML).

In step how: each per-process NVML call syncs the /proc tree before it answers (so within a
tick, what the exporter maps is what NVML just listed), and a thread syncs both the tree and
the runtime's socket every `SYNC_SECONDS`, so the tree and the runtime's faults (down, garbage)
follow the clock between calls too. With a manual clock the thread only ever repeats what the
last sync wrote; tests that move the clock call `sync()` to see the new time at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpu_exporter.sim.cri import FakeCriRuntime
from gpu_exporter.sim.fake_nvml import FakeNvmlLib
from gpu_exporter.sim.procfs import FakeProcfs
from gpu_exporter.sim.spec import Scenario

__all__ = ["SYNC_SECONDS", "SimulatedNode"]

SYNC_SECONDS = 0.1

log = logging.getLogger(__name__)


class SimulatedNode:
    """The node's /proc and CRI runtime for `scenario`, on `clock` (scenario seconds). With
    `fake`, the fake NVML in this process: its per-process calls sync the tree first, and it
    carries the node's paths. Without, the node serves another process (bench/run_node.py)."""

    def __init__(
        self, scenario: Scenario, clock: Callable[[], float], fake: FakeNvmlLib | None = None
    ) -> None:
        self._clock = clock
        self.procfs = FakeProcfs(scenario, clock)
        try:
            self.cri = FakeCriRuntime(scenario, clock).start()
        except BaseException:
            self.procfs.close()
            raise
        self._fake = fake
        if fake is not None:
            fake.process_listeners.append(self.procfs.sync)
            fake.proc_root, fake.cri_socket_path = self.proc_root, self.cri_socket_path
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="sim-node", daemon=True)
        self._thread.start()

    @property
    def proc_root(self) -> str:
        """The directory to read as /proc."""
        return self.procfs.root

    @property
    def cri_socket_path(self) -> str:
        """The CRI runtime's unix socket (endpoint `unix://` + it)."""
        return self.cri.socket_path

    def sync(self) -> None:
        """Bring /proc and the runtime's socket to the clock's now."""
        t = self._clock()
        self.procfs.sync(t)
        self.cri.sync(t)

    def _follow(self) -> None:
        failing = ""  # what the last sync failed with: logged once, not ten times a second
        while not self._stopped.wait(SYNC_SECONDS):
            try:
                self.sync()
            except Exception as exc:  # keep following: the next sync may well succeed
                if repr(exc) != failing:
                    log.exception("the simulated node could not follow the clock")
                failing = repr(exc)
            else:
                failing = ""

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(5)
        if self._fake is not None and self.procfs.sync in self._fake.process_listeners:
            self._fake.process_listeners.remove(self.procfs.sync)
        self.cri.close()
        self.procfs.close()
