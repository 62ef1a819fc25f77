"""What the notifier does with each refusal: against the real Alertmanager (400) and a small
HTTP server on 127.0.0.1 that answers by what a POST contains (401, 413, 400, 503)."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter.alerting.notify import Notifier, OutgoingAlert, TargetStats, answers
from gpu_exporter.alerting.notify import alertmanager as notifier_module
from gpu_exporter.alerting.notify.answers import Verdict
from gpu_exporter.alerting.notify.metrics import notifier_series
from gpu_exporter.alerting.notify.validation import payload_problem
from gpu_exporter.alerting.settings import AlertmanagerConfig
from gpu_exporter.model.catalog import FAMILIES
from tests.localserver import LocalServer
from tests.servers import Recorder, alertmanager, am_alerts
from tests.support import wait_for
from tests.test_notifier import am, notifier_to

FAST = {"retry_initial_backoff_seconds": 0.02, "retry_max_backoff_seconds": 0.1}
LOGGER = "gpu_exporter.alerting.notify.alertmanager"


# --- a server that answers by content ------------------------------------------------------


@dataclass(frozen=True)
class Post:
    names: tuple[str, ...]  # alertnames, in order
    status: int
    authorization: str


Answerer = Callable[[list[dict[str, Any]], str, int], tuple[int, str]]


class ScriptedServer:
    """Records every POST of alerts and answers `answer(alerts, authorization, body bytes)`."""

    def __init__(self, answer: Answerer) -> None:
        self.posts: list[Post] = []
        self._answer = answer
        self._lock = threading.Lock()
        self._server = LocalServer(self._handler())
        self.url = self._server.url

    def delivered(self) -> list[str]:
        """Alertnames in POSTs answered 2xx, in order (a name twice = a duplicate)."""
        with self._lock:
            return [n for p in self.posts if 200 <= p.status < 300 for n in p.names]

    def statuses(self) -> list[int]:
        with self._lock:
            return [p.status for p in self.posts]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                alerts = json.loads(raw)
                authorization = self.headers.get("Authorization", "")
                status, body = server._answer(alerts, authorization, len(raw))
                with server._lock:
                    names = tuple(a["labels"]["alertname"] for a in alerts)
                    server.posts.append(Post(names, status, authorization))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def __enter__(self) -> ScriptedServer:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)


@contextlib.contextmanager
def running(target: AlertmanagerConfig, **settings: Any) -> Iterator[Notifier]:
    external = settings.pop("external_labels", {})
    notifier = notifier_to([target], external, **{**FAST, **settings})
    notifier.start()
    try:
        yield notifier
    finally:
        notifier.stop(timeout=2.0)


def alert(name: str, **labels: str) -> OutgoingAlert:
    return OutgoingAlert(
        labels={"alertname": name, **labels},
        annotations={"summary": f"{name} summary"},
        starts_at=time.time(),
        ends_at=time.time() + 300,
    )


def stats_of(notifier: Notifier, url: str) -> TargetStats:
    return notifier.stats().targets[url]


# --- 401/403: kept and retried until the credentials work ----------------------------------


def test_401_keeps_the_alerts_until_the_password_file_is_fixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    password = tmp_path / "password"
    password.write_text("old-password\n")
    good = "Basic " + base64.b64encode(b"gpu:new-password").decode()

    def answer(alerts: list[dict[str, Any]], authorization: str, size: int) -> tuple[int, str]:
        return (200, "") if authorization == good else (401, "Unauthorized")

    caplog.set_level(logging.ERROR, logger=LOGGER)
    with ScriptedServer(answer) as server:
        target = am(server.url, basic_auth={"username": "gpu", "password_file": str(password)})
        with running(target) as notifier:
            notifier.send([alert("NeedsAuth0"), alert("NeedsAuth1")])
            wait_for(
                lambda: stats_of(notifier, server.url).failed_by_reason["unauthorized"] >= 6,
                5,
                "three refused attempts",
                0.01,
            )
            stats = stats_of(notifier, server.url)
            assert (stats.sent_total, stats.queue_length, stats.rejected_total) == (0, 2, 0)

            password.write_text("new-password\n")  # the secret is rotated: re-read, delivered
            wait_for(lambda: stats_of(notifier, server.url).sent_total == 2, 5, "delivery")
            stats = stats_of(notifier, server.url)

    assert server.delivered() == ["NeedsAuth0", "NeedsAuth1"]
    assert set(server.statuses()[:-1]) == {401}
    assert (stats.queue_length, stats.rejected_total, stats.dropped_total) == (0, 0, 0)
    refused = [r for r in caplog.records if "unauthorized" in r.getMessage()]
    assert refused and refused[0].levelno == logging.ERROR
    assert "kept and retried" in refused[0].getMessage()


def test_403_with_a_full_queue_drops_only_the_oldest_and_counts_them() -> None:
    def answer(alerts: list[dict[str, Any]], authorization: str, size: int) -> tuple[int, str]:
        return 403, '{"error": "forbidden"}'

    with (
        ScriptedServer(answer) as server,
        running(am(server.url), queue_capacity=3) as n,
    ):
        for i in range(5):
            n.send([alert(f"F{i}")])
        wait_for(lambda: stats_of(n, server.url).dropped_total == 2, 5, "two drops")
        wait_for(lambda: stats_of(n, server.url).failed_total > 0, 5, "a refused POST")
        stats = stats_of(n, server.url)
        assert stats.queue_length == 3
        assert stats.rejected_total == 0
        assert stats.failed_by_reason["unauthorized"] == stats.failed_total


# --- 413: halves, down to single alerts ----------------------------------------------------


def test_413_above_five_alerts_delivers_all_in_smaller_batches_none_twice() -> None:
    limit = 5

    def answer(alerts: list[dict[str, Any]], authorization: str, size: int) -> tuple[int, str]:
        return (413, "Request Entity Too Large") if len(alerts) > limit else (200, "")

    names = [f"Big{i:02d}" for i in range(23)]
    with ScriptedServer(answer) as server, running(am(server.url)) as notifier:
        notifier.send([alert(n) for n in names])
        wait_for(lambda: stats_of(notifier, server.url).sent_total == 23, 5, "delivery")
        learned = stats_of(notifier, server.url).batch_limit
        refusals = server.statuses().count(413)

        later = [f"Later{i}" for i in range(12)]
        notifier.send([alert(n) for n in later])
        wait_for(lambda: stats_of(notifier, server.url).sent_total == 35, 5, "later delivery")
        stats = stats_of(notifier, server.url)

    assert server.delivered() == names + later  # every alert once, in order
    assert all(len(p.names) <= limit for p in server.posts if p.status == 200)
    assert refusals >= 1 and learned <= limit
    assert server.statuses().count(413) == refusals  # the smaller size is remembered
    assert stats.failed_by_reason["too_large"] > 0
    assert (stats.rejected_total, stats.queue_length) == (0, 0)


def test_the_full_batch_size_is_tried_again_after_the_reset_time() -> None:
    def answer(alerts: list[dict[str, Any]], authorization: str, size: int) -> tuple[int, str]:
        return (413, "") if len(alerts) > 2 else (200, "")

    with (
        ScriptedServer(answer) as server,
        running(am(server.url), batch_limit_reset_seconds=0.3) as notifier,
    ):
        notifier.send([alert(f"R{i}") for i in range(4)])
        wait_for(lambda: stats_of(notifier, server.url).sent_total == 4, 5, "delivery")
        assert stats_of(notifier, server.url).batch_limit == 2
        time.sleep(0.4)
        notifier.send([alert(f"S{i}") for i in range(4)])
        wait_for(lambda: stats_of(notifier, server.url).sent_total == 8, 5, "second delivery")
    # Each send starts with the full size again (4 alerts, 413), then halves.
    assert server.statuses() == [413, 200, 200, 413, 200, 200]


def test_a_single_alert_still_too_large_is_dropped_loudly_and_the_rest_delivered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    huge = OutgoingAlert(
        labels={"alertname": "Huge", "gpu": "3"},
        annotations={"description": "x" * 20_000},
        starts_at=time.time(),
        ends_at=None,
    )

    def answer(alerts: list[dict[str, Any]], authorization: str, size: int) -> tuple[int, str]:
        return (413, "body too large") if size > 10_000 else (200, "")

    caplog.set_level(logging.ERROR, logger=LOGGER)
    others = [f"Small{i}" for i in range(7)]
    with ScriptedServer(answer) as server, running(am(server.url)) as notifier:
        notifier.send([alert(n) for n in others[:3]] + [huge] + [alert(n) for n in others[3:]])
        wait_for(lambda: stats_of(notifier, server.url).rejected_total == 1, 5, "the drop")
        wait_for(lambda: stats_of(notifier, server.url).sent_total == 7, 5, "delivery")
        stats = stats_of(notifier, server.url)

    assert sorted(server.delivered()) == sorted(others)
    assert len(server.delivered()) == 7
    assert "Huge" not in server.delivered()
    assert stats.rejected_by_reason == {"invalid": 0, "too_large": 1, "invalid_local": 0}
    assert stats.batch_limit == 256  # the alert was the problem, not the count
    [dropped] = [r for r in caplog.records if "dropping it" in r.getMessage()]
    assert "Huge" in dropped.getMessage() and "'gpu': '3'" in dropped.getMessage()
    assert "too_large" in dropped.getMessage() and "body too large" in dropped.getMessage()


# --- 400: bisect, deliver the good, drop the refused ---------------------------------------


def poisoned(alerts: list[dict[str, Any]], authorization: str, size: int) -> tuple[int, str]:
    """Like Alertmanager: 400 naming the problem when some alert of the batch is refused."""
    if any("poison" in a["labels"] for a in alerts):
        return 400, json.dumps('invalid label set: invalid value "poison"')
    return 200, ""


def test_400_for_one_alert_of_a_batch_delivers_the_others_and_drops_that_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    names = [f"Batch{i:02d}" for i in range(16)]
    batch = [alert(n, poison="1") if n == "Batch11" else alert(n) for n in names]
    with ScriptedServer(poisoned) as server, running(am(server.url)) as notifier:
        notifier.send(batch)
        wait_for(lambda: stats_of(notifier, server.url).rejected_total == 1, 5, "the drop")
        wait_for(lambda: stats_of(notifier, server.url).sent_total == 15, 5, "delivery")
        stats = stats_of(notifier, server.url)

    good = [n for n in names if n != "Batch11"]
    assert server.delivered() == good  # each once, in order
    assert len(server.posts) <= 2 * 4 + 1  # a bisection: log2(16) levels, two POSTs each
    assert stats.rejected_by_reason["invalid"] == 1
    assert stats.failed_by_reason["invalid"] > 0
    assert stats.queue_length == 0
    [dropped] = [r for r in caplog.records if "dropping it" in r.getMessage()]
    assert dropped.levelno == logging.ERROR
    assert "Batch11" in dropped.getMessage()
    assert 'invalid label set: invalid value "poison"' in dropped.getMessage()


def test_several_refused_alerts_and_503s_lose_and_duplicate_nothing() -> None:
    """Random 400s (poison), 413s (above 7 alerts) and 503s (one POST in four) with a
    queue that overflows: every alert ends delivered once, dropped as refused, or dropped by
    the overflow, and the counters say which."""
    rng = random.Random(20261201)
    lock = threading.Lock()

    def answer(alerts: list[dict[str, Any]], authorization: str, size: int) -> tuple[int, str]:
        with lock:
            unavailable = rng.random() < 0.25
        if unavailable:
            return 503, "unavailable"
        if len(alerts) > 7:
            return 413, ""
        return poisoned(alerts, authorization, size)

    poison = {f"P{i:03d}" for i in rng.sample(range(300), 12)}
    with (
        ScriptedServer(answer) as server,
        running(am(server.url), queue_capacity=120, max_batch_size=32) as n,
    ):
        for start in range(0, 300, 30):
            n.send(
                [
                    alert(name, poison="1") if name in poison else alert(name)
                    for name in (f"P{i:03d}" for i in range(start, start + 30))
                ]
            )
        wait_for(lambda: stats_of(n, server.url).queue_length == 0, 20, "an empty queue")
        stats = stats_of(n, server.url)

    delivered = server.delivered()
    assert len(delivered) == len(set(delivered))  # nothing twice
    assert not poison & set(delivered)
    assert stats.sent_total == len(delivered)
    assert stats.sent_total + stats.rejected_by_reason["invalid"] + stats.dropped_total == 300
    assert stats.rejected_by_reason["invalid"] <= len(poison)
    assert stats.rejected_by_reason["too_large"] == 0


def test_a_half_delivered_is_not_sent_again_when_the_other_half_fails() -> None:
    failed_once: set[str] = set()

    def answer(alerts: list[dict[str, Any]], authorization: str, size: int) -> tuple[int, str]:
        names = {a["labels"]["alertname"] for a in alerts}
        if len(alerts) > 4:
            return 413, ""
        if "H5" in names and "H5" not in failed_once:
            failed_once.add("H5")
            return 503, ""
        return 200, ""

    with ScriptedServer(answer) as server, running(am(server.url)) as notifier:
        notifier.send([alert(f"H{i}") for i in range(8)])
        wait_for(lambda: stats_of(notifier, server.url).sent_total == 8, 5, "delivery")
    assert [(p.names, p.status) for p in server.posts] == [
        (tuple(f"H{i}" for i in range(8)), 413),
        (("H0", "H1", "H2", "H3"), 200),
        (("H4", "H5", "H6", "H7"), 503),
        (("H4", "H5", "H6", "H7"), 200),
    ]


# --- against the real Alertmanager ---------------------------------------------------------


def test_real_alertmanager_400_drops_only_the_refused_alert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An invalid label name forced past the client-side check, as a notifier without one
    would send it: Alertmanager stores the others and answers 400 naming the problem."""
    monkeypatch.setattr(notifier_module, "payload_problem", lambda payload: None)
    caplog.set_level(logging.ERROR, logger=LOGGER)
    with Recorder() as hook, alertmanager(tmp_path / "am", f"{hook.url}/hook") as am_url:
        with running(am(am_url)) as notifier:
            notifier.send([alert("Good0"), alert("Bad", **{"k8s-cluster": "prod"}), alert("Good1")])
            wait_for(lambda: stats_of(notifier, am_url).rejected_total == 1, 8, "the drop")
            wait_for(lambda: stats_of(notifier, am_url).queue_length == 0, 8, "an empty queue")
            stats = stats_of(notifier, am_url)
        stored = sorted(a["labels"]["alertname"] for a in am_alerts(am_url))

    assert stored == ["Good0", "Good1"]
    assert stats.rejected_by_reason["invalid"] == 1
    [dropped] = [r for r in caplog.records if "dropping it" in r.getMessage()]
    assert "Bad" in dropped.getMessage()
    assert 'invalid label set: invalid name "k8s-cluster"' in dropped.getMessage()


def test_real_alertmanager_gets_the_valid_alerts_and_invalid_ones_are_refused_before(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=LOGGER)
    bad_annotation = OutgoingAlert(
        labels={"alertname": "BadAnnotation"},
        annotations={"run-book": "x"},
        starts_at=time.time(),
        ends_at=None,
    )
    with Recorder() as hook, alertmanager(tmp_path / "am", f"{hook.url}/hook") as am_url:
        with running(am(am_url)) as notifier:
            notifier.send([alert("Valid"), bad_annotation, alert("BadLabel", **{"1x": "y"})])
            wait_for(lambda: stats_of(notifier, am_url).sent_total == 1, 8, "delivery")
            stats = stats_of(notifier, am_url)
        stored = [a["labels"]["alertname"] for a in am_alerts(am_url)]

    assert stored == ["Valid"]
    assert stats.failed_total == 0  # the only POST carried the valid alert alone
    assert stats.rejected_by_reason == {"invalid": 0, "too_large": 0, "invalid_local": 2}
    logged = [r.getMessage() for r in caplog.records if "not sending alert" in r.getMessage()]
    assert len(logged) == 2
    assert "BadAnnotation" in logged[0] and "'run-book'" in logged[0]
    assert "BadLabel" in logged[1] and "'1x'" in logged[1]


def test_an_invalid_external_label_refuses_every_alert_before_sending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger=LOGGER)
    with (
        Recorder() as server,
        running(am(server.url), external_labels={"k8s-cluster": "prod"}) as notifier,
    ):
        notifier.send([alert("A"), alert("B")])
        stats = stats_of(notifier, server.url)
    assert server.requests == []
    assert stats.rejected_by_reason["invalid_local"] == 2
    assert "label name 'k8s-cluster' is not valid" in caplog.text


def test_dropped_alert_logs_are_capped_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger=LOGGER)
    with Recorder() as server, running(am(server.url)) as notifier:
        notifier.send([alert(f"Bad{i}", **{"bad-name": "x"}) for i in range(25)])
        stats = stats_of(notifier, server.url)
    logged = [r for r in caplog.records if "not sending alert" in r.getMessage()]
    assert len(logged) == notifier_module.LOGGED_DROPS_PER_INTERVAL
    assert stats.rejected_by_reason["invalid_local"] == 25  # the counter has them all


# --- the pieces ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "verdict", "reason"),
    [
        (200, Verdict.DELIVERED, ""),
        (202, Verdict.DELIVERED, ""),
        (400, Verdict.SPLIT_OR_DROP, "invalid"),
        (422, Verdict.SPLIT_OR_DROP, "invalid"),
        (413, Verdict.SPLIT_OR_DROP, "too_large"),
        (401, Verdict.RETRY, "unauthorized"),
        (403, Verdict.RETRY, "unauthorized"),
        (407, Verdict.RETRY, "unauthorized"),
        (408, Verdict.RETRY, "unavailable"),
        (429, Verdict.RETRY, "unavailable"),
        (500, Verdict.RETRY, "unavailable"),
        (503, Verdict.RETRY, "unavailable"),
        (301, Verdict.RETRY, "unexpected_status"),
        (404, Verdict.RETRY, "unexpected_status"),
        (405, Verdict.RETRY, "unexpected_status"),
    ],
)
def test_each_status_code_has_its_verdict(status: int, verdict: Verdict, reason: str) -> None:
    answer = answers.classify(status, "")
    assert (answer.verdict, answer.reason) == (verdict, reason)


def test_alertmanager_messages_are_unwrapped_for_the_log() -> None:
    # The bodies Alertmanager 0.25 really sends for a 400 and a 422.
    assert (
        'invalid name "x-y"'
        in answers.classify(400, '"invalid label set: invalid name \\"x-y\\""').detail
    )
    detail = answers.classify(422, '{"code":602,"message":"0.labels in body is required"}').detail
    assert detail == "HTTP 422: '0.labels in body is required'"
    assert answers.classify(502, "").detail == "HTTP 502: (no body)"


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({}, None),
        ({"labels": {"alertname": "A", "__meta": "kept"}}, None),  # Alertmanager takes it
        ({"labels": {}}, "no labels"),
        ({"labels": {"alertname": "A", "k8s-cluster": "prod"}}, "label name 'k8s-cluster'"),
        ({"labels": {"alertname": "A", "é": "x"}}, "label name 'é'"),
        ({"annotations": {"run book": "x"}}, "annotation name 'run book'"),
        ({"endsAt": "2026-01-01T00:00:00.000Z"}, "before startsAt"),
        ({"endsAt": "2026-01-02T00:00:00.000Z"}, None),  # equal: Alertmanager takes it
    ],
)
def test_client_side_checks_match_alertmanager(
    changes: dict[str, Any], problem: str | None
) -> None:
    payload = {
        "labels": {"alertname": "A"},
        "annotations": {"summary": "s"},
        "startsAt": "2026-01-02T00:00:00.000Z",
        **changes,
    }
    found = payload_problem(payload)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_every_reason_is_a_series_from_the_start_and_named_in_the_catalog() -> None:
    url = "http://127.0.0.1:9"
    notifier = notifier_to([am(url)])
    rows = {(s.name, s.labels): s.value for s in notifier_series(notifier)}
    help_of = {f.name: f.help for f in FAMILIES}
    for family, reasons in (
        ("gpu_exporter_notifications_errors_total", answers.ERROR_REASONS),
        ("gpu_exporter_notifications_rejected_total", answers.REJECT_REASONS),
    ):
        for reason in reasons:
            assert rows[(family, (("alertmanager", url), ("reason", reason)))] == 0
            assert reason in help_of[family]
    notifier.stop()
