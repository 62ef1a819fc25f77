"""Notifier against the real Alertmanager and small local HTTP(S) servers on 127.0.0.1."""

from __future__ import annotations

import base64
import contextlib
import re
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.alerting.notify import Delivery, Notifier, OutgoingAlert
from gpu_exporter.alerting.notify.alertmanager import USER_AGENT, format_timestamp
from gpu_exporter.alerting.settings import AlertingConfig, AlertmanagerConfig
from tests.daemon import free_port
from tests.servers import (
    Received,
    Recorder,
    alertmanager,
    am_alerts,
    webhook_messages,
)
from tests.support import require_tool

FAST = {"retry_initial_backoff_seconds": 0.05, "retry_max_backoff_seconds": 0.2}
RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


# --- helpers -------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def alert(name: str, ends_at: float | None = None, **labels: str) -> OutgoingAlert:
    return OutgoingAlert(
        labels={"alertname": name, **labels},
        annotations={"summary": f"{name} summary"},
        starts_at=time.time(),
        ends_at=ends_at,
    )


def am(url: str, **settings: Any) -> AlertmanagerConfig:
    """One Alertmanager's settings, as an `alerting.alertmanagers` entry gives them."""
    return AlertmanagerConfig.model_validate({"url": url, **settings})


def notifier_to(
    targets: Sequence[AlertmanagerConfig],
    external_labels: dict[str, str] | None = None,
    **settings: Any,
) -> Notifier:
    """A notifier for `targets`; `settings`: the `alerting:` section's (queue_capacity) and
    the delivery tunables."""
    section = {n: settings.pop(n) for n in list(settings) if n in AlertingConfig.model_fields}
    alerting = AlertingConfig(alertmanagers=list(targets), **section)
    return Notifier(alerting, external_labels or {}, delivery=Delivery(**settings))


@contextlib.contextmanager
def running(
    targets: Sequence[AlertmanagerConfig],
    external_labels: dict[str, str] | None = None,
    **settings: Any,
) -> Iterator[Notifier]:
    notifier = notifier_to(targets, external_labels, **{**FAST, **settings})
    notifier.start()
    try:
        yield notifier
    finally:
        notifier.stop(timeout=2.0)


def names(received: Received) -> list[str]:
    return [a["labels"]["alertname"] for a in received.body]


def test_firing_then_resolved_through_real_alertmanager(tmp_path: Path) -> None:
    with Recorder() as hook, alertmanager(tmp_path / "am", f"{hook.url}/hook") as am_url:
        external = {"cluster": "lab", "severity": "overridden-by-alert"}
        with running([am(am_url)], external) as notifier:
            firing = OutgoingAlert(
                labels={"alertname": "GPUBusyButIdle", "gpu": "0", "severity": "warning"},
                annotations={"summary": "GPU 0 busy but idle", "runbook": "look at SM activity"},
                starts_at=time.time(),
                ends_at=time.time() + 300,
                generator_url="http://node-1:9400/api/v1/alerts",
            )
            notifier.send([firing])

            [message] = webhook_messages(hook, "firing")
            expected_labels = {
                "alertname": "GPUBusyButIdle",
                "gpu": "0",
                "severity": "warning",
                "cluster": "lab",
            }
            assert message["alerts"][0]["labels"] == expected_labels
            [stored] = am_alerts(am_url, "GPUBusyButIdle")
            assert stored["labels"] == expected_labels
            assert stored["annotations"] == dict(firing.annotations)
            assert stored["generatorURL"] == firing.generator_url
            assert stored["status"]["state"] == "active"

            notifier.send([replace(firing, ends_at=time.time())])
            [resolved] = webhook_messages(hook, "resolved")
            assert resolved["alerts"][0]["labels"] == expected_labels
            assert resolved["alerts"][0]["status"] == "resolved"
            stats = notifier.stats()
            assert (stats.sent_total, stats.failed_total, stats.queue_length) == (2, 0, 0)


def test_alerts_wait_while_alertmanager_is_down_and_arrive_when_it_starts(
    tmp_path: Path,
) -> None:
    port = free_port()
    target = am(f"http://127.0.0.1:{port}", timeout_seconds=1.0)
    with Recorder() as hook, running([target], {"cluster": "lab"}) as notifier:
        notifier.send([alert(f"Down{i}", ends_at=time.time() + 300) for i in range(3)])
        notifier.send([alert(f"Down{i}", ends_at=time.time() + 300) for i in range(3, 5)])
        wait_until(lambda: notifier.stats().failed_total >= 5, "failed POSTs")
        assert notifier.stats().queue_length == 5
        assert notifier.stats().sent_total == 0

        with alertmanager(tmp_path / "am", f"{hook.url}/hook", port=port) as am_url:
            wait_until(lambda: notifier.stats().sent_total == 5, "delivery after start", 8)
            stored = am_alerts(am_url)
            assert sorted(a["labels"]["alertname"] for a in stored) == [
                f"Down{i}" for i in range(5)
            ]
            assert all(a["labels"]["cluster"] == "lab" for a in stored)
        stats = notifier.stats()
        assert (stats.queue_length, stats.dropped_total) == (0, 0)


# --- queueing, retries and stop ------------------------------------------------------------


def test_full_queue_drops_the_oldest_and_delivers_the_newest_later() -> None:
    port = free_port()
    target = am(f"http://127.0.0.1:{port}")
    with running([target], queue_capacity=3) as notifier:
        for i in range(5):
            notifier.send([alert(f"A{i}")])
        wait_until(lambda: notifier.stats().dropped_total == 2, "two drops")
        wait_until(lambda: notifier.stats().failed_total > 0, "a failed POST")
        assert notifier.stats().queue_length == 3

        with Recorder(port=port) as server:
            wait_until(lambda: notifier.stats().sent_total == 3, "delivery of the rest")
            delivered = [n for r in server.requests for n in names(r)]
        assert delivered == ["A2", "A3", "A4"]
        stats = notifier.stats()
        assert (stats.dropped_total, stats.queue_length) == (2, 0)


def test_a_down_alertmanager_does_not_hold_back_another() -> None:
    down = am(f"http://127.0.0.1:{free_port()}")
    with Recorder() as up_server, running([down, am(up_server.url)]) as notifier:
        notifier.send([alert("Independent")])
        assert names(up_server.wait_for(1)[0]) == ["Independent"]
        wait_until(lambda: notifier.stats().targets[up_server.url].sent_total == 1, "accounting")
        wait_until(lambda: notifier.stats().targets[down.url].failed_total > 0, "failures")
        assert notifier.stats().targets[down.url].queue_length == 1
        assert notifier.stats().targets[up_server.url].queue_length == 0


def test_batches_are_capped_and_keep_order() -> None:
    with Recorder() as server:
        notifier = notifier_to([am(server.url)], max_batch_size=2)
        notifier.send([alert(f"B{i}") for i in range(5)])  # queued before start: one backlog
        notifier.start()
        notifier.stop(timeout=2.0)
        assert [names(r) for r in server.requests] == [["B0", "B1"], ["B2", "B3"], ["B4"]]


def test_stop_flushes_then_ends_threads_and_is_prompt_when_target_is_down() -> None:
    with Recorder() as server:
        notifier = notifier_to([am(server.url)])
        notifier.start()
        notifier.send([alert("Flushed")])
        notifier.stop(timeout=2.0)
        assert [names(r) for r in server.requests] == [["Flushed"]]

    notifier = notifier_to([am(f"http://127.0.0.1:{free_port()}")])
    notifier.start()
    notifier.send([alert("Undeliverable")])
    started = time.monotonic()
    notifier.stop(timeout=3.0)
    assert time.monotonic() - started < 1.5
    notifier.send([alert("AfterStop")])  # ignored, and must not raise
    assert not [t for t in threading.enumerate() if t.name.startswith("notifier ")]


# --- payload, auth and error codes against a recording server ------------------------------


def test_payload_headers_and_basic_auth_from_password_file(tmp_path: Path) -> None:
    password_file = tmp_path / "password"
    password_file.write_text("s3cret\n")
    with Recorder() as server:
        target = am(
            server.url + "/prefix/",
            basic_auth={"username": "gpu", "password_file": str(password_file)},
        )
        external = {"cluster": "lab", "gpu": "external-loses", "node": "n1"}
        with running([target], external) as notifier:
            notifier.send([alert("Payload", gpu="3", node="", ends_at=None)])
            [request] = server.wait_for(1)

    assert request.path == "/prefix/api/v2/alerts"
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"] == USER_AGENT
    assert USER_AGENT.startswith("gpu-exporter/")
    expected_auth = "Basic " + base64.b64encode(b"gpu:s3cret").decode()
    assert request.headers["Authorization"] == expected_auth
    [sent] = request.body
    # Alert labels win; an empty alert label is absent, so the external one fills it in.
    assert sent["labels"] == {"alertname": "Payload", "gpu": "3", "cluster": "lab", "node": "n1"}
    assert sent["annotations"] == {"summary": "Payload summary"}
    assert RFC3339_MS.match(sent["startsAt"])
    assert "endsAt" not in sent  # not set: Alertmanager applies its resolve_timeout
    assert "generatorURL" not in sent


def test_bearer_token_file_is_reread_on_each_request(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("token-one\n")
    with Recorder() as server:
        target = am(server.url, bearer_token_file=str(token_file))
        with running([target]) as notifier:
            notifier.send([alert("First")])
            server.wait_for(1)
            token_file.write_text("token-two")
            notifier.send([alert("Second")])
            requests = server.wait_for(2)
    assert [r.headers["Authorization"] for r in requests] == [
        "Bearer token-one",
        "Bearer token-two",
    ]


def test_static_bearer_token() -> None:
    with (
        Recorder() as server,
        running([am(server.url, bearer_token="abc")]) as notifier,
    ):
        notifier.send([alert("Bearer")])
        [request] = server.wait_for(1)
    assert request.headers["Authorization"] == "Bearer abc"


def test_400_drops_the_batch_while_503_is_retried() -> None:
    with (
        Recorder(statuses=[400, 503, 503]) as server,
        running([am(server.url)]) as notifier,
    ):
        notifier.send([alert("Invalid")])
        wait_until(lambda: notifier.stats().rejected_total == 1, "the rejection")
        notifier.send([alert("Retried")])
        wait_until(lambda: notifier.stats().sent_total == 1, "delivery after 503s")
        stats = notifier.stats()
    assert [names(r) for r in server.requests] == [
        ["Invalid"],
        ["Retried"],
        ["Retried"],
        ["Retried"],
    ]
    assert (stats.failed_total, stats.rejected_total, stats.dropped_total) == (3, 1, 0)
    assert stats.queue_length == 0


# --- TLS -----------------------------------------------------------------------------------


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1, made with the openssl CLI."""
    openssl = require_tool("openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return str(cert), str(key)


def server_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


def test_https_with_ca_file_and_failure_without(tls_files: tuple[str, str]) -> None:
    cert, key = tls_files
    with Recorder(tls=server_context(cert, key)) as server:
        untrusted = am(server.url + "/untrusted", timeout_seconds=2)
        with running([untrusted]) as notifier:
            notifier.send([alert("Untrusted")])
            wait_until(lambda: notifier.stats().failed_total > 0, "a failed handshake")
            assert notifier.stats().sent_total == 0
        for target in (
            am(server.url + "/ca", tls={"ca_file": cert}),
            am(server.url + "/insecure", tls={"insecure_skip_verify": True}),
        ):
            with running([target]) as notifier:
                notifier.send([alert("Trusted")])
                wait_until(lambda n=notifier: n.stats().sent_total == 1, f"delivery to {target}")
    assert [r.path for r in server.requests] == ["/ca/api/v2/alerts", "/insecure/api/v2/alerts"]


def test_client_certificate(tls_files: tuple[str, str]) -> None:
    cert, key = tls_files
    with Recorder(tls=server_context(cert, key, client_ca=cert)) as server:
        with running([am(server.url, tls={"ca_file": cert}, timeout_seconds=2)]) as n:
            n.send([alert("NoClientCert")])
            wait_until(lambda: n.stats().failed_total > 0, "a refused client")
        target = am(server.url, tls={"ca_file": cert, "cert_file": cert, "key_file": key})
        with running([target]) as n:
            n.send([alert("ClientCert")])
            [request] = server.wait_for(1)
    assert names(request) == ["ClientCert"]


# --- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": "ftp://127.0.0.1:9093"}, "scheme must be http or https"),
        ({"url": "127.0.0.1:9093"}, "scheme must be http or https"),
        ({"url": "http://user:pw@127.0.0.1:9093"}, "basic_auth_username"),
        ({"url": "http://127.0.0.1:99999"}, "out of range"),
        ({"basic_auth": {"username": "u"}, "bearer_token": "t"}, "not both"),
        ({"basic_auth": {"username": "u", "password": "p", "password_file": "f"}}, "not both"),
        ({"basic_auth": {"password": "p"}}, "basic_auth.username"),
        ({"bearer_token": "t", "bearer_token_file": "f"}, "not both"),
        ({"bearer_token_file": "/nonexistent/token"}, "not a readable file"),
        ({"tls": {"cert_file": "c.pem"}}, "set together"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
    ],
)
def test_invalid_targets_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AlertingConfig(alertmanagers=[{"url": "http://127.0.0.1:9093", **kwargs}])


def test_invalid_settings_are_refused(tmp_path: Path) -> None:
    target = am("http://127.0.0.1:9093")
    with pytest.raises(ValueError, match="listed twice"):
        notifier_to([target, am("http://127.0.0.1:9093/")])
    with pytest.raises(ValueError, match="queue_capacity"):
        notifier_to([target], queue_capacity=0)
    with pytest.raises(ValueError, match="retry_max_backoff"):
        notifier_to([target], retry_initial_backoff_seconds=2, retry_max_backoff_seconds=1)
    bad_ca = am("https://127.0.0.1:9093", tls={"ca_file": str(tmp_path / "missing.pem")})
    with pytest.raises(ValueError, match="cannot load TLS files"):
        notifier_to([bad_ca])


def test_timestamps_are_rfc3339_utc_with_milliseconds() -> None:
    assert format_timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert format_timestamp(1767323045.6789) == "2026-01-02T03:04:05.679Z"
    assert format_timestamp(1767323045.9996) == "2026-01-02T03:04:06.000Z"
