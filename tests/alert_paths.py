"""One alert, raised alike by the daemon and by a real Prometheus evaluating the shipped rules
over the daemon's /metrics (both sending to a real Alertmanager): the labels each path fires it
with, for the end-to-end tests of a simulated scenario."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.daemon import serve
from tests.servers import Recorder, alertmanager, am_alerts, prometheus
from tests.support import wait_for

ROOT = Path(__file__).resolve().parent.parent
Firing = set[frozenset[tuple[str, str]]]


def fast_rules(directory: Path) -> Path:
    """The shipped rules with their ranges at 20 s, `for:` at 5 s and a 1 s interval."""
    rules = directory / "fast.rules.yaml"
    text = (ROOT / "rules/gpu-exporter.rules.yaml").read_text()
    text = re.sub(r"\[(\d+)m\]", "[20s]", text)
    text = re.sub(r"for: \d+[mh]", "for: 5s", text)
    rules.write_text(re.sub(r"interval: \d+s", "interval: 1s", text))
    return rules


def firing_on_both_paths(tmp_path: Path, scenario: str, alertname: str, node: str) -> Firing:
    """`serve --simulate scenario` and Prometheus, each firing `alertname`: the label sets
    once both paths agree (and Alertmanager holds as many)."""
    rules = fast_rules(tmp_path)
    with (
        Recorder() as hook,
        alertmanager(tmp_path / "am", f"{hook.url}/hook") as am_url,
        serve(
            tmp_path, "--simulate", scenario, "--interval", "0.5", "--rules", str(rules),
            "--alertmanager-url", am_url, "--external-label", f"node={node}",
        ) as daemon,
    ):  # fmt: skip
        daemon.wait_ready()
        with prometheus(tmp_path / "prom", f"127.0.0.1:{daemon.port}", rules, am_url, node) as url:

            def firing(base: str) -> Firing:
                alerts = httpx.get(f"{base}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
                return {
                    frozenset({**a["labels"], "node": node}.items())
                    for a in alerts
                    if a["labels"]["alertname"] == alertname and a["state"] == "firing"
                }

            def agreed() -> Firing | None:
                daemon_side, prometheus_side = firing(daemon.url), firing(url)
                return daemon_side if daemon_side and daemon_side == prometheus_side else None

            try:
                both = wait_for(agreed, 60, f"both paths to fire {alertname} alike")
            except AssertionError:
                raise AssertionError((firing(daemon.url), firing(url))) from None
            held = wait_for(lambda: len(am_alerts(am_url, alertname)) == len(both), 30, "AM")
            assert held, am_alerts(am_url, alertname)
    return both
