"""`gpu-exporter diagnose`'s terminal report: readable tables, health before performance,
ANSI colour only when asked for."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any, TextIO

from gpu_exporter.collect.classify import THROTTLE_REASONS
from gpu_exporter.diagnose.report import PodsRead
from gpu_exporter.diagnose.time_shares import CATEGORIES, CLASS_ORDER

CLASS_COLOURS = {
    "idle": "2",
    "throttled": "31",
    "launch_bound": "33",
    "link_bound": "33",
    "memory_bound": "36",
    "tensor_bound": "32",
    "compute_bound": "32",
    "unknown": "35",
}

CATEGORY_COLOURS = {
    "idle_gaps": "2",
    "copy": "33",
    "collective": "33",
    "launch_bound": "33",
    "memory_bound": "36",
    "compute_bound": "32",
    "throttled": "31",
    "unknown": "35",
}
# Short column names of the categories, in their order.
CATEGORY_COLUMNS = {
    "idle_gaps": "idle gaps",
    "copy": "copy",
    "collective": "collective",
    "launch_bound": "launch",
    "memory_bound": "memory",
    "compute_bound": "compute",
    "throttled": "throttled",
    "unknown": "unknown",
}
# Each section's heading, by its name in report.SECTIONS: numbered in the diagnosis' order.
SECTION_TITLES = {
    "health": "1. Health (the rule pack's gpu-health alerts over the profile)",
    "steady_and_comparable": "2. Steady and comparable (versions, clocks, settings, drift)",
    "where_the_time_goes": "3. Where the time goes (the classifier's seconds over the profile)",
    "hot_spots": "4. Hot spots: what to look at next (performance)",
}

# A verdict's colour: none for pass and info (nothing to do to the GPU).
VERDICT_COLOURS = {"pass": "32", "info": "", "warning": "33", "critical": "31"}


class Text:
    """Readable tables; ANSI colour only when asked for."""

    def __init__(self, out: TextIO, colour: bool) -> None:
        self.out = out
        self.colour = colour

    def paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour and code else text

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def section(self, title: str) -> None:
        self.line()
        self.line(self.paint(title, "1"))

    def table(self, header: list[str], rows: list[list[str]], codes: list[list[str]]) -> None:
        """Pads before painting, so colour codes never shift the columns."""
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        heading = (h.ljust(w) for h, w in zip(header, widths, strict=True))
        self.line(("  " + "  ".join(heading)).rstrip())
        for row, row_codes in zip(rows, codes, strict=True):
            cells = [
                self.paint(cell.ljust(w), code)
                for cell, w, code in zip(row, widths, row_codes, strict=True)
            ]
            self.line("  " + "  ".join(cells).rstrip())

    def subsection(self, title: str) -> None:
        self.line()
        self.line(title)

    def header(self, simulated: str | None, duration: float, pods: PodsRead | None = None) -> None:
        """What is known before the profile: the node, where pods come from, how long."""
        where = f' (simulated node: scenario "{simulated}")' if simulated else ""
        self.line(self.paint(f"gpu-exporter diagnose{where}", "1"))
        if pods is not None and pods.socket is not None:
            if pods.read:
                held = f"{pods.devices} device(s) held by pods"
                self.line(f"Pods: from the kubelet at {pods.socket} ({held})")
            else:
                self.line(
                    f"Pods: {self.paint('not read', '33')}: the kubelet at {pods.socket} "
                    "did not answer"
                )
        if pods is not None and pods.runtime_socket is not None:
            if pods.runtime_read:
                self.line(
                    f"Processes: their pods from the container runtime at {pods.runtime_socket}"
                )
            else:
                self.line(
                    f"Processes: {self.paint('not mapped', '33')}: the container runtime at "
                    f"{pods.runtime_socket} did not answer (their use is unattributed)"
                )
        self.line(f"Profiling for {duration:g} s ...")
        self.out.flush()

    def body(self, report: Mapping[str, Any]) -> None:
        """The sections in the diagnosis' order (report.SECTIONS), then what needs attention."""
        devices = report["devices"]
        self.section(SECTION_TITLES["health"])
        self._health(report)
        self.section(SECTION_TITLES["steady_and_comparable"])
        self._versions(report["versions"])
        self._comparable(report["comparable"], devices)
        self.section(SECTION_TITLES["where_the_time_goes"])
        self._topology(report["topology"])
        self._activity(report, devices)
        self._time(report["time"])
        self.section(SECTION_TITLES["hot_spots"])
        self._next_steps(devices)
        self.section("Needs attention")
        self._problems(report)
        notes = [(d, note) for d in devices for note in d["notes"]]
        if notes:
            self.section("Notes")
            for d, note in notes:
                self._wrapped(f"{_where(d)}: {note}", "  ", "    ")
        self.line()
        status = report["exit_status"]
        verdict = "something needs attention" if status else "nothing needs attention"
        self.line(f"Exit status {status}: {verdict}.")

    def _versions(self, versions: Mapping[str, str | None]) -> None:
        self.subsection("Versions:")
        labels = {
            "driver": "NVIDIA driver",
            "nvml": "NVML",
            "cuda_driver": "CUDA (driver API)",
            "nvidia_ml_py": "nvidia-ml-py",
            "exporter": "gpu-exporter",
        }
        for key, label in labels.items():
            self.line(f"  {label:<18} {versions.get(key) or 'n/a'}")

    def _comparable(self, comparable: Mapping[str, Any], devices: list[Mapping[str, Any]]) -> None:
        """Clocks and settings per GPU over the profile, the state at its end, then the drift
        and clock findings, the settings' own findings and what was not read."""
        self.subsection("Clocks and settings over the profile (SM clock while busy):")
        self.table(*_comparable_table(comparable))
        self.subsection("State at the end of the profile:")
        self.table(*_state_table(devices))
        for d in devices:
            if d["state"]["unavailable"]:
                self.line(
                    f"  GPU {d['index']}: {d['state']['unavailable']}; no current clocks, "
                    "power or temperature to show"
                )
        self.line()
        found = False
        for finding in comparable["findings"]:
            found = True
            level = finding["level"]
            label = self.paint(level, "33" if level == "warning" else "")
            self._wrapped(f"{label}: {finding['text']}", "  ", "    ")
        found = self._settings(devices) or found
        if not found:
            self._wrapped(
                "steady and comparable: one driver, the same settings on GPUs of one model, "
                "none changed during the profile, and steady SM clocks while busy (where read); "
                "power limit, persistence, ECC, application clocks, MIG and compute mode as "
                "their defaults (where NVML reports them)",
                "  ",
                "  ",
            )
        for gpu in comparable["gpus"]:
            for item in gpu["not_read"]:
                self._wrapped(f"GPU {gpu['index']} not read: {item}", "  ", "    ")
        for item in comparable["not_read"]:
            self._wrapped(f"not read: {item}", "  ", "    ")

    def _topology(self, topology: Mapping[str, Any]) -> None:
        self.subsection("Topology (as nvidia-smi topo -m):")
        for text in topology["matrix"].splitlines():
            self.line(f"  {text}".rstrip())
        for error in topology["errors"]:
            self.line(f"  {self.paint('could not read', '33')} {error}")
        meaning = topology["interpretation"]
        self.line()
        self.line(f"  In short: {meaning['summary']}")
        for note in meaning["notes"]:
            self._wrapped(f"- {note['text']}", "  ", "    ")

    def _activity(self, report: Mapping[str, Any], devices: list[Mapping[str, Any]]) -> None:
        self.subsection(f"Activity profile ({report['profile']['samples']} samples):")
        self.table(*_profile_table(devices, report["pods"]["kubelet_socket"] is not None))
        from_dcgm = [str(d["index"]) for d in devices if d.get("activity_source") == "dcgm"]
        if from_dcgm:
            self.line(
                f"  SM, tensor and DRAM of GPU {', '.join(from_dcgm)}: DCGM's profiling fields "
                "(NVML has no GPM before Hopper)."
            )
        if any(d["instances"] for d in devices):
            self.line(
                "  MIG instances: util is graphics-engine activity (NVML has no utilization "
                "under MIG); PCIe, NVLink and link are their GPU's."
            )
        pods = _pod_table(devices)
        if pods is not None:
            self.line()
            self._wrapped(
                "Per pod, from the processes NVML lists (util, enc, dec: means over the "
                "profile; energy: charged during it):",
                "  ",
                "  ",
            )
            self.table(*pods)

    def _time(self, time: Mapping[str, Any]) -> None:
        """Each GPU's seconds by category as shares, the node's, what to look at for each
        category that holds time (in order), and what is not measured."""
        self.subsection(
            "Time by category (shares of each GPU's profiled seconds; kernels: the share of "
            "time a kernel ran):"
        )
        self.table(*_time_table(time))
        for gpu in time["gpus"]:
            if not gpu["counted"]:
                self._wrapped(f"{gpu['where']}: not counted: {gpu['not_counted']}", "  ", "    ")
        held = [c for c in time["categories"] if c["seconds"] > 0]
        if held:
            self.subsection("What to look at, in this order:")
        for number, category in enumerate(held, 1):
            share = _na(category["share"], "{:.0%}")
            title = self.paint(category["title"], CATEGORY_COLOURS.get(category["category"], ""))
            self._wrapped(
                f"{title}: {share} of the time ({', '.join(category['held_by'])}). "
                f"{category['look_at']} Cannot tell apart: {category['cannot_tell_apart']}",
                f"  {number}. ",
                "     ",
            )
        self.subsection("Not measured:")
        for item in time["not_measured"]:
            self._wrapped(f"- {item['what']}: {item['why']}", "  ", "    ")

    def _wrapped(self, text: str, first: str, rest: str) -> None:
        self.line(textwrap.fill(text, 100, initial_indent=first, subsequent_indent=rest))

    def _verdicts(self, report: Mapping[str, Any]) -> None:
        """The node's verdict, then each GPU's: its verdict, next step and why."""
        node = report["health"]["node_verdict"]
        at = f" (GPU {', '.join(str(i) for i in node['gpus'])})" if node["gpus"] else ""
        code = VERDICT_COLOURS[node["verdict"]]
        self.line(f"  node verdict: {self.paint(node['verdict'], code)}{at}")
        for d in report["devices"]:
            verdict = d["health_verdict"]
            if verdict is None:
                self._wrapped(f"GPU {d['index']}: no verdict: {d['health_verdict_unavailable']}",
                              "    ", "      ")  # fmt: skip
                continue
            painted = self.paint(verdict["verdict"], VERDICT_COLOURS[verdict["verdict"]])
            if verdict["action"] == "none":
                text = f"GPU {d['index']}: {painted} ({verdict['meaning']})"
            else:
                text = (
                    f"GPU {d['index']}: {painted}, next step {verdict['action']} "
                    f"({verdict['reason']}: {verdict['meaning']}; cleared by "
                    f"{verdict['cleared_by']})"
                )
            self._wrapped(text, "    ", "      ")

    def _health(self, report: Mapping[str, Any]) -> None:
        health = report["health"]
        self._verdicts(report)
        found = False
        for d in report["devices"]:
            if not d["health_findings"]:
                continue
            found = True
            pods = f" ({_pod_names(d['pods'])})" if d["pods"] else ""
            self.line(f"  {self.paint('GPU ' + str(d['index']), '31')}{pods}:")
            for finding in d["health_findings"]:
                self._wrapped(finding["text"], "    ", "      ")
            self.line("    Next steps, in order:")
            for number, step in enumerate(d["next_steps"], 1):
                self._wrapped(step, f"    {number}. ", "       ")
        for finding in health["node_findings"]:
            found = True
            self._wrapped(f"node: {finding['text']}", "  ", "    ")
        if health["node_findings"]:
            for number, step in enumerate(health["node_next_steps"], 1):
                self._wrapped(step, f"    {number}. ", "       ")
        if not found:
            self.line("  no gpu-health alert was pending or firing")
        for error in health["evaluation_errors"]:
            self.line(f"  {self.paint('rule evaluation failed', '33')}: {error}")
        self._wrapped(health["earlier_xids"], "  ", "  ")

    def _settings(self, devices: list[Mapping[str, Any]]) -> bool:
        """Each GPU's settings findings (config_checks.py); whether there were any."""
        found = False
        for d in devices:
            config = d["config"]
            for finding in config["findings"]:
                found = True
                code = "33" if finding["level"] == "warning" else ""
                label = self.paint(finding["level"], code)
                self._wrapped(f"GPU {d['index']} {label}: {finding['text']}", "  ", "    ")
        return found

    def _next_steps(self, devices: list[Mapping[str, Any]]) -> None:
        """Per class, the healthy GPUs and MIG instances in it, then the steps (once per
        distinct list: an instance without activity has its own). A GPU with a health finding
        gets none: its numbers describe a broken GPU."""
        sick = [f"GPU {d['index']}" for d in devices if d["next_steps_for"] == "health"]
        judged = [
            (_where(d, i), i or d)
            for d in devices
            if d["next_steps_for"] != "health"
            for i in (None, *d["instances"])
        ]
        for cls in CLASS_ORDER:  # in the order of their categories (where the time goes)
            groups: dict[tuple[str, ...], list[tuple[str, Mapping[str, Any]]]] = {}
            for where, entry in judged:
                if entry["class"] == cls:
                    groups.setdefault(tuple(entry["next_steps"]), []).append((where, entry))
            for steps, members in groups.items():
                names = ", ".join(where for where, _ in members)
                self.line(f"  {self.paint(cls, CLASS_COLOURS[cls])} ({names})")
                reasons: dict[str, list[str]] = {}  # one line for the same reason
                for where, entry in members:
                    reasons.setdefault(entry["class_reason"], []).append(where)
                for reason, places in reasons.items():
                    self.line(f"    {', '.join(places)}: {reason}")
                for step in steps:
                    self._wrapped(step, "    - ", "      ")
        if sick:
            self.line(f"  none for {', '.join(sick)}: health first (section 1)")

    def _problems(self, report: Mapping[str, Any]) -> None:
        found = False
        for finding in report["health"]["node_findings"]:
            found = True
            self.line(f"  node: {self.paint(finding['text'], '31')}")
        for finding in report["comparable"]["findings"]:
            if finding["level"] == "warning":  # drift between GPUs or over the profile
                found = True
                self._wrapped(f"node: {self.paint(finding['text'], '31')}", "  ", "    ")
        for d in report["devices"]:
            for instance in (None, *d["instances"]):
                for problem in (instance or d)["problems"]:
                    found = True
                    self.line(f"  {_where(d, instance)}: {self.paint(problem, '31')}")
        # Held and unused: a cost, not a fault of the GPU (GpuAllocatedButIdle's condition).
        for d in report["devices"]:
            for instance in (None, *d["instances"]):
                for idle in (instance or d)["idle_allocations"]:
                    found = True
                    who = f"{idle['namespace']}/{idle['pod']} (container {idle['container']})"
                    self._wrapped(
                        f"{_where(d, instance)}: {self.paint('idle allocation', '33')}: {who} "
                        f"{idle['why']}",
                        "  ",
                        "    ",
                    )
        if not found:
            self.line("  nothing")


def _where(device: Mapping[str, Any], instance: Mapping[str, Any] | None = None) -> str:
    """ "GPU 0", or a MIG instance's "GPU 0 GI 9" ("GPU 3 GI 1 CI 2" in a shared GPU instance)."""
    where = f"GPU {device['index']}"
    return f"{where} {_instance_name(instance)}" if instance is not None else where


def _instance_name(instance: Mapping[str, Any]) -> str:
    name = f"GI {instance['gpu_instance']}"
    if instance["compute_instance"] is not None:
        name += f" CI {instance['compute_instance']}"
    return name


def _na(value: float | None, fmt: str = "{:.2f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _gigabytes(rate: float | None) -> str:
    return _na(None if rate is None else rate / 1e9, "{:.1f}")


def _pair(now: float | None, best: float | None, scale: float, unit: str) -> str:
    if now is None:
        return "n/a"
    top = f"/{best / scale:.0f}" if best is not None else ""
    return f"{now / scale:.0f}{top} {unit}"


# (header, rows, per-cell colour codes), as _Text.table takes them
_Table = tuple[list[str], list[list[str]], list[list[str]]]


def _state_table(devices: list[Mapping[str, Any]]) -> _Table:
    header = ["GPU", "model", "up", "SM clock", "power", "temp", "clock events", "PCIe", "NVLink"]
    header.append("health")
    rows: list[list[str]] = []
    codes: list[list[str]] = []
    for d in devices:
        s, pcie = d["state"], d["state"]["pcie"]
        events = [e for e in s["clock_events_active"] if e != "gpu_idle"] or ["-"]
        throttled = any(e in THROTTLE_REASONS for e in events)
        link = "n/a"
        if pcie["generation"] is not None and pcie["width"] is not None:
            link = f"Gen{pcie['generation']:g} x{pcie['width']:g}"
            if pcie["max_generation"] is not None and pcie["max_width"] is not None:
                link += f" (max Gen{pcie['max_generation']:g} x{pcie['max_width']:g})"
        nvlink = _na(s["nvlink_links_active"], "{:.0f}")
        if s["nvlink_links"] == 0:
            nvlink = "none"
        elif s["nvlink_links"] is not None and s["nvlink_links_active"] is not None:
            nvlink = f"{s['nvlink_links_active']:.0f}/{s['nvlink_links']}"
        # Health only: a launch-bound workload is a problem of the job, not of the GPU.
        alerts = list(dict.fromkeys(f["alert"] for f in d["health_findings"]))
        health = ", ".join(alerts) or ("ok" if d["up"] else "down")
        unhealthy = health != "ok"
        rows.append(
            [
                str(d["index"]),
                d["model"] or "n/a",
                "yes" if d["up"] else "NO",
                _pair(s["sm_clock_hz"], s["sm_clock_max_hz"], 1e6, "MHz"),
                _pair(s["power_watts"], s["power_limit_watts"], 1.0, "W"),
                _na(s["temperature_celsius"], "{:.0f} C"),
                ",".join(events),
                link,
                nvlink,
                health,
            ]
        )
        red_if = ["", "", not d["up"], False, False, False, throttled, False, False]
        codes.append(["31" if bad else "" for bad in [*red_if, unhealthy]])
    return header, rows, codes


def _mhz(hz: float | None) -> str:
    return "n/a" if hz is None else f"{hz / 1e6:.0f}"


def _comparable_table(comparable: Mapping[str, Any]) -> _Table:
    """One row per GPU: its model and driver, its SM clock while busy (range and maximum) and
    whether it held steady, and the settings compared between GPUs; a cell that drifts from
    the other GPUs' (or changed during the profile) is yellow."""
    header = ["GPU", "model", "driver", "SM clock", "steady", "power limit", "persist", "ECC"]
    header += ["app clocks", "MIG", "compute"]
    drift = {
        (gpu, finding["setting"])
        for finding in comparable["findings"]
        if finding["check"] in ("drift_between_gpus", "changed_during_profile")
        for gpu in finding["gpus"]
    }
    columns = (  # the settings behind each column after "steady"
        ("power_management_limit_watts", "enforced_power_limit_watts"),
        ("persistence_mode",),
        ("ecc_enabled",),
        ("application_sm_clock_mhz", "application_memory_clock_mhz"),
        ("mig_mode",),
        ("compute_mode",),
    )
    rows: list[list[str]] = []
    codes: list[list[str]] = []
    for gpu in comparable["gpus"]:
        s, clock = gpu["settings"], gpu["sm_clock"]
        if clock["busy_samples"]:
            low, high = _mhz(clock["min_hz"]), _mhz(clock["max_hz"])
            span = low if low == high else f"{low}-{high}"
            sm = f"{span}/{_mhz(clock['max_clock_hz'])} MHz"
        else:
            sm = "idle" if clock["idle_samples"] else "n/a"
        steady = {True: "yes", False: "NO", None: "-"}[clock["steady"]]
        limit, default = s["power_management_limit_watts"], s["power_default_limit_watts"]
        power = "n/a" if limit is None else f"{limit:g}"
        power += "" if default is None else f"/{default:g}"
        power += "" if limit is None else " W"
        app_sm, app_mem = s["application_sm_clock_mhz"], s["application_memory_clock_mhz"]
        app = "n/a" if app_sm is None and app_mem is None else f"{app_sm or '?'}/{app_mem or '?'}"
        rows.append(
            [
                str(gpu["index"]),
                gpu["model"] or "n/a",
                s["driver_version"] or "n/a",
                sm,
                steady,
                power,
                _on_off(s["persistence_mode"]),
                _on_off(s["ecc_enabled"]),
                app,
                _on_off(s["mig_mode"]),
                s["compute_mode"] or "n/a",
            ]
        )
        drifted = [any((gpu["index"], k) in drift for k in keys) for keys in columns]
        first = ["", "", "33" if (gpu["index"], "driver_version") in drift else ""]
        first += ["", "33" if clock["steady"] is False else ""]
        codes.append(first + ["33" if bad else "" for bad in drifted])
    return header, rows, codes


def _on_off(value: Any) -> str:
    return "n/a" if value is None else ("on" if value else "off")


def _time_table(time: Mapping[str, Any]) -> _Table:
    """One row per GPU or MIG instance counted (its seconds, kernel share and each category's
    share), then the node's over them; a not-counted one has dashes (said below the table)."""
    keys = [c.key for c in CATEGORIES]
    header = ["GPU", "seconds", "kernels", *(CATEGORY_COLUMNS[k] for k in keys)]
    rows: list[list[str]] = []
    codes: list[list[str]] = []
    for gpu in time["gpus"]:
        own = gpu["shares"] if gpu["counted"] else dict.fromkeys(keys)
        shares = [_percent(own[k]) for k in keys]
        rows.append(
            [gpu["where"], f"{gpu['seconds']:.1f}", _na(gpu["kernel_time_share"], "{:.0%}"),
             *shares]
        )  # fmt: skip
        codes.append(["", "", ""] + [_share_code(k, c) for k, c in zip(keys, shares, strict=True)])
    node = {c["category"]: c["share"] for c in time["categories"]}
    shares = [_percent(node[k]) for k in keys]
    rows.append(["node", f"{time['total_seconds']:.1f}", "", *shares])
    codes.append(["1", "", ""] + [_share_code(k, c) for k, c in zip(keys, shares, strict=True)])
    return header, rows, codes


def _percent(share: float | None) -> str:
    """A share as a percentage; "-" for none at all (0 or nothing profiled)."""
    return "-" if not share else f"{share:.0%}"


def _share_code(category: str, cell: str) -> str:
    return CATEGORY_COLOURS.get(category, "") if cell != "-" else ""


def _profile_table(devices: list[Mapping[str, Any]], pods: bool = False) -> _Table:
    """One row per GPU, and under a MIG GPU one per instance (its util is its graphics-engine
    activity; the links are the GPU's, on the GPU's row); a pod column when pods were read."""
    header = ["GPU", "util", "SM", "tensor", "DRAM", "PCIe GB/s", "NVLink GB/s", "link", "class"]
    if pods:
        header.append("pod")
    rows: list[list[str]] = []
    codes: list[list[str]] = []
    for d in devices:
        p = d["profile"]
        mig = d["mig"] is not None and d["mig"]["current"] and d["up"]
        cls = d["class"] or "n/a (down)"
        code = CLASS_COLOURS.get(d["class"] or "", "31")
        if mig:
            count = len(d["instances"])
            cls, code = f"MIG: {count} instance{'' if count == 1 else 's'}", "1"
        row = [
            str(d["index"]),
            _na(p["utilization"]),
            _na(p["sm_active"]),
            _na(p["tensor_active"]),
            _na(p["dram_active"]),
            _gigabytes(p["pcie_bytes_per_second"]),
            _gigabytes(p["nvlink_bytes_per_second"]),
            _na(p["link_utilization"], "{:.0%}"),
            cls,
        ]
        rows.append([*row, _pod_names(d["pods"])] if pods else row)
        codes.append([""] * 8 + [code] + ([""] if pods else []))
        for i in d["instances"]:
            q = i["profile"]
            row = [
                f"  {_instance_name(i)} {i['mig_profile'] or ''}".rstrip(),
                _na(q["utilization"]),
                _na(q["sm_active"]),
                _na(q["tensor_active"]),
                _na(q["dram_active"]),
                "",
                "",
                "",
                i["class"] or "n/a",
            ]
            rows.append([*row, _pod_names(i["pods"])] if pods else row)
            codes.append(
                [""] * 8 + [CLASS_COLOURS.get(i["class"] or "", "31")] + ([""] if pods else [])
            )
    return header, rows, codes


def _pod_table(devices: list[Mapping[str, Any]]) -> _Table | None:
    """One row per container (and per reason of processes of no known container) on each GPU
    and MIG instance with per-pod data; None when none has any (no per-process attribution)."""
    header = ["GPU", "pod", "container", "procs", "util", "enc", "dec", "memory", "energy"]
    header.append("charged")
    rows: list[list[str]] = []
    codes: list[list[str]] = []
    for d in devices:
        for instance in (None, *d["instances"]):
            entry, where = instance or d, _where(d, instance)
            for p in entry["pod_use"]:
                rows.append(
                    [
                        where,
                        f"{p['namespace']}/{p['pod']}",
                        p["container"] or "-",
                        _na(p["processes"], "{:.0f}"),
                        _na(p["utilization"]),
                        _na(p["encoder"]),
                        _na(p["decoder"]),
                        _gibibytes(p["memory_bytes"]),
                        _na(None if p["energy_joules"] is None else p["energy_joules"] / 1e3,
                            "{:.1f} kJ"),
                        p["attribution"] or "-",
                    ]
                )  # fmt: skip
                idle = "33" if p["idle"] else ""
                codes.append(["", idle, "", idle, idle, "", "", "", "", ""])
            for u in entry["unattributed"]:
                rows.append(
                    [
                        where,
                        f"({u['reason']} processes)",
                        "-",
                        _na(u["processes"], "{:.0f}"),
                        _na(u["utilization"]),
                        "n/a",
                        "n/a",
                        _gibibytes(u["memory_bytes"]),
                        "-",
                        "-",
                    ]
                )
                codes.append([""] * len(header))
    return (header, rows, codes) if rows else None


def _gibibytes(value: float | None) -> str:
    return _na(None if value is None else value / 2**30, "{:.1f} GiB")


def _pod_names(pods: list[Mapping[str, str]]) -> str:
    return ", ".join(f"{p['namespace']}/{p['pod']}" for p in pods) or "-"
