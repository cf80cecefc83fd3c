"""The experimental async intake (bench/asgi_intake.py, uvicorn) holds the shipped intake's
properties on PostgreSQL, the only database it serves: the CONTRACT's answers (each case
also against the shipped gunicorn server), slow heads and bodies answered 408 while others
are served, head limits, per-process metrics summed on /metrics, a clean stop on SIGTERM."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.helpers import event_body, ledger_counts, make_sender, signed_headers
from tests.integration.intake_answers import accepted_count, check_claim_answers, post
from tests.integration.test_http_parser import _exchange
from tests.integration.test_slow_headers import DEADLINE, served_while_slow_clients_get_408
from tests.servers import asgi_intake_server, gunicorn_server

WORKERS = 2


@pytest.fixture
def pg_env(pg_url, tmp_path):  # type: ignore[no-untyped-def]
    from tests.conftest import TEST_AUDIT_KEY, TEST_MASTER_KEY

    return {"DATABASE_URL": pg_url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
            "LEDGER_AUDIT_KEY": TEST_AUDIT_KEY, "LEDGER_VAR_DIR": str(tmp_path),
            "LEDGER_SECRET_KEY": "test-secret-key", "LEDGER_DEMO_HANDLERS": "1",
            "LEDGER_LOG_LEVEL": "WARNING",
            "LEDGER_BODY_READ_TIMEOUT_SECONDS": str(DEADLINE)}


@pytest.fixture
def pg_app(pg_env):  # type: ignore[no-untyped-def]
    from app import create_app

    application = create_app(pg_env)
    yield application
    application.extensions["ledger"].close()


@contextlib.contextmanager
def _server(kind: str, env: dict[str, str]) -> Iterator[tuple[str, Any]]:
    if kind == "async":
        with asgi_intake_server(env, workers=WORKERS) as served:
            yield served
    else:
        with gunicorn_server(env, workers=WORKERS) as served:
            yield served


@pytest.mark.parametrize("kind", ["shipped", "async"])
def test_the_contracts_answers(pg_app, pg_env, kind: str) -> None:  # type: ignore[no-untyped-def]
    """202, duplicates with the recorded outcome, 409, 401, 404, 413: the same on both."""
    sender = make_sender(pg_app)
    small = make_sender(pg_app, name="small", max_body_bytes=200)
    with _server(kind, pg_env) as (base, _process):
        check_claim_answers(pg_app, base, sender)
        forged = post(base, sender, "evt_2", event_body(sender, "evt_2"), secret="whsec_no")
        assert (forged.status_code, forged.json()) == (401, {"error": "unauthenticated"})
        unknown = requests.post(f"{base}/hooks/in_{'x' * 22}", data=b"{}", timeout=30)
        assert (unknown.status_code, unknown.json()) == (404, {"error": "unknown_integration"})
        large = event_body(small, "evt_3", data={"pad": "x" * 500})
        refused = post(base, small, "evt_3", large)
        assert (refused.status_code, refused.json()) == (413, {"error": "body_too_large"})
        invalid = post(base, sender, "evt 4", event_body(sender, "evt 4"))
        assert invalid.status_code == 400
        assert invalid.json()["error"] == "invalid_event"
    assert ledger_counts(pg_app) == {"receipts": 1, "jobs": 1, "conflicts": 1}


def test_slow_heads_and_bodies_are_answered_408_while_others_are_served(  # type: ignore[no-untyped-def]
        pg_app, pg_env) -> None:
    """test_slow_headers' 60 + 60 slow sockets, against the async intake."""
    sender = make_sender(pg_app)
    path = f"/hooks/{sender.public_id}"
    with asgi_intake_server(pg_env, workers=WORKERS) as (base_url, _process):
        served_while_slow_clients_get_408(base_url, sender, path)
    assert ledger_counts(pg_app)["receipts"] == 3


def test_a_head_over_the_limits_is_refused(pg_app, pg_env) -> None:  # type: ignore[no-untyped-def]
    """Too many header fields, or too many bytes of head: 431 and the connection closed."""
    sender = make_sender(pg_app)
    fields = "".join(f"X-Pad-{n}: 1\r\n" for n in range(100))
    huge = "X-Pad: " + "x" * (70 * 1024) + "\r\n"
    with asgi_intake_server(pg_env, workers=1) as (base_url, _process):
        for extra in (fields, huge):
            reply = _exchange(base_url, (f"POST /hooks/{sender.public_id} HTTP/1.1\r\nHost: x\r\n"
                                    f"{extra}Content-Length: 2\r\n\r\n{{}}").encode())
            assert reply.startswith(b"HTTP/1.1 431"), reply[:40]
    assert ledger_counts(pg_app)["receipts"] == 0


def test_metrics_sum_every_process_and_sigterm_stops_cleanly(  # type: ignore[no-untyped-def]
        pg_app, pg_env) -> None:
    """/metrics counts the deliveries of every worker; SIGTERM ends the server with 0."""
    sender = make_sender(pg_app)
    with asgi_intake_server(pg_env, workers=WORKERS) as (base_url, process):
        for n in range(20):  # new connections: the kernel spreads them over the workers
            body = event_body(sender, f"evt_m{n}")
            with requests.Session() as session:
                answer = session.post(f"{base_url}/hooks/{sender.public_id}", data=body,
                                      headers=signed_headers(sender, body, f"evt_m{n}"),
                                      timeout=30)
            assert answer.status_code == 202
        assert accepted_count(base_url) == 20
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    assert ledger_counts(pg_app)["receipts"] == 20
