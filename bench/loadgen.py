"""A small closed-loop scrape generator: N concurrent scrapers, M requests each, 127.0.0.1 only.

A minimal HTTP/1.1 client on asyncio streams, so that the client's own overhead stays small
next to the latencies measured: it keeps the connection alive when the server allows it (as
Prometheus does) and reconnects when the server closes it (HTTP/1.0 servers such as the
`wsgiref` one nvitop-exporter uses). Latency is from sending the request (including a connect
when one is needed) to the last byte of the body.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

PLAIN_HEADERS = {"Accept": "text/plain;version=0.0.4"}
# What Prometheus 2.x sends: OpenMetrics preferred, gzip accepted.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


class HttpError(Exception):
    pass


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


@dataclass
class ScrapeResult:
    latencies: list[float] = field(default_factory=list)  # seconds, successful requests only
    errors: int = 0
    bytes_received: int = 0
    wall_seconds: float = 0.0


def parse_head(head: bytes) -> tuple[str, int, dict[str, str]]:
    """Status line and headers (names lower-cased) of an HTTP/1.x response head."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise HttpError(f"bad status line {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return parts[0], int(parts[1]), headers


def keeps_alive(version: str, headers: dict[str, str]) -> bool:
    connection = headers.get("connection", "").lower()
    if version == "HTTP/1.1":
        return connection != "close"
    return connection == "keep-alive"


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";")[0].strip(), 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers expected
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await reader.readuntil(b"\r\n\r\n")
    version, status, headers = parse_head(head[:-4])
    alive = keeps_alive(version, headers)
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body, alive = await reader.read(), False
    return Response(status, headers, body, alive)


class Client:
    """One connection at a time to `url`'s host, reopened when the server closes it."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the load generator only talks to the local host")
        self.host, self.port = parts.hostname, parts.port or 80
        self.path = parts.path or "/"
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or PLAIN_HEADERS).items())
        request = f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{extra}\r\n"
        self._request = request.encode("latin-1")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def get(self) -> Response:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._writer.write(self._request)
        await self._writer.drain()
        response = await read_response(self._reader)
        if not response.keep_alive:
            await self.close()
        return response

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
            self._reader = self._writer = None


async def _scraper(
    url: str, requests: int, headers: dict[str, str] | None, result: ScrapeResult
) -> None:
    client = Client(url, headers)
    try:
        for _ in range(requests):
            started = time.perf_counter()
            try:
                response = await client.get()
            except (OSError, asyncio.IncompleteReadError, HttpError):
                result.errors += 1
                await client.close()
                continue
            elapsed = time.perf_counter() - started
            if response.status != 200:
                result.errors += 1
                continue
            result.latencies.append(elapsed)
            result.bytes_received += len(response.body)
    finally:
        await client.close()


async def scrape_load(
    url: str, concurrency: int, requests_each: int, headers: dict[str, str] | None = None
) -> ScrapeResult:
    """`concurrency` scrapers, each sending `requests_each` requests back to back."""
    result = ScrapeResult()
    started = time.perf_counter()
    await asyncio.gather(
        *(_scraper(url, requests_each, headers, result) for _ in range(concurrency))
    )
    result.wall_seconds = time.perf_counter() - started
    return result


def run_scrape_load(
    url: str, concurrency: int, requests_each: int, headers: dict[str, str] | None = None
) -> ScrapeResult:
    return asyncio.run(scrape_load(url, concurrency, requests_each, headers))


def fetch(url: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> Response:
    """One GET (for reading counters between measurements)."""

    async def once() -> Response:
        client = Client(url, headers)
        try:
            return await asyncio.wait_for(client.get(), timeout)
        finally:
            await client.close()

    return asyncio.run(once())
