"""Markdown tables from the results, and the verdict on each performance target."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.stats import ratio

OURS, OURS_STEADY, PEER = "gpu-exporter", "gpu-exporter-steady", "nvitop-exporter"
OURS_SHIPPED = "gpu-exporter-shipped"

# -- formatting ----------------------------------------------------------------------------------


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    """A number with a unit; "ms" and "us" take seconds; "n/a" for missing values."""
    if _missing(value):
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    scale = {"ms": 1e3, "us": 1e6}.get(unit, 1.0)
    number = value * scale
    if unit == "x":
        return f"{number:.{digits}f}x"
    if unit in ("", "count"):
        return f"{number:.0f}" if float(number).is_integer() else f"{number:.{digits}f}"
    return f"{number:.{digits}f} {unit}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table; cells are str()-ed, pipes escaped, columns padded."""
    cells = [[str(c).replace("|", "\\|") for c in row] for row in rows]
    head = [str(h).replace("|", "\\|") for h in headers]
    for row in cells:
        if len(row) != len(head):
            raise ValueError(f"row has {len(row)} cells, header has {len(head)}")
    widths = [max(len(c) for c in column) for column in zip(head, *cells, strict=True)]
    widths = [max(w, 3) for w in widths]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    rule = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(head), rule, *(line(r) for r in cells)])


def _get(data: Mapping[str, Any] | None, *path: str) -> Any:
    node: Any = data
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


# -- sections ------------------------------------------------------------------------------------

PEER_ROWS: tuple[tuple[str, str, str], ...] = (
    # (label, key in summary, unit)
    ("CPU per tick (process, idle window)", "cpu_seconds_per_tick", "ms"),
    ("CPU, % of one core", "cpu_percent_of_core", "%"),
    ("wall time per tick", "wall_seconds_per_tick", "ms"),
    ("  of which reading the GPUs", "reads_seconds_per_tick", "ms"),
    ("/metrics p50, 1 scraper", "scrape_1_p50", "ms"),
    ("/metrics p99, 1 scraper", "scrape_1_p99", "ms"),
    ("/metrics p50, 32 scrapers", "scrape_32_p50", "ms"),
    ("/metrics p99, 32 scrapers", "scrape_32_p99", "ms"),
    ("/metrics p99, Prometheus' headers", "scrape_prometheus_headers_p99", "ms"),
    ("resident memory (after load)", "rss_mib", "MiB"),
    ("peak resident memory (VmHWM)", "hwm_mib", "MiB"),
    ("bytes per scrape", "bytes_per_scrape", "count"),
    ("families declared", "families_declared", "count"),
    ("families with samples", "families_with_samples", "count"),
    ("GPU families with samples", "gpu_families", "count"),
)


def peer_section(peer: Mapping[str, Any]) -> str:
    summary = peer.get("summary", {})
    young, steady = summary.get(OURS, {}), summary.get(OURS_STEADY, {})
    shipped, theirs = summary.get(OURS_SHIPPED, {}), summary.get(PEER, {})
    ratios, ratios_young = peer.get("ratios") or {}, peer.get("ratios_young") or {}
    ratios_shipped = peer.get("ratios_shipped") or {}
    rows = []
    for label, key, unit in PEER_ROWS:
        rows.append(
            [
                label,
                fmt(young.get(key), unit),
                fmt(steady.get(key), unit),
                fmt(shipped.get(key), unit),
                fmt(theirs.get(key), unit),
                fmt(ratios_shipped.get(key), "x") if key in ratios_shipped else "",
                fmt(ratios.get(key), "x") if key in ratios else "",
                fmt(ratios_young.get(key), "x") if key in ratios_young else "",
            ]
        )
    headers = [
        "",
        "ours, trimmed, young",
        "ours, trimmed, steady",
        "ours, shipped, steady",
        PEER,
        "shipped / peer",
        "trimmed steady / peer",
        "trimmed young / peer",
    ]
    text = table(headers, rows)
    text += (
        "\n\ntrimmed: `serve` on the fake with its defaults (no pod or per-process "
        "attribution, no Alertmanager, log level warning); shipped: the configuration the "
        "chart renders from its default values (the whole rule pack, pod attribution from a "
        "kubelet served by another process, per-process attribution off, no Alertmanager, "
        "log level info)."
    )
    pods = [p.get("attributed_pods") for p in peer.get("phases", {}).get(OURS_SHIPPED, [])]
    if pods:
        text += f" Pods attributed in the shipped phases: {', '.join(map(str, pods))}."
    if peer.get("peer_unavailable"):
        text += f"\n\nPeer not measured: {peer['peer_unavailable']}."
    return text


def coverage_section(peer: Mapping[str, Any]) -> str:
    coverage = peer.get("coverage")
    if not coverage:
        return "Coverage needs both exporters."
    rows = []
    for quantity in coverage[OURS]:
        ours, theirs = coverage[OURS][quantity], coverage[PEER][quantity]
        rows.append([quantity, ", ".join(ours) or "-", ", ".join(theirs) or "-"])
    return table(["quantity", OURS, PEER], rows)


def scaling_section(scaling: Mapping[str, Any]) -> str:
    rows = []
    for name, result in scaling.get("configs", {}).items():
        tick, scrape = result["tick"], result.get("scrape", {})
        rows.append(
            [
                name,
                fmt(_get(tick, "young", "cpu_seconds_per_tick"), "ms"),
                fmt(_get(tick, "steady", "cpu_seconds_per_tick"), "ms"),
                fmt(_get(tick, "steady", "wall", "p50"), "ms"),
                fmt(_get(tick, "steady", "wall", "max"), "ms"),
                fmt(tick.get("store_samples"), "count"),
                fmt(_get(tick, "exposition", "openmetrics_gzip_cpu_seconds"), "ms"),
                fmt(scrape.get("scrape_1_p50"), "ms"),
                fmt(scrape.get("scrape_1_p99"), "ms"),
                fmt(scrape.get("scrape_32_p99"), "ms"),
                fmt(scrape.get("bytes_per_scrape"), "count"),
                fmt(scrape.get("rss_mib"), "MiB"),
            ]
        )
    headers = [
        "configuration",
        "tick CPU young",
        "tick CPU steady",
        "tick wall p50",
        "tick wall max",
        "store samples",
        "write on scrape (OM, gzip)",
        "scrape p50 (1)",
        "scrape p99 (1)",
        "scrape p99 (32)",
        "bytes",
        "RSS",
    ]
    text = table(headers, rows)
    per_device = per_device_cost(scaling)
    if per_device:
        text += "\n\nTick CPU per device (steady): " + ", ".join(
            f"{devices} GPUs {fmt(cost, 'ms')}" for devices, cost in per_device.items()
        )
        text += " (flat if cost is linear in devices)."
    mig = mig_cost(scaling)
    if not _missing(mig["per_device"]):
        text += (
            f"\n\n{MIG_CONFIG}: {mig['gpus']} GPUs x {mig['instances_per_gpu']} MIG instances = "
            f"{mig['devices']} devices (a device is a series-producing unit: a MIG parent or a "
            f"MIG instance); tick CPU per device (steady) {fmt(mig['per_device'], 'ms')}, "
            f"per GPU {fmt(mig['per_gpu'], 'ms')}."
        )
    return text


def per_device_cost(scaling: Mapping[str, Any]) -> dict[int, float]:
    """Steady tick CPU / devices for the 1, 8 and 64-GPU configurations that ran."""
    out = {}
    for name, devices in (("1gpu", 1), ("8gpu", 8), ("64gpu", 64)):
        cpu = _get(scaling, "configs", name, "tick", "steady", "cpu_seconds_per_tick")
        if not _missing(cpu):
            out[devices] = cpu / devices
    return out


MIG_CONFIG = "8gpu-mig-7x1g"
MIG_GPUS, MIG_INSTANCES_PER_GPU = 8, 7  # when the results do not say


def mig_cost(scaling: Mapping[str, Any]) -> dict[str, Any]:
    """The MIG configuration's steady tick CPU per device and per GPU, where a device is a
    series-producing unit (a MIG parent or a MIG instance: 8 + 56 = 64 devices)."""
    config = _get(scaling, "configs", MIG_CONFIG, "config") or {}
    gpus = int(config.get("devices", MIG_GPUS))
    per_gpu = int(config.get("mig_instances", MIG_INSTANCES_PER_GPU))
    devices = gpus * (1 + per_gpu)
    cpu = _get(scaling, "configs", MIG_CONFIG, "tick", "steady", "cpu_seconds_per_tick")
    return {
        "gpus": gpus,
        "instances_per_gpu": per_gpu,
        "devices": devices,
        "cpu": cpu,
        "per_device": None if _missing(cpu) else cpu / devices,
        "per_gpu": None if _missing(cpu) else cpu / gpus,
    }


OVERHEAD_VARIANTS = (
    ("bare_sequential", "bare pynvml loop, one thread"),
    ("bare_concurrent", "bare pynvml loop, thread per GPU"),
    ("source_only", "daemon: NVML source only"),
    ("tick_no_rules", "daemon: tick, rules off"),
    ("tick_shipped_rules", "daemon: tick, shipped rules"),
)


def overhead_section(overhead: Mapping[str, Any]) -> str:
    parts = []
    for model, data in overhead.get("models", {}).items():
        rows = []
        for key, label in OVERHEAD_VARIANTS:
            v = data["variants"][key]
            rows.append(
                [
                    label,
                    fmt(v["wall"]["mean"], "ms"),
                    fmt(v["wall"]["p99"], "ms"),
                    fmt(v["cpu_seconds_per_tick"], "ms"),
                    fmt(v["fake_cpu_seconds_per_tick"], "ms"),
                    fmt(v["cpu_net_of_fake_per_tick"], "ms"),
                ]
            )
        headers = ["variant", "wall mean", "wall p99", "CPU", "of which fake", "CPU net of fake"]
        parts.append(f"Latency model `{model}`:\n\n" + table(headers, rows))
        ratio_rows = [
            [k, fmt(v, "ms") if k.endswith("_seconds_per_tick") else fmt(v, "x")]
            for k, v in data["ratios"].items()
            if "net_of_fake" not in k  # older results: a ratio of two near-zero numbers
        ]
        bare_cpu = data["variants"]["bare_sequential"]["cpu_seconds_per_tick"]
        for key, _ in OVERHEAD_VARIANTS[2:]:
            own = data["variants"][key]["cpu_seconds_per_tick"] - bare_cpu
            if f"{key}_own_cpu_seconds_per_tick" not in data["ratios"]:
                ratio_rows.append([f"{key}_own_cpu_seconds_per_tick", fmt(own, "ms")])
        same = data["same_calls"]
        parts.append(
            table(["ratio", "value"], ratio_rows)
            + f"\n\nSame NVML calls per tick as the daemon's source: {fmt(same['same'])}"
            + (f" (differences: {same['differences']})" if not same["same"] else "")
        )
    polling = overhead.get("fake_xid_polling_cpu_seconds_per_second")
    if polling is not None:
        parts.append(
            "The fake's `nvmlEventSetWait` (it blocks until its deadline when no XID is still to "
            "come, else polls every 100 ms; real NVML blocks in the kernel): "
            f"{fmt(polling, 'ms')} CPU per second while the XID thread waits."
        )
    return "\n\n".join(parts)


# The soak's quantities (bench/soak.py GROWTH_LIMITS_PER_HOUR): key, name, unit.
SOAK_QUANTITIES = (("rss_mib", "RSS", "MiB"), ("threads", "threads", ""), ("fds", "open fds", ""))


# What the soak samples beside RSS (bench/soak.py EXPLAINING): key, name, unit.
SOAK_EXPLAINING = (
    ("python_blocks", "Python's live blocks", "count"),
    ("malloc_in_use_mib", "malloc's bytes in use", "MiB"),
    ("store_samples", "rule history samples", "count"),
)


def _per_hour(value: float | None, unit: str) -> str:
    text = fmt(value, unit, 3)
    return text if text == "n/a" else f"{text} / h"


def _soak_explaining(explaining: Mapping[str, Any]) -> str:
    parts = [
        f"{name} {fmt(entry['settled_start'], unit)} to {fmt(entry['end'], unit)} "
        f"({_per_hour(entry['slope_per_hour'], unit)})"
        for key, name, unit in SOAK_EXPLAINING
        if (entry := explaining.get(key))
    ]
    return f" Over the settled part: {'; '.join(parts)}." if parts else ""


def soak_section(soak: Mapping[str, Any]) -> str:
    rows = []
    notes = []
    for mode in ("accelerated", "realtime"):
        data = soak.get(mode)
        if not data:
            continue
        settled = data.get("settle") or {}
        for key, name, unit in SOAK_QUANTITIES:
            entry = _get(settled, "resources", key) or {}
            rows.append(
                [
                    mode,
                    name,
                    fmt(entry.get("start"), unit),
                    fmt(entry.get("peak"), unit),
                    fmt(entry.get("end"), unit),
                    _per_hour(entry.get("slope_per_hour"), unit),
                    _per_hour(entry.get("limit_per_hour"), unit),
                    entry.get("verdict", "n/a"),
                ]
            )
        hours = data.get("scenario_hours") or (data.get("seconds") or 0) / 3600
        notes.append(
            f"{mode}: {fmt(data.get('ticks'), 'count')} ticks, {fmt(hours, 'h')} of scenario "
            f"time, settled part from {fmt(settled.get('settled_from_seconds', 0) / 3600, 'h')}. "
            f"Verdict: {settled.get('verdict_line', 'n/a')}."
            + _soak_explaining(settled.get("explaining") or {})
        )
    headers = ["mode", "quantity", "start", "peak", "end", "slope, settled", "limit", "verdict"]
    return "\n\n".join([table(headers, rows), *notes])


def detection_section(detection: Mapping[str, Any]) -> str:
    if detection.get("unavailable"):
        return f"Not measured: {detection['unavailable']}."
    rows = [
        [
            r["rule"],
            r["gpu"],
            fmt(r["fault_at_scenario_seconds"], "s", 0),
            r["path"],
            fmt(r["latency_seconds"], "s", 1),
        ]
        for r in detection.get("rows", [])
    ]
    return table(["rule", "GPU", "fault at", "path", "fault -> webhook"], rows)


def compat_section(compat: Mapping[str, Any]) -> str:
    rows = [
        [
            name,
            fmt(data.get("tick_cpu_off_mean"), "ms"),
            fmt(data.get("tick_cpu_on_mean"), "ms"),
            fmt(data.get("on_vs_off"), "x", 3),
            fmt(_get(data, "compat_render", "mean"), "ms"),
            fmt(_get(data, "native_render", "mean"), "ms"),
            fmt(data.get("compat_bytes"), "count"),
            fmt(data.get("native_bytes"), "count"),
        ]
        for name, data in compat.get("configs", {}).items()
    ]
    return table(
        [
            "config",
            "tick CPU, compat off",
            "on, unscraped",
            "on / off",
            "/metrics/dcgm first scrape CPU",
            "/metrics text first scrape CPU",
            "/metrics/dcgm bytes",
            "/metrics bytes",
        ],
        rows,
    )


def processes_section(processes: Mapping[str, Any]) -> str:
    configs = processes.get("configs", {})
    rows = [
        [
            f"{name} ({fmt(data.get('processes'), 'count')} processes)",
            fmt(data.get("tick_cpu_off_mean"), "ms"),
            fmt(data.get("tick_cpu_on_mean"), "ms"),
            fmt(data.get("on_vs_off"), "x", 3),
            fmt(data.get("added_cpu_per_gpu"), "ms", 3),
            fmt(_get(data, "breakdown_on", "runtime_refresh", "per_tick_cpu"), "ms", 3),
            fmt(data.get("on_with_refresh_vs_off"), "x", 3),
            fmt(data.get("net_of_fake_on_vs_off"), "x", 3),
            f"{fmt(_get(data, 'memory', 'off', 'rss_mib'), 'MiB', 1)} / "
            f"{fmt(_get(data, 'memory', 'on', 'rss_mib'), 'MiB', 1)}",
            "yes" if data.get("attribution_complete") else "NO",
        ]
        for name, data in configs.items()
    ]
    headers = [
        "config",
        "tick CPU, off",
        "on",
        "on / off",
        "added per GPU",
        "runtime refresh per tick",
        "on + refresh / off",
        "on / off net of the fake NVML",
        "RSS off / on (daemon)",
        "every process attributed",
    ]
    parts = [table(headers, rows)]
    for name, data in configs.items():
        off = _get(data, "breakdown_off", "parts_cpu_per_tick") or {}
        on = _get(data, "breakdown_on", "parts_cpu_per_tick") or {}
        part_rows = [
            [part, fmt(off.get(part), "ms", 3), fmt(on.get(part), "ms", 3)]
            for part in dict.fromkeys([*off, *on])
        ]
        part_rows.append(
            [
                "whole tick (instrumented)",
                fmt(_get(data, "breakdown_off", "tick_cpu"), "ms", 3),
                fmt(_get(data, "breakdown_on", "tick_cpu"), "ms", 3),
            ]
        )
        breakdown = table(["part", "off", "on"], part_rows)
        parts.append(f"Where a tick's CPU goes, {name}:\n\n{breakdown}")
    return "\n\n".join(parts)


def _mib(value: Any) -> Any:
    return None if _missing(value) else value / 2**20


def _thousands(value: Any) -> str:
    return "n/a" if _missing(value) else f"{value:,.0f}"


def fleet_section(fleet: Mapping[str, Any]) -> str:
    if fleet.get("unavailable"):
        return f"Not measured: {fleet['unavailable']}."
    runs = fleet.get("runs", {})
    per = _get(fleet, "settings", "per") or 1000
    rows = [
        [
            f"{name} (`{data.get('job')}`)",
            ", ".join(data.get("rule_files") or []) or "none",
            fmt(data.get("nodes"), "count"),
            _thousands(data.get("exposition_series")),
            _thousands(data.get("head_series")),
            _thousands(_get(data, "per_1000", "head_series")),
            fmt(_mib(data.get("rss_bytes")), "MiB", 0),
            fmt(_mib(_get(data, "per_1000", "rss_bytes")), "MiB", 0),
            fmt(_mib(data.get("peak_rss_bytes")), "MiB", 0),
            f"{fmt(data.get('scrape_seconds_mean'), 'ms')} / "
            f"{fmt(data.get('scrape_seconds_max'), 'ms')}",
            fmt(_get(data, "per_1000", "cpu_cores"), "", 2),
            "yes" if data.get("head_series_accounted") else "NO",
        ]
        for name, data in runs.items()
    ]
    headers = [
        "run",
        "rule files",
        "nodes",
        "series per node",
        "head series",
        f"head series per {per:,} nodes",
        "Prometheus RSS",
        f"RSS per {per:,} nodes",
        "peak RSS",
        "scrape mean / max",
        f"Prometheus CPU cores per {per:,} nodes",
        "head = scraped + Prometheus' own",
    ]
    parts = [
        table(headers, rows),
        f"{fleet.get('prometheus', '?')}; {fleet.get('scaling', '')}; idle Prometheus "
        f"{fmt(_mib(fleet.get('idle_rss_bytes')), 'MiB', 0)}.",
    ]
    for name, data in runs.items():
        groups = data.get("rule_groups") or {}
        if not groups:
            continue
        group_rows = [
            [
                group,
                fmt(info.get("interval_seconds"), "s", 0),
                fmt(info.get("rules"), "count"),
                f"{fmt(info.get('min_seconds'), 'ms', 0)} / "
                f"{fmt(info.get('median_seconds'), 'ms', 0)} / "
                f"{fmt(info.get('max_seconds'), 'ms', 0)}",
                f"{fmt(info.get('min_seconds_per_1000'), 's')} / "
                f"{fmt(info.get('median_seconds_per_1000'), 's')}",
                ", ".join(
                    f"{rule} {fmt(seconds, 'ms')}"
                    for rule, seconds in info.get("slowest_rules", [])[:2]
                ),
                ", ".join(rule for rule, _ in info.get("errors", [])) or "none",
            ]
            for group, info in groups.items()
        ]
        group_headers = [
            "rule group",
            "interval",
            "rules",
            f"evaluation at {data.get('nodes')} nodes, fastest / median / slowest",
            f"per {per:,} nodes, fastest / median",
            "slowest rules",
            "failing rules",
        ]
        parts.append(f"Rule groups, {name}:\n\n" + table(group_headers, group_rows))
    return "\n\n".join(parts)


# -- targets -------------------------------------------------------------------------------------


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def _le(value: float | None, limit: float) -> bool | None:
    return None if _missing(value) else value <= limit


Target = tuple[str, str, str, bool | None]


def _ratio_target(name: str, value: float | None, limit: float, note: str) -> Target:
    return (name, fmt(value, "x"), note, _le(value, limit))


def _cpu_targets(results: Mapping[str, Any]) -> list[Target]:
    ratios = _get(results, "peer", "ratios") or {}
    young = _get(results, "peer", "ratios_young") or {}
    shipped = _get(results, "peer", "ratios_shipped") or {}
    summary = _get(results, "peer", "summary") or {}
    peer = _get(summary, PEER) or {}

    def note(name: str) -> str:
        ours = _get(summary, name) or {}
        return (
            f"{fmt(ours.get('cpu_seconds_per_tick'), 'ms')} vs "
            f"{fmt(peer.get('cpu_seconds_per_tick'), 'ms')}; whole process, one scrape per 15 s"
        )

    return [
        _ratio_target(
            "CPU per tick <= 0.9x nvitop-exporter (steady, shipped configuration)",
            shipped.get("cpu_seconds_per_tick"),
            0.9,
            note(OURS_SHIPPED),
        ),
        _ratio_target(
            "CPU per tick <= 0.9x nvitop-exporter (steady, trimmed configuration)",
            ratios.get("cpu_seconds_per_tick"),
            0.9,
            note(OURS_STEADY),
        ),
        _ratio_target(
            "CPU per tick <= 1.0x nvitop-exporter (young, trimmed)",
            young.get("cpu_seconds_per_tick"),
            1.0,
            "first minute after start",
        ),
    ]


def _limit(name: str, value: float | None, unit: str, limit: float, note: str = "") -> Target:
    return (name, fmt(value, unit), note, _le(value, limit))


def _ours(results: Mapping[str, Any]) -> Mapping[str, Any]:
    """The steady daemon's peer figures, else the young one's."""
    summary = _get(results, "peer", "summary") or {}
    return summary.get(OURS_STEADY) or summary.get(OURS) or {}


def _memory_targets(results: Mapping[str, Any]) -> list[Target]:
    summary = _get(results, "peer", "summary") or {}
    shipped = _get(summary, OURS_SHIPPED, "rss_mib")
    steady = _get(summary, OURS_STEADY, "rss_mib")
    peer = _get(summary, PEER, "rss_mib")
    floor = _get(results, "peer", "memory_floor") or {}
    stack, python = floor.get("stack_floor_mib"), floor.get("python_alone_mib")
    ours_added = None if _missing(shipped) or _missing(stack) else shipped - stack
    peer_added = None if _missing(peer) or _missing(python) else peer - python
    added_ratio = ratio(ours_added, peer_added)
    return [
        _limit(
            "RSS <= 64 MiB (steady, shipped configuration)",
            shipped,
            "MiB",
            64,
            f"trimmed configuration: {fmt(steady, 'MiB')}",
        ),
        _ratio_target(
            "RSS beyond the stack's import floor <= 1.0x nvitop-exporter's beyond Python",
            added_ratio,
            1.0,
            f"ours (shipped) {fmt(shipped, 'MiB')} - floor {fmt(stack, 'MiB')} (FastAPI, "
            f"uvicorn, prometheus-client, APScheduler); theirs {fmt(peer, 'MiB')} - "
            f"{fmt(python, 'MiB')} (bare interpreter)",
        ),
    ]


def _soak_targets(results: Mapping[str, Any]) -> list[Target]:
    """RSS, threads and open fds flat over the accelerated soak's settled part (n/a when the
    run ended before the rule history filled)."""
    settled = _get(results, "soak", "accelerated", "settle") or {}
    targets = []
    for key, name, unit in SOAK_QUANTITIES:
        entry = _get(settled, "resources", key) or {}
        verdict = entry.get("verdict")
        targets.append(
            (
                f"{name} flat over the soak, after the rule history filled",
                fmt(entry.get("slope_per_hour"), unit, 3) + " per hour of scenario time",
                f"flat = at most {fmt(entry.get('limit_per_hour'), unit, 3)} per hour",
                None if verdict not in ("flat", "growing") else verdict == "flat",
            )
        )
    return targets


def _linear_targets(results: Mapping[str, Any]) -> list[Target]:
    scaling = _get(results, "scaling") or {}
    cpu = per_device_cost(scaling)
    size = {int(k): v for k, v in (scaling.get("bytes_per_device") or {}).items()}
    cpu_growth = ratio(cpu.get(64), cpu.get(8))
    size_growth = ratio(size.get(64), size.get(8))
    scrape = _get(scaling, "configs", "64gpu", "scrape") or {}
    scrape_per_device = {
        devices: None if _missing(p99) else p99 / devices
        for devices, p99 in (
            (8, _get(scaling, "configs", "8gpu", "scrape", "scrape_32_p99")),
            (64, scrape.get("scrape_32_p99")),
        )
    }
    scrape_growth = ratio(scrape_per_device.get(64), scrape_per_device.get(8))
    return [
        _ratio_target(
            "64 devices: tick CPU per device <= 1.25x the 8-device figure",
            cpu_growth,
            1.25,
            f"{fmt(cpu.get(64), 'ms')} vs {fmt(cpu.get(8), 'ms')} per device, steady",
        ),
        _ratio_target(
            "64 devices: exposition bytes per device <= 1.1x the 8-device figure",
            size_growth,
            1.1,
            f"{fmt(size.get(64), 'count')} vs {fmt(size.get(8), 'count')} bytes per device",
        ),
        _ratio_target(
            "64 devices: /metrics p99 per device, 32 scrapers, <= 1.25x the 8-device figure",
            scrape_growth,
            1.25,
            f"{fmt(scrape_per_device.get(64), 'ms', 3)} vs "
            f"{fmt(scrape_per_device.get(8), 'ms', 3)} per device, same run",
        ),
        _limit(
            "64 devices: /metrics p99 <= 5 ms, 1 scraper", scrape.get("scrape_1_p99"), "ms", 0.005
        ),
        _limit(
            "64 devices: /metrics p99 <= 50 ms, 32 scrapers",
            scrape.get("scrape_32_p99"),
            "ms",
            0.050,
        ),
    ]


def _mig_targets(results: Mapping[str, Any]) -> list[Target]:
    """8 GPUs x 7 MIG instances keep the 64-device linearity target, a device being a
    series-producing unit: a GPU or a MIG instance (8 parents + 56 instances = 64 devices,
    vs the 8-GPU configuration's 8)."""
    scaling = _get(results, "scaling") or {}
    whole = per_device_cost(scaling).get(8)
    mig = mig_cost(scaling)
    gpus, instances, devices = mig["gpus"], mig["gpus"] * mig["instances_per_gpu"], mig["devices"]
    scrape = _get(scaling, "configs", MIG_CONFIG, "scrape") or {}
    per_gpu_ratio = ratio(mig["per_gpu"], whole)
    return [
        _ratio_target(
            f"{gpus} GPUs x {mig['instances_per_gpu']} MIG instances: tick CPU per device "
            f"<= 1.25x the {gpus}-GPU figure",
            ratio(mig["per_device"], whole),
            1.25,
            f"device = series-producing unit, a GPU or a MIG instance ({gpus} parents + "
            f"{instances} instances = {devices} devices, vs the {gpus}-GPU configuration's "
            f"{gpus}): {fmt(mig['per_device'], 'ms')} vs {fmt(whole, 'ms')} per device, steady; "
            f"per GPU {fmt(mig['per_gpu'], 'ms')} ({fmt(per_gpu_ratio, 'x')} the whole-GPU "
            "figure)",
        ),
        _limit(
            f"{gpus} x {mig['instances_per_gpu']} MIG: /metrics p99 <= 5 ms, 1 scraper",
            scrape.get("scrape_1_p99"),
            "ms",
            0.005,
        ),
    ]


def _latency_targets(results: Mapping[str, Any]) -> list[Target]:
    ours = _ours(results)
    pcie = _get(results, "scaling", "configs", "8gpu-pcie-20ms-call", "tick", "steady", "wall")
    plain = _get(results, "scaling", "configs", "8gpu", "tick", "steady", "wall")
    return [
        _limit("/metrics p99 <= 5 ms, 1 scraper", ours.get("scrape_1_p99"), "ms", 0.005),
        _limit("/metrics p99 <= 50 ms, 32 scrapers", ours.get("scrape_32_p99"), "ms", 0.050),
        _limit(
            "tick <= 30 % of 1 s, PCIe via the 20 ms call",
            _get(pcie, "max"),
            "ms",
            0.3,
            f"max of steady ticks; p50 {fmt(_get(pcie, 'p50'), 'ms')}",
        ),
        _limit(
            "tick <= 30 % of 1 s, byte counters",
            _get(plain, "max"),
            "ms",
            0.3,
            "max of steady ticks",
        ),
    ]


def _overhead_targets(results: Mapping[str, Any]) -> list[Target]:
    mixed = _get(results, "overhead", "models", "mixed", "ratios") or {}
    nvml_like = _get(results, "overhead", "models", "nvml-like", "ratios") or {}
    paired = _get(results, "overhead", "models", "mixed", "read_path_paired") or {}
    block = mixed.get("source_only_cpu_vs_bare")
    pairs = len(paired.get("ratios") or ())
    return [
        _ratio_target(
            "read path over bare NVML <= 1.25x (NVML source only, CPU)",
            paired.get("median", block),
            1.25,
            f"median of {pairs} back-to-back pairs; one block of each: "
            + (f"{block:.2f}x" if block is not None else "n/a")
            + "; fake included on both sides",
        ),
        _ratio_target(
            "whole tick <= 2x a bare loop at 0.36 ms per call (CPU)",
            nvml_like.get("tick_shipped_rules_cpu_vs_bare"),
            2.0,
            "shipped rules; fake included on both sides",
        ),
    ]


def _detection_targets(results: Mapping[str, Any]) -> list[Target]:
    rows = _get(results, "detection", "rows") or []
    daemon = [r["latency_seconds"] for r in rows if r["path"] == "daemon" and "Bench" in r["rule"]]
    name = "detection <= one tick after the condition (daemon, for: 0)"
    if None in daemon:  # a fault the daemon never reported
        return [(name, "never", f"{daemon.count(None)} of {len(daemon)} faults", False)]
    worst = max(daemon) if daemon else None
    return [_limit(name, worst, "s", 1.0, "fault -> webhook, worst of the faults, 1 s ticks")]


def _compat_targets(results: Mapping[str, Any]) -> list[Target]:
    """The tick must not pay for the compat output nobody scrapes (its renderer runs on a
    scrape only); 1.05x leaves room for the noise of alternating in-process rounds."""
    configs = _get(results, "compat", "configs") or {}
    return [
        _ratio_target(
            f"dcgm compat on but unscraped, {name}: tick CPU <= 1.05x compat off",
            data.get("on_vs_off"),
            1.05,
            f"{fmt(data.get('tick_cpu_on_mean'), 'ms')} vs "
            f"{fmt(data.get('tick_cpu_off_mean'), 'ms')}, in-process, alternating rounds",
        )
        for name, data in configs.items()
    ]


def dcgm_section(dcgm: Mapping[str, Any]) -> str:
    row = [
        dcgm.get("scenario", "?"),
        fmt(dcgm.get("tick_cpu_off_mean"), "ms"),
        fmt(dcgm.get("tick_cpu_on_mean"), "ms"),
        fmt(dcgm.get("on_vs_off"), "x", 3),
        "yes" if dcgm.get("activity_from_dcgm") else "NO",
    ]
    header = ["scenario", "tick CPU, dcgm off", "dcgm auto", "auto / off", "activity from DCGM"]
    return table(header, [row])


def _dcgm_targets(results: Mapping[str, Any]) -> list[Target]:
    """Reading DCGM's activity may cost a tick at most half again: the worker thread, the
    fake libdcgm's own Python (a real libdcgm is C) and the activity series and rules it
    feeds, which are the point. A run whose activity did not come from DCGM measured nothing."""
    data = _get(results, "dcgm")
    if not data:
        return []
    note = (
        f"{fmt(data.get('tick_cpu_on_mean'), 'ms')} vs {fmt(data.get('tick_cpu_off_mean'), 'ms')}"
        ", 4 A100s, in-process, alternating rounds"
    )
    value = data.get("on_vs_off") if data.get("activity_from_dcgm") else None
    return [_ratio_target("DCGM source on, 4 A100: tick CPU <= 1.5x off", value, 1.5, note)]


def _fleet_targets(results: Mapping[str, Any]) -> list[Target]:
    """The default configuration's series per node against the compat output's, both from
    the fleet emulation's one capture of the same node."""
    runs = _get(results, "fleet", "runs") or {}
    native = _get(runs, "native", "exposition_series")
    compat = _get(runs, "compat", "exposition_series")
    return [
        _limit(
            "series per node (/metrics, default profile) <= the compat endpoint's",
            None if _missing(compat) else native,
            "count",
            0.0 if _missing(compat) else compat,
            f"/metrics/dcgm of the same node: {fmt(compat, 'count')}; 8-GPU mixed, pods attributed",
        )
    ]


TARGET_GROUPS: tuple[Callable[[Mapping[str, Any]], list[Target]], ...] = (
    _cpu_targets,
    _memory_targets,
    _soak_targets,
    _linear_targets,
    _mig_targets,
    _overhead_targets,
    _latency_targets,
    _detection_targets,
    _compat_targets,
    _dcgm_targets,
    _fleet_targets,
)


def evaluate_targets(results: Mapping[str, Any]) -> list[Target]:
    return [row for group in TARGET_GROUPS for row in group(results)]


def targets_section(results: Mapping[str, Any]) -> str:
    targets = evaluate_targets(results)
    rows = [[name, value, note, _verdict(ok)] for name, value, note, ok in targets]
    return table(["target", "measured", "note", "verdict"], rows)


SECTIONS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("peer", "Ours vs nvitop-exporter (same fake NVML, 8-GPU mixed, 1 s)", peer_section),
    ("peer", "Quantities covered (families with samples)", coverage_section),
    ("scaling", "Scaling", scaling_section),
    ("overhead", "Overhead over bare NVML (in-process, 8 GPUs)", overhead_section),
    ("soak", "Soak", soak_section),
    ("detection", "Detection latency (fault -> webhook)", detection_section),
    ("compat", "dcgm-exporter compatibility (in-process, shipped rules)", compat_section),
    ("dcgm", "DCGM source before Hopper (in-process, shipped rules)", dcgm_section),
    (
        "processes",
        "Per-process attribution (in-process, shipped rules, pod attribution on both sides)",
        processes_section,
    ),
    (
        "fleet",
        "Fleet emulation (a real Prometheus scraping one node's output as many)",
        fleet_section,
    ),
)


def render(results: Mapping[str, Any], machine: Mapping[str, Any] | None = None) -> str:
    parts = ["# Benchmark summary"]
    if machine:
        parts.append(", ".join(f"{k}: {v}" for k, v in machine.items()))
    for key, title, section in SECTIONS:
        if key in results:
            parts.append(f"## {title}\n\n{section(results[key])}")
    parts.append(f"## Targets\n\n{targets_section(results)}")
    return "\n\n".join(parts) + "\n"
