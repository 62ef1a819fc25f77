"""A fake Kubernetes API server: a node's DRA ResourceSlices, listed and watched over HTTPS.

It speaks the wire protocol of kube-apiserver for `resource.k8s.io` ResourceSlices (Kubernetes
API concepts, "Efficient detection of changes" and "Retrieving large results sets in chunks"):

- `GET /apis/resource.k8s.io/<version>/resourceslices`: a ResourceSliceList, filtered by
  `fieldSelector` (`spec.nodeName`, `spec.driver`, `metadata.name`; `=` or `==`), paginated
  by `limit` and `continue`, with `metadata.resourceVersion`;
- the same with `watch=1`: a chunked stream of newline-delimited JSON events (ADDED, MODIFIED,
  DELETED) after `resourceVersion`, BOOKMARK events every `bookmark_seconds` with
  `allowWatchBookmarks=true`, ended cleanly after `timeoutSeconds`; a resourceVersion older
  than the history kept (`compact()`) is answered by an ERROR event with code 410, reason
  Expired, as kube-apiserver's watch cache does;
- `Authorization: Bearer <token>` required (401 Status otherwise); 404 "page not found" for a
  version not served (`versions`; v1beta1 wraps a device's fields in `basic:`).

The slices are set directly (`set_slices`) or computed at every request from a source
(`set_source`, e.g. a scenario at its clock's time: `start_for`); a change between two looks
becomes events with the next resourceVersions: a slice gone is DELETED (first), a new name
ADDED, a changed spec MODIFIED. Test hooks: `mode` ("forbidden": 403 on every request; "hang":
no answer until the mode changes or the server closes; "garbage": bodies and events that are
not JSON; "error": 500; "short_watch": every watch ends at once, without an event; "no_watch":
404 on every watch, lists served; "endless": every list page carries a `continue` token, the
next page the same items again; "trickle": list answers sent a byte every `trickle_seconds`),
`expire_next_watch()`, `close_watches(abrupt=...)`, `compact()`, `rotate_token()`, and the
requests seen (`list_calls`, `watch_calls`, `tokens_seen`, `watch_queries`).

TLS: the test CA and server certificate in gpu_exporter/sim/tls/ (test-only, see its README).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import secrets
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpu_exporter.collect.settings import DraConfig
from gpu_exporter.sim.dra import DRIVER, gpu_attributes, gpu_device_name, mig_attributes
from gpu_exporter.sim.dra import mig_device_name as dra_mig_device_name
from gpu_exporter.sim.spec import Scenario

TLS_DIR = Path(__file__).with_name("tls")
CA_FILE = str(TLS_DIR / "ca.crt")
GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")
MODES = (
    None,
    "forbidden",
    "hang",
    "garbage",
    "error",
    "short_watch",
    "no_watch",
    "endless",
    "trickle",
)
FIRST_RESOURCE_VERSION = 1000  # any number: clients must treat it as opaque
DEFAULT_WATCH_SECONDS = 1800  # kube-apiserver's --min-request-timeout


# ---------------------------------------------------------------------------------------------
# ResourceSlice objects (resource.k8s.io/v1 shape; served to v1beta1 clients with `basic:`)


def device(name: str, attributes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One entry of a slice's `spec.devices`."""
    entry: dict[str, Any] = {"name": name}
    if attributes is not None:
        entry["attributes"] = dict(attributes)
    return entry


def resource_slice(
    name: str,
    node_name: str,
    devices: Iterable[Mapping[str, Any]],
    *,
    driver: str = DRIVER,
    pool: str | None = None,
    generation: int = 0,
) -> dict[str, Any]:
    """A ResourceSlice as a driver publishes it: one pool (default: the node's name, as NVIDIA's
    driver names it) in one slice."""
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {
                "name": pool if pool is not None else node_name,
                "generation": generation,
                "resourceSliceCount": 1,
            },
            "devices": [dict(d) for d in devices],
        },
    }


def scenario_slices(scenario: Scenario, t: float) -> list[dict[str, Any]]:
    """The scenario's DRA driver's slice at scenario time `t`: every GPU and every MIG device
    live then, in one slice whose name and pool generation change at each `republish` time
    (none without `dra:`)."""
    dra = scenario.dra
    if dra is None:
        return []
    generation = sum(1 for at in dra.republish if at <= t)
    devices = []
    for gpu in scenario.devices:
        devices.append(device(gpu_device_name(gpu.index), gpu_attributes(gpu.uuid, gpu.model)))
        for instance in gpu.mig.live(t) if gpu.mig is not None else ():
            for ci, mig_uuid in enumerate(instance.mig_uuids):
                attributes = mig_attributes(
                    mig_uuid, gpu.uuid, instance.compute_profile(), gpu.model
                )
                devices.append(device(dra_mig_device_name(gpu.index, instance, ci), attributes))
    name = f"{dra.node_name}-{DRIVER}-{generation}"
    return [resource_slice(name, dra.node_name, devices, generation=generation)]


def _render(obj: Mapping[str, Any], version: str) -> dict[str, Any]:
    """A stored slice as `version` serves it."""
    out = copy.deepcopy(dict(obj))
    out["apiVersion"], out["kind"] = f"{GROUP}/{version}", "ResourceSlice"
    if version == "v1beta1":
        out["spec"]["devices"] = [
            {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
            for d in out["spec"].get("devices", [])
        ]
    return out


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _field(obj: Mapping[str, Any], path: str) -> Any:
    value: Any = obj
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


_SELECTABLE = ("metadata.name", "spec.nodeName", "spec.driver")


def _selector(text: str) -> list[tuple[str, str]] | str:
    """The (field, value) requirements of a fieldSelector, or why it is refused."""
    requirements = []
    for term in filter(None, text.split(",")):
        field, sep, value = term.partition("==") if "==" in term else term.partition("=")
        if not sep or field not in _SELECTABLE:
            return f'"{term}" is not a known field selector: only {", ".join(_SELECTABLE)}'
        requirements.append((field, value))
    return requirements


@dataclass(frozen=True)
class _Event:
    resource_version: int
    type: str
    obj: Mapping[str, Any]


# ---------------------------------------------------------------------------------------------
# The server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked watches, as kube-apiserver
    timeout = 30  # a client that connects and says nothing
    server: _Server

    def setup(self) -> None:
        self.request.settimeout(self.timeout)
        self.request.do_handshake()  # here, not in the accepting thread
        super().setup()
        self.server.fake._connected(self.request)

    def finish(self) -> None:
        self.server.fake._disconnected(self.request)
        super().finish()

    def do_GET(self) -> None:
        self.server.fake._handle(self)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read what they need from the counters


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeApiServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client gone mid-answer or a failed handshake: the client's side is under test


class FakeApiServer:
    """The server: `url`, `ca_file`, `token_file` and `node_name` are what the exporter's
    `kubernetes.dra` settings take (`settings()`)."""

    def __init__(
        self,
        node_name: str = "sim-node",
        versions: Iterable[str] = ("v1",),
        *,
        bookmark_seconds: float = 1.0,
        poll_seconds: float = 0.05,
        trickle_seconds: float = 0.05,
    ) -> None:
        self.node_name = node_name
        self.versions = tuple(versions)
        self.bookmark_seconds = bookmark_seconds
        self.poll_seconds = poll_seconds  # how often a watch looks at the source for changes
        self.trickle_seconds = trickle_seconds  # mode "trickle": the pause after each byte
        self.ca_file = CA_FILE
        self.directory = tempfile.mkdtemp(prefix="apiserver")
        self.token_file = os.path.join(self.directory, "token")
        self.token = ""
        self.rotate_token()
        self.url = ""
        self.list_calls = 0
        self.watch_calls = 0
        self.tokens_seen: list[str] = []
        self.watch_queries: list[dict[str, str]] = []  # each watch's query parameters
        self._mode: str | None = None
        self._unhang = threading.Event()
        self._unhang.set()
        self._cond = threading.Condition()
        self._resource_version = FIRST_RESOURCE_VERSION
        self._oldest = FIRST_RESOURCE_VERSION  # watches from before this answer 410
        self._objects: dict[str, dict[str, Any]] = {}
        self._events: list[_Event] = []
        self._desired: list[dict[str, Any]] = []
        self._source: Callable[[], list[dict[str, Any]]] | None = None
        self._continues: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self._expire_next: list[bool] = []  # per coming watch: answer 410 as a status?
        self._close_watches = 0  # bumped: open watches end (abrupt: see _abrupt)
        self._abrupt = False
        self._connections: set[socket.socket] = set()
        self._closing = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # What it serves -----------------------------------------------------------------------

    def set_slices(self, slices: Iterable[Mapping[str, Any]]) -> None:
        """Serve these slices from now on (replaces a source); changes become events."""
        with self._cond:
            self._source = None
            self._desired = [copy.deepcopy(dict(s)) for s in slices]
            self._sync()

    def set_source(self, slices_now: Callable[[], list[dict[str, Any]]]) -> None:
        """Serve `slices_now()`, asked at every request and every `poll_seconds` of a watch."""
        with self._cond:
            self._source = slices_now
            self._sync()

    def sync(self) -> int:
        """Look at the source now; the resourceVersion after it."""
        with self._cond:
            self._sync()
            return self._resource_version

    @property
    def resource_version(self) -> int:
        return self._resource_version

    # Test hooks -------------------------------------------------------------------------

    @property
    def mode(self) -> str | None:
        return self._mode

    @mode.setter
    def mode(self, mode: str | None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: one of {MODES}")
        self._mode = mode
        if mode == "hang":
            self._unhang.clear()
        else:
            self._unhang.set()  # hung requests end without an answer

    def expire_next_watch(self, as_status: bool = False) -> None:
        """The next watch answers 410 Gone: an ERROR event (as kube-apiserver does for a watch
        from too old a resourceVersion), or with `as_status` an HTTP 410 status."""
        with self._cond:
            self._expire_next.append(as_status)

    def close_watches(self, abrupt: bool = False) -> None:
        """End every open watch: cleanly (the chunked stream's end, as at `timeoutSeconds`),
        or `abrupt`ly (the connection cut mid-stream)."""
        with self._cond:
            self._close_watches += 1
            self._abrupt = abrupt
            self._cond.notify_all()

    def compact(self) -> None:
        """Forget the event history: a watch from any resourceVersion before now answers 410."""
        with self._cond:
            self._events.clear()
            self._oldest = self._resource_version

    def rotate_token(self) -> str:
        """A new token in `token_file`, as the kubelet rotates a bound ServiceAccount token;
        the old one is refused from now on."""
        self.token = secrets.token_urlsafe(24)
        staged = self.token_file + ".new"
        with open(staged, "w", encoding="utf-8") as f:
            f.write(self.token)
        os.replace(staged, self.token_file)  # the kubelet swaps the projected file whole
        return self.token

    def settings(self, **overrides: Any) -> DraConfig:
        """The exporter's `kubernetes.dra` settings for this server."""
        values = {
            "enabled": True,
            "api_server": self.url,
            "token_file": self.token_file,
            "ca_file": self.ca_file,
            "node_name": self.node_name,
            **overrides,
        }
        return DraConfig(**values)

    # Lifecycle --------------------------------------------------------------------------

    def start(self, avoid_ports: Collection[int] = ()) -> FakeApiServer:
        """Listen on a free port of 127.0.0.1 other than `avoid_ports`: the kernel may hand out
        a port that was free a moment ago because a caller only picked it for something else,
        such as the daemon this server was started for."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(TLS_DIR / "server.crt", TLS_DIR / "server.key")
        server = _Server(("127.0.0.1", 0), _Handler, bind_and_activate=True)
        refused: list[_Server] = []
        while server.server_address[1] in avoid_ports:
            refused.append(server)  # held while binding again, so the kernel picks another
            server = _Server(("127.0.0.1", 0), _Handler, bind_and_activate=True)
        for taken in refused:
            taken.server_close()
        server.fake = self
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
        self.url = f"https://127.0.0.1:{server.server_address[1]}"
        self._server = server
        self._closing = False
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving: open watches and hung requests end, connections are cut."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._unhang.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for conn in list(self._connections):
            _cut(conn)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connected(self, conn: socket.socket) -> None:
        with self._cond:
            self._connections.add(conn)

    def _disconnected(self, conn: socket.socket) -> None:
        with self._cond:
            self._connections.discard(conn)

    # The store --------------------------------------------------------------------------

    def _sync(self) -> None:
        """Turn the difference between the store and the source into events (lock held)."""
        desired_list = self._source() if self._source is not None else self._desired
        desired = {s["metadata"]["name"]: s for s in desired_list}
        changed = False
        for name in sorted(set(self._objects) - set(desired)):
            gone = self._objects.pop(name)
            self._record("DELETED", gone)
            changed = True
        for name in sorted(desired):
            wanted, held = desired[name], self._objects.get(name)
            if held is not None and held.get("spec") == wanted.get("spec"):
                continue
            self._record("ADDED" if held is None else "MODIFIED", wanted)
            changed = True
        if changed:
            self._cond.notify_all()

    def _record(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._resource_version += 1
        stored = copy.deepcopy(dict(obj))
        name = stored["metadata"]["name"]
        stored["metadata"] = {
            **stored["metadata"],
            "uid": hashlib.sha256(f"{self.node_name}/{name}".encode()).hexdigest()[:32],
            "resourceVersion": str(self._resource_version),
        }
        if kind != "DELETED":
            self._objects[name] = stored
        self._events.append(_Event(self._resource_version, kind, stored))

    # Requests ---------------------------------------------------------------------------

    def _handle(self, handler: _Handler) -> None:
        url = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        authorization = handler.headers.get("Authorization", "")
        token = authorization.removeprefix("Bearer ") if authorization.startswith("Bearer ") else ""
        self.tokens_seen.append(token)
        if token != self.token:
            return _send_json(handler, 401, _status(401, "Unauthorized", "Unauthorized"))
        if self._mode == "hang":
            self._unhang.wait()
            handler.close_connection = True  # no answer at all
            return None
        if self._mode == "forbidden":
            message = (
                'resourceslices.resource.k8s.io is forbidden: User "system:serviceaccount:'
                'gpu-exporter:gpu-exporter" cannot list resource "resourceslices" in API group '
                '"resource.k8s.io" at the cluster scope'
            )
            return _send_json(handler, 403, _status(403, "Forbidden", message))
        if self._mode == "error":
            return _send_json(handler, 500, _status(500, "InternalError", "etcdserver: timeout"))
        parts = url.path.strip("/").split("/")
        if (
            len(parts) != 4
            or parts[:2] != ["apis", GROUP]
            or parts[2] not in self.versions
            or parts[3] != "resourceslices"
        ):
            return _send(handler, 404, b"404 page not found\n", "text/plain; charset=utf-8")
        selector = _selector(query.get("fieldSelector", ""))
        if isinstance(selector, str):
            return _send_json(handler, 400, _status(400, "BadRequest", selector))
        if query.get("watch") in ("1", "true"):
            if self._mode == "no_watch":
                self.watch_calls += 1
                self.watch_queries.append(dict(query))
                return _send(handler, 404, b"404 page not found\n", "text/plain; charset=utf-8")
            return self._watch(handler, parts[2], query, selector)
        return self._list(handler, parts[2], query, selector)

    def _list(
        self,
        handler: _Handler,
        version: str,
        query: Mapping[str, str],
        selector: list[tuple[str, str]],
    ) -> None:
        self.list_calls += 1
        if self._mode == "garbage":
            return _send(handler, 200, b'{"kind": "ResourceSliceList", "items": [{"metadata"')
        with self._cond:
            token = query.get("continue")
            if token:
                page = self._continues.pop(token, None)
                if page is None:
                    message = (
                        "The provided continue parameter is too old to display a consistent list"
                    )
                    return _send_json(handler, 410, _status(410, "Expired", message))
                resource_version, remaining = page
            else:
                self._sync()
                resource_version = self._resource_version
                remaining = self._matching(selector)
            limit = int(query.get("limit") or 0)
            items, rest = (remaining[:limit], remaining[limit:]) if limit > 0 else (remaining, [])
            if self._mode == "endless" and not rest:
                rest = self._matching(selector)  # the next page starts over: it never ends
            metadata: dict[str, Any] = {"resourceVersion": str(resource_version)}
            if rest:
                token = secrets.token_urlsafe(12)
                self._continues[token] = (resource_version, rest)
                metadata["continue"] = token
                metadata["remainingItemCount"] = len(rest)
        answer = {
            "kind": "ResourceSliceList",
            "apiVersion": f"{GROUP}/{version}",
            "metadata": metadata,
            "items": [_render(o, version) for o in items],
        }
        if self._mode == "trickle":
            return self._trickle(handler, json.dumps(answer).encode())
        return _send_json(handler, 200, answer)

    def _trickle(self, handler: _Handler, body: bytes) -> None:
        """A 200 answer whose body comes a byte every `trickle_seconds`: each read returns in
        time, the whole takes ages (the rest at once when the mode changes)."""
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        for at in range(len(body)):
            if self._closing:
                handler.close_connection = True
                return
            if self._mode != "trickle":
                handler.wfile.write(body[at:])
                return
            handler.wfile.write(body[at : at + 1])  # an OSError once the client is gone
            time.sleep(self.trickle_seconds)

    def _matching(self, selector: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """The stored slices the field selector selects, by name (lock held)."""
        return [
            o
            for _, o in sorted(self._objects.items())
            if all(_field(o, f) == v for f, v in selector)
        ]

    def _watch(
        self,
        handler: _Handler,
        version: str,
        query: Mapping[str, str],
        selector: list[tuple[str, str]],
    ) -> None:
        self.watch_calls += 1
        self.watch_queries.append(dict(query))
        with self._cond:
            expire = self._expire_next.pop(0) if self._expire_next else None
            closed_at = self._close_watches
            self._sync()
            start = query.get("resourceVersion", "")
            cursor = int(start) if start.isdigit() else None
            too_old = cursor is not None and cursor < self._oldest
        message = f"too old resource version: {start} ({self._oldest})"
        if expire is True:
            return _send_json(handler, 410, _status(410, "Expired", message))
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        send = _chunks(handler)
        try:
            if expire is False or too_old:
                send({"type": "ERROR", "object": _status(410, "Expired", message)})
                return send(None)
            if self._mode == "garbage":
                send(b"<html>this is not a watch event</html>")
                return send(None)
            if self._mode == "short_watch":
                return send(None)  # ended before any event, bookmarks asked for or not
            self._stream(handler, version, query, selector, cursor, closed_at, send)
        except OSError:  # the client went away
            handler.close_connection = True
        return None

    def _stream(
        self,
        handler: _Handler,
        version: str,
        query: Mapping[str, str],
        selector: list[tuple[str, str]],
        cursor: int | None,
        closed_at: int,
        send: Callable[[Any], None],
    ) -> None:
        seconds = float(query.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        deadline = time.monotonic() + seconds
        bookmarks = query.get("allowWatchBookmarks") == "true"
        next_bookmark = time.monotonic() + self.bookmark_seconds
        if cursor is None:  # no resourceVersion: the current state first, as ADDED
            with self._cond:
                cursor = self._resource_version
                current = [o for _, o in sorted(self._objects.items())]
            for obj in current:
                if all(_field(obj, f) == v for f, v in selector):
                    send({"type": "ADDED", "object": _render(obj, version)})
        while True:
            with self._cond:
                self._sync()
                if (
                    self._resource_version == cursor
                    and not self._closing
                    and self._close_watches == closed_at
                ):
                    self._cond.wait(self.poll_seconds)
                    self._sync()
                pending = [e for e in self._events if e.resource_version > cursor]
                closing, abrupt = self._closing, self._abrupt
                ended = self._close_watches != closed_at
                now_version = self._resource_version
            for event in pending:
                if all(_field(event.obj, f) == v for f, v in selector):
                    send({"type": event.type, "object": _render(event.obj, version)})
            cursor = now_version  # every event up to it was in `pending`
            if closing or ended:
                if abrupt and ended:
                    _cut(handler.request)
                    handler.close_connection = True
                    return
                break
            now = time.monotonic()
            if now >= deadline:
                break
            if bookmarks and now >= next_bookmark:
                next_bookmark = now + self.bookmark_seconds
                send(_bookmark(version, cursor))
        if bookmarks:
            send(_bookmark(version, cursor))  # kube-apiserver's bookmark before a timeout
        send(None)


def _bookmark(version: str, resource_version: int) -> dict[str, Any]:
    return {
        "type": "BOOKMARK",
        "object": {
            "kind": "ResourceSlice",
            "apiVersion": f"{GROUP}/{version}",
            "metadata": {"resourceVersion": str(resource_version)},
        },
    }


def _chunks(handler: _Handler) -> Callable[[Any], None]:
    """Send one event (an object, or raw bytes) as one chunk; None ends the stream."""

    def send(event: Any) -> None:
        if event is None:
            handler.wfile.write(b"0\r\n\r\n")
            return
        line = event if isinstance(event, bytes) else json.dumps(event).encode()
        line += b"\n"
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))

    return send


def _send(
    handler: _Handler, code: int, body: bytes, content_type: str = "application/json"
) -> None:
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _send_json(handler: _Handler, code: int, obj: Any) -> None:
    _send(handler, code, json.dumps(obj).encode())


def _cut(conn: socket.socket) -> None:
    """Close a connection without a TLS close_notify or the chunked stream's end."""
    with contextlib.suppress(OSError):  # already closed
        socket.socket.shutdown(conn, socket.SHUT_RDWR)


def start_for(
    scenario: Scenario,
    clock: Callable[[], float] | None = None,
    avoid_ports: Collection[int] = (),
) -> FakeApiServer | None:
    """A running fake API server serving the scenario's DRA driver's slice at `clock()`
    (scenario seconds: pass the fake NVML's clock; by default real time since this call), on
    a port not in `avoid_ports`, or None when the scenario has no `dra:`."""
    if scenario.dra is None:
        return None
    now = clock if clock is not None else _seconds_since(time.monotonic())
    server = FakeApiServer(node_name=scenario.dra.node_name)
    server.set_source(lambda: scenario_slices(scenario, now()))
    return server.start(avoid_ports)


def _seconds_since(start: float) -> Callable[[], float]:
    def clock() -> float:
        return time.monotonic() - start

    return clock
