"""HTTP: /metrics, /healthz, /readyz and the JSON API, all served from the latest snapshot.

The app works before the sampler has ticked, and before NVML has started (`startup`): /healthz
says "starting" while start-up moves (503 only when start-up itself has not moved for the
stale bound, or gave up), /readyz and /metrics answer 503 with the reason. Every GET endpoint
also answers HEAD (the GET's status and headers, no body), as Prometheus' own server does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from gpu_exporter import __version__
from gpu_exporter.catalog import BY_NAME
from gpu_exporter.exposition import (
    CONTENT_TYPE_OPENMETRICS,
    CONTENT_TYPE_TEXT,
    wants_gzip,
    wants_openmetrics,
)
from gpu_exporter.sampler import Sampler
from gpu_exporter.series import DeviceView
from gpu_exporter.sources.startup import StartupProgress
from gpu_exporter.status_page import render_status_page, status_page_headers

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])

# Liveness fails only when the sampler has clearly stopped: several missed ticks, never one.
STALE_TICKS = 5
MIN_STALE_SECONDS = 10.0


def create_app(
    sampler: Sampler,
    source_ready: Callable[[], bool],
    rules: Any | None = None,
    startup: StartupProgress | None = None,
) -> FastAPI:
    """`rules` is the RuleManager, or None when in-daemon rules are disabled; `startup` the
    source's start-up progress (None: the source was started before the app)."""
    app = FastAPI(title="gpu-exporter", version=__version__, docs_url=None, redoc_url=None)
    stale_after = max(MIN_STALE_SECONDS, STALE_TICKS * sampler.interval)

    def get(path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
        """A GET route that answers HEAD too (kept out of the OpenAPI schema: one operation)."""

        def register(endpoint: Endpoint) -> Endpoint:
            app.add_api_route(path, endpoint, methods=["GET"], **options)
            app.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)
            return endpoint

        return register

    def not_started() -> str | None:
        """Why start-up is not done (None when it is, or was done before the app)."""
        return startup.reason() if startup is not None else None

    # async: the body is cached bytes except on a tick's first scrape, which writes it (about
    # 1 ms at 8 GPUs, 9 ms at 64); serving on the event loop skips a thread hop (about half
    # the CPU per scrape, measured with 32 concurrent scrapers).
    @get("/metrics")
    async def metrics(request: Request) -> Response:
        rendered = sampler.rendered
        if rendered is None:
            why = not_started() or "no snapshot yet"
            return PlainTextResponse(f"{why}\n", status_code=503)
        openmetrics = wants_openmetrics(request.headers.get("accept"))
        gzipped = wants_gzip(request.headers.get("accept-encoding"))
        headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if gzipped else {}
        return Response(
            rendered.body(openmetrics, gzipped),
            media_type=CONTENT_TYPE_OPENMETRICS if openmetrics else CONTENT_TYPE_TEXT,
            headers=headers,
        )

    @get("/healthz")
    def healthz() -> Response:
        age = sampler.seconds_since_last_tick()
        if age is None and startup is not None and not startup.ready:
            # NVML starting: alive while the start-up thread moves (it waits for NVML with
            # deadlines, so a hung driver call never stops it; only our own bug would).
            if startup.failure is not None:
                return PlainTextResponse(f"{startup.reason()}\n", 503)
            stuck = startup.stuck_for()
            if stuck > stale_after:
                return PlainTextResponse(f"start-up stuck for {stuck:.1f}s\n", 503)
            return PlainTextResponse(f"starting: {startup.reason()}\n")
        if age is None:
            # Starting up: alive as long as the first tick is not overdue.
            waited = sampler.seconds_since_start()
            if waited is not None and waited > stale_after:
                return PlainTextResponse(f"first tick not done after {waited:.1f}s\n", 503)
            return PlainTextResponse("starting\n")
        if age > stale_after:
            return PlainTextResponse(f"sampler stalled: last tick {age:.1f}s ago\n", 503)
        return PlainTextResponse("ok\n")

    @get("/readyz")
    def readyz() -> Response:
        why = not_started()
        if why is not None:
            return PlainTextResponse(f"not ready: {why}\n", 503)
        if not source_ready():
            return PlainTextResponse("not ready: NVML has not been initialised\n", 503)
        if sampler.latest is None:
            return PlainTextResponse("not ready: no snapshot yet\n", 503)
        age = sampler.seconds_since_last_tick()
        if age is not None and age > stale_after:
            return PlainTextResponse(f"not ready: last snapshot {age:.1f}s old\n", 503)
        return PlainTextResponse("ok\n")

    @get("/api/v1/devices")
    def devices() -> Response:
        published = sampler.published  # one tick's snapshot and series, never two
        if published is None:
            return JSONResponse({"status": "error", "error": "no snapshot yet"}, 503)
        snapshot, series_set = published.snapshot, published.series
        return JSONResponse(
            {
                "status": "success",
                "data": {
                    "timestamp": snapshot.timestamp,
                    "sequence": snapshot.sequence,
                    "node": dict(snapshot.node_info),
                    "devices": [device_json(view) for view in series_set.devices()],
                },
            }
        )

    @get("/", include_in_schema=False)
    def status_page() -> Response:
        return HTMLResponse(render_status_page(), headers=status_page_headers())

    @get("/api/v1/rules")
    def rules_endpoint() -> Response:
        groups = rules.rules_json() if rules is not None else []
        return JSONResponse({"status": "success", "data": {"groups": groups}})

    @get("/api/v1/alerts")
    def alerts_endpoint() -> Response:
        alerts = rules.alerts_json() if rules is not None else []
        return JSONResponse({"status": "success", "data": {"alerts": alerts}})

    return app


def device_json(device: DeviceView) -> dict[str, Any]:
    """One GPU as the tick's series show it: `labels` are its attribution labels (labels
    mode), `metrics` its families keyed by name, with their catalog labels."""
    metrics: dict[str, Any] = {}
    for reading in device.readings:
        value = reading.value if math.isfinite(reading.value) else None
        if BY_NAME[reading.family].labels:
            metrics.setdefault(reading.family, []).append(
                {"labels": dict(reading.labels), "value": value}
            )
        else:
            metrics[reading.family] = value
    return {
        "index": device.index,
        "uuid": device.uuid,
        "up": device.up,
        "down_reason": device.down_reason or None,
        "info": dict(device.info),
        "labels": dict(device.labels),
        "metrics": metrics,
    }
