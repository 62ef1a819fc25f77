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
"Efficient detection of changes" in the API concepts). A watch asks for a `timeoutSeconds` of
60 s randomized up to 2x (shorter than client-go's 5 to 10 minutes, so that a half-open
connection to a dead API server is noticed within about two minutes): one silent for longer
than that plus `timeout_seconds` is dead and restarted. As client-go's reflector
(tools/cache/reflector.go) has it, a watch that ends within a second without an event is a
failure ("very short watch"), and backs off like any other.

Everything is bounded: one list request takes at most `timeout_seconds` in all (not per read: a
trickling server cannot stretch it), a whole list at most 3 times that, 100 pages and 32 MiB;
the node's slices at most 1,000, with 10,000 devices in all (a driver publishes a few slices of
at most 128 devices each: kubernetes pkg/apis/resource ResourceSliceMaxDevices). Beyond a cap
the answer is `invalid`, as garbage is.

HTTPS with httpx (already a dependency) rather than the `kubernetes` package: that package and
its generated models cost tens of megabytes and a second of import time, for the two calls
needed here. In-cluster configuration is done as client-go's rest.InClusterConfig does it:
`https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the ServiceAccount's CA file, and
its token, which the kubelet rotates (bound tokens), re-read at every request.

Everything runs on a daemon thread: `start()` waits at most `timeout_seconds` for its first
list (the first tick usually knows the devices; the daemon's startup is never held longer), and
a tick only reads the finished, immutable snapshot (`devices()`). A failure (no answer, TLS,
401/403, 5xx, garbage) is counted by reason, logged once per change of state, and retried with a
back-off (1 s doubling to 30 s) that starts over only once a watch has proved healthy (an event
or bookmark came, or it stayed open a second). The last good snapshot is kept until
`grace_seconds` after the last success, then cleared, as pod attribution does
(gpu_exporter/collect/k8s/attribution.py); a watch open is a success all the while, so the
grace counts from the moment it broke.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
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
    "connection",  # refused, reset, cut mid-stream, a watch ended at once without an event
    "tls",  # the server's certificate does not verify against the CA file
    "timeout",  # no answer, or a watch silent for too long
    "unauthorized",  # 401: the token was refused
    "forbidden",  # 403: RBAC
    "not_found",  # 404 on every API version: no ResourceSlice API
    "http",  # any other error status, or an ERROR event other than 410
    "invalid",  # an answer that is not the JSON it should be, or one past a cap
    "other",  # anything else (a bug)
)

API_GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")  # newest first
PAGE_SIZE = 500
# The most one answer (or one watch event) may take in memory; an object in etcd is at most
# 1.5 MiB (etcd's default request limit), a node's slice list far less.
MAX_BODY_BYTES = 16 * 1024 * 1024
# Caps on one list and on what is kept: a node has a few slices per driver, each of at most
# 128 devices; a server past these is broken (or hostile), not a big node.
MAX_LIST_PAGES = 100
MAX_LIST_BYTES = 32 * 1024 * 1024
MAX_SLICES = 1_000
MAX_DEVICES = 10_000
LIST_DEADLINE_TIMEOUTS = 3  # a whole list, all its pages: at most this many timeout_seconds
# The server-side watch timeout, randomized up to 2x: a watch silent past it (and
# timeout_seconds more) is given up, so a dead server is noticed within about two minutes.
WATCH_SECONDS = 60
# client-go's reflector: a watch ended sooner than this without an event is a failure.
SHORT_WATCH_SECONDS = 1.0
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


class _Stopped(Exception):
    """stop() was called: no further request, no new client."""


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


class _Store:
    """The node's slices by metadata.name, within MAX_SLICES slices and MAX_DEVICES devices."""

    def __init__(self) -> None:
        self.slices: dict[str, _Slice] = {}
        self.devices = 0

    def put(self, name: str, found: _Slice) -> None:
        """Add or replace a slice; past a cap, ResourceSliceError and nothing changed."""
        old = self.slices.get(name)
        if old is None and len(self.slices) >= MAX_SLICES:
            raise ResourceSliceError(
                "invalid", f"more than {MAX_SLICES} ResourceSlices on this node: not read"
            )
        devices = self.devices - (len(old.devices) if old is not None else 0) + len(found.devices)
        if devices > MAX_DEVICES:
            raise ResourceSliceError(
                "invalid",
                f"more than {MAX_DEVICES} devices in this node's ResourceSlices: not read",
            )
        self.slices[name] = found
        self.devices = devices

    def remove(self, name: str) -> None:
        old = self.slices.pop(name, None)
        if old is not None:
            self.devices -= len(old.devices)


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
        self._store = _Store()  # the list, then the watch's events
        self._resource_version: str | None = None  # None: list (again)
        self.api_version: str | None = None  # the version the server serves, once found
        self._delay = backoff_seconds[0]
        self._http: httpx.Client | None = None
        self._http_lock = threading.Lock()  # the thread makes the client, stop() closes it
        self._url = settings.api_server  # the server's address, once known (for the log)
        self._streams: list[Any] = []  # httpcore network streams open now, for stop()
        self._streams_lock = threading.Lock()
        self._stopping = threading.Event()
        self._first_list = threading.Event()  # the thread's first list is over, however
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
    def up(self) -> bool:
        """Whether the slices are followed now: listed, or a watch open (gpu_exporter_dra_up)."""
        return self._status.up

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
        """Start the thread, and wait for its first list at most `timeout_seconds`: the first
        tick usually knows the devices, and the daemon's startup never waits longer."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._first_list.clear()
        self._thread = threading.Thread(target=self._run, name="dra-resource-slices", daemon=True)
        self._thread.start()
        self._first_list.wait(self.settings.timeout_seconds)

    def stop(self) -> None:
        self._stopping.set()
        self._interrupt()  # a watch blocked on a silent server returns at once
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=self.settings.timeout_seconds + 1.0)
        self._close_http()  # a thread still busy makes no new one: _client() checks _stopping

    def _run(self) -> None:
        expired_in_a_row = 0
        try:
            while not self._stopping.is_set():
                back_off = False
                try:
                    if self._resource_version is None or self._stale():
                        self._relist()
                    else:
                        self._watch()
                        expired_in_a_row = 0
                except _Expired:
                    # The resourceVersion left the server's window: list again, at once unless
                    # it keeps happening (a server that answers every watch so would be a busy
                    # loop).
                    self._resource_version = None
                    expired_in_a_row += 1
                    log.debug("ResourceSlices: the watch expired (410 Gone); listing again")
                    back_off = expired_in_a_row > 1
                except _NotServed:
                    # The version found no longer served (its watch 404s): find it again, after
                    # the back-off, or a server that lists but does not watch is a busy loop.
                    self.api_version, self._resource_version = None, None
                    back_off = True
                except Exception as error:  # the thread must survive anything
                    if self._stopping.is_set():
                        break
                    self._failed(error)
                    self._close_http()
                    back_off = True
                finally:
                    self._first_list.set()
                if back_off and not self._back_off():
                    break
        finally:
            self._close_http()

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
        with self._http_lock:  # never one made after stop() closed the last
            if self._stopping.is_set():
                raise _Stopped()
            if self._http is not None:
                return self._http
            server = api_server_url(self.settings.api_server, os.environ)
            try:
                DraConfig.https_url(server)  # the bearer token never in clear text
            except ValueError as error:
                where = (
                    "the in-cluster address ($KUBERNETES_SERVICE_HOST, $KUBERNETES_SERVICE_PORT)"
                    if self.settings.api_server == "auto"
                    else "kubernetes.dra.api_server"
                )
                raise ResourceSliceError("config", f"{where}: {error}") from None
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
                trust_env=False,  # no proxy or netrc from the environment: the cluster's server
                headers={
                    "Accept": "application/json",
                    "User-Agent": f"gpu-exporter/{__version__}",
                },
            )
            return self._http

    def _close_http(self) -> None:
        with self._streams_lock:
            self._streams = []
        with self._http_lock:
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

    def _get(self, params: Mapping[str, str], timeout: httpx.Timeout) -> Any:
        """A streamed GET of the slices of the version found (or being tried)."""
        path = f"/apis/{API_GROUP}/{self.api_version}/resourceslices"
        return self._client().stream(
            "GET",
            path,
            params=params,
            headers={"Authorization": f"Bearer {self._token()}"},
            timeout=timeout,
            extensions={"trace": self._trace},
        )

    def _check(self, response: httpx.Response, ends: float = math.inf) -> None:
        if response.status_code < 300:
            return
        body = _read(response, ends=ends)
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
                store, resource_version = self._list(node)
            except _NotServed:
                continue
            self._store, self._resource_version = store, resource_version
            self._listed()
            return
        self.api_version = None
        raise ResourceSliceError(
            "not_found",
            f"the API server serves no ResourceSlices ({API_GROUP} {', '.join(VERSIONS)}): "
            "DRA needs Kubernetes 1.32 or later (its beta APIs enabled before 1.34)",
        )

    def _list(self, node: str) -> tuple[_Store, str]:
        """One complete list, page after page: at most MAX_LIST_PAGES pages and MAX_LIST_BYTES,
        each request within timeout_seconds and all of them within LIST_DEADLINE_TIMEOUTS
        times that."""
        store = _Store()
        received = 0
        timeout = self.settings.timeout_seconds
        seconds = LIST_DEADLINE_TIMEOUTS * timeout
        deadline = time.monotonic() + seconds  # not self._monotonic: tests shift that one
        params = {"fieldSelector": f"spec.nodeName={node}", "limit": str(PAGE_SIZE)}
        for _ in range(MAX_LIST_PAGES):
            if self._stopping.is_set():
                raise _Stopped()
            began = time.monotonic()
            ends = min(began + timeout, deadline)
            too_slow = (
                f"no complete answer in {timeout:g} s"
                if ends < deadline
                else f"the list took longer than {seconds:g} s"
            )
            if ends <= began:
                raise ResourceSliceError("timeout", too_slow)
            budget = MAX_LIST_BYTES - received
            limit = min(MAX_BODY_BYTES, budget)
            too_large = f"a list over {MAX_LIST_BYTES} bytes" if limit == budget else ""
            try:
                with self._get(params, httpx.Timeout(ends - began)) as response:
                    self._check(response, ends)
                    body = _read(response, limit, ends, too_large=too_large, too_slow=too_slow)
            except httpx.TimeoutException as exc:  # a silence past this page's end: say whose
                raise ResourceSliceError("timeout", f"{too_slow} ({type(exc).__name__})") from exc
            received += len(body)
            answer = json.loads(body)
            if not isinstance(answer, dict) or not isinstance(answer.get("items"), list):
                raise ResourceSliceError("invalid", "a ResourceSliceList without items")
            for item in answer["items"]:
                store.put(*parse_slice(item))
            metadata = answer.get("metadata")
            metadata = metadata if isinstance(metadata, dict) else {}
            resource_version = metadata.get("resourceVersion")
            if not isinstance(resource_version, str) or not resource_version:
                raise ResourceSliceError("invalid", "a ResourceSliceList without resourceVersion")
            token = metadata.get("continue")
            if not token:
                return store, resource_version
            params = {**params, "continue": str(token)}
        raise ResourceSliceError(
            "invalid",
            f"a list of more than {MAX_LIST_PAGES} pages: the API server keeps answering with "
            "a `continue` token",
        )

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
        # Silent past its own timeout (the server ends it then) and timeout_seconds more: dead.
        timeout = httpx.Timeout(
            self.settings.timeout_seconds, read=self.settings.timeout_seconds + seconds
        )
        opened: float | None = None  # when the server took the watch (self._monotonic)
        heard = 0.0  # when it last said something
        events = 0
        unpublished = False
        try:
            with self._get(params, timeout) as response:
                self._check(response, time.monotonic() + self.settings.timeout_seconds)
                opened = heard = self._monotonic()
                self._watching()
                for line, more in _lines(response):
                    if self._stopping.is_set():
                        return
                    heard = self._monotonic()
                    unpublished |= self._apply(json.loads(line))
                    events += 1
                    if unpublished and not more:
                        # Events that came together (a republish's DELETED and ADDED) are
                        # published together: no tick sees the pool between them.
                        self._publish()
                        unpublished = False
        except Exception as error:
            if opened is not None and self._proved(opened, events):
                # Healthy until it broke, or until it fell silent: the grace counts from then.
                self._watched_until(heard if isinstance(error, httpx.TimeoutException) else None)
            raise
        finally:
            if unpublished:  # applied before a failure: the resourceVersion is past them
                self._publish()
        if self._stopping.is_set() or opened is None:
            return
        if not self._proved(opened, events):
            raise ResourceSliceError(
                "connection",
                f"the API server ended the watch at once (within {SHORT_WATCH_SECONDS:g} s, "
                "without an event)",
            )
        self._succeeded(watched=True)  # a watch the server ended cleanly: listening all along

    def _proved(self, opened: float, events: int) -> bool:
        """Whether a watch proved healthy: an event came, or it stayed open long enough."""
        return events > 0 or self._monotonic() - opened >= SHORT_WATCH_SECONDS

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
            self._store.put(*parse_slice(obj))  # past a cap: invalid, the store unchanged
            changed = True
        elif kind == "DELETED":
            name, _ = parse_slice(obj)
            self._store.remove(name)
            changed = True
        else:
            raise ResourceSliceError("invalid", f"a watch event of unknown type {kind!r:.40}")
        if isinstance(resource_version, str) and resource_version:
            self._resource_version = resource_version
        self._succeeded(watched=True)
        return changed

    # State ------------------------------------------------------------------------------------

    def _publish(self) -> None:
        self._devices = MappingProxyType(map_devices(self._store.slices, self.settings.drivers))

    def _listed(self) -> None:
        self._publish()
        old = self._status
        self._status = _Status(
            old.up, old.lists + 1, old.errors, old.last_success, old.succeeded_at
        )
        self._succeeded(watched=False)

    def _watching(self) -> None:
        """A watch the server took: up while it is open (the devices kept all the while), but
        not yet a success for the back-off, the log or the last-success time: that takes an
        event, or a watch open a while (`_proved`)."""
        old = self._status
        if not old.up:
            self._status = _Status(True, old.lists, old.errors, old.last_success, old.succeeded_at)

    def _watched_until(self, heard: float | None) -> None:
        """A healthy watch broke: a success until `heard` (self._monotonic), or until now."""
        now = self._monotonic()
        at = now if heard is None else heard
        old = self._status
        if old.succeeded_at is not None and old.succeeded_at >= at:
            return
        last_success = self._clock() - (now - at)
        self._status = _Status(old.up, old.lists, old.errors, last_success, at)

    def _succeeded(self, watched: bool) -> None:
        """A success; `watched`: by a watch that proved healthy, so the back-off starts over
        (a list alone does not: a server that lists but cannot watch would loop)."""
        old = self._status
        self._status = _Status(True, old.lists, old.errors, self._clock(), self._monotonic())
        if watched:
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


def _read(
    response: httpx.Response,
    limit: int = MAX_BODY_BYTES,
    ends: float = math.inf,
    *,
    too_large: str = "",
    too_slow: str = "",
) -> bytes:
    """The body, up to `limit` bytes, all of it by `ends` (time.monotonic): httpx's read timeout
    bounds each read, not the whole, which a trickling server could stretch at will."""
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limit:
            raise ResourceSliceError("invalid", too_large or f"an answer over {limit} bytes")
        if time.monotonic() > ends:
            raise ResourceSliceError("timeout", too_slow or "an answer that came too slowly")
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
