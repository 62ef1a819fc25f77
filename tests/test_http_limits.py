"""HTTP limits: header-read and idle timeouts, the connection cap, rate-limited flood logs;
and a bounded slowloris on 127.0.0.1 against a daemon with few file descriptors, during which
/healthz, /readyz and /metrics keep answering."""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import resource
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_exporter.web import http_limits
from gpu_exporter.web.http_limits import (
    Connections,
    Limits,
    RateLimitFilter,
    closing_cap,
    connection_cap,
)
from gpu_exporter.web.request_head import RequestHead
from tests.daemon import serve

# --- units ---------------------------------------------------------------------------------


class FakeConnection:
    def __init__(self, registry: Connections) -> None:
        self.registry = registry
        self.closed_as: str | None = None  # "answered 503" or "closed idle"

    def close_for_cap(self, reading: bool) -> None:
        if reading:
            self.closed_as = "answered 503"
            self.registry.start_closing(self)  # type: ignore[arg-type]
        else:
            self.closed_as = "closed idle"
            self.registry.forget(self)  # type: ignore[arg-type]

    def reset(self) -> None:
        self.closed_as = "reset"


def test_the_cap_closes_the_oldest_header_reader_then_the_oldest_idle_then_refuses() -> None:
    registry = Connections(Limits(5.0, 60.0, 3, max_closing=2))
    idle, reading_old, reading_new = (FakeConnection(registry) for _ in range(3))
    for connection, state in ((idle, "idle"), (reading_old, "reading"), (reading_new, "reading")):
        assert registry.admit(connection)  # type: ignore[arg-type]
        registry.mark(connection, state)  # type: ignore[arg-type]
    fourth = FakeConnection(registry)
    assert registry.admit(fourth)  # type: ignore[arg-type]
    assert reading_old.closed_as == "answered 503"  # a request may be coming: answered
    assert reading_new.closed_as is idle.closed_as is None
    registry.mark(fourth, "busy")  # type: ignore[arg-type]
    registry.mark(reading_new, "busy")  # type: ignore[arg-type]
    fifth = FakeConnection(registry)
    assert registry.admit(fifth)  # type: ignore[arg-type]
    assert idle.closed_as == "closed idle"  # no header reader left: the oldest idle one goes
    registry.mark(fifth, "busy")  # type: ignore[arg-type]
    assert not registry.admit(FakeConnection(registry))  # type: ignore[arg-type]
    assert len(registry.open) == 3
    # Answered connections waiting for their clients are bounded: the oldest is reset.
    waiting = [FakeConnection(registry) for _ in range(2)]
    for connection in waiting:
        registry.start_closing(connection)  # type: ignore[arg-type]
    assert reading_old.closed_as == "reset" and list(registry.closing) == waiting
    assert len(registry.open) == 3


@pytest.mark.parametrize(
    ("configured", "limit", "cap"), [(256, 1024, 256), (256, 256, 176), (256, 40, 1)]
)
def test_the_cap_stays_under_the_open_file_limit(configured: int, limit: int, cap: int) -> None:
    assert (
        connection_cap(configured, limit)
        == cap
        == min(configured, max(1, limit - http_limits.FD_RESERVE))
    )


@pytest.mark.parametrize(
    ("cap", "limit", "closing"), [(256, 1_048_576, 1024), (256, 512, 176), (176, 256, 16)]
)
def test_connections_closing_for_the_cap_stay_under_the_open_file_limit(
    cap: int, limit: int, closing: int
) -> None:
    assert closing_cap(cap, limit) == closing
    assert cap + closing <= limit - http_limits.FD_RESERVE + http_limits.ACCEPT_BATCH


def test_rate_limited_logging_keeps_one_line_per_kind_with_a_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    limiter = RateLimitFilter(interval=60)

    def record(message: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, message, args, None)

    passed = [limiter.filter(record("Invalid HTTP request received.")) for _ in range(1000)]
    assert passed.count(True) == 1
    assert limiter.filter(record("closed %d connections", 7))  # another kind passes
    now[0] += 61
    later = record("Invalid HTTP request received.")
    assert limiter.filter(later)
    assert (
        later.getMessage() == "Invalid HTTP request received. (999 more like this in the last 61s)"
    )
    for i in range(2 * RateLimitFilter.MAX_KINDS):  # kinds are bounded
        limiter.filter(record(f"kind {i}"))
    assert len(limiter._limit) == RateLimitFilter.MAX_KINDS


def first_refusal(pieces: list[bytes], limit: int) -> int | None:
    head = RequestHead(limit)
    for piece in pieces:
        refusal = head.feed(piece)
        if refusal is not None:
            return refusal
    return None


@settings(max_examples=300, deadline=None)
@given(
    line=st.integers(min_value=0, max_value=120),
    fields=st.lists(st.integers(min_value=0, max_value=40), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_the_head_limit_does_not_depend_on_how_the_bytes_arrive(
    line: int, fields: list[int], cuts: list[int]
) -> None:
    limit = 100
    request_line = b"GET /?q=" + b"a" * line + b" HTTP/1.1\r\n"
    head = request_line + b"".join(b"X-%d: %s\r\n" % (i, b"b" * n) for i, n in enumerate(fields))
    head += b"\r\n"
    whole = head + b"GET / HTTP/1.1\r\n"  # the next request's start, pipelined
    expected = 414 if len(request_line) - 1 > limit else 431 if len(head) > limit else None
    assert first_refusal([whole], limit) == expected
    bounds = sorted({0, len(whole), *(cut % (len(whole) + 1) for cut in cuts)})
    pieces = [whole[a:b] for a, b in itertools.pairwise(bounds)]
    assert first_refusal(pieces, limit) == expected


# --- a live daemon -------------------------------------------------------------------------


def web_settings(tmp_path: Path, **web: object) -> Path:
    path = tmp_path / "config.yml"
    path.write_text("web:\n" + "".join(f"  {key}: {value}\n" for key, value in web.items()))
    return path


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_header_read_and_idle_timeouts(tmp_path: Path) -> None:
    config = web_settings(tmp_path, header_read_timeout_seconds=1, idle_timeout_seconds=2)
    with serve(tmp_path, "--simulate", "--config", str(config)) as daemon:
        daemon.wait_ready()
        with socket.create_connection(("127.0.0.1", daemon.port)) as half:
            half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
            assert closed_by_server(half, within=5)
        with socket.create_connection(("127.0.0.1", daemon.port)) as silent:
            assert closed_by_server(silent, within=5)  # connected, sent nothing
        with socket.create_connection(("127.0.0.1", daemon.port)) as slow_but_in_time:
            slow_but_in_time.sendall(b"GET /healthz HTTP/1.1\r\n")
            time.sleep(0.3)
            slow_but_in_time.sendall(b"Host: x\r\n\r\n")
            slow_but_in_time.settimeout(5)
            assert slow_but_in_time.recv(4096).startswith(b"HTTP/1.1 200")
            # Kept alive, then idle: closed after the idle timeout, not the header timeout.
            assert not closed_by_server(slow_but_in_time, within=1.3)
            assert closed_by_server(slow_but_in_time, within=5)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


FD_LIMIT = 256
SLOWLORIS_SECONDS = 10.0
SLOWLORIS_SOCKETS = 2 * FD_LIMIT  # half-open connections kept open at once, at most
MAX_OPENS = 20_000  # connection attempts in all, at most


def lower_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def slowloris(port: int, stop: threading.Event, stats: dict[str, int]) -> None:
    """Keep up to SLOWLORIS_SOCKETS connections that send a header one line a second and never
    finish it; reopen those the server closes. Bounded by MAX_OPENS and `stop`."""
    open_socks: list[socket.socket] = []
    last_drip = time.monotonic()
    try:
        while not stop.is_set() and stats["opened"] < MAX_OPENS:
            while len(open_socks) < SLOWLORIS_SOCKETS and stats["opened"] < MAX_OPENS:
                sock = socket.socket()
                sock.setblocking(False)
                stats["opened"] += 1
                try:
                    sock.connect(("127.0.0.1", port))
                except BlockingIOError:
                    pass
                except OSError:
                    sock.close()
                    break
                open_socks.append(sock)
            if time.monotonic() - last_drip >= 1.0:
                last_drip = time.monotonic()
                kept = []
                for sock in open_socks:
                    try:
                        sock.send(b"GET /metrics HTTP/1.1\r\nX-a: b\r\n")
                        kept.append(sock)
                    except OSError:  # closed by the server (timeout or the cap)
                        stats["closed"] += 1
                        sock.close()
                open_socks = kept
            time.sleep(0.02)
    finally:
        for sock in open_socks:
            sock.close()


def test_probes_answer_through_a_slowloris_with_few_file_descriptors(tmp_path: Path) -> None:
    with serve(tmp_path, "--simulate", "--interval", "0.5", preexec_fn=lower_fd_limit) as daemon:
        daemon.wait_ready()
        pid = daemon.process.pid
        fds_before, rss_before = open_fds(pid), rss_kib(pid)
        log_before = len(daemon.output())
        stop, stats = threading.Event(), {"opened": 0, "closed": 0}
        attacker = threading.Thread(target=slowloris, args=(daemon.port, stop, stats))
        attacker.start()
        slowest: dict[str, float] = {}
        failures: list[str] = []
        try:
            deadline = time.monotonic() + SLOWLORIS_SECONDS
            time.sleep(1.0)  # let the flood fill the cap
            while time.monotonic() < deadline:
                for path in ("/healthz", "/readyz", "/metrics"):
                    started = time.monotonic()
                    try:
                        # A new connection each time, as kubelet probes.
                        response = httpx.get(f"{daemon.url}{path}", timeout=1.0)
                    except httpx.HTTPError as exc:
                        failures.append(f"{path}: {exc!r}")
                        continue
                    took = time.monotonic() - started
                    slowest[path] = max(slowest.get(path, 0.0), took)
                    if response.status_code != 200:
                        failures.append(f"{path}: {response.status_code}")
                time.sleep(0.2)
        finally:
            stop.set()
            attacker.join(timeout=30)
        assert not attacker.is_alive()
        assert not failures, failures[:5]
        assert all(took < 1.0 for took in slowest.values()), slowest
        assert stats["opened"] > FD_LIMIT  # more connections than the daemon has descriptors
        assert stats["closed"] > 0
        assert daemon.process.poll() is None
        log = daemon.output()[log_before:]
        assert len(log) < 20_000, log[-3000:]  # one line per kind and minute, not one per error
        assert rss_kib(pid) - rss_before < 30 * 1024
        # The flood's connections are gone once it stops.
        deadline = time.monotonic() + 10
        while open_fds(pid) > fds_before + 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert open_fds(pid) <= fds_before + 5


def test_a_flood_of_malformed_requests_logs_one_line(tmp_path: Path) -> None:
    with serve(tmp_path, "--simulate") as daemon:
        daemon.wait_ready()
        before = daemon.output().count("Invalid HTTP request received")
        for _ in range(300):
            with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
                sock.sendall(b"\x16\x03\x01 not HTTP at all\r\n\r\n")
                sock.settimeout(5)
                assert sock.recv(4096).startswith(b"HTTP/1.1 400")
        assert daemon.get("/healthz").status_code == 200
        assert daemon.output().count("Invalid HTTP request received") - before == 1


# --- answers at the cap and for oversized requests, over raw sockets ------------------------


def read_reply(sock: socket.socket, within: float = 10.0) -> bytes:
    """One whole HTTP response (head and Content-Length body), or what came before the server
    closed or reset the connection (b"" for a reset before any byte)."""
    sock.settimeout(within)
    received = b""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        head, blank, body = received.partition(b"\r\n\r\n")
        if blank:
            length = re.search(rb"(?im)^content-length: *(\d+)", head)
            if length and len(body) >= int(length.group(1)):
                return received
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        received += chunk
    return received


def status_and_headers(reply: bytes) -> tuple[int, dict[str, str]]:
    head = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in head[1:] if ": " in line)
    return int(head[0].split(" ")[1]), headers


def test_connections_past_the_cap_get_503_with_retry_after_never_an_empty_reply(
    tmp_path: Path,
) -> None:
    cap, clients = 4, 40
    config = web_settings(tmp_path, max_connections=cap)
    with serve(tmp_path, "--simulate", "--config", str(config)) as daemon:
        daemon.wait_ready()
        daemon.client.close()  # none of the test's own connections count against the cap
        # All connected before any sends its request: every one past the cap is closed for it.
        socks = [socket.create_connection(("127.0.0.1", daemon.port)) for _ in range(clients)]
        try:
            time.sleep(0.5)  # the server has accepted them all
            for sock in socks:
                with contextlib.suppress(OSError):  # a reset shows as an empty reply below
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            replies = [read_reply(sock) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
        assert all(replies), f"{replies.count(b'')} of {clients} got an empty reply"
        answers = [status_and_headers(reply) for reply in replies]
        refused = [headers for status, headers in answers if status == 503]
        assert {status for status, _ in answers} <= {200, 503}
        assert len(refused) >= clients - 2 * cap  # most were over the cap
        assert all(
            headers.get("retry-after") == "1" and headers.get("connection") == "close"
            for headers in refused
        ), refused[:3]
        assert httpx.get(f"{daemon.url}/healthz", timeout=5).status_code == 200


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        # one 100 KB header, sent whole
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n", 431),
        # a 140 KB query
        (b"GET /metrics?q=" + b"a" * 140_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
        # many headers, 20 KiB in all
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-A: " + b"b" * 90 + b"\r\n" * 1
         + b"".join(b"X-%d: %s\r\n" % (i, b"c" * 90) for i in range(210)) + b"\r\n", 431),
        # just under the limit: answered
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 16_000 + b"\r\n\r\n", 200),
    ],
    ids=["100KB-header", "140KB-query", "20KiB-of-headers", "16000B-header"],
)  # fmt: skip
def test_a_request_head_over_16_kib_is_answered_414_or_431(
    tmp_path: Path, request_bytes: bytes, status: int
) -> None:
    with serve(tmp_path, "--simulate") as daemon:
        daemon.wait_ready()
        with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
            with contextlib.suppress(OSError):
                sock.sendall(request_bytes)
            reply = read_reply(sock)
        assert reply, "no answer (a reset)"
        assert status_and_headers(reply)[0] == status, reply[:200]
        assert daemon.get("/healthz").status_code == 200


def test_a_request_head_sent_in_pieces_past_16_kib_is_answered_431(tmp_path: Path) -> None:
    with serve(tmp_path, "--simulate") as daemon:
        daemon.wait_ready()
        with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            with contextlib.suppress(OSError):
                for i in range(40):  # 40 headers of 1 KB, one at a time
                    sock.sendall(b"X-%d: %s\r\n" % (i, b"d" * 1000))
                    time.sleep(0.005)
                sock.sendall(b"\r\n")
            reply = read_reply(sock)
        assert reply, "no answer (a reset)"
        assert status_and_headers(reply)[0] == 431, reply[:200]
