"""The HTTP API fuzzed from its own OpenAPI schema (schemathesis) against a live daemon on
127.0.0.1, with basic auth on: every operation, GET and HEAD, with generated Accept,
Accept-Encoding and Authorization headers. Checks: never a 5xx; status codes, content types
and bodies as the schema declares them (for the JSON API; /metrics and the probes are text).

FastAPI's schema declares no parameters and `{}` JSON bodies for every route (api.py has no
response models), so the headers the handlers read are added to the schema here before
generating: that is where the parsing is (content negotiation, gzip, basic auth).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.daemon import Daemon, serve
from tests.tlsfiles import PASSWORD, USER, password_hash

MAX_EXAMPLES = 60  # per operation: 6 operations, about 10 s in all on a 2-core machine
TEXT_PATHS = {"/metrics", "/healthz", "/readyz"}
# Headers each handler (or the auth middleware in front of them all) reads.
FUZZED_HEADERS = ("Accept", "Accept-Encoding", "Authorization")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp_path = tmp_path_factory.mktemp("fuzz")
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  {USER}: {password_hash()}\n")
    with serve(
        tmp_path,
        "--simulate",
        "--interval",
        "0.5",
        "--web-config-file",
        str(web),
        auth=(USER, PASSWORD),
    ) as running:
        running.wait_ready()
        yield running


def with_fuzzed_headers(raw: dict[str, Any]) -> dict[str, Any]:
    """The served schema, plus the headers each operation reads as optional string headers,
    and 401 (basic auth) among each operation's responses."""
    schema = copy.deepcopy(raw)
    for operations in schema["paths"].values():
        for operation in operations.values():
            operation.setdefault("parameters", []).extend(
                {"name": name, "in": "header", "required": False, "schema": {"type": "string"}}
                for name in FUZZED_HEADERS
            )
            # The middleware's 401 is text, as exporter-toolkit's.
            operation["responses"].setdefault(
                "401", {"description": "no or wrong basic auth", "content": {"text/plain": {}}}
            )
    return schema


@pytest.fixture(scope="module")
def api_schema(daemon: Daemon) -> Any:
    served = httpx.get(f"{daemon.url}/openapi.json", auth=(USER, PASSWORD), timeout=5)
    assert served.status_code == 200, served.text
    schema = schemathesis.openapi.from_dict(with_fuzzed_headers(served.json()))
    schema.config.update(base_url=daemon.url)
    return schema


def check_case(case: Any) -> None:
    checks = [not_a_server_error, status_code_conformance]
    if case.path not in TEXT_PATHS:  # their declared application/json is FastAPI's default
        checks += [content_type_conformance, response_schema_conformance]
    response = case.call(timeout=10)
    case.validate_response(response, checks=checks)
    assert response.status_code in (200, 401), (case.method, case.path, response.status_code)
    if response.status_code == 401:
        assert response.headers["www-authenticate"] == ["Basic"]  # schemathesis: a list


def test_api_never_fails_and_answers_as_declared(api_schema: Any) -> None:
    # Hypothesis driven directly: schemathesis' pytest plugin (from_fixture) does not run
    # under pytest 9 (it reads Function._nodeid).
    tested = []
    for result in api_schema.get_all_operations():
        operation = result.ok()

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(case=operation.as_strategy())
        def fuzz(case: Any) -> None:
            check_case(case)

        fuzz()
        tested.append(f"{operation.method.upper()} {operation.path}")
    # Every route's GET (schemathesis generates no HEAD cases from this schema).
    routes = {
        "/metrics",
        "/healthz",
        "/readyz",
        "/api/v1/devices",
        "/api/v1/rules",
        "/api/v1/alerts",
    }
    assert {f"GET {route}" for route in routes} <= set(tested), tested


def test_the_right_credentials_are_among_the_cases(daemon: Daemon) -> None:
    """The fuzzed Authorization values are almost never right; the 200 path is covered here
    with every negotiated form, so a fuzz run that only saw 401 still checked the handlers."""
    for accept in ("", "application/openmetrics-text;q=0", "application/openmetrics-text"):
        for encoding in ("", "gzip", "gzip;q=0"):
            response = daemon.get(
                "/metrics", headers={"Accept": accept, "Accept-Encoding": encoding}
            )
            assert response.status_code == 200
            openmetrics = accept == "application/openmetrics-text"
            assert response.text.endswith("# EOF\n") is openmetrics
            assert (response.headers.get("content-encoding") == "gzip") is (encoding == "gzip")
    assert daemon.get("/api/v1/devices").json()["status"] == "success"
    assert httpx.get(f"{daemon.url}/metrics", timeout=5).status_code == 401


def test_the_fuzzed_schema_has_the_headers_on_every_route(api_schema: Any) -> None:
    for result in api_schema.get_all_operations():
        operation = result.ok()
        names = {parameter.name for parameter in operation.headers}
        assert set(FUZZED_HEADERS) <= names, operation.path
