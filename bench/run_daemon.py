#!/usr/bin/env python3
"""Run `gpu-exporter serve` on the fake NVML, timed, with two benchmark-only options.

    python bench/run_daemon.py --scenario FILE [--epoch UNIX_SECONDS]
                               [--prefill-history SECONDS] -- serve-args...

Whole ticks (NVML reads, rule evaluation, rendering) are timed by the daemon itself
(`gpu_exporter_full_tick_duration_seconds`, one tick late: a tick's exposition is rendered
before that tick ends); its `gpu_exporter_tick_duration_seconds` times only the NVML reads.

- `--epoch`: scenario time t happens at wall time `epoch + t`, so a fault scheduled at
  t = 20 s happens at a wall time the benchmark knows exactly, whenever the daemon got round
  to starting (default: when this launcher installs the fake, as `serve --simulate` does).
- `--prefill-history`: at the second tick, the rule engine's store is rewritten as if the
  daemon had been running that long (`bench.inproc.backfill`), so rule evaluation costs what
  it costs at steady state from the third tick on, instead of after 16 minutes.

A scenario's node around the GPUs (the kubelet, /proc and container runtime of its `pods:` and
`processes:`) is never served from this process, where its fakes' gRPC servers and threads
would count as the daemon's: bench/run_node.py serves it on the same `--epoch` when a
configuration reads it, as on a node.

The fake is installed before the CLI runs and `--simulate` is not passed, so the daemon's own
code finds pynvml already pointing at it, as `serve --simulate` arranges.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.inproc import backfill  # noqa: E402
from gpu_exporter import cli, sim  # noqa: E402
from gpu_exporter.alerting.rules.manager import RuleManager  # noqa: E402


def prefill_at_second_tick(seconds: float) -> None:
    """Patch RuleManager.on_series (before the CLI binds it) to backfill once."""
    original = RuleManager.on_series
    calls = 0

    def on_series(self: RuleManager, series_set: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal calls
        original(self, series_set, *args, **kwargs)
        calls += 1
        if calls == 2:
            backfill(self.store, series_set, seconds, self.evaluation_interval)

    RuleManager.on_series = on_series  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", required=True, help="scenario name or file")
    parser.add_argument("--epoch", type=float, help="wall time of scenario t=0 (default: now)")
    parser.add_argument("--prefill-history", type=float, metavar="SECONDS", default=0.0)
    parser.add_argument("serve_args", nargs="*", help="`gpu-exporter serve` arguments")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    epoch = time.time() if args.epoch is None else args.epoch
    sim.install(
        sim.load_scenario(args.scenario),
        clock=lambda: time.time() - epoch,
        node=False,
    )
    if args.prefill_history > 0:
        prefill_at_second_tick(args.prefill_history)
    return cli.main(["serve", *args.serve_args])


if __name__ == "__main__":
    sys.exit(main())
