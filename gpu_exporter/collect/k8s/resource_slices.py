"""What the node's DRA ResourceSlices say each device is: listed, then watched, from the API server.

A DRA driver publishes its devices in ResourceSlices (`resource.k8s.io`, Kubernetes 1.32+:
v1beta1, 1.33: v1beta2, 1.34: v1). Each slice names its `spec.driver`, `spec.nodeName` and
`spec.pool` (`name`, `generation`), and lists `spec.devices`, each with a `name` and
`attributes`: a map of attribute name (unqualified: in the driver's domain; or qualified,
`<driver>/<name>`) to a DeviceAttribute, a one-key object `{"string"|"int"|"bool"|"version":
value}`. v1beta1 wraps a device's fields in `basic:` (`devices[].basic.attributes`); v1beta2
and v1 have them on the device (kubernetes staging/src/k8s.io/api/resource/*/types.go). When a
pool's slices have different generations, only the highest generation is current ("consumers
should ignore the older generation": ResourcePool.Generation), as when a driver restarts and
republishes its slice under a new name.

The slices of this node are read as client-go's reflector reads them: a list
(`fieldSelector=spec.nodeName=<node>`, paginated with `limit`/`continue`) gives the
`resourceVersion` from which a watch (`watch=1`, `allowWatchBookmarks=true`) streams the
changes as newline-delimited JSON events (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR). A
watch the server ends is resumed from the last resourceVersion seen; "410 Gone" (the
resourceVersion has left the server's window: an HTTP status, or an ERROR event with code 410,
reason Expired) means list again (kubernetes apimachinery pkg/apis/meta/v1 watch semantics,
"Efficient detection of changes" in the API concepts). A watch silent for longer than
`timeout_seconds` past its own `timeoutSeconds` is dead and restarted.

HTTPS with httpx (already a dependency) rather than the `kubernetes` package: that package and
its generated models cost tens of megabytes and a second of import time, for the two calls
needed here. In-cluster configuration is done as client-go's rest.InClusterConfig does it:
`https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the ServiceAccount's CA file, and
its token, which the kubelet rotates (bound tokens), re-read at every request.

Everything runs on a daemon thread: a tick only reads the finished, immutable snapshot
(`devices()`). A failure (no answer, TLS, 401/403, 5xx, garbage) is counted by reason, logged
once per change of state, and retried with a back-off (1 s doubling to 30 s); the last good
snapshot is kept until `grace_seconds` after the last success, then cleared, as pod
attribution does (gpu_exporter/collect/k8s/attribution.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import httpx

from gpu_exporter import __version__
from gpu_exporter.collect.k8s.dra import DraDevice, SliceDevice
from gpu_exporter.collect.settings import DraConfig
from gpu_exporter.model.series import Producer, Series, series

log = logging.getLogger(__name__)

UP = "gpu_exporter_dra_up"
LISTS = "gpu_exporter_dra_lists_total"
ERRORS = "gpu_exporter_dra_errors_total"
LAST_SUCCESS = "gpu_exporter_dra_last_success_timestamp_seconds"
DEVICES = "gpu_exporter_dra_devices"

# `reason` of ERRORS, every one a series from the start.
REASONS = (
    "config",  # no node name, no API server address, token or CA file unreadable
    "connection",  # refused, reset, cut mid-stream
    "tls",  # the server's certificate does not verify against the CA file
    "timeout",  # no answer, or a watch silent for too long
    "unauthorized",  # 401: the token was refused
    "forbidden",  # 403: RBAC
    "not_found",  # 404 on every API version: no ResourceSlice API
    "http",  # any other error status, or an ERROR event other than 410
    "invalid",  # an answer that is not the JSON it should be
    "other",  # anything else (a bug)
)

API_GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first
PAGE_SIZE = 500
# The most one answer (or one watch event) may take in memory; an object in etcd is at most
# 1.5 MiB (etcd's default request limit), a node's slice list far less.
MAX_BODY_BYTES = 16 * 1024 * 1024
WATCH_SECONDS = 300  # client-go's minimum watch timeout (reflector.go), randomized up to 2x
BACKOFF_SECONDS = (1.0, 30.0)

DeviceMap = Mapping[DraDevice, SliceDevice]
_NO_DEVICES: DeviceMap = MappingProxyType({})
_OK = "ok"


class ResourceSliceError(Exception):
    """A failure with its `reason` (one of REASONS) and what to log."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Expired(Exception):
    """410 Gone: the resourceVersion (or a continue token) is too old; list again."""


class _NotServed(Exception):
    """404: the API server does not serve this version of the ResourceSlice API."""


@dataclass(frozen=True)
class _Slice:
    """What is kept of one ResourceSlice."""

    driver: str
    pool: str
    generation: int
    devices: tuple[tuple[str, SliceDevice], ...]


def _attribute(attributes: Mapping[str, Any], name: str, driver: str) -> str:
    """A DeviceAttribute's value as text, by its unqualified or driver-qualified name."""
    value = attributes.get(name)
    if value is None:
        value = attributes.get(f"{driver}/{name}")
    if not isinstance(value, dict):
        return ""
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            raw = value[kind]
            if isinstance(raw, bool):
                return "true" if raw else "false"
            return raw if isinstance(raw, str) else str(raw)
    return ""


def parse_slice(obj: Any) -> tuple[str, _Slice]:
    """(metadata.name, the slice) of a ResourceSlice of any served version. The name is required
    (the store's key); anything missing or malformed in the spec reads as absent: a slice
    without devices has none, a device without attributes an empty uuid."""
    if not isinstance(obj, dict):
        raise ResourceSliceError("invalid", f"a ResourceSlice that is not an object: {obj!r:.80}")
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        raise ResourceSliceError("invalid", "a ResourceSlice without metadata.name")
    spec = obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    driver = spec.get("driver")
    driver = driver if isinstance(driver, str) else ""
    pool = spec.get("pool")
    pool = pool if isinstance(pool, dict) else {}
    pool_name = pool.get("name") if isinstance(pool.get("name"), str) else ""
    generation = pool.get("generation")
    generation = generation if isinstance(generation, int) else 0
    devices: list[tuple[str, SliceDevice]] = []
    listed = spec.get("devices")
    for device in listed if isinstance(listed, list) else ():
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            continue
        # v1beta1: the fields under `basic`; v1beta2 and v1: on the device itself.
        basic = device.get("basic")
        fields: dict[str, Any] = basic if isinstance(basic, dict) else device
        attributes = fields.get("attributes")
        attributes = attributes if isinstance(attributes, dict) else {}
        described = SliceDevice(
            uuid=_attribute(attributes, "uuid", driver),
            kind=_attribute(attributes, "type", driver),
            parent_uuid=_attribute(attributes, "parentUUID", driver),
            profile=_attribute(attributes, "profile", driver),
        )
        devices.append((device["name"], described))
    return name, _Slice(driver, str(pool_name), generation, tuple(devices))


def map_devices(
    slices: Mapping[str, _Slice], drivers: Iterable[str]
) -> dict[DraDevice, SliceDevice]:
    """(driver, pool, device) -> device, of the given drivers' slices of each pool's newest
    generation; a device two slices publish is taken from the first by slice name."""
    wanted = frozenset(drivers)
    newest: dict[tuple[str, str], int] = {}
    for found in slices.values():
        key = (found.driver, found.pool)
        if found.driver in wanted and found.generation > newest.get(key, -1):
            newest[key] = found.generation
    out: dict[DraDevice, SliceDevice] = {}
    for _, found in sorted(slices.items()):
        if newest.get((found.driver, found.pool)) != found.generation:
            continue
        for name, described in found.devices:
            out.setdefault(DraDevice(found.driver, found.pool, name), described)
    return out


@dataclass(frozen=True)
class _Status:
    """Self-telemetry, replaced as a whole so `series` reads a consistent set without a lock."""

    up: bool = False
    lists: int = 0
    errors: Mapping[str, int] = field(default_factory=dict)
    last_success: float = 0.0  # Unix time; 0 until the first success
    succeeded_at: float | None = None  # monotonic time of the last success


def _explain(error: BaseException) -> tuple[str, str]:
    """(reason, log message) of a failure."""
    if isinstance(error, ResourceSliceError):
        return error.reason, str(error)
    if isinstance(error, httpx.TimeoutException):
        return "timeout", f"no answer in time ({type(error).__name__})"
    if isinstance(error, httpx.ConnectError):
        cause = error.__cause__ or error.__context__
        if isinstance(cause, ssl.SSLError) or "SSL" in str(error) or "certificate" in str(error):
            return "tls", f"TLS failed: {error}"
        return "connection", f"cannot connect: {error}"
    if isinstance(error, httpx.TransportError):
        return "connection", f"the connection failed: {error!r}"
    if isinstance(error, ValueError | UnicodeDecodeError):  # json.JSONDecodeError is one
        return "invalid", f"an answer that is not JSON: {error}"
    return "other", f"unexpected error: {error!r}"


def _status_message(response: httpx.Response, body: bytes) -> str:
    """The `message` of a Kubernetes Status body, else the start of the body."""
    try:
        status = json.loads(body)
        if isinstance(status, dict) and isinstance(status.get("message"), str):
            return status["message"]
    except ValueError:
        pass
    return body[:200].decode("utf-8", "replace").strip() or response.reason_phrase


class ResourceSlices:
    """This node's ResourceSlices, listed and watched on a daemon thread; see the module
    docstring. `devices()` is what a tick reads."""

    def __init__(
        self,
        settings: DraConfig,
        grace_seconds: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        watch_seconds: float = WATCH_SECONDS,
        backoff_seconds: tuple[float, float] = BACKOFF_SECONDS,
    ) -> None:
        self.settings = settings
        self.grace_seconds = grace_seconds
        self.watch_seconds = watch_seconds
        self.backoff_seconds = backoff_seconds
        self._clock = clock  # the last-success timestamp
        self._monotonic = monotonic  # the grace period (immune to wall-clock steps)
        self._devices: DeviceMap = _NO_DEVICES
        self._status = _Status(errors=dict.fromkeys(REASONS, 0))
        self._state: str | None = None  # _OK or a failure's reason; a change is logged once
        self._slices: dict[str, _Slice] = {}  # by metadata.name: the list, then the watch's events
        self._resource_version: str | None = None  # None: list (again)
        self.api_version: str | None = None  # the version the server serves, once found
        self._delay = backoff_seconds[0]
        self._http: httpx.Client | None = None
        self._url = settings.api_server  # the server's address, once known (for the log)
        self._streams: list[Any] = []  # httpcore network streams open now, for stop()
        self._streams_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # The tick's side -------------------------------------------------------------------------

    def devices(self) -> DeviceMap:
        """Read-only snapshot: (driver, pool, device) -> what the slices say of it. Never waits:
        past the grace after the last success, empty even while the thread is still stuck."""
        devices, status = self._devices, self._status
        if not status.up and devices and self._expired(status):
            return _NO_DEVICES
        return devices

    @property
    def resource_version(self) -> str | None:
        """The resourceVersion the slices are known at (None: to be listed)."""
        return self._resource_version

    def series(self) -> Iterator[Series]:
        """The ResourceSlice reader's own health."""
        status = self._status
        yield series(UP, 1.0 if status.up else 0.0)
        yield series(LISTS, status.lists)
        for reason in REASONS:
            yield series(ERRORS, status.errors.get(reason, 0), (("reason", reason),))
        yield series(LAST_SUCCESS, status.last_success)
        yield series(DEVICES, len(self.devices()))

    def producer(self) -> Producer:
        return Producer("dra", self.series, frozenset({"dra"}))

    # Lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """List now, in the caller's thread (each request bounded by `timeout_seconds`), then
        watch on a daemon thread: the first tick already knows the devices."""
        if self._thread is not None:
            return
        self._stopping.clear()
        try:
            self._relist()
        except _Expired:  # a continue token expired between pages: the thread lists again
            self._close_http()
        except Exception as error:
            self._failed(error)
            self._close_http()
        self._thread = threading.Thread(target=self._run, name="dra-resource-slices", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._interrupt()  # a watch blocked on a silent server returns at once
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self.settings.timeout_seconds + 1.0)
        self._close_http()

    def _run(self) -> None:
        if self._state != _OK and not self._back_off():
            return
        expired_in_a_row = 0
        while not self._stopping.is_set():
            try:
                if self._resource_version is None or self._stale():
                    self._relist()
                else:
                    self._watch()
                    expired_in_a_row = 0
            except _Expired:
                # The resourceVersion left the server's window: list again, at once unless it
                # keeps happening (a server that answers every watch so would be a busy loop).
                self._resource_version = None
                expired_in_a_row += 1
                log.debug("ResourceSlices: the watch expired (410 Gone); listing again")
                if expired_in_a_row > 1 and not self._back_off():
                    return
            except _NotServed:  # the API server no longer serves the version found
                self.api_version, self._resource_version = None, None
            except Exception as error:  # the thread must survive anything
                if self._stopping.is_set():
                    return
                self._failed(error)
                self._close_http()
                if not self._back_off():
                    return

    def _back_off(self) -> bool:
        """Wait the current back-off and double it; False when stopping."""
        delay = self._delay
        self._delay = min(delay * 2, self.backoff_seconds[1])
        return not self._stopping.wait(delay)

    def _stale(self) -> bool:
        """Failing past the grace: the slices kept may have missed more than a watch replays
        at once, so they are listed again rather than resumed."""
        status = self._status
        return not status.up and self._expired(status)

    # The API server ---------------------------------------------------------------------------

    def _node(self) -> str:
        node = self.settings.node_name or os.environ.get("NODE_NAME", "")
        if not node:
            raise ResourceSliceError(
                "config",
                "no node name: set kubernetes.dra.node_name or $NODE_NAME (the chart sets it "
                "from the downward API's spec.nodeName)",
            )
        return node

    def _token(self) -> str:
        """The ServiceAccount token, read again each time: the kubelet rotates bound tokens."""
        try:
            with open(self.settings.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ResourceSliceError(
                "config", f"cannot read the token file {self.settings.token_file}: {error}"
            ) from None
        if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
            token = ""  # would not make a valid header
        if not token:
            raise ResourceSliceError(
                "config", f"the token file {self.settings.token_file} holds no bearer token"
            )
        return token

    def _client(self) -> httpx.Client:
        if self._http is not None:
            return self._http
        server = api_server_url(self.settings.api_server, os.environ)
        verify: ssl.SSLContext | bool = False
        if server.startswith("https:"):
            try:
                verify = ssl.create_default_context(cafile=self.settings.ca_file)
            except (OSError, ssl.SSLError) as error:
                raise ResourceSliceError(
                    "config", f"cannot read the CA file {self.settings.ca_file}: {error}"
                ) from None
        self._url = server
        self._http = httpx.Client(
            base_url=server,
            verify=verify,
            trust_env=False,  # no proxy or netrc from the environment: the cluster's own server
            headers={"Accept": "application/json", "User-Agent": f"gpu-exporter/{__version__}"},
        )
        return self._http

    def _close_http(self) -> None:
        with self._streams_lock:
            self._streams = []
        http, self._http = self._http, None
        if http is not None:
            http.close()

    def _trace(self, event: str, info: Mapping[str, Any]) -> None:
        """httpx's `trace` extension: keep the connection's stream so that stop() can shut it."""
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            with self._streams_lock:
                # A plain socket wrapped by TLS, or a connection closed since, reads fileno -1.
                self._streams = [s for s in self._streams if _open(s)]
                self._streams.append(info.get("return_value"))

    def _interrupt(self) -> None:
        with self._streams_lock:
            streams, self._streams = self._streams, []
        for stream in streams:
            # The plain socket's shutdown (not SSLSocket's): a blocked read returns. A socket
            # closed meanwhile has nothing to interrupt.
            if _open(stream):
                with contextlib.suppress(OSError):
                    socket.socket.shutdown(stream.get_extra_info("socket"), socket.SHUT_RDWR)

    def _get(self, params: Mapping[str, str], read_timeout: float) -> Any:
        """A streamed GET of the slices of the version found (or being tried)."""
        timeout = httpx.Timeout(self.settings.timeout_seconds, read=read_timeout)
        path = f"/apis/{API_GROUP}/{self.api_version}/resourceslices"
        return self._client().stream(
            "GET",
            path,
            params=params,
            headers={"Authorization": f"Bearer {self._token()}"},
            timeout=timeout,
            extensions={"trace": self._trace},
        )

    def _check(self, response: httpx.Response) -> None:
        if response.status_code < 300:
            return
        body = _read(response)
        code = response.status_code
        message = _status_message(response, body)
        if code == 404:
            raise _NotServed(message)
        if code == 410:
            raise _Expired(message)
        if code == 401:
            raise ResourceSliceError(
                "unauthorized",
                f"401 Unauthorized: the API server refused the token in "
                f"{self.settings.token_file} ({message})",
            )
        if code == 403:
            raise ResourceSliceError(
                "forbidden",
                f"403 Forbidden: the ServiceAccount needs get, list and watch on "
                f"resourceslices.{API_GROUP} (a ClusterRole): {message}",
            )
        raise ResourceSliceError("http", f"HTTP {code}: {message}")

    def _relist(self) -> None:
        """List this node's slices, trying each API version until one is served."""
        node = self._node()
        candidates = [v for v in (self.api_version, *VERSIONS) if v is not None]
        for version in dict.fromkeys(candidates):
            self.api_version = version
            try:
                slices, resource_version = self._list(node)
            except _NotServed:
                continue
            self._slices, self._resource_version = slices, resource_version
            self._listed()
            return
        self.api_version = None
        raise ResourceSliceError(
            "not_found",
            f"the API server serves no ResourceSlices ({API_GROUP} {', '.join(VERSIONS)}): "
            "DRA needs Kubernetes 1.32 or later (its beta APIs enabled before 1.34)",
        )

    def _list(self, node: str) -> tuple[dict[str, _Slice], str]:
        slices: dict[str, _Slice] = {}
        params = {"fieldSelector": f"spec.nodeName={node}", "limit": str(PAGE_SIZE)}
        while True:
            with self._get(params, self.settings.timeout_seconds) as response:
                self._check(response)
                answer = json.loads(_read(response))
            if not isinstance(answer, dict) or not isinstance(answer.get("items"), list):
                raise ResourceSliceError("invalid", "a ResourceSliceList without items")
            for item in answer["items"]:
                name, parsed = parse_slice(item)
                slices[name] = parsed
            metadata = answer.get("metadata")
            metadata = metadata if isinstance(metadata, dict) else {}
            resource_version = metadata.get("resourceVersion")
            if not isinstance(resource_version, str) or not resource_version:
                raise ResourceSliceError("invalid", "a ResourceSliceList without resourceVersion")
            token = metadata.get("continue")
            if not token:
                return slices, resource_version
            params = {**params, "continue": str(token)}

    def _watch(self) -> None:
        """Follow the changes from the last resourceVersion until the server ends the watch."""
        assert self._resource_version is not None
        seconds = max(1, round(self.watch_seconds * random.uniform(1.0, 2.0)))
        params = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self._resource_version,
            "fieldSelector": f"spec.nodeName={self._node()}",
            "timeoutSeconds": str(seconds),
        }
        unpublished = False
        try:
            with self._get(params, self.settings.timeout_seconds + seconds) as response:
                self._check(response)
                self._succeeded()
                for line, more in _lines(response):
                    if self._stopping.is_set():
                        return
                    unpublished |= self._apply(json.loads(line))
                    if unpublished and not more:
                        # Events that came together (a republish's DELETED and ADDED) are
                        # published together: no tick sees the pool between them.
                        self._publish()
                        unpublished = False
        finally:
            if unpublished:  # applied before a failure: the resourceVersion is past them
                self._publish()
        if not self._stopping.is_set():
            self._succeeded()  # a watch the server ended cleanly: it was listening all along

    def _apply(self, event: Any) -> bool:
        """One watch event; whether it changed the slices."""
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise ResourceSliceError("invalid", f"a watch event that is not one: {event!r:.80}")
        kind, obj = event.get("type"), event["object"]
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired(obj.get("message", ""))
            raise ResourceSliceError(
                "http", f"the watch failed: {obj.get('code')} {obj.get('message', '')}"
            )
        metadata = obj.get("metadata")
        resource_version = metadata.get("resourceVersion") if isinstance(metadata, dict) else None
        if kind == "BOOKMARK":
            changed = False
        elif kind in ("ADDED", "MODIFIED"):
            name, parsed = parse_slice(obj)
            self._slices[name] = parsed
            changed = True
        elif kind == "DELETED":
            name, _ = parse_slice(obj)
            self._slices.pop(name, None)
            changed = True
        else:
            raise ResourceSliceError("invalid", f"a watch event of unknown type {kind!r:.40}")
        if isinstance(resource_version, str) and resource_version:
            self._resource_version = resource_version
        self._succeeded()
        return changed

    # State ------------------------------------------------------------------------------------

    def _publish(self) -> None:
        self._devices = MappingProxyType(map_devices(self._slices, self.settings.drivers))

    def _listed(self) -> None:
        self._publish()
        old = self._status
        self._status = _Status(
            old.up, old.lists + 1, old.errors, old.last_success, old.succeeded_at
        )
        self._succeeded()

    def _succeeded(self) -> None:
        old = self._status
        self._status = _Status(True, old.lists, old.errors, self._clock(), self._monotonic())
        self._delay = self.backoff_seconds[0]
        if self._state != _OK:
            log.info(
                "ResourceSlices of node %s at %s (%s/%s): %d devices, watching",
                self.settings.node_name or os.environ.get("NODE_NAME", ""),
                self._url,
                API_GROUP,
                self.api_version,
                len(self._devices),
            )
        self._state = _OK

    def _expired(self, status: _Status) -> bool:
        """Past the grace after the last success (or never a success)."""
        if status.succeeded_at is None:
            return True
        return self._monotonic() - status.succeeded_at >= self.grace_seconds

    def _failed(self, error: BaseException) -> None:
        reason, message = _explain(error)
        old = self._status
        errors = {**old.errors, reason: old.errors.get(reason, 0) + 1}
        self._status = _Status(False, old.lists, errors, old.last_success, old.succeeded_at)
        where = self._url
        if not self._expired(old):
            # One failed request or a restarting API server: the devices are where they were.
            if reason != self._state:
                log.warning(
                    "ResourceSlices: the API server (%s) failed (%s); keeping the last known "
                    "devices until %.0f s after the last success",
                    where,
                    message,
                    self.grace_seconds,
                )
            self._state = reason
            return
        # Past the grace a device's description may be wrong (a MIG layout changed): none.
        dropped = bool(self._devices)
        self._devices = _NO_DEVICES
        if reason != self._state or dropped:
            log.warning(
                "ResourceSlices: no DRA devices until the API server (%s) answers: %s",
                where,
                message,
            )
        self._state = reason


def api_server_url(api_server: str, environ: Mapping[str, str]) -> str:
    """The API server's base URL: as configured, or with `auto` the in-cluster address
    (client-go rest.InClusterConfig: the kubernetes Service's host and port variables)."""
    if api_server != "auto":
        return api_server.rstrip("/")
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ResourceSliceError(
            "config",
            "kubernetes.dra.api_server is auto but $KUBERNETES_SERVICE_HOST is not set "
            "(not in a pod?): set api_server",
        )
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"https://{host}:{port}"


def _open(stream: Any) -> bool:
    """Whether an httpcore network stream's socket is still open."""
    try:
        sock = stream.get_extra_info("socket")
        return sock is not None and sock.fileno() != -1
    except Exception:
        return False


def _read(response: httpx.Response) -> bytes:
    """The body, up to MAX_BODY_BYTES."""
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise ResourceSliceError("invalid", f"an answer over {MAX_BODY_BYTES} bytes")
    return bytes(body)


def _lines(response: httpx.Response) -> Iterator[tuple[bytes, bool]]:
    """A watch's events, one JSON object a line (each up to MAX_BODY_BYTES), and whether
    another whole line has already arrived after it."""
    pending = bytearray()
    for chunk in response.iter_bytes():
        pending += chunk
        while (end := pending.find(b"\n")) >= 0:
            line = bytes(pending[:end]).strip()
            del pending[: end + 1]
            if line:
                yield line, b"\n" in pending
        if len(pending) > MAX_BODY_BYTES:
            raise ResourceSliceError("invalid", f"a watch event over {MAX_BODY_BYTES} bytes")
    if pending.strip():
        yield bytes(pending).strip(), False
