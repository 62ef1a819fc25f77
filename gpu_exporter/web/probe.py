"""`gpu-exporter probe URL`: GET one URL and succeed only on HTTP 200, for places that have the
exporter's image but no shell, wget or curl (the image is FROM scratch), such as the chart's
`helm test` pod, which probes /readyz through the Service.

Exit status: 0 when the answer is 200; 1 for any other answer or when no answer came (refused,
timed out, TLS failure), with one line on stderr saying which; 2 for a URL that is not
http(s)://HOST[:PORT]/... . Only the standard library is imported, so the probe starts quickly
under a small CPU limit.
"""

from __future__ import annotations

import argparse
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

EXIT_OK = 0
EXIT_NOT_READY = 1
EXIT_USAGE = 2
DEFAULT_TIMEOUT_SECONDS = 10.0
# How much of a non-200 body is printed: /readyz says why it is not ready in a line or two.
_BODY_PREVIEW_BYTES = 300

DESCRIPTION = """\
GET URL and exit 0 when it answers HTTP 200. Any other status, a refused connection, a timeout
or a TLS failure exits 1 with one line on stderr naming it; a malformed URL exits 2. Redirects
are not followed: a 3xx is reported as such."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    probe = commands.add_parser(
        "probe",
        help="GET a URL and exit 0 on HTTP 200 (for images without a shell)",
        description=DESCRIPTION,
    )
    probe.add_argument("url", metavar="URL", help="e.g. http://127.0.0.1:9449/readyz")
    probe.add_argument(
        "--insecure",
        action="store_true",
        help="https: do not verify the server's certificate or name (whether it answers, "
        "not whom it proves to be)",
    )
    probe.add_argument(
        "--timeout",
        type=_timeout_seconds,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help=f"for connecting and for the answer (default {DEFAULT_TIMEOUT_SECONDS:g})",
    )


def run(args: argparse.Namespace) -> int:
    problem = _url_problem(args.url)
    if problem:
        print(f"probe: {problem}", file=sys.stderr)
        return EXIT_USAGE
    outcome = probe(args.url, insecure=args.insecure, timeout=args.timeout)
    print(f"probe: {args.url}: {outcome.message}", file=sys.stdout if outcome.ok else sys.stderr)
    return EXIT_OK if outcome.ok else EXIT_NOT_READY


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str  # "HTTP 200 OK", or what went wrong


def probe(url: str, *, insecure: bool = False, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> Outcome:
    """The result of one GET of `url`: ok only for status 200."""
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context()
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(
        _NoRedirect(), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(urllib.request.Request(url, method="GET"), timeout=timeout) as answer:
            status, reason, body = answer.status, answer.reason, answer.read(_BODY_PREVIEW_BYTES)
    except urllib.error.HTTPError as exc:  # any status urllib does not take as success
        status, reason, body = exc.code, exc.reason, _read_quietly(exc)
    except urllib.error.URLError as exc:
        return Outcome(False, _connection_problem(exc.reason, insecure))
    except (TimeoutError, OSError) as exc:  # a timeout while reading the answer
        return Outcome(False, _connection_problem(exc, insecure))
    if status == 200:
        return Outcome(True, f"HTTP 200 {reason}".rstrip())
    detail = " ".join(body.decode("utf-8", "replace").split())
    return Outcome(False, f"HTTP {status} {reason}" + (f": {detail}" if detail else ""))


def _url_problem(url: str) -> str:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError as exc:
        return f"not a URL: {url!r} ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http:// or https:// URL with a host: {url!r}"
    return ""


def _connection_problem(reason: object, insecure: bool) -> str:
    if isinstance(reason, ssl.SSLCertVerificationError):
        hint = "" if insecure else " (--insecure skips the check)"
        return f"TLS certificate not accepted: {reason.verify_message}{hint}"
    if isinstance(reason, ssl.SSLError):
        return f"TLS failed: {reason.reason or reason}"
    if isinstance(reason, TimeoutError):
        return "no answer within the timeout"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, OSError) and reason.strerror:
        return f"cannot connect: {reason.strerror}"
    return f"cannot connect: {reason}"


def _read_quietly(error: urllib.error.HTTPError) -> bytes:
    try:
        return error.read(_BODY_PREVIEW_BYTES)
    except OSError:
        return b""


def _timeout_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 3600, got {text!r}")
    return value


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is the answer, not a hop: a readiness URL that redirects is misconfigured."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None
