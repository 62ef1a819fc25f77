"""The soak benchmark (bench/soak.py) measures what it claims: threads and open descriptors read
from /proc, slopes over the settled part only, a verdict that flips on a growing series, the
chart's configuration, and a short accelerated run of the whole node. No timing is asserted."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import heap, report, scenarios, soak
from bench.procfs import Probe, parse_threads
from gpu_exporter.alerting.pack import PACK_DIR
from gpu_exporter.config.load import load_config
from tests.test_values_schema import rendered, rendered_config

# -- /proc ---------------------------------------------------------------------------------------


def test_threads_come_from_the_status_line() -> None:
    assert parse_threads("Name:\tpython3\nVmRSS:\t 1 kB\nThreads:\t17\n") == 17
    with pytest.raises(ValueError, match="Threads"):
        parse_threads("Name:\tpython3\nVmRSS:\t1 kB\n")


# A process of its own (this pytest worker has other tests' threads coming and going): at each
# line on stdin it starts two threads and opens three files, then says so.
_GROWING_CHILD = """
import sys, threading
kept = []
for line in sys.stdin:
    for _ in range(2):
        threading.Thread(target=threading.Event().wait, daemon=True).start()
    kept += [open(sys.executable, "rb") for _ in range(3)]
    print("grown", flush=True)
"""


def test_probe_counts_started_threads_and_opened_files() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _GROWING_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        probe = Probe(child.pid)
        counts = []
        for _ in range(3):
            child.stdin.write("grow\n")
            child.stdin.flush()
            assert child.stdout.readline() == "grown\n"
            counts.append((probe.threads(), probe.open_fds()))
    finally:
        child.kill()
        child.wait()
    (t1, f1), (t2, f2), (t3, f3) = counts
    assert (t2 - t1, t3 - t2) == (2, 2)
    assert (f2 - f1, f3 - f2) == (3, 3)
    assert t1 == 3  # the main thread and the first two


def test_another_process_folder_counts_every_entry(tmp_path: Path) -> None:
    (tmp_path / "42" / "fd").mkdir(parents=True)
    for n in range(3):
        (tmp_path / "42" / "fd" / str(n)).touch()
    (tmp_path / "42" / "status").write_text("Threads:\t9\n")
    probe = Probe(42, root=tmp_path)
    assert (probe.open_fds(), probe.threads()) == (3, 9)


def test_live_heap_follows_objects_kept_and_freed() -> None:
    # Other threads of this worker (tests before this one leave some) allocate and free
    # meanwhile, and the cyclic collector may run: sizes big enough that their noise, a few MiB
    # and some thousand blocks, cannot hide the change, and the collector held off.
    gc.collect()
    gc.disable()
    try:
        before = heap.live_heap()
        kept = [[n] for n in range(200_000)]  # small objects: Python's own allocator
        block = bytearray(64 * heap.MIB)  # a large one: malloc
        during = heap.live_heap()
        del kept, block
        after = heap.live_heap()
    finally:
        gc.enable()
    assert during["python_blocks"] >= before["python_blocks"] + 190_000
    assert during["malloc_in_use_mib"] >= before["malloc_in_use_mib"] + 60
    assert after["python_blocks"] < during["python_blocks"] - 190_000
    assert after["malloc_in_use_mib"] < during["malloc_in_use_mib"] - 60


# -- slopes and the verdict ----------------------------------------------------------------------

FILL = 4200.0  # the settled part's start, seconds of scenario time


def series(
    rss: Callable[[float], float],
    threads: Callable[[float], float] = lambda t: 25,
    fds: Callable[[float], float] = lambda t: 12,
    hours: float = 4.0,
) -> list[dict[str, Any]]:
    """A sample a minute of scenario time, each quantity a function of the seconds."""
    return [
        {"scenario_seconds": t, "rss_mib": rss(t), "threads": threads(t), "fds": fds(t)}
        for t in (60.0 * n for n in range(1, int(hours * 60) + 1))
    ]


def filling(t: float) -> float:
    """RSS rising 9 MiB while the history fills, flat after: what a healthy daemon shows."""
    return 88.0 + 9.0 * min(t, FILL) / FILL


def test_growth_while_the_history_fills_is_not_a_leak() -> None:
    result = soak.settle(series(filling), FILL)
    rss = result["resources"]["rss_mib"]
    assert rss["start"] == pytest.approx(filling(60.0))
    assert rss["peak"] == rss["end"] == pytest.approx(97.0)
    assert rss["slope_per_hour"] == pytest.approx(0.0, abs=1e-9)
    assert result["settled_from_seconds"] == FILL
    assert result["settled_seconds"] == 4 * 3600 - FILL
    assert {e["verdict"] for e in result["resources"].values()} == {"flat"}
    assert result["verdict"] == "flat" and result["verdict_line"].startswith("flat: ")
    # The same run's second half, as the soak read it before: still filling at its start.
    assert soak.settle(series(filling), 0.0)["resources"]["rss_mib"]["slope_per_hour"] > 0.4


@pytest.mark.parametrize(
    ("quantity", "rate", "verdict"),
    [
        ("rss_mib", 0.25, "growing"),  # 6 MiB a day: over the 5 MiB a day called flat
        ("rss_mib", 0.15, "flat"),
        ("threads", 2.0, "growing"),
        ("fds", 1.5, "growing"),
        ("fds", 0.5, "flat"),
    ],
)
def test_the_verdict_flips_on_a_series_growing_after_the_fill(
    quantity: str, rate: float, verdict: str
) -> None:
    def growing(t: float) -> float:
        return 10.0 + rate * max(0.0, t - FILL) / 3600

    functions: dict[str, Callable[[float], float]] = {"rss": filling}
    functions[{"rss_mib": "rss"}.get(quantity, quantity)] = growing
    result = soak.settle(series(**functions), FILL)
    entry = result["resources"][quantity]
    assert entry["slope_per_hour"] == pytest.approx(rate)
    assert entry["verdict"] == verdict
    assert result["verdict"] == verdict
    assert result["verdict_line"].startswith(f"{verdict}: ")


def test_what_explains_the_resident_set_gets_slopes_without_a_verdict() -> None:
    points = series(filling)
    for point in points:
        t = point["scenario_seconds"]
        point["python_blocks"] = 380_000
        point["malloc_in_use_mib"] = 20.0 + 0.05 * t / 3600
        point["store_samples"] = 160_000 * min(t, FILL) / FILL
    explaining = soak.settle(points, FILL)["explaining"]
    assert explaining["python_blocks"]["slope_per_hour"] == pytest.approx(0.0, abs=1e-9)
    assert explaining["malloc_in_use_mib"]["slope_per_hour"] == pytest.approx(0.05)
    assert explaining["store_samples"]["settled_start"] == 160_000
    text = report.soak_section(soak_results(soak.settle(points, FILL))["soak"])
    assert "Python's live blocks 380000 to 380000 (0 / h)" in text
    assert "malloc's bytes in use" in text
    # Not sampled in every settled point (the realtime mode never is): left out.
    del points[-1]["python_blocks"]
    assert "python_blocks" not in soak.settle(points, FILL)["explaining"]


def test_one_thread_started_once_reads_flat_over_hours() -> None:
    """A step of one in the middle of T settled hours has a slope of 1.5 / T per hour."""
    middle = FILL + (4 * 3600 - FILL) / 2
    result = soak.settle(series(filling, threads=lambda t: 25 + (t >= middle)), FILL)
    assert result["resources"]["threads"]["verdict"] == "flat"


def test_a_run_ending_before_the_history_fills_is_unsettled() -> None:
    result = soak.settle(series(lambda t: 50 + t, hours=1.5), FILL)
    assert result["verdict"] == "unsettled"
    assert result["resources"]["rss_mib"]["slope_per_hour"] is None
    assert result["verdict_line"].startswith("unsettled: ")
    targets = {name: ok for name, _, _, ok in report.evaluate_targets(soak_results(result))}
    assert targets["RSS flat over the soak, after the rule history filled"] is None


def soak_results(settled: dict[str, Any]) -> dict[str, Any]:
    return {"soak": {"accelerated": {"ticks": 14_400, "scenario_hours": 4.0, "settle": settled}}}


def test_report_and_targets_take_the_settled_verdicts() -> None:
    grown = soak.settle(series(filling, fds=lambda t: 12 + 3 * max(0.0, t - FILL) / 3600), FILL)
    results = soak_results(grown)
    targets = {name: ok for name, _, _, ok in report.evaluate_targets(results)}
    assert targets["RSS flat over the soak, after the rule history filled"] is True
    assert targets["threads flat over the soak, after the rule history filled"] is True
    assert targets["open fds flat over the soak, after the rule history filled"] is False
    section = report.soak_section(results["soak"])
    assert "| accelerated | open fds" in section and "growing" in section
    assert grown["verdict_line"] in section


# -- the configuration and the node --------------------------------------------------------------

AM_URL = "http://127.0.0.1:9"


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out |= flat(value, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): data}


def test_the_soak_runs_the_charts_configuration(tmp_path: Path) -> None:
    """The chart's config.yaml (default values, per-process attribution on, one Alertmanager)
    loaded by the daemon equals the soak pipeline's configuration, but for where things are on
    this machine and the refresh cadence the accelerated clock needs."""
    values = ["--set", "processAttribution.enabled=true"]
    values += ["--set", f"alerting.alertmanagers[0].url={AM_URL}"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(rendered_config(*values)))
    chart = flat(load_config(tmp_path / "config.yaml", {}, environ={}).model_dump())
    _, _, pipeline = soak.start(soak.SoakSettings.quick(), AM_URL)
    try:
        assert pipeline.config is not None
        ours = flat(pipeline.config.model_dump())
    finally:
        pipeline.close()
    differing = {key for key in chart.keys() | ours.keys() if chart.get(key) != ours.get(key)}
    locations = {
        "rules.files",
        "kubernetes.socket_path",
        "kubernetes.processes.proc_root",
        "kubernetes.processes.runtime_socket",
    }
    assert differing == locations | set(soak.ACCELERATED_SETTINGS)
    for key, value in soak.ACCELERATED_SETTINGS.items():
        assert ours[key] == value
    # The chart's rule folder holds every file of the pack, which the soak globs in place.
    (rules_map,) = [
        o
        for o in rendered(*values)
        if o["kind"] == "ConfigMap" and "rules" in o["metadata"]["name"]
    ]
    assert chart["rules.files"] == ["/etc/gpu-exporter/rules/*.yaml"]
    assert ours["rules.files"] == [str(PACK_DIR / "*.yaml")]
    assert set(rules_map["data"]) == {p.name for p in PACK_DIR.glob("*.yaml")}


def test_job_churn_adds_pods_and_reused_pids() -> None:
    scenario = scenarios.add_job_churn(
        scenarios.generate_processes(8), until=1000, every=300, gpu=7
    )
    jobs = [p for p in scenario["pods"] if p["pod"].startswith("job-")]
    assert [(p["from"], p["until"], p["replica"]) for p in jobs] == [
        (0, 240.0, 2),
        (300, 540.0, 2),
        (600, 840.0, 2),
        (900, 1140.0, 2),
    ]
    pids: dict[str, list[int]] = {}
    for process in scenario["processes"]:
        pod = process.get("pod", {}).get("pod", "")
        if pod.startswith("job-"):
            pids.setdefault(pod, []).append(process["pid"])
    assert pids["job-0"] == pids["job-2"] != pids["job-1"] == pids["job-3"]
    assert len(set(pids["job-0"])) == 2
    with pytest.raises(ValueError, match="GPU 8"):
        scenarios.add_job_churn(scenarios.generate_processes(8), until=10, every=5, gpu=8)


def test_quick_accelerated_soak_samples_the_whole_node() -> None:
    """A minute of the node in this process: every sample reads threads and descriptors, the
    churned jobs reach the series, pods come from the kubelet; too short to settle."""
    with soak.CountingSink() as sink:
        result = soak.accelerated(soak.SoakSettings.quick(), sink.url)
    points = result["points"]
    assert [p["tick"] for p in points] == [10, 20, 30, 40, 50, 60]
    assert all(p["threads"] > 1 and p["fds"] > 3 and p["rss_mib"] > 0 for p in points)
    assert all(p["python_blocks"] > 0 and p["malloc_in_use_mib"] > 0 for p in points)
    assert result["configuration"]["jobs_scheduled"] == 4  # every 20 s up to 80 s
    assert result["jobs_seen_in_series"] >= 2
    assert result["kubelet_list_calls"] >= 1
    assert result["settle"]["verdict"] == "unsettled"
    assert result["settle"]["settled_from_seconds"] > 3600  # the pack reads an hour back
