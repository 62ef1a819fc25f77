"""What an Alertmanager's answer to a POST of alerts means for those alerts.

Prometheus (notifier/notifier.go, 2.42: sendAll/sendOne) counts any non-2xx answer as an error
and does not send that batch again; firing alerts come back with the rule engine's next resend.
Here a batch stays queued and is retried with back-off for every answer except the two that say
the payload itself can never be accepted:

- 400 and 422: Alertmanager's API v2 (api/v2/api.go postAlertsHandler, 0.25) stores the valid
  alerts of a batch and answers 400 with the problems of the others, joined by "; " and not
  saying which alert (`invalid label set: invalid name "k8s-cluster"`); its request validation
  answers 422 (a required field missing). The batch is split in halves until each refused alert
  is alone; only those are dropped, each logged with its labels and that message. The valid
  alerts sent again meanwhile are merged by Alertmanager (same labels, same alert), as the
  rule engine's resends are.
- 413 (a proxy's or server's body limit): the batch is sent again in halves; a single alert
  still too large is dropped.

401/403/407 (an auth proxy, a rotated secret) and anything else are retried: credentials may be
fixed and secret files are re-read on each attempt; the queue stays bounded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

_MAX_DETAIL = 500

# gpu_exporter_notifications_errors_total{reason}: why a POST did not deliver its alerts.
UNREACHABLE = "unreachable"  # no HTTP answer: connection refused, TLS, timeout
CREDENTIALS = "credentials"  # a password or token file could not be read here
UNAUTHORIZED = "unauthorized"  # 401, 403, 407
UNAVAILABLE = "unavailable"  # 408, 429, 5xx: "later"
INVALID = "invalid"  # 400, 422: some alert of the batch is refused
TOO_LARGE = "too_large"  # 413
UNEXPECTED = "unexpected_status"  # 3xx (redirects are not followed), 404, other 4xx
ERROR_REASONS = (
    UNREACHABLE,
    CREDENTIALS,
    UNAUTHORIZED,
    UNAVAILABLE,
    INVALID,
    TOO_LARGE,
    UNEXPECTED,
)

# gpu_exporter_notifications_rejected_total{reason}: why an alert was given up for good.
INVALID_LOCAL = "invalid_local"  # refused before sending: Alertmanager would answer 400
REJECT_REASONS = (INVALID, TOO_LARGE, INVALID_LOCAL)

# Failures that do not end by themselves: someone has to change a setting or a secret.
NEEDS_ATTENTION = frozenset({CREDENTIALS, UNAUTHORIZED, UNEXPECTED})


class Verdict(Enum):
    DELIVERED = "delivered"
    RETRY = "retry"  # back to the head of the queue, sent again after a back-off
    SPLIT_OR_DROP = "split_or_drop"  # 400/413: halves are sent again; a single alert is dropped


@dataclass(frozen=True)
class Answer:
    verdict: Verdict
    reason: str = ""  # one of ERROR_REASONS unless delivered
    detail: str = ""  # for the log: the status and what the server said


DELIVERED = Answer(Verdict.DELIVERED)


def classify(status: int, body: str) -> Answer:
    if 200 <= status < 300:
        return DELIVERED
    detail = f"HTTP {status}: {_message(body)}"
    if status in (400, 422):
        return Answer(Verdict.SPLIT_OR_DROP, INVALID, detail)
    if status == 413:
        return Answer(Verdict.SPLIT_OR_DROP, TOO_LARGE, detail)
    if status in (401, 403, 407):
        return Answer(Verdict.RETRY, UNAUTHORIZED, detail)
    if status in (408, 429) or status >= 500:
        return Answer(Verdict.RETRY, UNAVAILABLE, detail)
    return Answer(Verdict.RETRY, UNEXPECTED, detail)


def no_answer(detail: str) -> Answer:
    return Answer(Verdict.RETRY, UNREACHABLE, detail)


def no_credentials(detail: str) -> Answer:
    return Answer(Verdict.RETRY, CREDENTIALS, detail)


def _message(body: str) -> str:
    """Alertmanager's message: a JSON string (400) or {"code", "message"} (422), else the text."""
    text = body.strip()
    try:
        decoded = json.loads(text)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
        text = decoded["message"]
    elif isinstance(decoded, str):
        text = decoded
    text = text[:_MAX_DETAIL]
    return repr(text) if text else "(no body)"
