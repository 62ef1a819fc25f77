"""`gpu-exporter diagnose`'s terminal report: readable tables, health before performance,
ANSI colour only when asked for."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any, TextIO

from gpu_exporter.collect.classify import CLASSES, THROTTLE_REASONS
from gpu_exporter.collect.nvml.topology import Topology
from gpu_exporter.diagnose.report import PodsRead
from gpu_exporter.diagnose.topology_notes import interpret

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

    def header(
        self,
        simulated: str | None,
        versions: Mapping[str, str | None],
        topology: Topology,
        duration: float,
        pods: PodsRead | None = None,
    ) -> None:
        where = f' (simulated node: scenario "{simulated}")' if simulated else ""
        self.line(self.paint(f"gpu-exporter diagnose{where}", "1"))
        self.section("1. Versions")
        labels = {
            "driver": "NVIDIA driver",
            "nvml": "NVML",
            "cuda_driver": "CUDA (driver API)",
            "nvidia_ml_py": "nvidia-ml-py",
            "exporter": "gpu-exporter",
        }
        for key, label in labels.items():
            self.line(f"  {label:<18} {versions.get(key) or 'n/a'}")
        self.section("2. Topology (as nvidia-smi topo -m)")
        for text in topology.matrix_text().splitlines():
            self.line(f"  {text}".rstrip())
        for error in topology.errors:
            self.line(f"  {self.paint('could not read', '33')} {error}")
        meaning = interpret(topology)
        self.line()
        self.line(f"  In short: {meaning.summary}")
        for note in meaning.notes:
            self._wrapped(f"- {note.text}", "  ", "    ")
        self.line()
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
        devices = report["devices"]
        self.section("3. GPU state")
        self.table(*_state_table(devices))
        for d in devices:
            if d["state"]["unavailable"]:
                self.line(
                    f"  GPU {d['index']}: {d['state']['unavailable']}; no current clocks, "
                    "power or temperature to show"
                )
        self.section(f"4. Activity profile ({report['profile']['samples']} samples)")
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
        self.section("5. Health (the rule pack's gpu-health alerts over the profile)")
        self._health(report)
        self.section("6. Settings")
        self._settings(devices)
        self.section("7. What to look at next (performance)")
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

    def _settings(self, devices: list[Mapping[str, Any]]) -> None:
        found = False
        for d in devices:
            config = d["config"]
            for finding in config["findings"]:
                found = True
                code = "33" if finding["level"] == "warning" else ""
                label = self.paint(finding["level"], code)
                self._wrapped(f"GPU {d['index']} {label}: {finding['text']}", "  ", "    ")
        if not found:
            self.line("  power limit, persistence, ECC, application clocks, MIG and compute mode")
            self.line("  as their defaults (where NVML reports them)")

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
        for cls in CLASSES:
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
            self.line(f"  none for {', '.join(sick)}: health first (section 5)")

    def _problems(self, report: Mapping[str, Any]) -> None:
        found = False
        for finding in report["health"]["node_findings"]:
            found = True
            self.line(f"  node: {self.paint(finding['text'], '31')}")
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
