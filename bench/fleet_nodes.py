"""A fake fleet: one node's captured exposition served as many nodes, and the Prometheus
scrape configuration that scrapes them as the shipped ServiceMonitor does.

Each node is a path on one HTTP server on 127.0.0.1 (`/<node>/metrics`,
`/<node>/metrics/dcgm`). Its body is the captured one with what differs between real nodes
rewritten: every GPU and MIG UUID (unique in a real fleet) becomes one derived from the node's
name, and the template node name (the daemon's $NODE_NAME, dcgm-exporter's `hostname` label)
becomes the node's. Each node therefore has exactly the captured node's series, under labels
of its own. Pod names are kept: the scenario's pods run on every node.

Scrape configuration: what the Prometheus Operator generates from deploy/servicemonitor.yaml
and the chart's compat endpoint (helm/gpu-exporter/templates/servicemonitor.yaml): `node` from
`__meta_kubernetes_pod_node_name`, namespace/pod/container/service/endpoint target labels
dropped; for the native output `instance` and `job` dropped from the series
(metric_relabel_configs; `up` keeps them); the compat output keeps `instance` under its own job.
Kubernetes sets `instance` to the pod's address, so each target gets a distinct pod-like one.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from tests.localserver import LocalServer

NATIVE, COMPAT = "native", "compat"
OUTPUT_PATHS = {NATIVE: "/metrics", COMPAT: "/metrics/dcgm"}
# The jobs the Operator names them: the Service's name, and the chart's `<fullname>-dcgm`.
JOBS = {NATIVE: "gpu-exporter", COMPAT: "gpu-exporter-dcgm"}
TEMPLATE_NODE = "fleet-template-node"  # $NODE_NAME of the captured daemon
NODE_NAME_META = "__meta_kubernetes_pod_node_name"

_UUID = re.compile(
    r"\b(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE
)


def node_name(index: int) -> str:
    return f"gpu-node-{index:04d}"


def pod_address(index: int) -> str:
    """A distinct pod-network address per node, as Kubernetes gives `instance`."""
    if not 0 <= index < 250 * 250:
        raise ValueError(f"node index {index} out of range")
    return f"10.244.{index // 250}.{index % 250 + 2}:9449"


def node_uuid(node: str, uuid: str) -> str:
    """A UUID of the same form (GPU-/MIG- prefix, 8-4-4-4-12 hex) derived from the node's name
    and the captured UUID: stable, distinct between nodes and between a node's devices."""
    prefix, _, _ = uuid.partition("-")
    digest = hashlib.sha256(f"{node}\0{uuid}".encode()).hexdigest()
    return f"{prefix}-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def uuids(text: str) -> set[str]:
    return {match.group(0) for match in _UUID.finditer(text)}


def node_body(template: str, node: str) -> str:
    """The captured exposition as `node` would serve it."""
    mapping = {uuid: node_uuid(node, uuid) for uuid in uuids(template)}
    if len(set(mapping.values())) != len(mapping):
        raise ValueError(f"{node}: two devices got the same UUID")
    text = _UUID.sub(lambda match: mapping[match.group(0)], template)
    return text.replace(f'="{TEMPLATE_NODE}"', f'="{node}"')


@dataclass(frozen=True)
class Body:
    content_type: str
    plain: bytes
    gzipped: bytes


def fleet_bodies(template: str, content_type: str, output: str, nodes: int) -> dict[str, Body]:
    """Path -> body for `nodes` nodes of one output (NATIVE or COMPAT)."""
    bodies = {}
    for index in range(nodes):
        node = node_name(index)
        plain = node_body(template, node).encode()
        bodies[target_path(node, output)] = Body(content_type, plain, gzip.compress(plain, 6))
    return bodies


def target_path(node: str, output: str) -> str:
    return f"/{node}{OUTPUT_PATHS[output]}"


class ReplayServer:
    """Serves each path's body (gzip when the scraper accepts it, as the daemon does) over
    HTTP/1.1 keep-alive, and counts the requests per path."""

    def __init__(self, bodies: Mapping[str, Body]) -> None:
        self.bodies = dict(bodies)
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server = LocalServer(self._handler_class())
        self.port, self.url = self._server.port, self._server.url

    def __enter__(self) -> ReplayServer:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                body = replay.bodies.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                with replay._lock:
                    replay.requests[self.path] += 1
                gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
                payload = body.gzipped if gzipped else body.plain
                self.send_response(200)
                self.send_header("Content-Type", body.content_type)
                if gzipped:
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def scrape_job(output: str, address: str, nodes: int) -> dict[str, Any]:
    """One scrape job of `nodes` targets at `address` (host:port of the replay server)."""
    targets = [
        {
            "targets": [address],
            "labels": {
                "__metrics_path__": target_path(node_name(index), output),
                NODE_NAME_META: node_name(index),
                "instance": pod_address(index),
            },
        }
        for index in range(nodes)
    ]
    job: dict[str, Any] = {
        "job_name": JOBS[output],
        "static_configs": targets,
        "relabel_configs": [
            {"source_labels": [NODE_NAME_META], "target_label": "node", "action": "replace"},
            {"action": "labeldrop", "regex": "(namespace|pod|container|service|endpoint)"},
        ],
    }
    if output == NATIVE:
        job["metric_relabel_configs"] = [{"action": "labeldrop", "regex": "(instance|job)"}]
    return job


def prometheus_config(
    jobs: Sequence[Mapping[str, Any]], interval: float, rule_files: Sequence[Path] = ()
) -> dict[str, Any]:
    """A whole configuration: scrape and evaluation every `interval`, timeout within it."""
    seconds = f"{interval:g}s"
    return {
        "global": {
            "scrape_interval": seconds,
            "scrape_timeout": seconds,
            "evaluation_interval": seconds,
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": list(jobs),
    }
