"""The exporter-toolkit web-configuration file: TLS and basic auth, as node_exporter reads it.

Format: prometheus/exporter-toolkit docs/web-configuration.md (web/tls_config.go, v0.14).
`load_web_config` reads a file with the bounded YAML loader, checks its shape with the pydantic
model `WebConfigFile` (every error names the file, line and field) and builds what serving
needs: an `ssl.SSLContext` and the bcrypt hashes. What Python's ssl module
cannot do is refused with the reason rather than ignored:

- client_auth_type RequestClientCert and RequireAnyClientCert (Go asks for a certificate
  without verifying it; OpenSSL verifies whatever it asks for);
- curve_preferences (the ssl module sets no key-exchange group list);
- rate_limit (not implemented here).

`http_server_config.http2: true` (the toolkit's default) is accepted and logged once: this
server speaks HTTP/1.1 and says so in ALPN, so HTTP/2 clients fall back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import ssl
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from gpu_exporter.support.validation import InputError, Wording, validate
from gpu_exporter.support.yamlfile import LocatedYaml, Path_, load_yaml_file

log = logging.getLogger("gpu_exporter.web")


class WebConfigError(ValueError):
    """A web-config file that cannot be used; the message names the file, line and field."""


TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# client_auth_type -> verify mode; None: cannot be honoured (the value says why).
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNSUPPORTED_CLIENT_AUTH = {
    "RequestClientCert": "requests a certificate without verifying it",
    "RequireAnyClientCert": "requires a certificate without verifying it",
}
# Go's crypto/tls names (tls.CipherSuites(), TLS 1.0-1.2; TLS 1.3's are not configurable in Go
# either) -> OpenSSL's.
CIPHER_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}
# http_server_config.headers the toolkit allows, and the values it allows (None: any).
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
# $2a$, $2b$, $2y$ (htpasswd -B writes 2y), cost, 22 characters of salt, 31 of hash.
BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")


@dataclass(frozen=True)
class WebConfig:
    """A loaded web-config file. `ssl_context` None: plain HTTP; `users` empty: no auth."""

    path: str
    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: tuple[tuple[bytes, bytes], ...] = ()
    # client_allowed_sans: a client certificate must name one of these (DNS, IP, email, URI).
    allowed_sans: frozenset[str] = frozenset()
    # Every file it was built from (itself, certificates, keys, CAs), for reload checks.
    files: tuple[str, ...] = ()

    def peer_allowed(self, peercert: Mapping[str, Any] | None) -> bool:
        if not self.allowed_sans:
            return True
        names = {value for _, value in (peercert or {}).get("subjectAltName", ())}
        return bool(names & self.allowed_sans)


def load_web_config(path: str | Path) -> WebConfig:
    """Parse and check the file and build its TLS context; `WebConfigError` names the place."""
    try:
        doc = load_yaml_file(path)
    except ValueError as exc:  # YamlFileError: unreadable, not UTF-8, invalid YAML
        raise WebConfigError(str(exc)) from exc
    if doc.data is None:  # an empty file: plain HTTP without auth, as the toolkit reads it
        doc.data = {}
    try:
        file = validate(WebConfigFile, doc, wording=_WORDING)
    except InputError as exc:
        raise WebConfigError(str(exc)) from None
    return _Builder(doc).web_config(file)


# --- the file's shape (exporter-toolkit's web/tls_config.go) ---------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


_WORDING = Wording(
    unknown_key="unknown field; known: {known}",
    missing_key="missing {key}",
    not_a_mapping="must be a mapping, not {kind}",
    not_a_list="must be a list of strings, not {kind}",
)


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise PydanticCustomError("string", f"must be a non-empty string, not {_kind(value)}")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise PydanticCustomError("boolean", f"must be true or false, not {_kind(value)}")
    return value


def _choice(choices: Mapping[str, Any]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = _string(value)
        if text not in choices:
            raise PydanticCustomError("choice", f"{text!r} is not one of {', '.join(choices)}")
        return text

    return check


def _cipher_suite(value: Any) -> str:
    name = _string(value)
    if name not in CIPHER_SUITES:
        raise PydanticCustomError(
            "cipher", f"{name!r} is not a TLS 1.2 suite we know; known: " + ", ".join(CIPHER_SUITES)
        )
    return name


String = Annotated[str, BeforeValidator(_string)]
CipherSuite = Annotated[str, BeforeValidator(_cipher_suite)]
Boolean = Annotated[bool, BeforeValidator(_boolean)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsServerConfig(_Section):
    cert: String | None = None
    key: String | None = None
    client_ca: String | None = None
    cert_file: String | None = None
    key_file: String | None = None
    client_auth_type: Annotated[
        str, BeforeValidator(_choice({**CLIENT_AUTH, **UNSUPPORTED_CLIENT_AUTH}))
    ] = "NoClientCert"
    client_ca_file: String | None = None
    client_allowed_sans: list[String] | None = None
    min_version: Annotated[str, BeforeValidator(_choice(TLS_VERSIONS))] = "TLS12"
    max_version: Annotated[str, BeforeValidator(_choice(TLS_VERSIONS))] = "TLS13"
    cipher_suites: list[CipherSuite] | None = None
    prefer_server_cipher_suites: Boolean | None = None
    curve_preferences: list[Any] | None = None

    @field_validator("curve_preferences")
    @classmethod
    def _no_curves(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise PydanticCustomError(
                "unsupported",
                "not supported: Python's ssl module cannot set the key-exchange groups",
            )
        return value

    @field_validator("client_auth_type")
    @classmethod
    def _verifying(cls, value: str) -> str:
        if value in UNSUPPORTED_CLIENT_AUTH:
            raise PydanticCustomError(
                "unsupported",
                f"{value} is not supported (Go's crypto/tls {UNSUPPORTED_CLIENT_AUTH[value]}; "
                "OpenSSL verifies any certificate it asks for): use VerifyClientCertIfGiven "
                "or RequireAndVerifyClientCert with client_ca_file",
            )
        return value


def _header(name: str) -> Any:
    """A header's value: any text, or one of the values the toolkit allows; blank unsets it."""
    allowed = HEADERS[name]

    def check(value: Any) -> str | None:
        if value is None or value == "":
            return None
        text = _string(value)
        if allowed is not None and text.lower() not in allowed:
            raise PydanticCustomError("choice", f"{text!r} is not one of {', '.join(allowed)}")
        return text

    return Field(alias=name), BeforeValidator(check)


class Headers(_Section):
    """http_server_config.headers: only the headers the toolkit allows."""

    content_security_policy: Annotated[str | None, *_header("Content-Security-Policy")] = None
    x_frame_options: Annotated[str | None, *_header("X-Frame-Options")] = None
    x_content_type_options: Annotated[str | None, *_header("X-Content-Type-Options")] = None
    x_xss_protection: Annotated[str | None, *_header("X-XSS-Protection")] = None
    strict_transport_security: Annotated[str | None, *_header("Strict-Transport-Security")] = None


class HttpServerConfig(_Section):
    http2: Boolean | None = None
    headers: Headers | None = None


class WebConfigFile(_Section):
    """The file as written; `_Builder` makes what serving needs of it."""

    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig | None = None
    basic_auth_users: dict[Any, Any] | None = None
    rate_limit: Any = None

    @field_validator("rate_limit")
    @classmethod
    def _no_rate_limit(cls, value: Any) -> Any:
        if value is not None:
            raise PydanticCustomError("unsupported", "not supported by gpu-exporter; remove it")
        return value

    @field_validator("basic_auth_users", mode="before")
    @classmethod
    def _users(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, dict):
            raise PydanticCustomError(
                "users", f"must be a mapping of user: bcrypt hash, not {_kind(value)}"
            )
        return value


class _Builder:
    """The checks that need more than the file's shape (files, OpenSSL), and the result."""

    def __init__(self, doc: LocatedYaml) -> None:
        self.doc = doc
        self.directory = Path(doc.filename).parent
        self.files = [doc.filename]

    def fail(self, path: Path_, problem: str) -> WebConfigError:
        return WebConfigError(f"{self.doc.where(path)}: {problem}")

    def web_config(self, file: WebConfigFile) -> WebConfig:
        users = self.users(file.basic_auth_users or {})
        headers: tuple[tuple[bytes, bytes], ...] = ()
        allowed_sans, context = frozenset[str](), None
        if file.http_server_config is not None:
            headers = self.http_server_config(file.http_server_config)
        if file.tls_server_config is not None:
            context, allowed_sans = self.tls(file.tls_server_config)
        return WebConfig(
            self.doc.filename, context, users, headers, allowed_sans, tuple(self.files)
        )

    def users(self, value: Mapping[Any, Any]) -> dict[str, bytes]:
        path: Path_ = ("basic_auth_users",)
        users = {}
        for user, hashed in value.items():
            where = (*path, user)
            if not isinstance(user, str) or not user or ":" in user:
                raise self.fail(where, "a user name is a non-empty string without ':'")
            if not isinstance(hashed, str) or not BCRYPT_HASH.fullmatch(hashed):
                raise self.fail(
                    where,
                    'must be a bcrypt hash ($2y$10$... as `htpasswd -nBC 10 ""` writes)',
                )
            users[user] = hashed.encode()
        return users

    def http_server_config(self, section: HttpServerConfig) -> tuple[tuple[bytes, bytes], ...]:
        path: Path_ = ("http_server_config",)
        if section.http2:
            log.info("%s: http2 is not supported; serving HTTP/1.1", self.doc.where(path))
        if section.headers is None:
            return ()
        values = section.headers.model_dump(by_alias=True, exclude_none=True)
        return tuple(
            (name.lower().encode("latin-1"), text.encode("latin-1"))
            for name, text in values.items()
        )

    def tls(self, section: TlsServerConfig) -> tuple[ssl.SSLContext, frozenset[str]]:
        path: Path_ = ("tls_server_config",)

        def at(key: str) -> Path_:
            return (*path, key)

        verify = CLIENT_AUTH[section.client_auth_type]
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.set_alpn_protocols(["http/1.1"])
        low, high = TLS_VERSIONS[section.min_version], TLS_VERSIONS[section.max_version]
        if low > high:
            raise self.fail(at("min_version"), "is above max_version")
        try:
            context.minimum_version, context.maximum_version = low, high
        except (ValueError, ssl.SSLError) as exc:
            raise self.fail(at("min_version"), f"this OpenSSL refuses it: {exc}") from exc
        if section.cipher_suites:
            try:
                context.set_ciphers(":".join(CIPHER_SUITES[n] for n in section.cipher_suites))
            except ssl.SSLError as exc:
                raise self.fail(at("cipher_suites"), f"OpenSSL refuses them: {exc}") from exc
        if section.prefer_server_cipher_suites is False:
            context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        self.certificate(context, section, path)
        self.client_ca(context, section, path, verify)
        context.verify_mode = verify
        sans = frozenset(section.client_allowed_sans or ())
        if sans and verify is not ssl.CERT_REQUIRED:
            raise self.fail(
                at("client_allowed_sans"), "needs client_auth_type: RequireAndVerifyClientCert"
            )
        return context, sans

    def pem(self, section: TlsServerConfig, path: Path_, inline: str, file: str) -> tuple[str, str]:
        """("file", its path) or ("inline", the PEM text); one of the two must be given."""
        inline_text, file_name = getattr(section, inline), getattr(section, file)
        if inline_text and file_name:
            raise self.fail((*path, inline), f"give {inline} or {file}, not both")
        if inline_text:
            return "inline", inline_text
        if file_name:
            resolved = str(self.directory / file_name)  # relative to the web-config file, as Go
            self.files.append(resolved)
            return "file", resolved
        raise self.fail(path, f"missing {file} (or {inline})")

    def certificate(self, context: ssl.SSLContext, section: TlsServerConfig, path: Path_) -> None:
        cert = self.pem(section, path, "cert", "cert_file")
        key = self.pem(section, path, "key", "key_file")
        where = (*path, "cert_file" if cert[0] == "file" else "cert")
        with _as_files(cert, key) as (cert_path, key_path):
            try:
                context.load_cert_chain(cert_path, key_path)
            except (OSError, ssl.SSLError) as exc:
                problem = f"cannot load the certificate and key: {_reason(exc)}"
                raise self.fail(where, problem) from exc

    def client_ca(
        self,
        context: ssl.SSLContext,
        section: TlsServerConfig,
        path: Path_,
        verify: ssl.VerifyMode,
    ) -> None:
        if not (section.client_ca or section.client_ca_file):
            if verify is not ssl.CERT_NONE:
                raise self.fail((*path, "client_auth_type"), "needs client_ca_file (or client_ca)")
            return
        kind, value = self.pem(section, path, "client_ca", "client_ca_file")
        where = (*path, "client_ca_file" if kind == "file" else "client_ca")
        try:
            if kind == "file":
                context.load_verify_locations(cafile=value)
            else:
                context.load_verify_locations(cadata=value)
        except (OSError, ssl.SSLError, TypeError) as exc:  # TypeError: non-ASCII inline PEM
            raise self.fail(where, f"cannot load the CA certificates: {_reason(exc)}") from exc


@contextlib.contextmanager
def _as_files(*items: tuple[str, str]) -> Iterator[list[str]]:
    """Paths for (kind, value) pairs: a file as it is; inline PEM in a private temporary file,
    removed afterwards (load_cert_chain reads only files)."""
    temporary: list[str] = []
    paths = []
    try:
        for kind, value in items:
            if kind == "file":
                paths.append(value)
                continue
            handle, name = tempfile.mkstemp(suffix=".pem")  # mode 0600
            temporary.append(name)
            with os.fdopen(handle, "w") as out:
                out.write(value)
            paths.append(name)
        yield paths
    finally:
        for name in temporary:
            os.unlink(name)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return f"{exc.reason} ({exc.library or 'ssl'})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def file_stamps(paths: tuple[str, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    """(inode, size, mtime) of each file, None where it cannot be read: a change means reload."""
    stamps: list[tuple[int, int, int] | None] = []
    for name in paths:
        try:
            info = os.stat(name)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((info.st_ino, info.st_size, info.st_mtime_ns))
    return tuple(stamps)


class _SwappableContext(ssl.SSLContext):
    """The listening socket's context: each new connection is wrapped by `current`, so a new
    certificate, CA or version range applies from the next handshake on (asyncio's TLS
    transport only calls wrap_bio)."""

    current: ssl.SSLContext

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        return self.current.wrap_bio(*args, **kwargs)


class LiveWebConfig:
    """The web config in force, reloaded when one of its files changes (`check`) or on
    request (`reload`, for SIGHUP). A file that no longer loads keeps the previous settings,
    logged once per change of the files; so does one that turns TLS on or off (the listening
    socket cannot change), which needs a restart."""

    def __init__(self, path: str | None, loader: Callable[[str], WebConfig] = load_web_config):
        self.path, self._loader = path, loader
        self._requested = False
        self.current = loader(path) if path is not None else WebConfig("")
        self._stamps = file_stamps(self.current.files)
        self.ssl_context: _SwappableContext | None = None
        if self.current.ssl_context is not None:
            self.ssl_context = _SwappableContext(ssl.PROTOCOL_TLS_SERVER)
            self.ssl_context.current = self.current.ssl_context

    def request_reload(self) -> None:
        """Reload at the next `check` (safe from a signal handler)."""
        self._requested = True

    def check(self) -> None:
        requested, self._requested = self._requested, False
        if requested or (self.path is not None and file_stamps(self.current.files) != self._stamps):
            self.reload()

    def reload(self) -> None:
        if self.path is None:
            return
        self._stamps = file_stamps(self.current.files)
        try:
            new = self._loader(self.path)
        except (WebConfigError, OSError) as exc:
            log.error("web config not reloaded, the previous one stays: %s", exc)
            return
        if (new.ssl_context is None) != (self.ssl_context is None):
            log.error(
                "web config not reloaded, the previous one stays: %s turns TLS %s, which "
                "needs a restart",
                self.path,
                "on" if new.ssl_context is not None else "off",
            )
            return
        if self.ssl_context is not None and new.ssl_context is not None:
            self.ssl_context.current = new.ssl_context
        self.current = new
        self._stamps = file_stamps(new.files)
        log.info("web config reloaded from %s", self.path)
