#!/usr/bin/env python3
"""Serve a scenario's node around its GPUs from a process of its own, as a real node does.

    python bench/run_node.py --scenario FILE --epoch UNIX_SECONDS --ready FILE

The kubelet's PodResources socket (the scenario's `pods:`), the container runtime's CRI socket
and the /proc tree (its `processes:`), all at scenario time `now - epoch`, the clock that
`bench/run_daemon.py --epoch` gives the fake NVML. `serve --simulate` runs these in the
daemon's own process, where the fakes' gRPC servers (grpcio, about 26 MiB) and threads would
be counted as the daemon's; the peer benchmark's shipped configuration runs them here instead.
When they listen, `--ready` gets a JSON object with `kubelet_socket`, `runtime_socket` and
`proc_root`; SIGTERM or SIGINT stops it.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpu_exporter import sim  # noqa: E402
from gpu_exporter.sim.kubelet import start_for  # noqa: E402
from gpu_exporter.sim.node import SimulatedNode  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", required=True, help="scenario name or file")
    parser.add_argument("--epoch", type=float, required=True, help="wall time of scenario t=0")
    parser.add_argument("--ready", type=Path, required=True, help="where to write the endpoints")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    scenario = sim.load_scenario(args.scenario)

    def clock() -> float:
        return time.time() - args.epoch

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    kubelet = start_for(scenario, clock)
    node = SimulatedNode(scenario, clock)  # follows the clock on a thread of its own
    try:
        endpoints = {
            "kubelet_socket": kubelet.socket_path if kubelet is not None else None,
            "runtime_socket": node.cri_socket_path,
            "proc_root": node.proc_root,
        }
        partial = args.ready.with_suffix(".partial")
        partial.write_text(json.dumps(endpoints))
        partial.rename(args.ready)  # whole or absent: the benchmark polls for it
        while not stop.wait(1.0):  # a signal lands between waits
            pass
    finally:
        node.close()
        if kubelet is not None:
            kubelet.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
