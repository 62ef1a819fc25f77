"""Certificates for TLS tests, made by the real `openssl` in a test's directory, and
web-config files that use them."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt

from tests.support import require_tool

USER, PASSWORD = "prometheus", "s3cret-for-tests"


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self, with_certificate: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if with_certificate:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [require_tool("openssl"), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def make_pki(directory: Path, name: str = "ca") -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate with the
    SAN DNS:scraper.test, all EC P-256, valid for a day."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl(
        "req", "-x509", *key, "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "1",
        "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    for leaf, san, usage in (
        ("server", "IP:127.0.0.1,DNS:localhost", "serverAuth"),
        ("client", "DNS:scraper.test", "clientAuth"),
    ):
        _openssl(
            "req", *key, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", f"/CN={leaf}",
            cwd=directory,
        )  # fmt: skip
        (directory / f"{leaf}.ext").write_text(
            f"subjectAltName={san}\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n"
        )
        _openssl(
            "x509", "-req", "-in", f"{leaf}.csr", "-CA", f"{name}.crt", "-CAkey", f"{name}.key",
            "-CAcreateserial", "-out", f"{leaf}.crt", "-days", "1", "-extfile", f"{leaf}.ext",
            cwd=directory,
        )  # fmt: skip
    return Pki(
        directory,
        directory / f"{name}.crt",
        directory / "server.crt",
        directory / "server.key",
        directory / "client.crt",
        directory / "client.key",
    )


def password_hash(password: str = PASSWORD) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()  # cost 4: fast tests


def write_web_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def tls_web_config(pki: Pki, extra: str = "", users: bool = True) -> str:
    auth = f"basic_auth_users:\n  {USER}: {password_hash()}\n" if users else ""
    return (
        "tls_server_config:\n"
        f"  cert_file: {pki.server_cert}\n"
        f"  key_file: {pki.server_key}\n"
        f"{extra}"
        f"{auth}"
    )
