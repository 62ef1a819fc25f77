"""The status page: self-contained HTML, and what headless Chromium renders from the real API JSON.

The JSON comes from the production sampler, rule manager and API code run in-process on the
fake NVML (`mixed`, ~11 simulated minutes so the shipped alerts fire); a small threaded server
serves it next to `render_status_page()`. Chromium is required: without it the browser tests
fail (scripts/test.sh installs it).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpu_exporter import sim
from gpu_exporter.alerting.rules.manager import RuleManager
from gpu_exporter.alerting.settings import RulesConfig
from gpu_exporter.collect.classify import CLASSES, Classifier
from gpu_exporter.collect.nvml.source import NvmlSource
from gpu_exporter.collect.source import ErrorLog
from gpu_exporter.pipeline.sampler import Sampler
from gpu_exporter.web.api import create_app
from gpu_exporter.web.status_page import render_status_page, status_page_headers
from tests.conftest import ManualClock
from tests.localserver import LocalServer

HEADERS = (
    "GPU",
    "Model",
    "State",
    "Health",
    "Pod",
    "Bottleneck",
    "Why",
    "Utilization",
    "SM activity",
    "Tensor activity",
    "DRAM activity",
    "PCIe / capacity",
    "NVLink / capacity",
    "Memory",
    "Power / limit",
    "SM clock / max",
    "Temperature",
    "Throttle reasons",
)
# Runs its handler if it is ever parsed as markup; the test then finds data-pwned on <body>.
PROBE = '<img src=x onerror="document.body.dataset.pwned=1">'


# -- unit --------------------------------------------------------------------------------------


def test_page_is_self_contained_and_accessible() -> None:
    page = render_status_page()
    assert page.startswith("<!DOCTYPE html>")
    assert '<html lang="en">' in page and "<title>" in page
    assert not re.search(r"https?://", page), "no absolute URLs: nothing may load from outside"
    assert not re.search(r"<link\b|<script[^>]*\bsrc=|@import|url\(", page, re.I)
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page
    for header in HEADERS:
        assert f'<th scope="col">{header}</th>' in page
    for header in ("State", "Alert", "Severity", "Summary"):
        assert f'<th scope="col">{header}</th>' in page
    # Relative URLs, so the page works behind a path prefix.
    assert 'getData("api/v1/devices")' in page and 'getData("api/v1/alerts")' in page
    assert "prefers-color-scheme: dark" in page


# -- the real JSON, a tiny server, and Chromium ---------------------------------------------------


@pytest.fixture(scope="module")
def api_json() -> Iterator[dict[str, Any]]:
    """/api/v1/devices and /api/v1/alerts as the daemon answers them for `mixed`."""
    clock = ManualClock()
    sim.install("mixed", clock=clock)
    errors = ErrorLog()
    source = NvmlSource(errors=errors, clock=clock)
    try:
        source.start()
        rules = RuleManager(RulesConfig(evaluation_interval_seconds=5.0))  # the shipped rule pack
        rules.load()
        sampler = Sampler(source, errors, interval=5.0, wall_clock=lambda: 1.75e9 + clock.now)
        sampler.add_processor("classifier", Classifier().process)
        sampler.add_listener(rules)
        for _ in range(130):  # 650 s: past the 2-10 min `for:` of the throttling rules
            clock.advance(5.0)
            sampler.tick()
        client = TestClient(create_app(sampler, lambda: source.started, rules))
        yield {
            "devices": client.get("/api/v1/devices").json(),
            "alerts": client.get("/api/v1/alerts").json(),
        }
    finally:
        source.close()
        sim.uninstall()


Route = tuple[int, dict[str, str], bytes]  # status, headers, body


def json_route(body: Any, status: int = 200) -> Route:
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


@contextmanager
def serve(routes: dict[str, Route]) -> Iterator[str]:
    """Serve `routes` (path -> response) on 127.0.0.1; yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, headers, body = routes.get(self.path.split("?")[0], (404, {}, b"not found"))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

    with LocalServer(Handler) as server:
        yield server.url


def page_routes(prefix: str, devices: Any, alerts: Any, csp: bool = True) -> dict[str, Route]:
    """The page (with its CSP unless `csp` is False) and the two API answers."""
    headers = {"Content-Type": "text/html; charset=utf-8"}
    if csp:
        headers.update(status_page_headers())
    return {
        f"{prefix}/": (200, headers, render_status_page().encode()),
        f"{prefix}/api/v1/devices": json_route(devices),
        f"{prefix}/api/v1/alerts": json_route(alerts),
    }


def chromium(tmp_path: Path, url: str, *args: str) -> str:
    """Run headless Chromium on `url` until the page has fetched its data; returns stdout."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:  # fail, never skip: the status page must be checked in a browser
        pytest.fail("chromium not found: apt-get install -y --no-install-recommends chromium")
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    command = [
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
        "--window-size=1280,900", "--virtual-time-budget=3000", *args, url,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    # stderr carries harmless dbus and /etc/chromium.d noise; show it only on failure.
    assert done.returncode == 0, f"chromium failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return done.stdout


class Dom(HTMLParser):
    """Rows of the rendered tables: data-col -> cell text, plus the throttle chips, the health
    problems (text, state), the class chip's kind, each cell's title and the columns whose bar
    is hot."""

    def __init__(self, markup: str) -> None:
        super().__init__()
        self.rows: dict[str, list[dict[str, Any]]] = {"gpus": [], "alerts": [], "pods": []}
        self.tags: list[tuple[str, dict[str, str]]] = []
        self._table = ""
        self._row: dict[str, Any] | None = None
        self._col: str | None = None
        self._chip: list[str] | None = None  # the list the open chip's text goes to
        self.feed(markup)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {k: v or "" for k, v in attrs}
        classes = attr.get("class", "").split()
        self.tags.append((tag, attr))
        if tag == "table":
            self._table = attr.get("id", "")
        elif tag == "tr" and self._table in self.rows:
            self._row = {"attrs": attr, "chips": [], "problems": [], "titles": {}, "hot": set()}
        elif tag in ("td", "th") and self._row is not None and "data-col" in attr:
            self._col = attr["data-col"]
            self._row[self._col] = ""
            self._row["titles"][self._col] = attr.get("title", "")
        elif tag == "span" and self._row is not None and "chip" in classes:
            self._chip = self._row["chips"]
            self._chip.append("")
        elif tag == "span" and self._row is not None and "problem" in classes:
            self._row["problems"].append(("", "firing" if "firing" in classes else "pending"))
            self._chip = []
        elif tag == "span" and self._row is not None and "class" in classes:
            self._row["kind"] = attr.get("data-kind", "")
        elif tag == "span" and self._row is not None and {"bar", "hot"} <= set(classes):
            self._row["hot"].add(self._col)

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._row is not None:
            if self._row["titles"]:  # skip the header row and "no data" rows (no data-col)
                self.rows[self._table].append(self._row)
            self._row = None
        elif tag in ("td", "th"):
            self._col = None
        elif tag == "span":
            self._chip = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._col is not None:
            self._row[self._col] += data
            if self._chip is self._row["chips"]:
                self._chip[-1] += data
            elif self._chip is not None:  # a health problem
                text, state = self._row["problems"][-1]
                self._row["problems"][-1] = (text + data, state)

    def attrs(self, tag: str, **match: str) -> dict[str, str]:
        return next(
            a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in match.items())
        )


def test_browser_renders_every_gpu_and_the_firing_alerts(
    api_json: dict[str, Any], tmp_path: Path
) -> None:
    with serve(page_routes("", api_json["devices"], api_json["alerts"])) as base:
        dom = Dom(chromium(tmp_path, f"{base}/", "--dump-dom"))
        shot = tmp_path / "status.png"
        chromium(tmp_path, f"{base}/", f"--screenshot={shot}")

    gpus = {row["gpu"]: row for row in dom.rows["gpus"]}
    assert sorted(gpus) == [str(i) for i in range(8)], gpus.keys()
    assert all(row["model"] == "NVIDIA H200" and row["state"] == "up" for row in gpus.values())
    launch_bound = gpus["4"]  # utilization 97%, SMs ~12% busy
    assert launch_bound["util"] == "97%"
    assert re.fullmatch(r"1[0-4]%", launch_bound["sm"]), launch_bound
    assert "hw_thermal_slowdown" in gpus["5"]["chips"] and "hw_slowdown" in gpus["5"]["chips"]
    assert re.fullmatch(r"\d{3} / 1,980 MHz", gpus["5"]["clock"]), gpus["5"]
    assert re.fullmatch(r"9\d °Cmemory 9\d °C", gpus["5"]["temp"]), gpus["5"]
    assert re.fullmatch(r"\d{3} / 700 W", gpus["6"]["power"]), gpus["6"]
    assert gpus["0"]["chips"] == [] and gpus["0"]["throttle"] == "none"  # gpu_idle is not shown
    assert "n/a" not in {row[c] for row in gpus.values() for c in ("util", "sm", "tensor", "dram")}
    assert all(re.fullmatch(r"\d+(\.\d)? / \d+ GiB", row["memory"]) for row in gpus.values())
    assert {row["pod"] for row in gpus.values()} == {"—"}  # no kubelet here
    assert not [row for row in gpus.values() if "instance" in row["attrs"].get("class", "")]
    # The classifier's class per GPU, its kind as the chip's colour, its reason beside it.
    classes = {gpu: row["bottleneck"] for gpu, row in gpus.items()}
    assert set(classes.values()) <= set(CLASSES) and classes["7"] == "link_bound", classes
    devices = {str(d["index"]): d for d in api_json["devices"]["data"]["devices"]}
    for gpu, row in gpus.items():
        assert row["kind"] == devices[gpu]["bottleneck_kind"] and row["kind"], row
        assert row["why"] == devices[gpu]["bottleneck_reason"] and row["why"], row
        assert row["health"] == "ok" and "unhealthy" not in row["attrs"].get("class", ""), row
    assert gpus["4"]["kind"] == gpus["7"]["kind"] == "waste" and gpus["2"]["kind"] == "fine"
    # Links against capacity; the NVLink that makes GPU 7 link-bound is the hot bar.
    assert re.fullmatch(r"3\d\d / 450 GB/s", gpus["7"]["nvlink"]), gpus["7"]
    assert re.fullmatch(r"\d+(\.\d)? / 63 GB/s", gpus["7"]["pcie"]), gpus["7"]
    assert gpus["7"]["hot"] == {"nvlink"} and not gpus["4"]["hot"] & {"pcie", "nvlink"}

    firing = {(a["alertname"], a["gpu"]) for a in dom.rows["alerts"] if a["state"] == "firing"}
    assert {("GpuThermalSlowdown", "5"), ("GpuBusyButIdle", "4")} <= firing, firing
    assert dom.attrs("div", id="error").get("hidden") is not None  # no error banner
    assert dom.attrs("time", id="updated").get("datetime")  # "last updated" was set
    # No per-process data here: no per-pod table, not even its heading.
    assert dom.attrs("section", id="pods-section").get("hidden") is not None
    assert dom.rows["pods"] == []

    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000, len(png)


def test_browser_escapes_hostile_values_and_shows_missing_ones_as_na(
    api_json: dict[str, Any], tmp_path: Path
) -> None:
    devices = copy.deepcopy(api_json["devices"])
    gpu0, gpu1, gpu2, gpu3 = devices["data"]["devices"][:4]
    gpu0["info"]["model"] = PROBE
    gpu0["metrics"]["gpu_clock_event_active"].append({"labels": {"reason": PROBE}, "value": 1.0})
    gpu1.update(up=False, down_reason=PROBE, metrics={}, links=None)
    gpu1.update(bottleneck=None, bottleneck_kind=None, bottleneck_reason=None)  # as when down
    gpu2.update(bottleneck=PROBE, bottleneck_kind=PROBE, bottleneck_reason=PROBE)
    gpu2["health"] = {"state": "unhealthy", "why": None, "problems": [
        {"alertname": PROBE, "state": "firing", "severity": PROBE, "text": PROBE,
         "summary": PROBE},
    ]}  # fmt: skip
    gpu0["links"] = {"pcie": {"bytes_per_second": PROBE}, "nvlink": PROBE}
    del gpu3["metrics"]["gpu_sm_active_ratio"]  # absent, as on pre-Hopper GPUs
    gpu3["metrics"]["gpu_tensor_active_ratio"] = None  # NaN is sent as null
    alerts = {"status": "success", "data": {"alerts": [{
        "labels": {"alertname": PROBE, "severity": PROBE, "gpu": "3"},
        "annotations": {"summary": PROBE},
        "state": "firing", "activeAt": "2025-01-01T00:00:00Z", "value": "1e+00",
    }]}}  # fmt: skip

    # Served under a path prefix, as behind an ingress: the page's relative URLs must follow.
    # Without the CSP, which would block the probe's handler even if it were parsed as markup.
    with serve(page_routes("/gpu", devices, alerts, csp=False)) as base:
        markup = chromium(tmp_path, f"{base}/gpu/", "--dump-dom")
    dom = Dom(markup)

    assert "data-pwned" not in markup and not [t for t, _ in dom.tags if t == "img"]
    gpus = {row["gpu"]: row for row in dom.rows["gpus"]}
    assert len(gpus) == 8
    assert gpus["0"]["model"] == PROBE and PROBE in gpus["0"]["chips"]
    assert gpus["1"]["state"] == f"down: {PROBE}"
    assert [gpus["1"][c] for c in ("util", "sm", "power", "temp", "throttle")] == ["n/a"] * 5
    assert gpus["1"]["bottleneck"] == "—" and gpus["1"]["why"] == ""
    assert gpus["1"]["pcie"] == gpus["1"]["nvlink"] == "n/a"
    assert gpus["2"]["bottleneck"] == gpus["2"]["why"] == PROBE
    assert gpus["2"]["kind"] == ""  # not a kind: no class name built from it
    assert gpus["2"]["problems"] == [(PROBE, "firing")] and gpus["2"]["health"] == PROBE
    assert gpus["0"]["pcie"] == gpus["0"]["nvlink"] == "n/a"
    assert gpus["3"]["sm"] == "n/a" and gpus["3"]["tensor"] == "n/a"  # never 0%
    assert gpus["3"]["dram"].endswith("%")
    [alert] = dom.rows["alerts"]
    assert alert["alertname"] == alert["severity"] == alert["summary"] == PROBE


def test_browser_shows_an_error_banner_when_the_api_cannot_be_reached(tmp_path: Path) -> None:
    routes = page_routes("", {}, {})
    routes["/api/v1/devices"] = json_route({"status": "error", "error": "no snapshot yet"}, 503)
    del routes["/api/v1/alerts"]  # 404
    with serve(routes) as base:
        markup = chromium(tmp_path, f"{base}/", "--dump-dom")
    banner = re.search(r'<div id="error" role="alert"( hidden(="")?)?>(.*?)</div>', markup, re.S)
    assert banner is not None and banner.group(1) is None, "banner missing or hidden"
    text = banner.group(3)
    assert "Cannot reach the exporter API" in text, text
    assert (
        "api/v1/devices: no snapshot yet (HTTP 503)" in text and "api/v1/alerts: HTTP 404" in text
    ), text
    assert Dom(markup).rows["gpus"] == []  # nothing invented
