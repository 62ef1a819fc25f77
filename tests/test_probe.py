"""`gpu-exporter probe URL`, what the chart's `helm test` pod runs in the exporter's own image:
exit 0 only on HTTP 200, 1 with a precise line for every other outcome, 2 for a bad URL. Servers
are real, on 127.0.0.1; the daemon case runs `serve --simulate` and probes its /readyz."""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from gpu_exporter.web.probe import probe
from tests.daemon import free_port, serve
from tests.localserver import LocalServer
from tests.tlsfiles import make_pki


class Answers(BaseHTTPRequestHandler):
    """/ok: 200; /unready: 503 with a reason; /moved: 302; /slow: 200 after a second."""

    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(1.0)
        status, body = {
            "/ok": (200, b"ok\n"),
            "/slow": (200, b"ok\n"),
            "/unready": (503, b"not ready:\n  NVML has not started\n"),
            "/moved": (302, b""),
        }.get(self.path, (404, b"no such page"))
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "/ok")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def run_probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter.cli", "probe", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_200_exits_0_and_anything_else_exits_1_saying_what_came_back():
    with LocalServer(Answers) as server:
        ok = run_probe(server.url + "/ok")
        unready = run_probe(server.url + "/unready")
        moved = probe(server.url + "/moved")
        missing = probe(server.url + "/nothing")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == f"probe: {server.url}/ok: HTTP 200 OK"
    assert unready.returncode == 1
    assert unready.stderr.strip() == (
        f"probe: {server.url}/unready: HTTP 503 Service Unavailable: "
        "not ready: NVML has not started"
    )
    assert "Traceback" not in unready.stderr
    # A redirect is reported, not followed to the 200 behind it.
    assert not moved.ok and moved.message == "HTTP 302 Found"
    assert not missing.ok and missing.message == "HTTP 404 Not Found: no such page"


def test_https_needs_a_trusted_certificate_unless_insecure(tmp_path):
    pki = make_pki(tmp_path / "pki")
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    with LocalServer(Answers, tls=tls) as server:
        verified = run_probe(server.url + "/ok")
        insecure = run_probe("--insecure", server.url + "/ok")
        unready = probe(server.url + "/unready", insecure=True)
    assert verified.returncode == 1
    assert "TLS certificate not accepted: " in verified.stderr
    assert "(--insecure skips the check)" in verified.stderr
    assert insecure.returncode == 0, insecure.stderr
    assert unready.message.startswith("HTTP 503 Service Unavailable: not ready")


def test_no_answer_is_named():
    refused = probe(f"http://127.0.0.1:{free_port()}/readyz", timeout=5)
    assert not refused.ok and refused.message == "connection refused"
    with LocalServer(Answers) as server:
        slow = probe(server.url + "/slow", timeout=0.3)
    assert not slow.ok and slow.message == "no answer within the timeout"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["ftp://127.0.0.1/readyz"], "not an http:// or https:// URL with a host"),
        (["http:///readyz"], "not an http:// or https:// URL with a host"),
        (["http://127.0.0.1:port/readyz"], "not a URL: 'http://127.0.0.1:port/readyz'"),
        (["--timeout", "0", "http://127.0.0.1/"], "--timeout: must be more than 0"),
    ],
)
def test_a_bad_url_or_timeout_exits_2_naming_it(args, expected):
    result = run_probe(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_probes_the_daemons_readyz(tmp_path: Path):
    with serve(tmp_path, "--simulate", "mixed") as daemon:
        daemon.wait_ready()
        result = run_probe(daemon.url + "/readyz")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"probe: {daemon.url}/readyz: HTTP 200 OK"
