"""HTTP limits: header-read and idle timeouts, the connection cap, rate-limited flood logs;
and a bounded slowloris on 127.0.0.1 against a daemon with few file descriptors, during which
/healthz, /readyz and /metrics keep answering."""

from __future__ import annotations

import logging
import resource
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from gpu_exporter.web import http_limits
from gpu_exporter.web.http_limits import Connections, Limits, RateLimitFilter, connection_cap
from tests.daemon import serve

# --- units ---------------------------------------------------------------------------------


class FakeConnection:
    def __init__(self, registry: Connections) -> None:
        self.registry, self.dropped = registry, False

    def drop(self) -> None:
        self.dropped = True
        self.registry.forget(self)  # type: ignore[arg-type]


def test_the_cap_closes_the_oldest_header_reader_then_the_oldest_idle_then_refuses() -> None:
    registry = Connections(Limits(5.0, 60.0, 3))
    idle, reading_old, reading_new = (FakeConnection(registry) for _ in range(3))
    for connection, state in ((idle, "idle"), (reading_old, "reading"), (reading_new, "reading")):
        assert registry.admit(connection)  # type: ignore[arg-type]
        registry.mark(connection, state)  # type: ignore[arg-type]
    fourth = FakeConnection(registry)
    assert registry.admit(fourth)  # type: ignore[arg-type]
    assert reading_old.dropped and not reading_new.dropped and not idle.dropped
    registry.mark(fourth, "busy")  # type: ignore[arg-type]
    registry.mark(reading_new, "busy")  # type: ignore[arg-type]
    fifth = FakeConnection(registry)
    assert registry.admit(fifth)  # type: ignore[arg-type]
    assert idle.dropped  # no header reader left: the oldest idle one goes
    registry.mark(fifth, "busy")  # type: ignore[arg-type]
    assert not registry.admit(FakeConnection(registry))  # type: ignore[arg-type]
    assert len(registry.open) == 3


@pytest.mark.parametrize(
    ("configured", "limit", "cap"), [(256, 1024, 256), (256, 256, 192), (256, 40, 1)]
)
def test_the_cap_stays_under_the_open_file_limit(configured: int, limit: int, cap: int) -> None:
    assert (
        connection_cap(configured, limit)
        == cap
        == min(configured, max(1, limit - http_limits.FD_RESERVE))
    )


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
