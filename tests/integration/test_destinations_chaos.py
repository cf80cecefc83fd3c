"""A destination down under load, then back, with a worker killed mid-request (kill -9).

Real `ledger worker` processes on both databases forward an integration's events to a
receiving service on loopback that deduplicates by `Idempotency-Key` (as the how-to asks
of a platform's services). The service is down (503) while events arrive; when it comes
back, the first request it takes is held while its worker is killed with SIGKILL, and the
service then applies that request's effect anyway (the answer is lost with the worker).
At the end: no event lost (every receipt complete), every event's key was delivered until
acknowledged, and the service applied exactly one effect per event.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import standardwebhooks
from sqlalchemy import func, select

from app import create_app
from ledger.access import audit
from ledger.access.integrations import get_integration
from ledger.db.schema import receipts
from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.store import DestinationSettings, create_destination
from tests.helpers import WAIT, deliver, make_sender
from tests.servers import thread_server

pytestmark = [pytest.mark.slow]

BIN = Path(sys.executable).parent
EVENTS = 30
MAX_IN_FLIGHT = 3
ADMIN = audit.Actor(name="test", role="admin")


class DedupService:
    """A receiving service: verifies, applies one effect per Idempotency-Key, answers 200.

    While `down` it answers 503. With `hold_next` set, the next request waits for
    `release` before it is applied and answered.
    """

    def __init__(self, secret: str) -> None:
        self.verifier = standardwebhooks.Webhook(secret)
        self.lock = threading.Lock()
        self.down = True
        self.requests: Counter[str] = Counter()  # every request per key
        self.since_up: Counter[str] = Counter()  # requests per key once it was back
        self.effects: Counter[str] = Counter()  # effects applied per key
        self.acknowledged: set[str] = set()
        self.hold_next = False
        self.held_key: str | None = None  # the request whose worker was killed
        self.active = 0  # requests being answered now
        self.peak = 0  # the most at once: bounded by --max-in-flight across workers
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items()
                   if k.startswith("HTTP_")}
        self.verifier.verify(body, headers)  # raises (a 500) on a bad signature
        key = headers["idempotency-key"]
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            return self._answer(key, start_response)
        finally:
            with self.lock:
                self.active -= 1

    def _answer(self, key: str, start_response: Callable[..., Any]) -> Iterable[bytes]:
        """Answer 503 while down; else apply the key's effect once and answer 200."""
        with self.lock:
            self.requests[key] += 1
            hold, self.hold_next = self.hold_next, False
            if self.down:
                start_response("503 Down", [("Connection", "close")])
                return [b"down"]
            self.since_up[key] += 1
        if hold:
            self.held_key = key
            self.holding.set()
            self.release.wait(WAIT)
        with self.lock:
            if key not in self.effects:  # the deduplication a platform's service does
                self.effects[key] += 1
            self.acknowledged.add(key)
        start_response("200 OK", [("Connection", "close")])
        return [b"ok"]


def _wait(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as stderr:
        return subprocess.Popen([str(BIN / "ledger"), "worker", "--concurrency", "2"],
                                cwd=str(log.parent), env={**os.environ, **env},
                                stdout=subprocess.DEVNULL, stderr=stderr)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def _complete(app: Any) -> int:
    with app.extensions["ledger"].engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(receipts)
                                .where(receipts.c.state == 1)).scalar_one())


def test_destination_down_then_back_with_a_worker_killed_mid_request(test_env, tmp_path):
    env = {**test_env, "LEDGER_DEMO_HANDLERS": "0", "LEDGER_LOG_LEVEL": "WARNING",
           "LEDGER_DESTINATION_ALLOW": "127.0.0.1", "LEDGER_LEASE_SECONDS": "3",
           "LEDGER_RETRY_BASE_SECONDS": "0.5", "LEDGER_RETRY_CAP_SECONDS": "2",
           "LEDGER_MAX_ATTEMPTS": "100", "LEDGER_DB_POOL_SIZE": "4"}
    app = create_app(env)
    workers: list[subprocess.Popen[bytes]] = []
    service: DedupService | None = None
    try:
        sender = make_sender(app, account="acme", name="shop")
        svc = app.extensions["ledger"]

        def app_of_service(environ: dict[str, Any], start_response: Callable[..., Any]
                           ) -> Iterable[bytes]:
            assert service is not None
            return service(environ, start_response)

        with thread_server(app_of_service) as url:
            with svc.engine.begin() as conn:
                created = create_destination(
                    conn, svc.box, ADMIN, get_integration(conn, sender.public_id),
                    DestinationSettings(url=url + "/in", timeout_seconds=10,
                                        max_in_flight=MAX_IN_FLIGHT, rate_per_second=50),
                    policy=AddressPolicy.from_entries(["127.0.0.1"]), handled_types=(),
                    now=svc.clock.now())
            service = DedupService(created.signing_secret)
            workers.append(_worker(env, tmp_path / "worker-a.log"))
            client = app.test_client()
            for n in range(EVENTS):  # under load while the destination is down
                response = deliver(client, sender, f"evt_{n:03d}", "order.paid", {"n": n})
                assert response.status_code == 202
            _wait(lambda: sum(service.requests.values()) >= 2, "requests while down")
            with service.lock:
                service.hold_next, service.down = True, False  # back
            assert service.holding.wait(WAIT), "no request came after the destination was back"
            os.kill(workers[0].pid, signal.SIGKILL)  # mid-request
            workers[0].wait(timeout=10)
            service.release.set()  # the effect is applied; its answer is lost
            workers.append(_worker(env, tmp_path / "worker-b.log"))
            workers.append(_worker(env, tmp_path / "worker-c.log"))
            _wait(lambda: _complete(app) == EVENTS, "every receipt to complete")
        keys = {f"{sender.scope}:evt_{n:03d}" for n in range(EVENTS)}
        assert set(service.acknowledged) == keys  # each key delivered until acknowledged
        assert service.effects == Counter(dict.fromkeys(keys, 1))  # exactly one effect each
        # The killed worker's request was sent again once its lease ended: deduplicated.
        assert service.held_key is not None
        assert service.since_up[service.held_key] >= 2
        assert service.peak <= MAX_IN_FLIGHT  # across three worker processes
    finally:
        if service is not None:
            service.release.set()
        for process in workers:
            _stop(process)
        app.extensions["ledger"].close()


class Arrivals:
    """A receiving service that notes when each request arrives and answers 200."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: list[float] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        with self.lock:
            self.times.append(time.monotonic())
        start_response("200 OK", [("Connection", "close")])
        return [b"ok"]


def test_the_rate_holds_across_worker_processes(test_env, tmp_path):
    rate, events = 5.0, 12
    env = {**test_env, "LEDGER_DEMO_HANDLERS": "0", "LEDGER_LOG_LEVEL": "WARNING",
           "LEDGER_DESTINATION_ALLOW": "127.0.0.1", "LEDGER_DB_POOL_SIZE": "4"}
    app = create_app(env)
    workers: list[subprocess.Popen[bytes]] = []
    arrivals = Arrivals()
    try:
        sender = make_sender(app, account="acme", name="shop")
        svc = app.extensions["ledger"]
        with thread_server(arrivals) as url:
            with svc.engine.begin() as conn:
                create_destination(
                    conn, svc.box, ADMIN, get_integration(conn, sender.public_id),
                    DestinationSettings(url=url + "/in", rate_per_second=rate),
                    policy=AddressPolicy.from_entries(["127.0.0.1"]), handled_types=(),
                    now=svc.clock.now())
            client = app.test_client()
            for n in range(events):  # a backlog, then two processes of two loops each
                assert deliver(client, sender, f"evt_{n}", "order.paid").status_code == 202
            workers = [_worker(env, tmp_path / f"worker-{n}.log") for n in range(2)]
            _wait(lambda: _complete(app) == events, "every receipt to complete")
        times = sorted(arrivals.times)
        assert len(times) == events
        # Paced one interval apart across all four loops: a lower bound, never flaky
        # under load (slowness only spreads the requests further).
        assert times[-1] - times[0] >= (events - 1) / rate - 0.5
    finally:
        for process in workers:
            _stop(process)
        app.extensions["ledger"].close()
