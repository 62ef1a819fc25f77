"""The HTTP API fuzzed from its own OpenAPI schema (schemathesis) against a live daemon on
127.0.0.1 with basic auth on: every operation, with the Accept and Accept-Encoding headers the
schema declares for /metrics and generated basic-auth credentials. Checks: never a 5xx; status
codes, content types, response headers and JSON bodies as the schema declares them.

Two runs: with the right credentials on every case (the handlers answer), and with basic auth
required, as it is on this daemon (the served schema says optional: the app cannot know
whether the web config has users), so that schemathesis generates the Authorization header.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from pydantic import BaseModel
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpu_exporter.web.api import AlertsAnswer, DevicesAnswer, RulesAnswer
from tests.daemon import Daemon, serve
from tests.tlsfiles import PASSWORD, USER, password_hash

# Per operation; only /metrics has parameters, the others run out of distinct cases sooner.
HANDLER_EXAMPLES = 150
CREDENTIAL_EXAMPLES = 40
ROUTES = {"/metrics", "/healthz", "/readyz", "/api/v1/devices", "/api/v1/rules", "/api/v1/alerts"}
RIGHT_CREDENTIALS = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# A recording and an alerting rule that fires at once (for: 0s), so /api/v1/rules and
# /api/v1/alerts have every kind of entry their schema describes.
RULES = """\
groups:
  - name: fuzz
    rules:
      - record: fuzz:gpu_up:sum
        expr: sum(gpu_up)
      - alert: FuzzGpuUp
        expr: gpu_up == 1
        labels: {severity: info}
        annotations: {summary: "GPU {{ $labels.gpu }} is up"}
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp_path = tmp_path_factory.mktemp("fuzz")
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  {USER}: {password_hash()}\n")
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    with serve(
        tmp_path,
        "--simulate",
        "--interval",
        "0.5",
        "--web-config-file",
        str(web),
        "--rules",
        str(rules),
        auth=(USER, PASSWORD),
    ) as running:
        running.wait_ready()
        yield running


@pytest.fixture(scope="module")
def served_schema(daemon: Daemon) -> dict[str, Any]:
    served = httpx.get(f"{daemon.url}/openapi.json", auth=(USER, PASSWORD), timeout=5)
    assert served.status_code == 200, served.text
    schema: dict[str, Any] = served.json()
    return schema


def fuzzed(served: dict[str, Any], base_url: str, credentials_required: bool) -> Any:
    raw = copy.deepcopy(served)
    if credentials_required:
        raw["security"] = [{"basicAuth": []}]  # this daemon has users
    schema = schemathesis.openapi.from_dict(raw)
    schema.config.update(base_url=base_url)
    return schema


def check_case(case: Any) -> None:
    """The case checked against the schema; then HEAD, which must answer as the GET did."""
    response = case.call(timeout=10)
    case.validate_response(response, checks=CHECKS)
    if response.status_code == 401:
        assert response.headers["www-authenticate"] == ["Basic"]  # schemathesis: a list
    head = httpx.head(f"{case.operation.base_url}{case.path}", headers=case.headers, timeout=10)
    assert head.content == b""
    if head.status_code == response.status_code:  # a probe may have changed its mind
        assert head.headers["content-type"] == response.headers["content-type"][0]


def fuzz_every_operation(schema: Any, examples: int, authorization: str | None) -> list[str]:
    """Hypothesis driven directly: schemathesis' pytest plugin (from_fixture) does not run
    under pytest 9 (it reads Function._nodeid)."""
    tested = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(case=operation.as_strategy())
        def fuzz(case: Any) -> None:
            if authorization is not None:
                case.headers = {**(case.headers or {}), "Authorization": authorization}
            check_case(case)

        fuzz()
        tested.append(f"{operation.method.upper()} {operation.path}")
    return sorted(tested)


def test_api_never_fails_and_answers_as_declared(
    daemon: Daemon, served_schema: dict[str, Any]
) -> None:
    """With the right credentials: the handlers answer (the generated headers reach them)."""
    schema = fuzzed(served_schema, daemon.url, credentials_required=False)
    tested = fuzz_every_operation(schema, HANDLER_EXAMPLES, RIGHT_CREDENTIALS)
    # Every route's GET (schemathesis generates no HEAD cases: check_case asks HEAD itself).
    assert tested == sorted(f"GET {route}" for route in ROUTES)


def test_generated_credentials_never_fail_and_answer_as_the_schema_declares(
    daemon: Daemon, served_schema: dict[str, Any]
) -> None:
    """Basic auth required, as it is on this daemon: schemathesis generates the Authorization
    header (nearly always wrong: 401, as declared)."""
    assert served_schema["security"] == [{}, {"basicAuth": []}]  # optional, as served
    schema = fuzzed(served_schema, daemon.url, credentials_required=True)
    for result in schema.get_all_operations():
        assert "Authorization" in {p.name for p in result.ok().headers}
    tested = fuzz_every_operation(schema, CREDENTIAL_EXAMPLES, None)
    assert tested == sorted(f"GET {route}" for route in ROUTES)


def test_the_schema_declares_what_each_route_answers(served_schema: dict[str, Any]) -> None:
    paths = served_schema["paths"]
    assert set(paths) == ROUTES
    declared = {path: paths[path]["get"]["responses"] for path in ROUTES}
    assert {path: sorted(responses) for path, responses in declared.items()} == {
        "/metrics": ["200", "401", "503"],
        "/healthz": ["200", "401", "503"],
        "/readyz": ["200", "401", "503"],
        "/api/v1/devices": ["200", "401", "503"],
        "/api/v1/rules": ["200", "401"],
        "/api/v1/alerts": ["200", "401"],
    }
    assert sorted(declared["/metrics"]["200"]["content"]) == [
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        "text/plain; version=0.0.4; charset=utf-8",
    ]
    headers = {p["name"] for p in paths["/metrics"]["get"]["parameters"]}
    assert headers == {"Accept", "Accept-Encoding"}
    for path in ROUTES - {"/metrics"}:
        assert "parameters" not in paths[path]["get"], path  # nothing else reads a header


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/api/v1/devices", DevicesAnswer),
        ("/api/v1/rules", RulesAnswer),
        ("/api/v1/alerts", AlertsAnswer),
    ],
)
def test_the_json_answers_are_exactly_their_models(
    daemon: Daemon, path: str, model: type[BaseModel]
) -> None:
    """Every key and value of the answer survives the model (which forbids extra keys)."""
    body = daemon.get(path).json()
    assert model.model_validate(body).model_dump(mode="json") == body
    data = body["data"]
    if path == "/api/v1/devices":
        assert len(data["devices"]) == 8
    elif path == "/api/v1/rules":
        (group,) = data["groups"]
        assert [rule["type"] for rule in group["rules"]] == ["recording", "alerting"]
        assert group["rules"][1]["alerts"]
    else:
        assert {alert["labels"]["alertname"] for alert in data["alerts"]} == {"FuzzGpuUp"}


def test_the_handlers_answer_every_negotiated_form(daemon: Daemon) -> None:
    """The fuzz reaches the handlers with the right credentials on about half its cases; the
    forms that matter are asked here too, each for sure."""
    for accept in ("", "application/openmetrics-text;q=0", "application/openmetrics-text"):
        for encoding in ("", "gzip", "gzip;q=0"):
            response = daemon.get(
                "/metrics", headers={"Accept": accept, "Accept-Encoding": encoding}
            )
            assert response.status_code == 200
            openmetrics = accept == "application/openmetrics-text"
            assert response.text.endswith("# EOF\n") is openmetrics
            assert (response.headers.get("content-encoding") == "gzip") is (encoding == "gzip")
    assert httpx.get(f"{daemon.url}/metrics", timeout=5).status_code == 401
