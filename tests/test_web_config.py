"""The web-config file (exporter-toolkit format): parsing and its errors, the TLS context,
basic auth as middleware, hot reload; and a live daemon over TLS with each client-cert mode."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import signal
import socket
import ssl
import threading
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from gpu_exporter.web import http_server
from gpu_exporter.web.auth import WebSecurity
from gpu_exporter.web.password_check import PasswordCheck, Verdict, basic_credentials
from gpu_exporter.web.web_config import LiveWebConfig, WebConfigError, load_web_config
from tests.daemon import serve
from tests.support import wait_for
from tests.tlsfiles import PASSWORD, USER, Pki, make_pki, password_hash, tls_web_config


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def write(tmp_path: Path, text: str, name: str = "web.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config:\n  cert_file: a\n  key_fiel: b\n",
         ":3: tls_server_config.key_fiel: unknown field"),
        ("nonsense: 1\n", ":1: nonsense: unknown field"),
        ("- a\n", "(top level): must be a mapping, not a list"),
        ("basic_auth_users:\n  alice: plaintext\n",
         ":2: basic_auth_users.alice: must be a bcrypt hash"),
        ("basic_auth_users: [alice]\n", ":1: basic_auth_users: must be a mapping"),
        ("tls_server_config:\n  key_file: k\n", ":1: tls_server_config: missing cert_file"),
        ("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n",
         ":2: tls_server_config.cert_file: cannot load the certificate and key: No such file"),
        ("tls_server_config:\n  cert: x\n  cert_file: y\n  key_file: z\n",
         "tls_server_config.cert: give cert or cert_file, not both"),
        ("rate_limit:\n  interval: 1s\n  burst: 5\n", ":1: rate_limit: not supported"),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
         ":3: http_server_config.headers.X-Frame-Options: 'allow' is not one of deny, sameorigin"),
        ("http_server_config:\n  headers:\n    X-Powered-By: me\n",
         "http_server_config.headers.X-Powered-By: unknown field"),
        ("http_server_config:\n  http2: maybe\n", ":2: http_server_config.http2: must be true"),
        ("a: [\n", ":2: invalid YAML"),
    ],
)  # fmt: skip
def test_bad_files_name_file_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(WebConfigError) as caught:
        load_web_config(path)
    assert str(caught.value).startswith(str(path)), caught.value
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("  client_auth_type: RequestClientCert\n", "RequestClientCert is not supported"),
        ("  client_auth_type: RequireAnyClientCert\n", "RequireAnyClientCert is not supported"),
        ("  client_auth_type: Sometimes\n", "'Sometimes' is not one of NoClientCert"),
        ("  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
        ("  curve_preferences: [CurveP256]\n", "curve_preferences: not supported"),
        ("  min_version: TLS14\n", "'TLS14' is not one of TLS10, TLS11, TLS12, TLS13"),
        ("  min_version: TLS13\n  max_version: TLS12\n", "min_version: is above max_version"),
        ("  cipher_suites: [TLS_AES_128_GCM_SHA256]\n", "is not a TLS 1.2 suite we know"),
        ("  client_allowed_sans: [a]\n", "needs client_auth_type: RequireAndVerifyClientCert"),
        ("  client_ca: caf\u00e9\n", "client_ca: cannot load the CA certificates"),
        ("  client_ca: not a certificate\n", "client_ca: cannot load the CA certificates"),
    ],
)
def test_what_cannot_be_honoured_is_refused(
    tmp_path: Path, pki: Pki, extra: str, message: str
) -> None:
    path = write(tmp_path, tls_web_config(pki, extra))
    with pytest.raises(WebConfigError, match=message) as caught:
        load_web_config(path)
    assert f"{path}:" in str(caught.value)


def test_a_key_that_does_not_match_the_certificate_is_refused(tmp_path: Path, pki: Pki) -> None:
    text = f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.client_key}\n"
    with pytest.raises(
        WebConfigError, match="cannot load the certificate and key: KEY_VALUES_MISMATCH"
    ):
        load_web_config(write(tmp_path, text))


def test_a_full_file_loads(tmp_path: Path, pki: Pki) -> None:
    # Relative paths are relative to the file's directory, as the toolkit reads them.
    os.symlink(pki.server_cert, tmp_path / "s.crt")
    os.symlink(pki.server_key, tmp_path / "s.key")
    os.symlink(pki.ca, tmp_path / "ca.crt")
    text = (
        "tls_server_config:\n"
        "  cert_file: s.crt\n  key_file: s.key\n  client_ca_file: ca.crt\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        "  client_allowed_sans: [scraper.test]\n"
        "  min_version: TLS13\n"
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n"
        "  prefer_server_cipher_suites: false\n"
        "http_server_config:\n  http2: true\n"
        "  headers:\n    X-Frame-Options: deny\n    Content-Security-Policy: ''\n"
        f"basic_auth_users:\n  {USER}: {password_hash()}\n"
    )
    config = load_web_config(write(tmp_path, text))
    assert config.ssl_context is not None
    assert config.ssl_context.verify_mode is ssl.CERT_REQUIRED
    assert config.ssl_context.minimum_version is ssl.TLSVersion.TLSv1_3
    assert not config.ssl_context.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    assert config.headers == ((b"x-frame-options", b"deny"),)  # a blank header is unset
    assert config.allowed_sans == {"scraper.test"}
    assert set(config.users) == {USER}
    assert config.files == (
        str(tmp_path / "web.yml"),
        *(str(tmp_path / n) for n in ("s.crt", "s.key", "ca.crt")),
    )


def test_inline_pem_loads(tmp_path: Path, pki: Pki) -> None:
    def block(name: str, path: Path) -> str:
        return f"  {name}: |\n" + "".join(f"    {line}\n" for line in path.read_text().splitlines())

    text = "tls_server_config:\n" + block("cert", pki.server_cert) + block("key", pki.server_key)
    text += block("client_ca", pki.ca) + "  client_auth_type: VerifyClientCertIfGiven\n"
    config = load_web_config(write(tmp_path, text))
    assert config.ssl_context is not None
    assert config.ssl_context.verify_mode is ssl.CERT_OPTIONAL


def test_an_empty_file_means_plain_http_without_auth(tmp_path: Path) -> None:
    config = load_web_config(write(tmp_path, ""))
    assert config.ssl_context is None and not config.users


def test_web_config_problem_for_the_command_line(tmp_path: Path) -> None:
    assert http_server.web_config_problem(None) == ""
    bad = write(tmp_path, "nonsense: 1\n")
    assert http_server.web_config_problem(str(bad)).startswith(f"{bad}:1:")


# --- basic auth ----------------------------------------------------------------------------


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def app_behind(live: LiveWebConfig, probes_without_auth: bool = True) -> WebSecurity:
    app = FastAPI()
    for path in ("/metrics", "/healthz", "/readyz"):
        app.add_api_route(path, lambda: PlainTextResponse("ok\n"))
    return WebSecurity(app, live, probes_without_auth)


def get_all(app: WebSecurity, requests: list[tuple[str, dict[str, str]]]) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.get(path, headers=headers) for path, headers in requests]

    return asyncio.run(main())


def auth_file(tmp_path: Path, extra: str = "") -> LiveWebConfig:
    return LiveWebConfig(
        str(write(tmp_path, f"basic_auth_users:\n  {USER}: {password_hash()}\n{extra}"))
    )


@pytest.mark.parametrize("probes_without_auth", [True, False])
def test_basic_auth_guards_every_path_but_open_probes(
    tmp_path: Path, probes_without_auth: bool
) -> None:
    app = app_behind(auth_file(tmp_path), probes_without_auth)
    good, wrong = basic(USER, PASSWORD), basic(USER, "wrong")
    responses = get_all(
        app,
        [
            ("/metrics", {}),
            ("/metrics", wrong),
            ("/metrics", basic("mallory", PASSWORD)),
            ("/metrics", good),
            ("/healthz", {}),
            ("/readyz", {}),
            ("/readyz", good),
        ],
    )
    codes = [r.status_code for r in responses]
    probe = 200 if probes_without_auth else 401
    assert codes == [401, 401, 401, 200, probe, probe, 200]
    assert responses[0].headers["www-authenticate"] == "Basic"
    assert responses[0].text == "Unauthorized\n"


def test_response_headers_from_the_file(tmp_path: Path) -> None:
    live = auth_file(
        tmp_path, "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
    )
    ok, refused = get_all(app_behind(live), [("/metrics", basic(USER, PASSWORD)), ("/metrics", {})])
    assert ok.status_code == 200 and ok.headers["x-content-type-options"] == "nosniff"
    assert refused.status_code == 401 and refused.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "header",
    [None, b"", b"Bearer abc", b"Basic !!!", b"Basic " + base64.b64encode(b"no-colon"),
     b"Basic " + base64.b64encode(b"\xff\xfe:x")],
)  # fmt: skip
def test_malformed_authorization_is_refused(header: bytes | None) -> None:
    assert basic_credentials(header) is None


def counting_checks(check: PasswordCheck, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The passwords `check` runs bcrypt for, in order."""
    calls: list[bytes] = []
    real = check._check
    monkeypatch.setattr(check, "_check", lambda p, h: calls.append(p) or real(p, h))
    return calls


def authorization(user: str, password: str) -> bytes:
    return basic(user, password)["Authorization"].encode()


def test_only_verified_passwords_are_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    users = {USER: password_hash().encode()}
    check = PasswordCheck()
    calls = counting_checks(check, monkeypatch)

    def allowed(user: str, password: str) -> bool:
        return asyncio.run(check.check(users, authorization(user, password))) is Verdict.ALLOWED

    assert [allowed(USER, f"wrong-{i}") for i in range(5)] == [False] * 5
    assert allowed("nobody", "x") is False
    assert check._verified == {}  # wrong passwords leave nothing behind
    assert allowed(USER, PASSWORD) and allowed(USER, PASSWORD) and allowed(USER, PASSWORD)
    assert len(calls) == 7  # the right password was checked with bcrypt once
    assert len(check._verified) == 1
    assert allowed(USER, "x" * 100) is False  # over bcrypt's 72 bytes: refused, no error
    assert allowed(USER, "wrong-0") is False and len(calls) == 9  # a wrong one: bcrypt again
    assert len(check._verified) == 1


def test_the_cache_holds_salted_digests_and_a_reload_empties_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = auth_file(tmp_path)
    check, other = PasswordCheck(), PasswordCheck()
    calls = counting_checks(check, monkeypatch)

    def verdict(on: PasswordCheck) -> Verdict:
        return asyncio.run(on.check(live.current.users, authorization(USER, PASSWORD)))

    assert verdict(check) is verdict(check) is verdict(other) is Verdict.ALLOWED
    assert len(calls) == 1
    (digest,) = check._verified
    assert PASSWORD.encode() not in digest and digest not in other._verified  # a key per process

    # The same user and hash, reloaded with another setting: checked with bcrypt again.
    path = Path(live.path or "")
    headers = "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
    path.write_text(path.read_text() + headers)
    live.check()
    assert live.current.headers
    assert verdict(check) is Verdict.ALLOWED and len(calls) == 2
    # The user removed: refused, whatever was cached.
    path.write_text(f"basic_auth_users:\n  other: {password_hash()}\n")
    live.check()
    assert verdict(check) is Verdict.DENIED


def test_a_failing_client_waits_in_its_own_lane_and_a_good_one_passes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    users = {USER: password_hash().encode()}
    check = PasswordCheck()
    gate = threading.Event()  # wrong passwords' checks hang until it is set
    real = check._check

    def gated(password: bytes, hashed: bytes) -> bool:
        if password != PASSWORD.encode():
            assert gate.wait(timeout=30)
        return real(password, hashed)

    monkeypatch.setattr(check, "_check", gated)
    attacker, scraper, elsewhere = ("10.0.0.66", 40000), ("10.0.0.66", 40001), ("10.0.0.9", 5)

    async def main() -> None:
        gate.set()
        assert await check.check(users, authorization(USER, "first"), attacker) is Verdict.DENIED
        gate.clear()
        # The attacker's connection failed: its next checks wait in the slow lane, one at a
        # time, SLOW_LANE_WAITING at most; past that it is answered at once.
        waiting = [
            asyncio.create_task(check.check(users, authorization(USER, f"wrong-{i}"), attacker))
            for i in range(1 + PasswordCheck.SLOW_LANE_WAITING)
        ]
        await asyncio.sleep(0.1)
        assert check.slow_lane.full() and not any(task.done() for task in waiting)
        assert await check.check(users, authorization(USER, "more"), attacker) is Verdict.BUSY
        # The same wrong password from another connection is the same failing client.
        assert await check.check(users, authorization(USER, "first"), elsewhere) is Verdict.BUSY
        # A good client, even from the attacker's address, is not queued behind them.
        good = check.check(users, authorization(USER, PASSWORD), scraper)
        assert await asyncio.wait_for(good, timeout=10) is Verdict.ALLOWED
        assert check.slow_lane.pending == 1 + PasswordCheck.SLOW_LANE_WAITING
        gate.set()
        assert await asyncio.gather(*waiting) == [Verdict.DENIED] * len(waiting)
        assert check.slow_lane.pending == 0
        # A connection that failed, then got it right, is in good standing again.
        assert await check.check(users, authorization(USER, PASSWORD), attacker) is Verdict.ALLOWED
        assert not check.failures.recent(("connection", attacker))

    try:
        asyncio.run(main())
    finally:
        gate.set()
        check.close()


def test_an_unknown_user_costs_bcrypt_on_a_worker_thread_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bcrypt

    users = {USER: password_hash().encode()}
    hashed_on, checked_on = [], []
    real_hash, real_check = bcrypt.hashpw, bcrypt.checkpw
    monkeypatch.setattr(
        bcrypt, "hashpw", lambda *a: hashed_on.append(threading.current_thread()) or real_hash(*a)
    )
    monkeypatch.setattr(
        bcrypt,
        "checkpw",
        lambda *a: checked_on.append(threading.current_thread()) or real_check(*a),
    )
    nobody = authorization("nobody", PASSWORD)
    check = PasswordCheck()
    assert asyncio.run(check.check(users, nobody)) is Verdict.DENIED
    assert asyncio.run(check.check(users, nobody)) is Verdict.DENIED
    assert len(hashed_on) == 1 and len(checked_on) == 2  # the dummy is made once, then reused
    assert threading.main_thread() not in hashed_on + checked_on  # never on the event loop


# --- reload --------------------------------------------------------------------------------


def test_reload_on_change_keeps_the_old_settings_when_the_new_file_is_bad(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, f"basic_auth_users:\n  {USER}: {password_hash()}\n")
    live = LiveWebConfig(str(path))
    first = live.current
    live.check()
    assert live.current is first  # unchanged files: nothing reloaded

    path.write_text(f"basic_auth_users:\n  other: {password_hash()}\n")
    live.check()
    assert set(live.current.users) == {"other"}

    caplog.set_level(logging.ERROR, "gpu_exporter.web")
    path.write_text("basic_auth_users:\n  other: not-a-hash-at-all\n")
    live.check()
    live.check()
    assert set(live.current.users) == {"other"}
    errors = [r.getMessage() for r in caplog.records if "not reloaded" in r.getMessage()]
    assert len(errors) == 1 and f"{path}:2: basic_auth_users.other" in errors[0]

    live.request_reload()  # SIGHUP: reload even without a change (and log again)
    live.check()
    assert len([r for r in caplog.records if "not reloaded" in r.getMessage()]) == 2


def test_turning_tls_on_needs_a_restart(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, "")
    live = LiveWebConfig(str(path))
    path.write_text(tls_web_config(pki))
    caplog.set_level(logging.ERROR, "gpu_exporter.web")
    live.check()
    assert live.current.ssl_context is None
    assert "turns TLS on, which needs a restart" in caplog.text


# --- a live daemon over TLS ----------------------------------------------------------------


def test_daemon_serves_tls_with_auth_and_open_probes(tmp_path: Path, pki: Pki) -> None:
    web = write(tmp_path, tls_web_config(pki))
    with serve(
        tmp_path, "--simulate", "--web-config-file", str(web), tls=pki.client_context()
    ) as daemon:
        daemon.wait_ready()
        assert daemon.get("/metrics").status_code == 401
        assert daemon.get("/api/v1/devices").status_code == 401
        scraped = daemon.get("/metrics", auth=(USER, PASSWORD))
        assert scraped.status_code == 200 and "gpu_up{" in scraped.text
        with pytest.raises(httpx.ConnectError):  # an unknown CA
            httpx.get(f"{daemon.url}/readyz", verify=ssl.create_default_context(), timeout=5)
        with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port
            httpx.get(f"http://127.0.0.1:{daemon.port}/readyz", timeout=5)
        assert daemon.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("mode", "without_cert_works"),
    [("VerifyClientCertIfGiven", True), ("RequireAndVerifyClientCert", False)],
)
def test_client_certificate_modes(
    tmp_path: Path, pki: Pki, mode: str, without_cert_works: bool
) -> None:
    extra = f"  client_ca_file: {pki.ca}\n  client_auth_type: {mode}\n"
    web = write(tmp_path, tls_web_config(pki, extra, users=False))
    with serve(
        tmp_path, "--simulate", "--web-config-file", str(web), tls=pki.client_context(True)
    ) as daemon:
        daemon.wait_ready()
        assert daemon.get("/metrics").status_code == 200  # with a certificate the CA signed
        if without_cert_works:
            plain = httpx.get(f"{daemon.url}/readyz", verify=pki.client_context(), timeout=5)
            assert plain.status_code == 200
        else:
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"{daemon.url}/readyz", verify=pki.client_context(), timeout=5)
        stranger = make_pki(tmp_path / "other", "other-ca")  # a certificate another CA signed
        foreign = pki.client_context()
        foreign.load_cert_chain(stranger.client_cert, stranger.client_key)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{daemon.url}/readyz", verify=foreign, timeout=5)


def test_client_allowed_sans(tmp_path: Path, pki: Pki) -> None:
    extra = (
        f"  client_ca_file: {pki.ca}\n  client_auth_type: RequireAndVerifyClientCert\n"
        "  client_allowed_sans: [someone-else.test]\n"
    )
    web = write(tmp_path, tls_web_config(pki, extra, users=False))
    with serve(
        tmp_path, "--simulate", "--web-config-file", str(web), tls=pki.client_context(True)
    ) as daemon:
        wait_for(
            lambda: "Uvicorn running" in daemon.output() or daemon.process.poll() is not None, 15
        )
        with pytest.raises(httpx.HTTPError):
            daemon.get("/readyz")
        web.write_text(
            tls_web_config(pki, extra.replace("someone-else.test", "scraper.test"), users=False)
        )
        wait_for(lambda: "web config reloaded" in daemon.output(), 10, "the reload")
        assert daemon.get("/readyz").status_code in (200, 503)


def test_certificate_rotation_and_sighup(tmp_path: Path, pki: Pki) -> None:
    """A new certificate (another CA) applies from the next handshake, without a restart; a
    broken one keeps the old; SIGHUP reloads too."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    web = write(tmp_path, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    with serve(
        tmp_path, "--simulate", "--web-config-file", str(web), tls=pki.client_context()
    ) as daemon:
        daemon.wait_ready()
        cert.write_text("garbage\n")
        wait_for(lambda: "web config not reloaded" in daemon.output(), 10, "the failed reload")
        assert (
            httpx.get(f"{daemon.url}/healthz", verify=pki.client_context(), timeout=5).status_code
            == 200
        )

        other = make_pki(tmp_path / "rotated", "rotated-ca")
        key.write_bytes(other.server_key.read_bytes())
        cert.write_bytes(other.server_cert.read_bytes())
        wait_for(lambda: "web config reloaded" in daemon.output(), 10, "the reload")
        fresh = httpx.get(f"{daemon.url}/healthz", verify=other.client_context(), timeout=5)
        assert fresh.status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{daemon.url}/healthz", verify=pki.client_context(), timeout=5)

        before = daemon.output().count("web config reloaded")
        daemon.process.send_signal(signal.SIGHUP)
        wait_for(
            lambda: daemon.output().count("web config reloaded") > before, 10, "SIGHUP's reload"
        )
        assert daemon.process.poll() is None


def test_a_bad_web_config_stops_the_daemon_with_status_2_and_the_place(tmp_path: Path) -> None:
    web = write(tmp_path, "tls_server_config:\n  cert_file: nowhere.crt\n  key_file: nowhere.key\n")
    with serve(tmp_path, "--simulate", "--web-config-file", str(web)) as daemon:
        assert daemon.process.wait(timeout=30) == 2
        output = daemon.output()
    assert f"{web}:2: tls_server_config.cert_file: cannot load the certificate and key" in output
    assert "Traceback" not in output


def test_a_tls_handshake_not_done_in_time_is_closed(tmp_path: Path, pki: Pki) -> None:
    """The header-read timeout bounds the TLS handshake too (asyncio's default is 60 s)."""
    web = write(tmp_path, tls_web_config(pki, users=False))
    config = write(tmp_path, "web:\n  header_read_timeout_seconds: 1\n", "config.yml")
    args = ("--simulate", "--config", str(config), "--web-config-file", str(web))
    with serve(tmp_path, *args, tls=pki.client_context()) as daemon:
        daemon.wait_ready()
        with socket.create_connection(("127.0.0.1", daemon.port)) as silent:
            silent.settimeout(8)  # closed by the 1 s timeout; at 60 s recv raises TimeoutError
            with contextlib.suppress(ConnectionResetError):
                assert silent.recv(1) == b""
