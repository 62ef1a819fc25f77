"""Alertmanager API v2 notifier: per-target bounded queues, retries with back-off, TLS and auth.

It behaves like Prometheus' notifier (notifier/notifier.go) for the alerts the rule engine
produces: the engine decides what to send and when (firing alerts re-sent every resend_delay
with endsAt in the future, resolved ones with endsAt = resolution time); this module only
delivers them. One deliberate difference: a batch that fails stays at the head of its queue
and is retried with back-off instead of being dropped, so an Alertmanager that is down, hung or
refusing the credentials for a while loses nothing unless its queue overflows. Only alerts that
Alertmanager refuses one by one (400/422, 413) are dropped, each logged and counted; see
answers.py for what each answer leads to.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpu_exporter import __version__
from gpu_exporter.alerting.notify import answers
from gpu_exporter.alerting.notify.answers import Answer, Verdict
from gpu_exporter.alerting.notify.validation import payload_problem
from gpu_exporter.alerting.settings import AlertingConfig, AlertmanagerConfig
from gpu_exporter.support.ratelimit import RateLimit

if TYPE_CHECKING:  # imported by _build_client, only when an Alertmanager is configured
    import httpx

log = logging.getLogger(__name__)

USER_AGENT = f"gpu-exporter/{__version__}"
API_PATH = "/api/v2/alerts"
# Repeated warnings (queue overflow, an Alertmanager that stays down) at most this often.
WARN_INTERVAL_SECONDS = 30.0
# Alerts logged one by one when dropped: at most this many per WARN_INTERVAL_SECONDS, then a count.
LOGGED_DROPS_PER_INTERVAL = 10
_NO_LABELS: Mapping[str, str] = MappingProxyType({})

Payload = dict[str, Any]


@dataclass(frozen=True)
class OutgoingAlert:
    """One alert as the rule engine hands it over."""

    labels: Mapping[str, str]  # includes alertname; external labels are added by the notifier
    annotations: Mapping[str, str]
    starts_at: float  # unix seconds
    ends_at: float | None  # unix seconds; None = not set (Alertmanager applies resolve_timeout)
    generator_url: str = ""


@dataclass(frozen=True)
class Delivery:
    """How alerts are delivered: tunables, not settings (the configuration has no key for
    them; tests shorten them). At most 256 alerts go in one POST, as Prometheus' notifier
    sends (notifier.go, maxBatchSize); a failed POST is retried after half a second, doubling
    up to 30 s. After a 413 fewer alerts go in one POST; the full max_batch_size is tried
    again `batch_limit_reset_seconds` after the last 413 (a proxy's limit may have been
    raised)."""

    max_batch_size: int = 256
    retry_initial_backoff_seconds: float = 0.5
    retry_max_backoff_seconds: float = 30.0
    batch_limit_reset_seconds: float = 600.0

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not self.retry_initial_backoff_seconds > 0:
            raise ValueError("retry_initial_backoff_seconds must be > 0")
        if self.retry_max_backoff_seconds < self.retry_initial_backoff_seconds:
            raise ValueError("retry_max_backoff_seconds must be >= retry_initial_backoff_seconds")
        if not self.batch_limit_reset_seconds > 0:
            raise ValueError("batch_limit_reset_seconds must be > 0")


@dataclass(frozen=True)
class TargetStats:
    url: str
    sent_total: int  # alerts in POSTs that Alertmanager accepted (2xx)
    failed_by_reason: Mapping[
        str, int
    ]  # alerts in failed POSTs (each attempt), answers.ERROR_REASONS
    dropped_total: int  # alerts dropped, oldest first, because the queue was full
    rejected_by_reason: Mapping[
        str, int
    ]  # alerts given up as undeliverable, answers.REJECT_REASONS
    queue_length: int  # alerts waiting, including the batch being posted
    queue_capacity: int
    batch_limit: int  # alerts per POST now: max_batch_size, or less after a 413
    latency_seconds_sum: float  # time spent in POSTs, successful or not
    latency_seconds_count: int  # POST attempts
    last_success_timestamp: float | None  # clock() of the last accepted POST

    @property
    def failed_total(self) -> int:
        return sum(self.failed_by_reason.values())

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected_by_reason.values())


@dataclass(frozen=True)
class NotifierStats:
    targets: Mapping[str, TargetStats]  # by target url

    @property
    def sent_total(self) -> int:
        return sum(t.sent_total for t in self.targets.values())

    @property
    def failed_total(self) -> int:
        return sum(t.failed_total for t in self.targets.values())

    @property
    def dropped_total(self) -> int:
        return sum(t.dropped_total for t in self.targets.values())

    @property
    def rejected_total(self) -> int:
        return sum(t.rejected_total for t in self.targets.values())

    @property
    def queue_length(self) -> int:
        return sum(t.queue_length for t in self.targets.values())


class Notifier:
    """Sends alerts to every configured Alertmanager; one queue and sender thread per target."""

    def __init__(
        self,
        settings: AlertingConfig,
        external_labels: Mapping[str, str] = _NO_LABELS,
        clock: Callable[[], float] = time.time,
        delivery: Delivery = Delivery(),
    ) -> None:
        """To `settings.alertmanagers`, with `external_labels` (the configured ones and the
        node's, resolved by the caller) added to every alert."""
        for target in settings.alertmanagers:
            target.check()  # again: a secret file may have gone since the settings were read
        urls = [t.url.rstrip("/") for t in settings.alertmanagers]
        duplicates = sorted({u for u in urls if urls.count(u) > 1})
        if duplicates:
            # Stats and metrics are keyed by url, so each Alertmanager may appear once.
            raise ValueError(f"alertmanager url listed more than once: {', '.join(duplicates)}")
        for name, value in external_labels.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ValueError(f"external label {name!r}={value!r}: names and values are strings")
        self._external_labels = dict(external_labels)
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False
        self._late_sends = RateLimit(WARN_INTERVAL_SECONDS)
        self._invalid_log = RateLimit(WARN_INTERVAL_SECONDS, burst=LOGGED_DROPS_PER_INTERVAL)
        self._senders = _build_senders(settings, delivery, clock)

    def start(self) -> None:
        with self._lock:
            if self._started or self._stopped:
                raise RuntimeError("Notifier.start() may be called once, before stop()")
            self._started = True
        for sender in self._senders:
            sender.start()

    def send(self, alerts: Sequence[OutgoingAlert]) -> None:
        """Queue alerts for every Alertmanager. Never blocks on the network, never raises."""
        try:
            payloads = [p for p in map(self._payload_or_none, alerts) if p is not None]
            if len(payloads) < len(alerts):
                for sender in self._senders:
                    sender.reject_locally(len(alerts) - len(payloads))
            if not payloads or not self._senders:
                return
            if self._stopped:
                if self._late_sends.allow():
                    log.warning("notifier is stopped; %d alerts not sent", len(payloads))
                return
            for sender in self._senders:
                sender.enqueue(payloads)
        except Exception:  # the rule engine must keep running whatever happens here
            log.exception("notifier: could not queue %r", alerts)

    def stop(self, timeout: float = 5.0) -> None:
        """Try to flush the queues within `timeout` seconds, then end the sender threads."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        deadline = time.monotonic() + max(timeout, 0.0)
        for sender in self._senders:
            sender.begin_drain(deadline)
        for sender in self._senders:
            sender.join(deadline)

    def stats(self) -> NotifierStats:
        return NotifierStats(targets={s.url: s.stats() for s in self._senders})

    def _payload_or_none(self, alert: OutgoingAlert) -> Payload | None:
        """The alert's payload, or None (logged) when Alertmanager could never accept it."""
        payload: Payload | None = None
        try:
            payload = alert_payload(alert, self._external_labels)
            problem = payload_problem(payload)
        except (TypeError, ValueError, OverflowError, AttributeError) as exc:
            problem = f"malformed: {exc}"
        if problem is None:
            return payload
        passed = self._invalid_log.allow()
        if passed is not None:
            log.error(
                "notifier: not sending alert %s, Alertmanager would refuse it: %s%s",
                _describe(payload["labels"] if payload else getattr(alert, "labels", alert)),
                problem,
                passed.note,
            )
        return None


def _build_senders(
    settings: AlertingConfig, delivery: Delivery, clock: Callable[[], float]
) -> tuple[_TargetSender, ...]:
    senders: list[_TargetSender] = []
    try:
        for target in settings.alertmanagers:
            senders.append(_TargetSender(target, settings.queue_capacity, delivery, clock))
    except Exception:  # e.g. a bad TLS file: close the clients already made
        for sender in senders:
            sender.join(0.0)
        raise
    return tuple(senders)


def alert_payload(alert: OutgoingAlert, external_labels: Mapping[str, str]) -> Payload:
    """The Alertmanager API v2 JSON object for one alert (postableAlert)."""
    # An empty label value means "no such label" in Prometheus; external labels fill those
    # in, and otherwise alert labels win on conflict (notifier.go).
    labels = {_text(k): _text(v) for k, v in alert.labels.items() if v != ""}
    for name, value in external_labels.items():
        labels.setdefault(name, value)
    payload: Payload = {
        "labels": labels,
        "annotations": {_text(k): _text(v) for k, v in alert.annotations.items()},
        "startsAt": format_timestamp(alert.starts_at),
    }
    if alert.ends_at is not None:
        payload["endsAt"] = format_timestamp(alert.ends_at)
    if alert.generator_url:
        payload["generatorURL"] = _text(alert.generator_url)
    return payload


def format_timestamp(unix_seconds: float) -> str:
    """RFC 3339 in UTC with milliseconds, e.g. 2026-01-02T03:04:05.678Z."""
    millis = round(float(unix_seconds) * 1000)
    seconds, frac = divmod(millis, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{frac:03d}Z"


@dataclass(frozen=True)
class _Settled:
    """What a finished POST did to the queue (for the logs, outside the lock)."""

    displaced: int = 0  # alerts of the batch an overflow had displaced: dropped now
    rejected: tuple[Payload, ...] = ()  # alerts refused alone: dropped for good
    new_limit: int | None = None  # alerts per POST after a 413


class _TargetSender:
    """The queue, HTTP client and thread for one Alertmanager.

    Invariant (under `_cond`): len(_queue) + live in-flight alerts <= capacity, where the live
    in-flight alerts are the batch being posted minus those an overflow has displaced.

    A batch that is not delivered goes back to the head of the queue, in order, so the next
    batch starts with the same alerts: after a 413 it is taken in halves (`_limit`), after a
    400/422 in the halves `_pieces` lists, and an alert is only dropped when a POST of it alone
    is refused. A half that was delivered is never sent again when the other one fails.
    """

    def __init__(
        self,
        target: AlertmanagerConfig,
        capacity: int,
        delivery: Delivery,
        clock: Callable[[], float],
    ) -> None:
        self.url = target.url
        self._target = target
        self._endpoint = target.url.rstrip("/") + API_PATH
        self._capacity = capacity
        self._max_batch = delivery.max_batch_size
        self._initial_backoff = delivery.retry_initial_backoff_seconds
        self._max_backoff = delivery.retry_max_backoff_seconds
        self._limit_reset = delivery.batch_limit_reset_seconds
        self._clock = clock
        self._client = _build_client(target)
        self._cond = threading.Condition()
        self._queue: deque[Payload] = deque()
        self._inflight = 0
        self._displaced = 0
        self._limit = self._max_batch  # lowered by a 413
        self._limit_lowered_at = 0.0  # monotonic time of the last 413
        # Sizes of the next batches: the halves of batches refused with 400/422 (the alerts
        # they stand for are at the head of the queue). A hint: an overflow may shift it, which
        # costs a POST at worst, since only a refused single alert is ever dropped.
        self._pieces: deque[int] = deque()
        self._batch_is_piece = False
        self._drain_deadline: float | None = None  # monotonic; set once stop() began
        self._closed = False
        self._thread: threading.Thread | None = None
        self._sent = self._dropped = 0
        self._failed = dict.fromkeys(answers.ERROR_REASONS, 0)
        self._rejected = dict.fromkeys(answers.REJECT_REASONS, 0)
        self._latency_sum = 0.0
        self._attempts = 0
        self._last_success: float | None = None
        self._unreported_drops = 0
        self._drop_warnings = RateLimit(WARN_INTERVAL_SECONDS)
        self._failure_warnings = RateLimit(WARN_INTERVAL_SECONDS)
        self._rejection_log = RateLimit(WARN_INTERVAL_SECONDS, burst=LOGGED_DROPS_PER_INTERVAL)
        self._failure_streak = 0

    # --- called from other threads -------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"notifier {self.url}", daemon=True)
        self._thread.start()

    def enqueue(self, payloads: list[Payload]) -> None:
        with self._cond:
            if self._closed:
                return
            self._queue.extend(payloads)
            dropped = self._enforce_capacity()
            self._cond.notify()
        self._report_drops(dropped)

    def reject_locally(self, count: int) -> None:
        """Count alerts the notifier refused before queueing them (see validation.py)."""
        with self._cond:
            self._rejected[answers.INVALID_LOCAL] += count

    def begin_drain(self, deadline: float) -> None:
        with self._cond:
            self._drain_deadline = deadline
            self._cond.notify()

    def join(self, deadline: float) -> None:
        if self._thread is None:  # never started: nothing runs, only the client to close
            self._close()
            return
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            # Only a POST started before stop() can still run; it ends by its own timeout.
            log.warning(
                "notifier: sender for %s still busy after stop(); it ends within %.0f s",
                self.url,
                self._target.timeout_seconds,
            )

    def stats(self) -> TargetStats:
        with self._cond:
            return TargetStats(
                url=self.url,
                sent_total=self._sent,
                failed_by_reason=MappingProxyType(dict(self._failed)),
                dropped_total=self._dropped,
                rejected_by_reason=MappingProxyType(dict(self._rejected)),
                queue_length=len(self._queue) + self._inflight - self._displaced,
                queue_capacity=self._capacity,
                batch_limit=self._limit,
                latency_seconds_sum=self._latency_sum,
                latency_seconds_count=self._attempts,
                last_success_timestamp=self._last_success,
            )

    # --- the sender thread ---------------------------------------------------------------

    def _run(self) -> None:
        backoff = self._initial_backoff
        try:
            while (batch := self._take_batch()) is not None:
                verdict = self._deliver(batch)
                if verdict is not Verdict.RETRY:  # delivered, or split / dropped: go on now
                    backoff = self._initial_backoff
                    continue
                if self._draining():
                    break  # stopping and the Alertmanager is failing: do not wait for it
                self._wait_backoff(backoff)
                backoff = min(backoff * 2, self._max_backoff)
        except Exception:  # a bug here must not silently stop all notifications
            log.exception("notifier: sender for %s crashed", self.url)
        finally:
            self._close()

    def _take_batch(self) -> list[Payload] | None:
        """The next batch (oldest alerts first), or None when the thread should end."""
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self._drain_deadline is not None)
            if not self._queue:
                return None
            if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
                return None
            since_413 = time.monotonic() - self._limit_lowered_at
            if self._limit < self._max_batch and since_413 >= self._limit_reset:
                self._limit = self._max_batch
            size = min(len(self._queue), self._limit)
            self._batch_is_piece = bool(self._pieces)
            if self._pieces:
                piece = self._pieces.popleft()
                if piece > size:  # the rest of the piece is the next batch
                    self._pieces.appendleft(piece - size)
                size = min(size, piece)
            batch = [self._queue.popleft() for _ in range(size)]
            self._inflight, self._displaced = size, 0
            return batch

    def _deliver(self, batch: list[Payload]) -> Verdict:
        started = time.monotonic()
        answer = self._post(batch)
        elapsed = time.monotonic() - started
        settled = self._settle(batch, answer, elapsed)
        self._log_answer(answer, len(batch), settled)
        self._report_drops(settled.displaced)
        return answer.verdict

    def _post(self, batch: list[Payload]) -> Answer:
        try:
            headers = {"Content-Type": "application/json", **self._auth_headers()}
        except OSError as exc:  # a rotated secret may be briefly missing: try again later
            return answers.no_credentials(f"cannot read credentials: {exc}")
        body = json.dumps(batch, separators=(",", ":")).encode()
        import httpx  # already loaded by _build_client: a dictionary lookup

        try:
            response = self._client.post(
                self._endpoint, content=body, headers=headers, timeout=self._request_timeout()
            )
        except httpx.HTTPError as exc:  # connection refused, TLS failure, timeout, ...
            return answers.no_answer(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # e.g. a token httpx cannot put in a header: keep the alerts
            return answers.no_answer(f"unexpected {type(exc).__name__}: {exc}")
        return answers.classify(response.status_code, response.text)

    def _settle(self, batch: list[Payload], answer: Answer, elapsed: float) -> _Settled:
        """Account for a finished POST and put back what is to be sent again."""
        with self._cond:
            size, displaced = len(batch), self._displaced
            self._inflight = self._displaced = 0
            self._attempts += 1
            self._latency_sum += elapsed
            if answer.verdict is Verdict.DELIVERED:
                self._sent += size
                self._last_success = self._clock()
                return _Settled()
            self._failed[answer.reason] += size
            # The oldest alerts of the batch that newer ones displaced are dropped now.
            self._dropped += displaced
            live = batch[displaced:]
            if answer.verdict is Verdict.SPLIT_OR_DROP and size == 1:
                self._rejected[answer.reason] += len(live)
                if answer.reason == answers.TOO_LARGE:
                    self._limit = self._max_batch  # that alert was the problem, not the count
                return _Settled(displaced, rejected=tuple(live))
            # Back to the head, in order: the next batch starts with these alerts again.
            self._queue.extendleft(reversed(live))
            new_limit = None
            same_piece = answer.verdict is Verdict.RETRY or answer.reason == answers.TOO_LARGE
            if same_piece and self._batch_is_piece and live:
                self._pieces.appendleft(len(live))
            if answer.reason == answers.TOO_LARGE:
                self._limit = new_limit = max(1, size // 2)
                self._limit_lowered_at = time.monotonic()
            elif answer.reason == answers.INVALID and live:
                first = (len(live) + 1) // 2
                self._pieces.extendleft(p for p in (len(live) - first, first) if p)
            return _Settled(displaced, new_limit=new_limit)

    def _wait_backoff(self, seconds: float) -> None:
        with self._cond:  # sends do not shorten the back-off; stop() does
            self._cond.wait_for(lambda: self._drain_deadline is not None, timeout=seconds)

    def _draining(self) -> bool:
        with self._cond:
            return self._drain_deadline is not None

    def _request_timeout(self) -> float:
        with self._cond:
            deadline = self._drain_deadline
        if deadline is None:
            return self._target.timeout_seconds
        return max(min(self._target.timeout_seconds, deadline - time.monotonic()), 0.05)

    def _close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            left = len(self._queue)
        self._client.close()
        if left:
            log.warning("notifier: stopped with %d alerts not delivered to %s", left, self.url)

    # --- helpers -------------------------------------------------------------------------

    def _enforce_capacity(self) -> int:
        """Drop the oldest alerts beyond capacity (lock held); returns how many were dropped now.

        The batch being posted holds the oldest alerts, so it is displaced first; its alerts
        count as dropped only if the POST fails (if it succeeds they were delivered after all).
        """
        live_inflight = self._inflight - self._displaced
        excess = len(self._queue) + live_inflight - self._capacity
        if excess <= 0:
            return 0
        from_batch = min(excess, live_inflight)
        self._displaced += from_batch
        excess -= from_batch
        for _ in range(excess):
            self._queue.popleft()
        self._dropped += excess
        return excess

    def _auth_headers(self) -> dict[str, str]:
        """Read per request so that rotated password and token files take effect."""
        t, auth = self._target, self._target.basic_auth
        if t.bearer_token is not None:
            return {"Authorization": f"Bearer {t.bearer_token}"}
        if t.bearer_token_file is not None:
            return {"Authorization": f"Bearer {_read(t.bearer_token_file)}"}
        if auth is not None:
            password = auth.password or ""
            if auth.password_file is not None:
                password = _read(auth.password_file)
            userpass = f"{auth.username}:{password}".encode()
            return {"Authorization": "Basic " + base64.b64encode(userpass).decode("ascii")}
        return {}

    def _report_drops(self, count: int) -> None:
        if count <= 0:
            return
        with self._cond:
            self._unreported_drops += count
            if not self._drop_warnings.allow():
                return
            count, self._unreported_drops = self._unreported_drops, 0
            total = self._dropped
        log.warning(
            "notifier: queue for %s is full (capacity %d); dropped the %d oldest alerts "
            "(%d dropped in total)",
            self.url,
            self._capacity,
            count,
            total,
        )

    def _log_answer(self, answer: Answer, size: int, settled: _Settled) -> None:
        if answer.verdict is Verdict.DELIVERED:
            if self._failure_streak:
                log.info(
                    "notifier: %s accepts alerts again after %d failed attempts",
                    self.url,
                    self._failure_streak,
                )
            self._failure_streak = 0
            return
        for payload in settled.rejected:
            passed = self._rejection_log.allow()
            if passed is not None:
                log.error(
                    "notifier: %s refused alert %s on its own (%s), dropping it: %s%s",
                    self.url,
                    _describe(payload["labels"]),
                    answer.reason,
                    answer.detail,
                    passed.note,
                )
        if settled.rejected or (answer.verdict is Verdict.SPLIT_OR_DROP and size == 1):
            return
        if answer.verdict is Verdict.SPLIT_OR_DROP:
            if settled.new_limit is not None:
                log.warning(
                    "notifier: %s refused %d alerts as too large (%s); sending at most %d "
                    "per POST for %.0f s",
                    self.url,
                    size,
                    answer.detail,
                    settled.new_limit,
                    self._limit_reset,
                )
            else:
                log.warning(
                    "notifier: %s refused a batch of %d alerts (%s); sending it in halves "
                    "to find the refused ones",
                    self.url,
                    size,
                    answer.detail,
                )
            return
        self._failure_streak += 1
        if not self._failure_warnings.allow():
            level = logging.DEBUG
        elif answer.reason in answers.NEEDS_ATTENTION:
            level = logging.ERROR
        else:
            level = logging.WARNING
        log.log(
            level,
            "notifier: sending %d alerts to %s failed (%s, attempt %d; kept and retried): %s",
            size,
            self.url,
            answer.reason,
            self._failure_streak,
            answer.detail,
        )


def _build_client(target: AlertmanagerConfig) -> httpx.Client:
    # Imported here, not at module level: httpx and what it pulls in (pygments, httpcore,
    # certifi...) cost about 4 MiB and 20 ms at start-up, and the daemon imports this module
    # even when no Alertmanager is configured.
    import httpx

    return httpx.Client(
        verify=_ssl_context(target),
        timeout=target.timeout_seconds,
        headers={"User-Agent": USER_AGENT},
        # Only the explicit settings apply: no proxy or CA bundle taken from the environment.
        trust_env=False,
        follow_redirects=False,
    )


def _ssl_context(target: AlertmanagerConfig) -> ssl.SSLContext:
    tls = target.tls
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
        if tls.cert_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
    except OSError as exc:  # includes ssl.SSLError: unreadable or invalid PEM
        raise ValueError(f"alertmanager {target.url}: cannot load TLS files: {exc}") from exc
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _read(path: str) -> str:
    # Trailing newlines are common in secret files; Prometheus trims whitespace too.
    return Path(path).read_text(encoding="utf-8").strip()


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _describe(labels: object) -> str:
    """An alert for the log: its name first, then all its labels."""
    if isinstance(labels, Mapping):
        return f"{labels.get('alertname', '(no alertname)')} {dict(labels)}"
    return repr(labels)
