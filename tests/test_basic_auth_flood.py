"""Basic auth under a flood of wrong passwords, against a live daemon on 127.0.0.1: a good
scrape right after the start is not queued behind the failing clients' bcrypt checks."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import httpx

from tests.daemon import serve
from tests.support import wait_for
from tests.tlsfiles import PASSWORD, USER

ATTACKERS = 20
COST = 10  # bcrypt's default in htpasswd -B: each check takes tens of milliseconds
ATTACK_REQUESTS = 3000  # per attacker, at most: the flood ends by itself


@dataclass
class Attack:
    """Each attacker's answers as (when, status, Retry-After)."""

    stop: threading.Event = field(default_factory=threading.Event)
    answers: list[tuple[float, int, str | None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hammer(self, url: str, number: int) -> None:
        """Wrong passwords, a new one each time, on one kept-alive connection."""
        with httpx.Client(base_url=url, timeout=30) as client:
            for attempt in range(ATTACK_REQUESTS):
                if self.stop.is_set():
                    return
                try:
                    response = client.get("/metrics", auth=(USER, f"wrong-{number}-{attempt}"))
                except httpx.HTTPError as exc:
                    with self.lock:
                        self.errors.append(repr(exc))
                    continue
                retry = response.headers.get("retry-after")
                with self.lock:
                    self.answers.append((time.monotonic(), response.status_code, retry))

    def checked_between(self, start: float, end: float) -> int:
        """Wrong passwords answered 401 (each after a bcrypt check) within [start, end]."""
        with self.lock:
            return sum(start <= when <= end and status == 401 for when, status, _ in self.answers)


def test_a_good_scrape_is_not_queued_behind_twenty_clients_with_wrong_passwords(
    tmp_path: Path,
) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(COST)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  {USER}: {hashed}\n")
    with serve(tmp_path, "--simulate", "--web-config-file", str(web)) as daemon:
        daemon.wait_ready()
        # One check's cost, here and now: a wrong password on the idle daemon.
        costs = []
        for attempt in range(3):
            with httpx.Client(base_url=daemon.url, timeout=30) as client:
                started = time.monotonic()
                response = client.get("/metrics", auth=(USER, f"probe-{attempt}"))
                costs.append(time.monotonic() - started)
            assert response.status_code == 401
        one_check = min(costs)
        scraper = httpx.Client(base_url=daemon.url, timeout=30)  # Prometheus, first scrape

        attack = Attack()
        attackers = [
            threading.Thread(target=attack.hammer, args=(daemon.url, n)) for n in range(ATTACKERS)
        ]
        for thread in attackers:
            thread.start()
        try:
            # Every attacker has been refused at least once: the daemon knows them now.
            wait_for(
                lambda: attack.checked_between(0, time.monotonic()) >= 2 * ATTACKERS,
                timeout=60,
                what="the attackers' first refusals",
                interval=0.05,
            )
            with scraper:
                started = time.monotonic()
                good = scraper.get("/metrics", auth=(USER, PASSWORD))
                took = time.monotonic() - started
            checked_meanwhile = attack.checked_between(started, started + took)
        finally:
            attack.stop.set()
            for thread in attackers:
                thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in attackers)

        assert good.status_code == 200 and "gpu_up{" in good.text
        statuses = {status for _, status, _ in attack.answers}
        assert statuses <= {401, 429}, statuses  # never let in
        busy = [retry for _, status, retry in attack.answers if status == 429]
        assert busy and all(retry == "1" for retry in busy)  # the slow lane was full at times
        assert not attack.errors, attack.errors[:3]
        # Not queued behind the attackers: while the good scrape waited, the daemon finished
        # a few of their checks (the failing clients' lane, one at a time), not all twenty.
        # Counted, not timed: how long it waited depends on what else the machine runs.
        assert checked_meanwhile <= 4, (checked_meanwhile, took, one_check)
