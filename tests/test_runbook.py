"""The runbook: one section per shipped alert, served at /runbook, and runbook_url made absolute
in every path that hands alerts to a person (the daemon, `rules export`, the config)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from gpu_exporter.alerting.rules import runbook
from gpu_exporter.alerting.rules.loader import load_rule_files
from gpu_exporter.alerting.rules.template import expand
from gpu_exporter.config.load import ConfigError, load_config
from gpu_exporter.model.xids import CRITICAL
from gpu_exporter.web import runbook_page
from tests.daemon import serve

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / "rules/gpu-exporter.rules.yaml"


def shipped_alerts() -> list[tuple[str, dict[str, str]]]:
    return [
        (rule["alert"], rule["annotations"])
        for group in yaml.safe_load(PACK.read_text())["groups"]
        for rule in group["rules"]
    ]


def test_every_alert_has_a_section_of_its_own() -> None:
    anchors = runbook_page.anchors()
    assert len(anchors) == len(set(anchors))
    for name, texts in shipped_alerts():
        assert texts["runbook_url"] == f"docs/runbook.md#{runbook.anchor_of(name)}", name
        assert runbook.anchor_of(name) in anchors, f"docs/runbook.md has no section {name}"


def test_the_page_renders_each_section_and_no_repository_links() -> None:
    page = runbook_page.render_page()
    for name, _ in shipped_alerts():
        assert f'<h3 id="{runbook.anchor_of(name)}">{name}</h3>' in page
    assert 'href="docs/' not in page and 'href="../' not in page  # nothing the daemon serves
    assert "<script" not in page


@pytest.mark.parametrize(
    ("value", "base", "expected"),
    [
        ("docs/runbook.md#gpulost", "https://wiki/rb", "https://wiki/rb#gpulost"),
        ("docs/runbook.md#gpulost", "https://wiki/rb/", "https://wiki/rb#gpulost"),
        ("docs/runbook.md#gpulost", "", "docs/runbook.md#gpulost"),
        ("https://team/own#x", "https://wiki/rb", "https://team/own#x"),  # a user's own link
    ],
)
def test_resolve_url(value: str, base: str, expected: str) -> None:
    assert runbook.resolve_url(value, base) == expected


@pytest.mark.parametrize(
    ("listen", "tls", "environ", "expected"),
    [
        ("10.0.0.5:9449", False, {}, "http://10.0.0.5:9449/runbook"),
        ("0.0.0.0:9449", False, {"POD_IP": "10.1.2.3"}, "http://10.1.2.3:9449/runbook"),
        ("[::]:9449", True, {"POD_IP": "fd00::7"}, "https://[fd00::7]:9449/runbook"),
        ("[::1]:9449", False, {}, "http://[::1]:9449/runbook"),
    ],
)
def test_default_base_url(listen: str, tls: bool, environ: dict[str, str], expected: str) -> None:
    assert runbook.default_base_url(listen, tls, environ) == expected


def test_without_pod_ip_the_default_names_this_host() -> None:
    url = urlsplit(runbook.default_base_url("0.0.0.0:9449", False, {}))
    assert url.hostname and url.hostname != "0.0.0.0" and url.port == 9449


@pytest.mark.parametrize("bad", ["docs/runbook.md", "ftp://x/rb", "https://x/rb#top"])
def test_config_refuses_a_base_url_that_is_not_absolute(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"alerting:\n  runbook_base_url: {bad!r}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    assert "alerting.runbook_base_url" in str(error.value) and ":2" in str(error.value)


def test_config_base_url_wins_over_the_default(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("alerting:\n  runbook_base_url: https://wiki.example/gpu\n")
    assert (
        load_config(path, environ={}).runbook_base_url(tls=lambda: False)
        == "https://wiki.example/gpu"
    )


def export(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "rules", "export", *flags, str(PACK)],
        capture_output=True,
        text=True,
    )


def test_rules_export_makes_every_link_absolute() -> None:
    result = export("--runbook-base-url", "https://w/rb")
    assert result.returncode == 0, result.stderr
    rules = [r for g in yaml.safe_load(result.stdout)["spec"]["groups"] for r in g["rules"]]
    for rule in rules:
        anchor = runbook.anchor_of(rule["alert"])
        assert rule["annotations"]["runbook_url"] == f"https://w/rb#{anchor}"


def test_rules_export_asks_where_the_runbook_is() -> None:
    """No default: Prometheus knows no address of the runbook (the shipped ServiceMonitor drops
    `instance`), and a link that does not open is worse than an error before the rollout."""
    result = export()
    assert result.returncode == 2 and result.stdout == ""
    assert "--runbook-base-url" in result.stderr


def test_the_daemon_serves_the_runbook_its_alerts_link(tmp_path: Path) -> None:
    with serve(tmp_path, "--simulate") as daemon:
        daemon.wait_ready()
        page = httpx.get(f"{daemon.url}/runbook", timeout=5)
        groups = httpx.get(f"{daemon.url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp
    links = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"]]
    assert links and all(
        link.startswith(f"http://127.0.0.1:{daemon.port}/runbook#") for link in links
    ), links
    for link in links:
        assert f'id="{urlsplit(link).fragment}"' in page.text, link


@pytest.mark.parametrize("xid", sorted(CRITICAL))
def test_the_xid_description_names_xids_py_meaning(xid: int) -> None:
    """GpuXidCritical's description spells each XID's meaning as gpu_exporter/model/xids.py does."""
    (rule,) = [r for g in load_rule_files([PACK]) for r in g.rules if r.name == "GpuXidCritical"]
    text = expand(
        rule.annotations["description"],
        labels={"gpu": "1", "uuid": "GPU-1", "xid": str(xid)},
        value=1.7e9,
    )
    assert f"XID {xid} ({CRITICAL[xid]}) at 2023-11-14 22:13:20 +0000 UTC." in text, text
