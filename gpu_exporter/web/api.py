"""HTTP: /metrics, /healthz, /readyz and the JSON API, all served from the latest snapshot.

The app works before the sampler has ticked, and before NVML has started (`startup`): /healthz
says "starting" while start-up moves (503 only when start-up itself has not moved for the
stale bound, or gave up), /readyz and /metrics answer 503 with the reason. Every GET endpoint
also answers HEAD (the GET's status and headers, no body), as Prometheus' own server does.

The OpenAPI schema (/openapi.json) says what each route answers: status codes, media types and,
for the JSON API, its bodies (the pydantic models below, shaped as Prometheus' HTTP API:
`{"status": "success", "data": ...}`). They document and test the bodies; the handlers write
their JSON themselves, so no answer is validated or re-encoded on the way out.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Annotated, Any, Literal, Protocol, TypeVar

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from gpu_exporter import __version__
from gpu_exporter.alerting.health import HealthView
from gpu_exporter.alerting.pack import HEALTH_GROUP
from gpu_exporter.alerting.rules import runbook
from gpu_exporter.alerting.rules.loader import NOT_EVALUATED
from gpu_exporter.collect.classify import class_kind
from gpu_exporter.collect.startup import StartupProgress
from gpu_exporter.model.catalog import BY_NAME
from gpu_exporter.model.pod_shares import is_shared
from gpu_exporter.model.series import ACTIVITY_FAMILIES, DeviceView, InstanceView, SeriesSet
from gpu_exporter.model.snapshot import DeviceSample, Reading, Snapshot
from gpu_exporter.model.verdict import Verdict, WindowStats
from gpu_exporter.web import runbook_page
from gpu_exporter.web.dcgm_compat.endpoint import DcgmCompat
from gpu_exporter.web.exposition import (
    CONTENT_TYPE_OPENMETRICS,
    CONTENT_TYPE_TEXT,
    RenderedMetrics,
    wants_gzip,
    wants_openmetrics,
)
from gpu_exporter.web.pod_json import IdleAlerts, pod_use_json, unattributed_json
from gpu_exporter.web.status_page import render_status_page, status_page_headers

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])

# Liveness fails only when the sampler has clearly stopped: several missed ticks, never one.
STALE_TICKS = 5
MIN_STALE_SECONDS = 10.0


# -- the JSON bodies, as the OpenAPI schema declares them ------------------------------------


class PublishedTick(Protocol):
    """One tick's snapshot and its series, published together (never two ticks mixed)."""

    @property
    def snapshot(self) -> Snapshot: ...

    @property
    def series(self) -> SeriesSet: ...


class Ticks(Protocol):
    """What the HTTP side reads of the sampler (`gpu_exporter/pipeline/sampler.py`): the
    latest tick's results and how long ago it was taken. Reading only: a request never makes
    the sampler do anything."""

    @property
    def interval(self) -> float: ...

    @property
    def published(self) -> PublishedTick | None: ...

    @property
    def latest(self) -> Snapshot | None: ...

    @property
    def series(self) -> SeriesSet | None: ...

    @property
    def rendered(self) -> RenderedMetrics | None: ...

    def seconds_since_start(self) -> float | None: ...

    def seconds_since_last_tick(self) -> float | None: ...


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LabelledValue(_Body):
    labels: dict[str, str]
    value: float | None = Field(description="null when not finite (NaN, ±Inf)")


Metrics = dict[str, float | list[LabelledValue] | None]
_METRICS = "per family: its value, or for families with labels a list of them"


class Pod(_Body):
    namespace: str
    pod: str
    container: str


class InstanceMemory(_Body):
    """null when absent: on a compute instance of a shared GPU instance memory is the GPU
    instance's, no single compute instance's."""

    used_bytes: float | None = Field(description="gpu_memory_used_bytes")
    total_bytes: float | None = Field(description="gpu_memory_total_bytes")


class InstanceActivity(_Body):
    """Fractions of the last sample period; null where not measured: NVML GPM (Hopper and
    newer), or DCGM where the exporter has a host engine (A100, A30), reads them per GPU
    instance, so A100/A30 MIG instances without DCGM and the compute instances of a shared GPU
    instance have none."""

    graphics_engine: float | None = Field(
        description="gpu_graphics_engine_active_ratio: the share of time a kernel ran; it "
        "stands in for utilization, which NVML does not give under MIG"
    )
    sm: float | None = Field(description="gpu_sm_active_ratio")
    sm_occupancy: float | None = Field(description="gpu_sm_occupancy_ratio")
    tensor: float | None = Field(description="gpu_tensor_active_ratio")
    dram: float | None = Field(description="gpu_dram_active_ratio")


class InstanceSize(_Body):
    """gpu_mig_instance_info's labels, as numbers."""

    gpu_slices: int | None = Field(
        description="GPU slices of its GPU instance (of 7 on A100/H100/H200)"
    )
    compute_slices: int | None = Field(description="compute slices of its compute instance")
    multiprocessors: int | None = Field(description="SMs of its compute instance")
    memory_bytes: int | None = Field(description="memory of its GPU instance")


Kind = Literal["waste", "fine", "spare", "unknown"]
_KIND = (
    "what its class means (gpu_exporter/collect/classify.py CLASS_KINDS): waste (held but held "
    "back: idle while a pod holds it, launch_bound, link_bound, throttled), fine (at a hardware "
    "roof: tensor_bound, compute_bound, memory_bound), spare (idle, no pod holds it), unknown; "
    "null without a class"
)
_REASON = (
    "the classifier's one-line reason for its class, with the numbers it measured (what "
    "`diagnose` prints as class_reason); null without a class"
)


class Link(_Body):
    """The classifier's window: the busier direction's mean rate against the link's payload
    capacity per direction."""

    bytes_per_second: float | None
    capacity_bytes_per_second: float | None = Field(
        description="PCIe: generation x width in the current link state; NVLink: active links "
        "x the architecture's per-link rate; null when unknown"
    )
    utilization: float | None = Field(description="bytes_per_second / capacity, 0..1")


class Links(_Body):
    pcie: Link
    nvlink: Link


class HealthProblem(_Body):
    alertname: str
    state: Literal["pending", "firing"]
    severity: str
    text: str = Field(description="short: XID 79: NVIDIA's meaning of it, else the alert name")
    summary: str = Field(description="the alert's summary annotation")


class Health(_Body):
    """From the active alerts of the shipped rule pack's gpu-health group for this GPU."""

    state: Literal["healthy", "pending", "unhealthy", "unknown"] = Field(
        description="unhealthy: one of them fires; pending: one waits out its `for:`; unknown: "
        "no verdict (in-daemon rules disabled, the group not loaded or not evaluated yet)"
    )
    why: str | None = Field(description="why the state is unknown; null otherwise")
    problems: list[HealthProblem] = Field(description="firing first")


_MEASURED = (
    "per-process attribution (kubernetes.processes): null where not measured, never 0 for "
    "unmeasured"
)


class PodUse(_Body):
    """One container's use of the GPU or MIG instance in the last tick, from the processes
    NVML lists (the gpu_pod_* families). Every number is null where it was not measured."""

    namespace: str
    pod: str
    container: str
    allocated: bool = Field(
        description="the kubelet allocated it the device (gpu_pod_info); false for a container "
        "that uses a GPU it was not allocated"
    )
    processes: int | None = Field(
        description="gpu_pod_processes: its processes on the device; 0 for a container "
        "allocated the device that runs none there"
    )
    memory_bytes: float | None = Field(
        description="gpu_pod_memory_used_bytes: memory its processes use (NVML's per-process "
        "figures)"
    )
    utilization: float | None = Field(
        description="gpu_pod_utilization_ratio: share of the last tick its kernels ran, 0..1 "
        "(its part of the GPU's utilization); null on MIG instances (NVML has none there)"
    )
    encoder: float | None = Field(
        description="gpu_pod_encoder_utilization_ratio: share of the last tick the video "
        "encoders worked for it; null on MIG instances"
    )
    decoder: float | None = Field(
        description="gpu_pod_decoder_utilization_ratio: as encoder, for the video decoders"
    )
    energy_joules: float | None = Field(
        description="gpu_pod_energy_joules_total (a counter, summed over its attributions): "
        "GPU energy charged to it while it ran there; null before any was charged and on MIG "
        "instances"
    )
    attribution: Literal["exclusive", "apportioned", "mixed"] | None = Field(
        description="how energy_joules was charged: exclusive (measured: it was alone on the "
        "GPU), apportioned (an estimate: the tick's energy by its share of the SM time), mixed "
        "(both, at different times); null without energy"
    )
    idle_alert: Literal["pending", "firing"] | None = Field(
        description="the shipped GpuAllocatedButIdle alert for this container on this device, "
        "when active (null also when in-daemon rules are disabled)"
    )
    waste: bool = Field(
        description="it holds the device and does nothing with it: GpuAllocatedButIdle fires "
        "for it, or now it runs no process there or its processes ran no kernel in the last "
        "tick (measured, never assumed)"
    )
    waste_reason: str | None = Field(description="why waste is true; null when it is false")


class Unattributed(_Body):
    """Processes on the device that no container is known for (gpu_unattributed_*)."""

    reason: str = Field(
        description="host: they run outside Kubernetes; unknown: their container could not be "
        "found (see gpu_exporter_process_attribution_up)"
    )
    processes: int | None = Field(description="gpu_unattributed_processes")
    memory_bytes: float | None = Field(description="gpu_unattributed_memory_used_bytes")
    utilization: float | None = Field(
        description="gpu_unattributed_utilization_ratio, 0..1; null on MIG instances"
    )


_POD_USE = (
    "each container's use of it in the last tick, by namespace, pod and container "
    f"({_MEASURED}); empty without per-process attribution"
)
_UNATTRIBUTED = (
    "use by processes of no known container, by reason; empty without per-process attribution "
    "or when every process has its container"
)
_SHARED = (
    "several containers hold or use it (time-slicing, MPS, several pods on one MIG instance), "
    "or a container and processes of no known container do"
)


class Instance(_Body):
    identity: dict[str, str] = Field(
        description="the labels that tell it apart on its series, after the parent's gpu and "
        "uuid: gpu_instance, compute_instance (only when its GPU instance has several), "
        "mig_uuid, mig_profile"
    )
    labels: dict[str, str] = Field(description="pod attribution labels (labels mode)")
    pods: list[Pod] = Field(description="every pod holding it (gpu_pod_info), in either mode")
    bottleneck: str | None = Field(
        description="its bottleneck class (gpu_bottleneck); null without classifier output"
    )
    bottleneck_kind: Kind | None = Field(description=_KIND)
    bottleneck_reason: str | None = Field(description=_REASON)
    memory: InstanceMemory
    activity: InstanceActivity
    size: InstanceSize | None = Field(description="null without gpu_mig_instance_info")
    shared: bool = Field(description=_SHARED)
    pod_use: list[PodUse] = Field(
        description=f"{_POD_USE}. Under MIG NVML has processes and memory only: utilization, "
        "encoder, decoder and energy are null"
    )
    unattributed: list[Unattributed] = Field(description=_UNATTRIBUTED)
    metrics: Metrics = Field(description=_METRICS)


class Device(_Body):
    index: int = Field(description="NVML index")
    uuid: str = Field(description='"" when the UUID could not be read (the GPU is then down)')
    up: bool
    down_reason: str | None = Field(description="why the GPU is down; null when up")
    info: dict[str, str] = Field(description="gpu_info's labels")
    labels: dict[str, str] = Field(description="pod attribution labels (labels mode)")
    bottleneck: str | None = Field(
        description="its bottleneck class (gpu_bottleneck); null without classifier output, "
        "for a down GPU and with MIG on (its instances have theirs)"
    )
    bottleneck_kind: Kind | None = Field(description=_KIND)
    bottleneck_reason: str | None = Field(description=_REASON)
    links: Links | None = Field(
        description="PCIe and NVLink throughput against capacity, as the classifier measured "
        "them (with MIG on, through its instances); null without classifier output"
    )
    health: Health
    shared: bool = Field(description=f"{_SHARED}; false with MIG on (its instances say)")
    pod_use: list[PodUse] = Field(description=_POD_USE)
    unattributed: list[Unattributed] = Field(description=_UNATTRIBUTED)
    metrics: Metrics = Field(description=_METRICS)
    instances: list[Instance] = Field(
        description="its MIG instances (MIG devices), by GPU instance then compute instance; "
        "empty for a GPU without MIG. A MIG-enabled GPU's utilization, activity and class "
        "are its instances', not its own"
    )


class DevicesData(_Body):
    timestamp: float
    sequence: int
    node: dict[str, str]
    devices: list[Device]


class DevicesAnswer(_Body):
    status: Literal["success"]
    data: DevicesData


class ErrorAnswer(_Body):
    status: Literal["error"]
    error: str


class Alert(_Body):
    labels: dict[str, str]
    annotations: dict[str, str]
    state: Literal["pending", "firing"]
    activeAt: str = Field(description="RFC 3339")
    value: str = Field(description="the sample value, as Go's %e")


class _Rule(_Body):
    name: str
    query: str
    labels: dict[str, str]
    health: Literal["ok", "err", "unknown"] = Field(
        description="err: the last evaluation failed, or the daemon does not evaluate the rule"
    )
    lastError: str = Field(
        description='why health is err ("" otherwise); for a rule the daemon loaded but never '
        f'evaluates (Prometheus does), "{NOT_EVALUATED}: unsupported PromQL construct: ..."'
    )
    evaluationTime: float
    lastEvaluation: str = Field(description="RFC 3339; 0001-01-01T00:00:00Z before the first")


class RecordingRule(_Rule):
    type: Literal["recording"]


class AlertingRule(_Rule):
    type: Literal["alerting"]
    state: Literal["inactive", "pending", "firing"]
    duration: float
    keepFiringFor: float
    annotations: dict[str, str]
    alerts: list[Alert]


class RuleGroup(_Body):
    name: str
    file: str
    interval: float
    limit: int
    evaluationTime: float
    lastEvaluation: str
    rules: list[Annotated[RecordingRule | AlertingRule, Field(discriminator="type")]]


class RuleGroups(_Body):
    groups: list[RuleGroup]


class RulesAnswer(_Body):
    status: Literal["success"]
    data: RuleGroups


class Alerts(_Body):
    alerts: list[Alert]


class AlertsAnswer(_Body):
    status: Literal["success"]
    data: Alerts


# -- what each route may answer ----------------------------------------------------------------

_TEXT = {"text/plain": {"schema": {"type": "string"}}}
# web_auth.py: with basic_auth_users every route (the probes too, unless probes_without_auth)
# answers 401 without the right credentials, as exporter-toolkit does.
_UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {
        "description": "basic auth is on and the request has no or wrong credentials",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string", "enum": ["Basic"]}}},
        "content": _TEXT,
    }
}
_METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the latest snapshot: Prometheus text format 0.0.4, or OpenMetrics "
        "when the Accept header prefers it; gzip when Accept-Encoding allows it",
        "content": {
            CONTENT_TYPE_TEXT: {"schema": {"type": "string"}},
            CONTENT_TYPE_OPENMETRICS: {"schema": {"type": "string"}},
        },
    },
    503: {"description": "no snapshot yet (start-up, or before the first tick)", "content": _TEXT},
    **_UNAUTHORIZED,
}
_PROBE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "ok, or starting (and moving)", "content": _TEXT},
    503: {"description": "not alive / not ready: the reason", "content": _TEXT},
    **_UNAUTHORIZED,
}
_DEVICES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": DevicesAnswer, "description": "each GPU as the latest tick's series show it"},
    503: {"model": ErrorAnswer, "description": "no snapshot yet"},
    **_UNAUTHORIZED,
}
_BASIC_AUTH = {"basicAuth": {"type": "http", "scheme": "basic"}}
# The request headers /metrics negotiates on, declared in the schema only: read from the
# request as before, as FastAPI's Header() parameters cost about 14 us a scrape (a third of
# the handler's time at the ASGI level, measured on the fake NVML's 8 GPUs).
_METRICS_HEADERS = {
    "parameters": [
        {
            "name": name,
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": description,
        }
        for name, description in (
            ("Accept", "OpenMetrics when it prefers application/openmetrics-text"),
            ("Accept-Encoding", "a gzip body when it allows gzip"),
        )
    ]
}


_DCGM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the latest tick in dcgm-exporter 4.8's names, labels, units and text "
        "format (docs/migrating-from-dcgm-exporter.md); gzip when Accept-Encoding allows it",
        "content": {CONTENT_TYPE_TEXT: {"schema": {"type": "string"}}},
    },
    503: {"description": "no snapshot yet (start-up, or before the first tick)", "content": _TEXT},
    **_UNAUTHORIZED,
}


def dcgm_metrics(
    sampler: Ticks, compat: DcgmCompat, not_started: Callable[[], str | None]
) -> Callable[[Request], Awaitable[Response]]:
    """The handler of /metrics/dcgm (and of /metrics on the compat listener). Text format
    only, whatever Accept says: dcgm-exporter serves nothing else."""

    async def handler(request: Request) -> Response:
        series = sampler.series
        if series is None:
            return _no_snapshot(not_started)
        gzipped, headers = _gzip(request)
        return Response(compat.body(series, gzipped), media_type=CONTENT_TYPE_TEXT, headers=headers)

    return handler


def create_compat_app(
    sampler: Ticks, compat: DcgmCompat, startup: StartupProgress | None = None
) -> FastAPI:
    """The dcgm-exporter drop-in listener (`dcgm_compat.listen_address`): /metrics only, in
    compat form, for scrape configs and tools that assume dcgm-exporter's port and path."""
    app = FastAPI(title="gpu-exporter (dcgm-exporter compatible)", version=__version__)
    app.openapi_url = None
    handler = dcgm_metrics(sampler, compat, _not_started(startup))
    for method in ("GET", "HEAD"):
        app.add_api_route("/metrics", handler, methods=[method], include_in_schema=False)
    return app


def runbook_html() -> Response:
    """The alert runbook every shipped alert's runbook_url points at
    (gpu_exporter/web/runbook_page.py)."""
    return HTMLResponse(runbook_page.render_page(), headers=runbook_page.page_headers())


def _no_snapshot(not_started: Callable[[], str | None]) -> Response:
    why = not_started() or "no snapshot yet"
    return PlainTextResponse(f"{why}\n", status_code=503)


def _gzip(request: Request) -> tuple[bool, dict[str, str]]:
    """Whether the scraper takes gzip, and the response headers that go with it."""
    gzipped = wants_gzip(request.headers.get("accept-encoding"))
    return gzipped, {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"} if gzipped else {}


def _not_started(startup: StartupProgress | None) -> Callable[[], str | None]:
    """Why start-up is not done (None when it is, or was done before the app)."""
    return lambda: startup.reason() if startup is not None else None


def create_app(
    sampler: Ticks,
    source_ready: Callable[[], bool],
    rules: Any | None = None,
    startup: StartupProgress | None = None,
    dcgm_compat: DcgmCompat | None = None,
) -> FastAPI:
    """`rules` is the RuleManager, or None when in-daemon rules are disabled; `startup` the
    source's start-up progress (None: the source was started before the app); `dcgm_compat`
    serves /metrics/dcgm (None: no such route)."""
    app = FastAPI(title="gpu-exporter", version=__version__, docs_url=None, redoc_url=None)
    app.openapi = lambda: _openapi_schema(app)  # type: ignore[method-assign]
    stale_after = max(MIN_STALE_SECONDS, STALE_TICKS * sampler.interval)

    def get(path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
        """A GET route that answers HEAD too (kept out of the OpenAPI schema: one operation)."""

        def register(endpoint: Endpoint) -> Endpoint:
            app.add_api_route(path, endpoint, methods=["GET"], **options)
            app.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)
            return endpoint

        return register

    not_started = _not_started(startup)

    # async: the body is cached bytes except on a tick's first scrape, which writes it (about
    # 1 ms at 8 GPUs, 9 ms at 64); serving on the event loop skips a thread hop (about half
    # the CPU per scrape, measured with 32 concurrent scrapers).
    @get(
        "/metrics",
        response_class=Response,
        responses=_METRICS_RESPONSES,
        openapi_extra=_METRICS_HEADERS,
    )
    async def metrics(request: Request) -> Response:
        rendered = sampler.rendered
        if rendered is None:
            return _no_snapshot(not_started)
        openmetrics = wants_openmetrics(request.headers.get("accept"))
        gzipped, headers = _gzip(request)
        return Response(
            rendered.body(openmetrics, gzipped),
            media_type=CONTENT_TYPE_OPENMETRICS if openmetrics else CONTENT_TYPE_TEXT,
            headers=headers,
        )

    if dcgm_compat is not None:
        get("/metrics/dcgm", response_class=Response, responses=_DCGM_RESPONSES)(
            dcgm_metrics(sampler, dcgm_compat, not_started)
        )

    @get("/healthz", response_class=PlainTextResponse, responses=_PROBE_RESPONSES)
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

    @get("/readyz", response_class=PlainTextResponse, responses=_PROBE_RESPONSES)
    def readyz() -> Response:
        why = not_started()
        if why is not None:
            return PlainTextResponse(f"not ready: {why}\n", 503)
        if not source_ready():
            return PlainTextResponse("not ready: NVML has not been initialised\n", 503)
        latest = sampler.latest
        if latest is None:
            return PlainTextResponse("not ready: no snapshot yet\n", 503)
        age = sampler.seconds_since_last_tick()
        if age is not None and age > stale_after:
            return PlainTextResponse(f"not ready: last snapshot {age:.1f}s old\n", 503)
        # Still ready (unready would take the exporter out of the Service just when its
        # series say what is missing), but says what the tick could not see.
        degraded = "".join(f"degraded: {line}\n" for line in latest.degraded())
        return PlainTextResponse(f"ok\n{degraded}")

    @get("/api/v1/devices", response_class=JSONResponse, responses=_DEVICES_RESPONSES)
    def devices() -> Response:
        published = sampler.published  # one tick's snapshot and series, never two
        if published is None:
            return JSONResponse({"status": "error", "error": "no snapshot yet"}, 503)
        snapshot, series_set = published.snapshot, published.series
        health = HealthView(rules.rules_json(HEALTH_GROUP) if rules is not None else None)
        idle = IdleAlerts(rules.alerts_json() if rules is not None else None)
        return JSONResponse(
            {
                "status": "success",
                "data": {
                    "timestamp": snapshot.timestamp,
                    "sequence": snapshot.sequence,
                    "node": dict(snapshot.node_info),
                    "devices": [
                        device_json(view, snapshot.device(view.index), health, idle)
                        for view in series_set.devices()
                    ],
                },
            }
        )

    @get("/", include_in_schema=False)
    def status_page() -> Response:
        return HTMLResponse(render_status_page(), headers=status_page_headers())

    get(runbook.RUNBOOK_PATH, include_in_schema=False)(runbook_html)

    @get(
        "/api/v1/rules",
        response_class=JSONResponse,
        responses={200: {"model": RulesAnswer, "description": "rule groups"}, **_UNAUTHORIZED},
    )
    def rules_endpoint() -> Response:
        groups = rules.rules_json() if rules is not None else []
        return JSONResponse({"status": "success", "data": {"groups": groups}})

    @get(
        "/api/v1/alerts",
        response_class=JSONResponse,
        responses={200: {"model": AlertsAnswer, "description": "active alerts"}, **_UNAUTHORIZED},
    )
    def alerts_endpoint() -> Response:
        alerts = rules.alerts_json() if rules is not None else []
        return JSONResponse({"status": "success", "data": {"alerts": alerts}})

    return app


def _openapi_schema(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, built once, with basic auth as an optional security scheme (in force
    only when the web config has users)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schema.setdefault("components", {})["securitySchemes"] = _BASIC_AUTH
        schema["security"] = [{}, {"basicAuth": []}]
        app.openapi_schema = schema
    return app.openapi_schema


def device_json(
    device: DeviceView,
    sample: DeviceSample | None = None,
    health: HealthView | None = None,
    idle: IdleAlerts | None = None,
) -> dict[str, Any]:
    """One GPU as the tick's series show it: `labels` are its attribution labels (labels
    mode), `metrics` its families keyed by name, with their catalog labels, `instances` its
    MIG instances, `pod_use` and `unattributed` who uses how much of it. `sample` is the same
    tick's DeviceSample (the classifier's verdicts, which are no series), `health` the rule
    engine's view (None: rules disabled), `idle` its GpuAllocatedButIdle alerts."""
    verdicts = _instance_verdicts(sample)
    instances = sorted(device.instances, key=lambda instance: instance.order_key)
    verdict = sample.verdict if sample is not None else None
    # With MIG on the GPU has no verdict; its links are the same in each instance's.
    link_source = verdict or next((v for v in verdicts.values() if v is not None), None)
    held = bool(InstanceView.pods_of(device.readings))
    return {
        "index": device.index,
        "uuid": device.uuid,
        "up": device.up,
        "down_reason": device.down_reason or None,
        "info": dict(device.info),
        "labels": dict(device.labels),
        **_class_json(bottleneck_class(device.readings), verdict, held),
        "links": _links_json(link_source.stats) if link_source is not None else None,
        "health": (health or HealthView(None)).of(device.index),
        "shared": is_shared(device.readings),
        "pod_use": pod_use_json(device.readings, device.index, "", idle),
        "unattributed": unattributed_json(device.readings),
        "metrics": _metrics_json(device.readings),
        "instances": [
            instance_json(instance, device.index, verdicts.get(instance.mig_uuid), idle)
            for instance in instances
        ],
    }


def _instance_verdicts(sample: DeviceSample | None) -> dict[str, Verdict | None]:
    if sample is None:
        return {}
    return {instance.mig_uuid: instance.verdict for instance in sample.instances}


def _class_json(cls: str | None, verdict: Verdict | None, held: bool) -> dict[str, Any]:
    """The class, its kind and the classifier's reason (only when it is that class's)."""
    reason = verdict.why if verdict is not None and verdict.cls == cls else None
    return {
        "bottleneck": cls,
        "bottleneck_kind": class_kind(cls, held) if cls is not None else None,
        "bottleneck_reason": reason,
    }


def _links_json(stats: WindowStats) -> dict[str, Any]:
    def link(rate: float | None, capacity: float | None, share: float | None) -> dict[str, Any]:
        return {
            "bytes_per_second": _finite(rate),
            "capacity_bytes_per_second": _finite(capacity),
            "utilization": _finite(share),
        }

    return {
        "pcie": link(stats.pcie_bytes_per_second, stats.pcie_capacity, stats.pcie_utilization),
        "nvlink": link(
            stats.nvlink_bytes_per_second, stats.nvlink_capacity, stats.nvlink_utilization
        ),
    }


def instance_json(
    instance: InstanceView, gpu: int, verdict: Verdict | None = None, idle: IdleAlerts | None = None
) -> dict[str, Any]:
    """One MIG instance: its identity and pods, the quantities people look for first (class,
    its kind and reason, memory, activity, size, who uses how much of it), and all its
    families as `metrics`. `gpu`: its parent's index (to find its GpuAllocatedButIdle alerts)."""

    def finite(family: str) -> float | None:
        return _finite(instance.value(family))

    pods = instance.pods()
    return {
        "identity": dict(instance.identity),
        "labels": dict(instance.labels),
        "pods": [
            {"namespace": namespace, "pod": pod, "container": container}
            for namespace, pod, container in pods
        ],
        **_class_json(bottleneck_class(instance.readings), verdict, bool(pods)),
        "memory": {
            "used_bytes": finite("gpu_memory_used_bytes"),
            "total_bytes": finite("gpu_memory_total_bytes"),
        },
        "activity": {key: finite(family) for key, family in ACTIVITY_FAMILIES.items()},
        "size": instance.size,
        "shared": is_shared(instance.readings),
        "pod_use": pod_use_json(instance.readings, gpu, instance.mig_uuid, idle),
        "unattributed": unattributed_json(instance.readings),
        "metrics": _metrics_json(instance.readings),
    }


def bottleneck_class(readings: Iterable[Reading]) -> str | None:
    """The class gpu_bottleneck marks current (1), or None without classifier output."""
    current = None
    for reading in readings:
        if reading.family == "gpu_bottleneck" and reading.value == 1.0:
            current = dict(reading.labels).get("class")
    return current


def _metrics_json(readings: Iterable[Reading]) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for reading in readings:
        value = _finite(reading.value)
        if BY_NAME[reading.family].labels:
            metrics.setdefault(reading.family, []).append(
                {"labels": dict(reading.labels), "value": value}
            )
        else:
            metrics[reading.family] = value
    return metrics


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
