"""The status page at `/`: one self-contained HTML document for `kubectl port-forward` debugging.

No external assets (inline CSS and JS, system fonts, no framework). The script polls
`api/v1/devices` and `api/v1/alerts` every 2 s through relative URLs, so the page also works
behind a path prefix, and puts every value into the DOM with `textContent`, never as markup.

Per GPU, in reading order: its state; its health (the daemon's active alerts of the shipped
pack's gpu-health group for it, as /api/v1/devices gives them: firing red, pending amber, the
row styled so an unhealthy GPU stands out); the pod holding it; its bottleneck class as a chip
coloured by the kind the server gives (waste, fine, spare, unknown) and the classifier's
one-line reason; activity; PCIe and NVLink throughput against capacity (the link that makes
a GPU link_bound has the hot bar); memory, power, clocks, temperature and throttling. The page
holds no threshold, alert name or class list of its own: it shows what the API says.

A GPU with MIG enabled has a row of its own (power, clocks, temperature, throttling: the
physical GPU's) saying "MIG: n instances" where a whole GPU shows its class, and one indented
row per MIG instance under it (its profile, GPU instance and compute instance, class, pods,
memory and activity; its utilization is its graphics-engine activity, as NVML has no
utilization under MIG).

With per-process attribution, a table of its own lists, for each shared GPU and MIG instance
(the API's `shared`: several containers hold or use it, or a container and processes of no
known container), one row per container: processes, its share of the utilization, encoder and
decoder, memory, energy and how it was charged (exclusive or apportioned); processes of no
known container have a row per reason (host, unknown). A container the API marks waste (holds
a share and does nothing with it) is painted as the waste classes are, with the API's reason.
Without per-process data the table and its heading are not shown at all.
"""

from __future__ import annotations

import functools
import html
import re

from gpu_exporter import __version__
from gpu_exporter.web.page_security import inline_hash, page_headers

REFRESH_SECONDS = 2

_PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>gpu-exporter status</title>
<style>
:root {
  --bg: #ffffff; --fg: #1b1f24; --muted: #57606a; --line: #d0d7de; --head: #f6f8fa;
  --bar: #e6e9ee; --fill: #2f6fdd; --ok: #1a7f37; --bad: #cf222e; --warn: #9a6700;
  --warn-bg: #fff8c5; --bad-bg: #ffebe9; --chip: #eef1f5;
  --waste: #bc4c00; --waste-bg: #fff1e5; --fine-bg: #dafbe1;
}
@media (prefers-color-scheme: dark) {
  :root {
    --bg: #0d1117; --fg: #e6edf3; --muted: #8d96a0; --line: #30363d; --head: #161b22;
    --bar: #262c36; --fill: #4c8fff; --ok: #3fb950; --bad: #ff7b72; --warn: #d29922;
    --warn-bg: #3b2e0a; --bad-bg: #4a1414; --chip: #21262d;
    --waste: #f0883e; --waste-bg: #3d2311; --fine-bg: #12301c;
  }
}
* { box-sizing: border-box; }
body {
  margin: 0; padding: 1rem 1.25rem; background: var(--bg); color: var(--fg);
  font: 13px/1.35 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
}
header { display: flex; flex-wrap: wrap; align-items: baseline; gap: .5rem 1.5rem; }
h1 { font-size: 1.3rem; margin: 0; }
h2 { font-size: 1.05rem; margin: 1.5rem 0 .5rem; }
.muted { color: var(--muted); }
#error {
  margin: .75rem 0; padding: .6rem .8rem; border: 1px solid var(--bad);
  background: var(--bad-bg); color: var(--fg); border-radius: 6px; font-weight: 600;
}
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; }
caption { text-align: left; color: var(--muted); padding-bottom: .3rem; }
th, td { padding: .3rem .3rem; border-bottom: 1px solid var(--line); text-align: left;
  vertical-align: middle; white-space: nowrap; }
thead th { background: var(--head); font-weight: 600; white-space: normal;
  vertical-align: bottom; }
tbody th { font-weight: 600; }
/* The GPU column stays in view while the wide table scrolls sideways. */
#gpus tr > :first-child { position: sticky; left: 0; z-index: 1; background: var(--bg); }
#gpus thead tr > :first-child { background: var(--head); }
#gpus tr.down > :first-child, #gpus tr.unhealthy > :first-child { background: var(--bad-bg); }
#gpus tr.suspect > :first-child { background: var(--warn-bg); }
.stale { opacity: .55; }
.num { font-variant-numeric: tabular-nums; }
.na { color: var(--muted); font-style: italic; }
.state-up { color: var(--ok); font-weight: 600; }
.state-down { color: var(--bad); font-weight: 600; }
tr.down td, tr.down th, tr.unhealthy td, tr.unhealthy th { background: var(--bad-bg); }
tr.unhealthy > th:first-child, tr.down > th:first-child { box-shadow: inset 4px 0 var(--bad); }
tr.suspect td, tr.suspect th { background: var(--warn-bg); }
tr.suspect > th:first-child { box-shadow: inset 4px 0 var(--warn); }
tr.instance > th { padding-left: 1.6rem; font-weight: 400; }
tr.instance > th::before { content: "\21B3\00A0"; color: var(--muted); }
tr.instance > td, tr.instance > th { border-bottom-style: dashed; }
.mig { font-weight: 600; }
.bar { display: block; width: 3.6rem; height: .45rem; margin-top: .2rem; background: var(--bar);
  border-radius: 3px; overflow: hidden; }
.bar > span { display: block; height: 100%; background: var(--fill); }
.bar.hot > span { background: var(--warn); }
.chip { display: inline-block; white-space: nowrap; margin: 0 .25rem .15rem 0; padding: 0 .45rem;
  border-radius: 999px; background: var(--warn-bg); color: var(--fg);
  border: 1px solid var(--warn); font-size: .85em; }
.class { display: inline-block; padding: 0 .45rem; border-radius: 4px; background: var(--chip);
  font-weight: 600; border: 1px solid var(--line); }
.class.kind-waste { background: var(--waste-bg); color: var(--waste); border-color: var(--waste); }
.class.kind-fine { background: var(--fine-bg); color: var(--ok); border-color: var(--ok); }
.class.kind-unknown { font-style: italic; border-style: dashed; }
.problem { display: block; width: max-content; margin: 0 0 .15rem; padding: 0 .45rem;
  border-radius: 4px; font-weight: 600; font-size: .85em; color: var(--fg); }
.problem.firing { background: var(--bad-bg); border: 1px solid var(--bad); }
.problem.pending { background: var(--warn-bg); border: 1px solid var(--warn); }
.healthy { color: var(--ok); font-weight: 600; }
td.why { white-space: normal; min-width: 13rem; max-width: 15rem; font-size: .9em; }
/* A container that holds a share and does nothing with it: painted as the waste classes. */
#pods tr.waste td, #pods tr.waste th { background: var(--waste-bg); }
#pods tr.waste > th:first-child { box-shadow: inset 4px 0 var(--waste); }
#pods tr.unattributed td.pod { font-style: italic; }
#pods td.use { white-space: normal; min-width: 12rem; max-width: 18rem; font-size: .9em; }
td.pod .line { max-width: 11rem; overflow: hidden; text-overflow: ellipsis; }
.legend { margin: 0 0 .4rem; max-width: 80rem; }
.firing { color: var(--bad); font-weight: 600; }
.pending { color: var(--warn); font-weight: 600; }
td.summary { white-space: normal; min-width: 20rem; }
tr.down td.state { white-space: normal; max-width: 12rem; }
td.throttle { white-space: normal; min-width: 8rem; max-width: 10rem; }
.line { display: block; }
footer { margin-top: 1.5rem; font-size: .85em; }
</style>
</head>
<body>
<header>
  <h1>gpu-exporter</h1>
  <span id="node" class="muted"></span>
  <span>Last updated: <time id="updated">never</time></span>
</header>
<div id="error" role="alert" hidden></div>
<noscript><p>This page needs JavaScript; the raw data is at
  <a href="api/v1/devices">api/v1/devices</a> and <a href="api/v1/alerts">api/v1/alerts</a>.
</p></noscript>

<h2 id="gpus-title">GPUs</h2>
<p class="legend muted">Health: the daemon's gpu-health alerts for the GPU (red: firing,
  amber: pending). Bottleneck: <b>orange</b> is waste (held but held back), <b>green</b> is
  fine (at a hardware roof), grey is spare (idle, no pod holds it) or unknown. Activity is a
  fraction of the last sample period; links are the busier direction against the link's
  capacity; n/a: not measurable here. MIG instances are listed under their GPU: their
  utilization is graphics-engine activity (NVML has none under MIG); health, links, power,
  clocks, temperature and throttling are the whole GPU's.</p>
<div class="scroll">
<table id="gpus" aria-labelledby="gpus-title">

  <thead><tr>
    <th scope="col">GPU</th>
    <th scope="col">Model</th>
    <th scope="col">State</th>
    <th scope="col">Health</th>
    <th scope="col">Pod</th>
    <th scope="col">Bottleneck</th>
    <th scope="col">Why</th>
    <th scope="col">Utilization</th>
    <th scope="col">SM activity</th>
    <th scope="col">Tensor activity</th>
    <th scope="col">DRAM activity</th>
    <th scope="col">PCIe / capacity</th>
    <th scope="col">NVLink / capacity</th>
    <th scope="col">Memory</th>
    <th scope="col">Power / limit</th>
    <th scope="col">SM clock / max</th>
    <th scope="col">Temperature</th>
    <th scope="col">Throttle reasons</th>
  </tr></thead>
  <tbody><tr><td colspan="18" class="muted">Loading&hellip;</td></tr></tbody>
</table>
</div>

<section id="pods-section" hidden>
<h2 id="pods-title">Use per pod on shared GPUs</h2>
<p class="legend muted">GPUs and MIG instances that several containers share (time-slicing,
  MPS), from the processes NVML lists. Utilization: the share of the last sample period the
  container's kernels ran, its part of the GPU's utilization (NVML has none under MIG).
  Memory: what its processes use. Energy: what was charged to it while it ran there:
  exclusive (it was alone on the GPU: measured) or apportioned (the GPU's energy by its share
  of the SM time: an estimate). <b>Orange</b>: waste, a container that holds a share and does
  nothing with it. Processes of no known container are listed by reason: host (outside
  Kubernetes) or unknown (their container could not be found).</p>
<div class="scroll">
<table id="pods" aria-labelledby="pods-title">
  <thead><tr>
    <th scope="col">GPU</th>
    <th scope="col">Pod</th>
    <th scope="col">Container</th>
    <th scope="col">Processes</th>
    <th scope="col">Utilization share</th>
    <th scope="col">Encoder / decoder</th>
    <th scope="col">Memory</th>
    <th scope="col">Energy</th>
    <th scope="col">Use</th>
  </tr></thead>
  <tbody></tbody>
</table>
</div>
</section>

<h2 id="alerts-title">Alerts <span id="alert-count" class="muted"></span></h2>
<div class="scroll">
<table id="alerts" aria-labelledby="alerts-title">
  <thead><tr>
    <th scope="col">State</th>
    <th scope="col">Alert</th>
    <th scope="col">Severity</th>
    <th scope="col">GPU</th>
    <th scope="col">Summary</th>
  </tr></thead>
  <tbody><tr><td colspan="5" class="muted">Loading&hellip;</td></tr></tbody>
</table>
</div>

<footer class="muted">gpu-exporter __VERSION__ &middot; refreshes every __REFRESH__ s &middot;
  <a href="metrics">metrics</a> &middot; <a href="api/v1/devices">devices</a> &middot;
  <a href="api/v1/alerts">alerts</a> &middot; <a href="api/v1/rules">rules</a></footer>

<script>
"use strict";
(() => {
  const REFRESH_MS = __REFRESH__ * 1000;
  const TIMEOUT_MS = 5000;
  // data-col names, in column order: stable hooks for tests and user styles.
  const GPU_COLS = ["gpu", "model", "state", "health", "pod", "bottleneck", "why", "util", "sm",
    "tensor", "dram", "pcie", "nvlink", "memory", "power", "clock", "temp", "throttle"];
  const ALERT_COLS = ["state", "alertname", "severity", "gpu", "summary"];
  const POD_COLS = ["gpu", "pod", "container", "processes", "util", "codec", "memory", "energy",
    "use"];
  let lastOk = null;  // when the device data last arrived

  // Every value goes through textContent: API data is never parsed as markup.
  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }
  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);
  const list = (m, family) => (Array.isArray(m[family]) ? m[family] : []);
  const labelOf = (s, key) => (s && s.labels && s.labels[key] != null ? String(s.labels[key]) : "");

  function labelled(m, family, key, want) {
    for (const s of list(m, family)) if (labelOf(s, key) === want) return num(s.value);
    return null;
  }
  function activeLabels(m, family, key) {
    return list(m, family).filter((s) => s && s.value === 1).map((s) => labelOf(s, key));
  }

  function bar(fraction, hot) {
    const outer = el("span", null, hot ? "bar hot" : "bar");
    outer.setAttribute("aria-hidden", "true");
    const inner = el("span");
    inner.style.width = (Math.max(0, Math.min(1, fraction)) * 100).toFixed(1) + "%";
    outer.append(inner);
    return outer;
  }
  function naCell(cls, why) {
    const td = el("td", "n/a", "na " + cls);
    td.title = why || "not measured on this GPU";
    return td;
  }
  function pctCell(v, cls, why) {
    if (v === null) return naCell(cls, why);
    const td = el("td", null, "num " + cls);
    td.append(el("span", Math.round(v * 100) + "%", "val"), bar(v, false));
    return td;
  }
  function memCell(used, total, why) {
    if (used === null) return naCell("memory", why);
    const gib = (x) => x / 2 ** 30;
    const fmt = (x) => (gib(x) < 100 ? gib(x).toFixed(1) : Math.round(gib(x)).toString());
    const td = el("td", null, "num memory");
    td.append(el("span", (total === null ? fmt(used) : fmt(used) + " / " + fmt(total)) + " GiB",
      "val"));
    if (total !== null && total > 0) td.append(bar(used / total, used / total >= 0.95));
    return td;
  }
  // namespace/pod per holder (gpu_pod_info, in either attribution mode); the container as title.
  function podCell(pods) {
    const td = el("td", null, "pod");
    if (pods.length === 0) td.append(el("span", "—", "na"));
    for (const p of pods) {
      const line = el("span", String(p.namespace || "") + "/" + String(p.pod || ""), "line");
      if (p.container) line.title = "container " + String(p.container);
      td.append(line);
    }
    return td;
  }
  function podInfo(m) {
    return list(m, "gpu_pod_info").map((s) => s.labels || {});
  }
  // The class chip, coloured by the kind the server gives (waste, fine, spare, unknown).
  function classCell(cls, kind) {
    const td = el("td", null, "bottleneck");
    if (cls === null || cls === undefined) {
      td.append(el("span", "—", "na"));
      td.title = "unknown: no bottleneck class reported";
    } else {
      const chip = el("span", cls, "class");
      if (typeof kind === "string" && /^[a-z]+$/.test(kind)) {
        chip.classList.add("kind-" + kind);
        chip.dataset.kind = kind;
        chip.title = kind;
      }
      td.append(chip);
    }
    return td;
  }
  function whyCell(reason, missing) {
    if (typeof reason === "string" && reason) return el("td", reason, "why");
    return el("td", missing || "", "why muted");
  }
  // The gpu-health alerts active for the GPU, as the server read them from the rule engine.
  function healthCell(h) {
    const td = el("td", null, "health");
    if (!h || typeof h !== "object" || h.state === "unknown") {
      td.append(el("span", "unknown", "na"));
      td.title = (h && h.why) || "no health verdict";
      return td;
    }
    const problems = Array.isArray(h.problems) ? h.problems : [];
    if (problems.length === 0) td.append(el("span", "ok", "healthy"));
    for (const p of problems) {
      const state = p.state === "firing" ? "firing" : "pending";
      const chip = el("span", p.text || p.alertname, "problem " + state);
      chip.title = [p.summary, p.alertname + " " + state].filter(Boolean).join(" · ");
      td.append(chip);
    }
    return td;
  }
  function healthRowClass(h) {
    if (!h || typeof h !== "object") return "";
    return h.state === "unhealthy" ? "unhealthy" : h.state === "pending" ? "suspect" : "";
  }
  // A link's rate against its capacity (bytes/s per direction), as GB/s with a bar.
  function linkCell(link, cls, hot) {
    const l = link && typeof link === "object" ? link : {};
    const rate = num(l.bytes_per_second);
    const cap = num(l.capacity_bytes_per_second);
    if (rate === null) {
      return naCell(cls, cap === null ? "no active link, or not measured" : undefined);
    }
    const gb = (x) => (x / 1e9 < 10 ? (x / 1e9).toFixed(1) : Math.round(x / 1e9).toString());
    const td = el("td", null, "num " + cls);
    td.append(el("span", (cap === null ? gb(rate) : gb(rate) + " / " + gb(cap)) + " GB/s", "val"));
    if (cap !== null && cap > 0) td.append(bar(rate / cap, hot));
    const share = num(l.utilization);
    if (share !== null) td.title = Math.round(share * 100) + "% of capacity";
    return td;
  }
  function linkCells(links, cls) {
    const ls = links && typeof links === "object" ? links : {};
    const share = (l) => (l && typeof l === "object" ? num(l.utilization) : null) ?? -1;
    const busier = share(ls.nvlink) > share(ls.pcie) ? "nvlink" : "pcie";
    // Hot: the link that makes this GPU link_bound.
    const hot = (name) => cls === "link_bound" && name === busier;
    return [linkCell(ls.pcie, "pcie", hot("pcie")), linkCell(ls.nvlink, "nvlink", hot("nvlink"))];
  }
  function parentCell(cls, index) {
    const td = el("td", "", "inherited " + cls);
    td.title = "a quantity of the whole GPU: see GPU " + index;
    return td;
  }
  function ratioCell(value, limit, unit, cls, hotAt) {
    if (value === null) return naCell(cls);
    const td = el("td", null, "num " + cls);
    const fmt = (x) => Math.round(x).toLocaleString("en-US");
    const text = (limit === null ? fmt(value) : fmt(value) + " / " + fmt(limit)) + " " + unit;
    td.append(el("span", text, "val"));
    if (limit !== null && limit > 0) td.append(bar(value / limit, value / limit >= hotAt));
    return td;
  }

  function deviceRow(d) {
    const m = d.metrics && typeof d.metrics === "object" ? d.metrics : {};
    const tr = el("tr");
    tr.dataset.gpu = String(d.index);
    tr.dataset.health = (d.health && d.health.state) || "unknown";
    tr.className = [d.up ? "" : "down", healthRowClass(d.health)].filter(Boolean).join(" ");
    const idx = el("th", d.index, "num index");
    idx.scope = "row";
    tr.append(idx, el("td", (d.info && d.info.model) || "—", "model"));

    const state = el("td", null, "state");
    if (d.up) state.append(el("span", "up", "state-up"));
    else {
      state.append(el("span", "down", "state-down"));
      if (d.down_reason) state.append(el("span", ": " + d.down_reason, "reason"));
    }
    tr.append(state, healthCell(d.health), podCell(podInfo(m)));

    // MIG on: the classes, utilization and activity are the instances' (rows below).
    const mig = labelled(m, "gpu_mig_mode", "state", "current") === 1;
    const instances = Array.isArray(d.instances) ? d.instances : [];
    const perInstance = mig ? "MIG is on: see its instances below" : undefined;
    const cls = d.bottleneck;  // null without classifier output
    if (mig) {
      const td = el("td", null, "bottleneck");
      td.append(el("span", "MIG: " + instances.length + " instance" +
        (instances.length === 1 ? "" : "s"), "mig"));
      td.title = "MIG is enabled: each MIG instance has its own class";
      tr.append(td, whyCell(null, "each instance has its own class"));
    } else tr.append(classCell(cls, d.bottleneck_kind), whyCell(d.bottleneck_reason));

    tr.append(
      pctCell(num(m.gpu_utilization_ratio), "util", perInstance),
      pctCell(num(m.gpu_sm_active_ratio), "sm", perInstance),
      pctCell(num(m.gpu_tensor_active_ratio), "tensor", perInstance),
      pctCell(num(m.gpu_dram_active_ratio), "dram", perInstance),
      ...linkCells(d.links, cls),
      memCell(num(m.gpu_memory_used_bytes), num(m.gpu_memory_total_bytes),
        mig ? "MIG is on: the GPU's memory is read per instance (the GPU's total needs the " +
          "MIG monitor capability)" : undefined),
      ratioCell(num(m.gpu_power_watts), num(m.gpu_power_limit_watts), "W", "power", 0.95),
    );
    const mhz = (v) => (v === null ? null : v / 1e6);
    tr.append(ratioCell(mhz(labelled(m, "gpu_clock_hertz", "clock", "sm")),
      mhz(labelled(m, "gpu_clock_max_hertz", "clock", "sm")), "MHz", "clock", 2));

    const gpuTemp = labelled(m, "gpu_temperature_celsius", "sensor", "gpu");
    const memTemp = labelled(m, "gpu_temperature_celsius", "sensor", "memory");
    if (gpuTemp === null && memTemp === null) tr.append(naCell("temp"));
    else {
      const td = el("td", null, "num temp");
      if (gpuTemp !== null) td.append(el("span", Math.round(gpuTemp) + " °C", "line"));
      if (memTemp !== null) td.append(el("span", "memory " + Math.round(memTemp) + " °C", "line"));
      tr.append(td);
    }

    // Active clock-event reasons; gpu_idle is normal, not throttling.
    if (!Array.isArray(m.gpu_clock_event_active)) tr.append(naCell("throttle"));
    else {
      const td = el("td", null, "throttle");
      const reasons = activeLabels(m, "gpu_clock_event_active", "reason")
        .filter((r) => r !== "gpu_idle");
      if (reasons.length === 0) td.append(el("span", "none", "muted"));
      for (const r of reasons) td.append(el("span", r, "chip"));
      tr.append(td);
    }
    GPU_COLS.forEach((name, i) => { tr.children[i].dataset.col = name; });
    return tr;
  }

  // One MIG instance, under its GPU's row: its own class, pods, activity and memory; the
  // GPU's power, clocks, temperature and throttling are left to the GPU's row.
  function instanceRow(d, inst) {
    const id = inst.identity && typeof inst.identity === "object" ? inst.identity : {};
    const act = inst.activity && typeof inst.activity === "object" ? inst.activity : {};
    const mem = inst.memory && typeof inst.memory === "object" ? inst.memory : {};
    const tr = el("tr", null, ["instance", healthRowClass(d.health)].filter(Boolean).join(" "));
    tr.dataset.gpu = String(d.index);
    tr.dataset.migUuid = String(id.mig_uuid || "");
    let name = "GI " + String(id.gpu_instance ?? "?");
    if (id.compute_instance != null) name += " · CI " + String(id.compute_instance);
    const idx = el("th", name, "num index");
    idx.scope = "row";
    idx.title = String(id.mig_uuid || "");
    const profile = el("td", String(id.mig_profile || "—"), "model");
    const size = inst.size && typeof inst.size === "object" ? inst.size : null;
    if (size && size.gpu_slices != null) {
      profile.title = size.gpu_slices + " GPU slice(s), " + size.multiprocessors + " SMs";
    }
    const state = el("td", "MIG instance", "state muted");
    const shared = id.compute_instance != null;
    const noActivity = shared
      ? "measured per GPU instance: this one is split into several compute instances"
      : "not measured yet, or not measurable: NVML reads MIG activity with GPM, which " +
        "needs Hopper or newer and two samples";
    const ge = pctCell(num(act.graphics_engine), "util", noActivity);
    ge.title = num(act.graphics_engine) === null ? noActivity
      : "graphics-engine activity (NVML has no utilization under MIG)";
    tr.append(
      idx, profile, state, parentCell("health", d.index),
      podCell(Array.isArray(inst.pods) ? inst.pods : []),
      classCell(inst.bottleneck, inst.bottleneck_kind), whyCell(inst.bottleneck_reason),
      ge,
      pctCell(num(act.sm), "sm", noActivity),
      pctCell(num(act.tensor), "tensor", noActivity),
      pctCell(num(act.dram), "dram", noActivity),
      parentCell("pcie", d.index), parentCell("nvlink", d.index),
      memCell(num(mem.used_bytes), num(mem.total_bytes),
        shared ? "the GPU instance's, shared by its compute instances" : undefined),
      parentCell("power", d.index), parentCell("clock", d.index),
      parentCell("temp", d.index), parentCell("throttle", d.index),
    );
    GPU_COLS.forEach((col, i) => { tr.children[i].dataset.col = col; });
    return tr;
  }

  // -- use per pod on shared GPUs and MIG instances ---------------------------------------
  function countCell(v, cls) {
    return v === null ? naCell(cls) : el("td", String(Math.round(v)), "num " + cls);
  }
  function codecCell(enc, dec, why) {
    if (enc === null && dec === null) return naCell("codec", why);
    const pct = (v) => (v === null ? "n/a" : Math.round(v * 100) + "%");
    return el("td", "enc " + pct(enc) + " · dec " + pct(dec), "num codec");
  }
  function energyCell(joules, attribution, why) {
    if (joules === null) return naCell("energy", why);
    const td = el("td", null, "num energy");
    const kj = joules / 1000;
    const text = kj < 100 ? kj.toFixed(1) : Math.round(kj).toLocaleString("en-US");
    td.append(el("span", text + " kJ", "val"));
    if (typeof attribution === "string" && attribution) {
      td.append(el("span", attribution, "line muted"));
    }
    return td;
  }
  // What the API says of the container's use: waste (orange, with the API's reason) or not.
  function useCell(p) {
    const td = el("td", null, "use");
    if (p.waste === true) {
      const chip = el("span", "idle", "class kind-waste");
      chip.dataset.kind = "waste";
      td.append(chip);
      if (typeof p.waste_reason === "string" && p.waste_reason) {
        td.append(el("span", p.waste_reason, "line"));
        td.title = p.waste_reason;
      }
    } else if (p.allocated === false) {
      td.append(el("span", "in use, not allocated to it", "muted"));
      td.title = "the kubelet did not allocate it this GPU";
    } else td.append(el("span", "in use", "muted"));
    return td;
  }
  function shareRows(d, where, owner, total, mig) {
    const rows = [];
    const noUtil = mig ? "NVML has no per-process utilization under MIG" : undefined;
    const noEnergy = mig ? "NVML measures no energy per MIG instance"
      : "none charged to it yet: its processes ran no kernel";
    const start = (cls, migUuid) => {
      const tr = el("tr", null, cls);
      tr.dataset.gpu = String(d.index);
      if (migUuid) tr.dataset.migUuid = String(migUuid);
      const th = el("th", where, "num index");
      th.scope = "row";
      tr.append(th);
      return tr;
    };
    const migUuid = mig && owner.identity ? owner.identity.mig_uuid : "";
    for (const p of Array.isArray(owner.pod_use) ? owner.pod_use : []) {
      if (!p || typeof p !== "object") continue;
      const tr = start(p.waste === true ? "waste" : "", migUuid);
      tr.append(
        el("td", String(p.namespace || "") + "/" + String(p.pod || ""), "pod"),
        el("td", String(p.container || "—"), "container"),
        countCell(num(p.processes), "processes"),
        pctCell(num(p.utilization), "util", noUtil),
        codecCell(num(p.encoder), num(p.decoder), noUtil),
        memCell(num(p.memory_bytes), total),
        energyCell(num(p.energy_joules), p.attribution, noEnergy),
        useCell(p),
      );
      rows.push(tr);
    }
    for (const u of Array.isArray(owner.unattributed) ? owner.unattributed : []) {
      if (!u || typeof u !== "object") continue;
      const tr = start("unattributed", migUuid);
      const use = el("td", null, "use");
      use.append(el("span", "no known container", "muted"));
      tr.append(
        el("td", String(u.reason || "unknown") + " processes", "pod"),
        el("td", "—", "container"),
        countCell(num(u.processes), "processes"),
        pctCell(num(u.utilization), "util", noUtil),
        naCell("codec", "not split by reason"),
        memCell(num(u.memory_bytes), total),
        naCell("energy", "charged to no container"),
        use,
      );
      rows.push(tr);
    }
    for (const tr of rows) POD_COLS.forEach((col, i) => { tr.children[i].dataset.col = col; });
    return rows;
  }
  function podUseRows(devices) {
    const rows = [];
    for (const d of devices) {
      const m = d.metrics && typeof d.metrics === "object" ? d.metrics : {};
      if (d.shared === true) {
        rows.push(...shareRows(d, String(d.index), d, num(m.gpu_memory_total_bytes), false));
      }
      for (const inst of Array.isArray(d.instances) ? d.instances : []) {
        if (!inst || inst.shared !== true) continue;
        const id = inst.identity && typeof inst.identity === "object" ? inst.identity : {};
        let where = String(d.index) + " GI " + String(id.gpu_instance ?? "?");
        if (id.compute_instance != null) where += " CI " + String(id.compute_instance);
        const mem = inst.memory && typeof inst.memory === "object" ? inst.memory : {};
        rows.push(...shareRows(d, where, inst, num(mem.total_bytes), true));
      }
    }
    return rows;
  }

  function messageRow(text, columns) {
    const td = el("td", text, "muted");
    td.colSpan = columns;
    const tr = el("tr");
    tr.append(td);
    return tr;
  }

  function renderDevices(data) {
    const devices = Array.isArray(data.devices) ? data.devices.slice() : [];
    devices.sort((a, b) => a.index - b.index);
    const body = document.querySelector("#gpus tbody");
    const rows = [];
    let instances = 0;
    for (const d of devices) {
      rows.push(deviceRow(d));
      for (const inst of Array.isArray(d.instances) ? d.instances : []) {
        rows.push(instanceRow(d, inst));
        instances += 1;
      }
    }
    if (rows.length === 0) rows.push(messageRow("No GPUs found.", GPU_COLS.length));
    body.replaceChildren(...rows);
    // Per-pod use only where there is some: no heading, no empty table otherwise.
    const shares = podUseRows(devices);
    document.querySelector("#pods tbody").replaceChildren(...shares);
    document.getElementById("pods-section").hidden = shares.length === 0;
    const node = data.node || {};
    const up = devices.filter((d) => d.up).length;
    let text = up + " of " + devices.length + " GPUs up";
    if (instances) text += " · " + instances + " MIG instance" + (instances === 1 ? "" : "s");
    if (node.driver_version) text += " · driver " + node.driver_version;
    if (typeof data.timestamp === "number") {
      text += " · snapshot " + new Date(data.timestamp * 1000).toLocaleTimeString();
    }
    document.getElementById("node").textContent = text;
  }

  const STATE_ORDER = { firing: 0, pending: 1 };
  function renderAlerts(data) {
    const alerts = Array.isArray(data.alerts) ? data.alerts.slice() : [];
    const gpuOf = (a) => labelOf(a, "gpu");
    // An instance's alert names its GPU instance (and compute instance) after the GPU.
    const whereOf = (a) => {
      let where = gpuOf(a);
      if (labelOf(a, "gpu_instance")) where += " GI " + labelOf(a, "gpu_instance");
      if (labelOf(a, "compute_instance")) where += " CI " + labelOf(a, "compute_instance");
      return where;
    };
    alerts.sort((a, b) =>
      (STATE_ORDER[a.state] ?? 2) - (STATE_ORDER[b.state] ?? 2) ||
      (Number(gpuOf(a)) || 0) - (Number(gpuOf(b)) || 0) ||
      labelOf(a, "alertname").localeCompare(labelOf(b, "alertname")));
    const rows = alerts.map((a) => {
      const tr = el("tr");
      const ann = a.annotations || {};
      tr.append(
        el("td", a.state, "state " + (a.state === "firing" ? "firing" : "pending")),
        el("td", labelOf(a, "alertname"), "alertname"),
        el("td", labelOf(a, "severity") || "—", "severity"),
        el("td", whereOf(a) || "—", "num gpu"),
        el("td", ann.summary || ann.description || "", "summary"),
      );
      ALERT_COLS.forEach((name, i) => { tr.children[i].dataset.col = name; });
      return tr;
    });
    if (rows.length === 0) rows.push(messageRow("No firing or pending alerts.", ALERT_COLS.length));
    document.querySelector("#alerts tbody").replaceChildren(...rows);
    const firing = alerts.filter((a) => a.state === "firing").length;
    document.getElementById("alert-count").textContent =
      "(" + firing + " firing, " + (alerts.length - firing) + " pending)";
  }

  async function getData(url) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), TIMEOUT_MS);
    try {
      const resp = await fetch(url, { cache: "no-store", signal: ctl.signal,
        headers: { Accept: "application/json" } });
      let body = null;
      try { body = await resp.json(); } catch (e) { /* not JSON: reported below */ }
      if (!resp.ok || !body || body.status !== "success" || !body.data) {
        const why = (body && body.error) || (resp.ok ? "not an API response" : "");
        throw new Error(why ? why + " (HTTP " + resp.status + ")" : "HTTP " + resp.status);
      }
      return body.data;
    } catch (e) {
      const why = e && e.name === "AbortError" ? "timed out" : (e && e.message) || String(e);
      throw new Error(url + ": " + why);
    } finally {
      clearTimeout(timer);
    }
  }

  async function refresh() {
    const [devices, alerts] = await Promise.allSettled(
      [getData("api/v1/devices"), getData("api/v1/alerts")]);
    const problems = [];
    for (const [result, render, table, columns] of [
      [devices, renderDevices, "gpus", GPU_COLS.length],
      [alerts, renderAlerts, "alerts", ALERT_COLS.length]]) {
      const ok = result.status === "fulfilled";
      if (ok) {
        try { render(result.value); } catch (e) { problems.push("bad data: " + e.message); }
      } else problems.push(result.reason.message);
      const node = document.getElementById(table);
      node.classList.toggle("stale", !ok);
      if (!ok && !node.dataset.loaded) {  // never had data: say so instead of "Loading"
        node.tBodies[0].replaceChildren(messageRow("No data: the API did not answer.", columns));
      }
      if (ok) node.dataset.loaded = "1";
    }
    document.getElementById("pods").classList.toggle("stale", devices.status !== "fulfilled");
    if (devices.status === "fulfilled") {
      lastOk = new Date();
      const t = document.getElementById("updated");
      t.textContent = lastOk.toLocaleTimeString();
      t.dateTime = lastOk.toISOString();
    }
    const banner = document.getElementById("error");
    if (problems.length) {
      banner.textContent = "Cannot reach the exporter API (" + problems.join("; ") + "). " +
        (lastOk ? "Showing data from " + lastOk.toLocaleTimeString() + ". " : "") +
        "Retrying every " + REFRESH_MS / 1000 + " s.";
      banner.hidden = false;
    } else banner.hidden = true;
    setTimeout(refresh, REFRESH_MS);
  }
  refresh();
})();
</script>
</body>
</html>
"""


def render_status_page() -> str:
    """The whole page; static apart from the version, so it can be served from memory."""
    return _PAGE.replace("__VERSION__", html.escape(__version__)).replace(
        "__REFRESH__", str(REFRESH_SECONDS)
    )


def _inline_hash(page: str, tag: str) -> str:
    body = re.search(rf"<{tag}>(.*?)</{tag}>", page, re.S)
    if body is None:
        raise ValueError(f"status page has no <{tag}> block")
    return inline_hash(body.group(1))


@functools.cache
def status_page_headers() -> dict[str, str]:
    """Response headers for the page: a CSP that allows only its own inline script and style
    (by hash) and requests to the same origin, so even a missed escape could not run code.
    The page is static, so they are computed once."""
    page = render_status_page()
    headers = page_headers(
        f"script-src {_inline_hash(page, 'script')}; "
        f"style-src {_inline_hash(page, 'style')}; connect-src 'self'"
    )
    return {**headers, "Cache-Control": "no-store"}
