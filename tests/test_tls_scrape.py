"""A real Prometheus scrapes /metrics over TLS with basic auth, the daemon configured by an
exporter-toolkit web-config file (the one promtool accepts as its own); a wrong password
leaves the target down with 401, plain HTTP to the TLS port fails."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.daemon import serve
from tests.servers import prometheus_with_config
from tests.support import require_tool, wait_for
from tests.tlsfiles import PASSWORD, USER, make_pki, tls_web_config

SCRAPE = """\
global:
  scrape_interval: 2s
  scrape_timeout: 2s  # a loaded CI machine: bcrypt checks run one at a time
scrape_configs:
- job_name: tls-auth
  scheme: https
  tls_config:
    ca_file: {ca}
  basic_auth:
    username: {user}
    password: {password}
  static_configs:
  - targets: ['{target}']
- job_name: wrong-password
  scheme: https
  tls_config:
    ca_file: {ca}
  basic_auth:
    username: {user}
    password: not-the-password
  static_configs:
  - targets: ['{target}']
- job_name: plain-http
  static_configs:
  - targets: ['{target}']
"""


def targets(url: str) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/targets", timeout=5)
    response.raise_for_status()
    active = response.json()["data"]["activeTargets"]
    return {target["labels"]["job"]: target for target in active if target["health"] != "unknown"}


def query(url: str, expression: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expression}, timeout=5)
    response.raise_for_status()
    return response.json()["data"]["result"]


def test_prometheus_scrapes_over_tls_with_basic_auth(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    web = tmp_path / "web.yml"
    web.write_text(tls_web_config(pki))
    # The same file is a valid web config for Prometheus' own exporter-toolkit.
    checked = subprocess.run(
        [require_tool("promtool"), "check", "web-config", str(web)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with serve(
        tmp_path,
        "--simulate",
        "--web-config-file",
        str(web),
        tls=pki.client_context(),
        auth=(USER, PASSWORD),
    ) as daemon:
        daemon.wait_ready()
        config = SCRAPE.format(
            ca=pki.ca, user=USER, password=PASSWORD, target=f"127.0.0.1:{daemon.port}"
        )
        with prometheus_with_config(tmp_path / "prometheus", config) as url:
            # Settled: every target scraped, the right credentials up (a first scrape may time
            # out on a loaded machine; that is Prometheus retrying, not a failure).
            seen = wait_for(
                lambda: (
                    (found := targets(url))
                    and len(found) == 3
                    and found["tls-auth"]["health"] == "up"
                    and found
                ),
                45,
                "three scrapes, tls-auth up",
            )
            assert seen["tls-auth"]["scrapeUrl"].startswith("https://")
            assert seen["wrong-password"]["health"] == "down"
            assert "401" in seen["wrong-password"]["lastError"], seen["wrong-password"]
            assert seen["plain-http"]["health"] == "down"
            samples = wait_for(lambda: query(url, 'gpu_up{job="tls-auth"}'), 15, "gpu_up")
            assert {sample["metric"]["gpu"] for sample in samples}
            assert not query(url, 'gpu_up{job!="tls-auth"}')
