"""bcrypt checks of basic-auth passwords that a flood of wrong ones cannot starve.

prometheus/exporter-toolkit (web/handler.go) runs bcrypt.CompareHashAndPassword under one
mutex, so checks run one at a time in arrival order, and caches every result, right or wrong,
keyed by user, hash and password. One at a time in arrival order means a good scrape waits
for every wrong password that arrived before it. Here:

- only successes are remembered: an HMAC (with a key made at start) of user, hash and
  password, in a bounded LRU emptied whenever the web config's users are reloaded; a wrong
  password never enters it, so wrong ones cannot grow or churn it;
- clients in good standing are checked `GOOD_STANDING_WORKERS` at a time, on threads of their
  own (bcrypt releases the GIL; the event loop never runs it);
- a client that failed within `FAILURE_MEMORY_SECONDS` (its connection, or the same user and
  password from any connection) is checked in the slow lane: one check at a time, at most
  `SLOW_LANE_WAITING` waiting; past that it gets `Verdict.BUSY` at once, without bcrypt.

The remote address alone does not mark a client as failing: behind a proxy or a service mesh
every client has the same one, and one attacker would put them all in the slow lane.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import enum
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

log = logging.getLogger("gpu_exporter.http")

T = TypeVar("T")


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    DENIED = "denied"  # no, malformed or wrong credentials: 401
    BUSY = "busy"  # a failing client whose lane is full: 429, checked later if it retries


class Lane:
    """Checks run `workers` at a time on threads of their own; with `waiting`, at most that
    many more wait for a thread (None: as many as there are connections)."""

    def __init__(self, name: str, workers: int, waiting: int | None) -> None:
        self.name, self.workers, self.waiting = name, workers, waiting
        self.pending = 0  # running and waiting; touched on the event loop only
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def full(self) -> bool:
        return self.waiting is not None and self.pending >= self.workers + self.waiting

    async def run(self, check: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self.workers, thread_name_prefix=f"bcrypt-{self.name}"
            )
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, check, *args)
        finally:
            self.pending -= 1

    def close(self) -> None:
        """Drop the checks still waiting (their clients are gone with the server)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class FailureMemory:
    """Keys that failed a check within `seconds`, the `size` most recent at most."""

    def __init__(
        self, seconds: float, size: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.seconds, self.size, self._clock = seconds, size, clock
        self._last: OrderedDict[Hashable, float] = OrderedDict()

    def failed(self, *keys: Hashable) -> None:
        now = self._clock()
        for key in keys:
            self._last[key] = now
            self._last.move_to_end(key)
        while len(self._last) > self.size:
            self._last.popitem(last=False)

    def recent(self, *keys: Hashable) -> bool:
        now = self._clock()
        return any(now - self._last.get(key, -self.seconds) < self.seconds for key in keys)

    def forgive(self, key: Hashable) -> None:
        self._last.pop(key, None)

    def __len__(self) -> int:
        return len(self._last)


class PasswordCheck:
    """Basic-auth credentials against the web config's bcrypt hashes (see the module's doc)."""

    CACHE_SIZE = 64  # users x password versions in use at once; a handful in practice
    GOOD_STANDING_WORKERS = 2
    SLOW_LANE_WAITING = 8
    FAILURE_MEMORY_SECONDS = 600.0  # longer than any scrape interval: a misconfigured
    FAILURE_MEMORY_SIZE = 4096  # scraper stays in the slow lane between its scrapes

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)  # the cache's digests are of no use elsewhere
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._users: Mapping[str, bytes] | None = None  # the users the cache is for
        self.failures = FailureMemory(self.FAILURE_MEMORY_SECONDS, self.FAILURE_MEMORY_SIZE)
        self.good_standing = Lane("good", self.GOOD_STANDING_WORKERS, None)
        self.slow_lane = Lane("failing", 1, self.SLOW_LANE_WAITING)
        self._dummy_lock = threading.Lock()
        self._dummies: dict[bytes, bytes] = {}  # hash prefix ($2y$10$) -> a hash of that cost

    async def check(
        self,
        users: Mapping[str, bytes],
        authorization: bytes | None,
        client: tuple[str, int] | None = None,
    ) -> Verdict:
        """The verdict on an `Authorization` header from `client` (its address and port: the
        connection) against `users` (name -> bcrypt hash; a new mapping empties the cache)."""
        credentials = basic_credentials(authorization)
        if credentials is None:
            return Verdict.DENIED
        if users is not self._users:
            self._verified.clear()
            self._users = users
        user, password = credentials
        hashed = users.get(user)
        digest = self._digest(user.encode(), hashed or b"", password)
        connection = ("connection", client) if client is not None else None
        if hashed is not None and digest in self._verified:
            self._verified.move_to_end(digest)
            self._succeeded(connection)
            return Verdict.ALLOWED
        keys = (digest, connection) if connection is not None else (digest,)
        lane = self.slow_lane if self.failures.recent(*keys) else self.good_standing
        if lane.full():
            log.warning(
                "basic auth: %d checks of failing clients pending; answered 429", lane.pending
            )
            return Verdict.BUSY
        if hashed is None:  # the dummy costs what a real user's check costs
            await lane.run(self._check_unknown, password, next(iter(users.values())))
            matched = False
        else:
            matched = await lane.run(self._check, password, hashed)
        if not matched:
            self.failures.failed(*keys)
            return Verdict.DENIED
        if users is self._users:  # not reloaded meanwhile
            self._verified[digest] = None
            while len(self._verified) > self.CACHE_SIZE:
                self._verified.popitem(last=False)
        self._succeeded(connection)
        return Verdict.ALLOWED

    def _succeeded(self, connection: tuple[str, tuple[str, int]] | None) -> None:
        """A connection that got it right is in good standing again (a mistyped password)."""
        if connection is not None:
            self.failures.forgive(connection)

    def close(self) -> None:
        self.good_standing.close()
        self.slow_lane.close()

    def _digest(self, *parts: bytes) -> bytes:
        message = b"".join(len(part).to_bytes(4, "big") + part for part in parts)
        return hmac.digest(self._key, message, hashlib.sha256)

    def _check(self, password: bytes, hashed: bytes) -> bool:
        import bcrypt  # only with basic auth configured

        try:
            return bcrypt.checkpw(password, hashed)
        except ValueError:  # a password over bcrypt's 72 bytes: refused, as Go's bcrypt
            return False

    def _check_unknown(self, password: bytes, like: bytes) -> None:
        """An unknown user's check, against a dummy hash of `like`'s cost (made here, on a
        worker thread: hashing at cost 14 takes a second, which the event loop must not)."""
        import bcrypt

        prefix = like[:7]  # "$2y$10$"
        with self._dummy_lock:
            if prefix not in self._dummies:
                rounds = int(prefix[4:6])
                self._dummies[prefix] = bcrypt.hashpw(b"no such user", bcrypt.gensalt(rounds))
        self._check(password, self._dummies[prefix])


def basic_credentials(authorization: bytes | None) -> tuple[str, bytes] | None:
    """(user, password) from `Authorization: Basic ...`, None when absent or malformed."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
        user, colon, password = decoded.partition(b":")
        name = user.decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (name, password) if colon else None
