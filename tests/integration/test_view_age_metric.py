"""`ledger_credential_view_age_seconds` comes only from web processes, the only ones that
refresh a credential view, and a stopped web worker leaves no instance behind."""

from __future__ import annotations

from datetime import timedelta

import requests
from sqlalchemy import create_engine, insert, select

from ledger.db.schema import instances
from tests.servers import gunicorn_server, thread_server


def test_only_web_instances_report_a_view_age(app) -> None:  # type: ignore[no-untyped-def]
    svc = app.extensions["ledger"]
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        for instance_id, kind in (("h:1:worker", "worker"), ("h:2:scheduler", "scheduler"),
                                  ("h:3:web", "web")):
            conn.execute(insert(instances).values(
                id=instance_id, kind=kind, hostname="h", pid=1,
                started_at=now - timedelta(hours=1), heartbeat_at=now,
                credentials_refreshed_at=None))
    with thread_server(app) as base:
        text = requests.get(f"{base}/metrics", timeout=30).text
    reported = {line.split('"')[1] for line in text.splitlines()
                if line.startswith("ledger_credential_view_age_seconds{")}
    assert "h:1:worker" not in reported and "h:2:scheduler" not in reported
    assert "h:3:web" in reported


def test_a_stopped_web_worker_deregisters(test_env) -> None:  # type: ignore[no-untyped-def]
    with gunicorn_server(test_env, workers=2) as (base, _process):
        for _ in range(8):  # reach both workers so both register
            assert requests.get(f"{base}/healthz", timeout=30).status_code == 200
    engine = create_engine(test_env["DATABASE_URL"])
    try:
        with engine.connect() as conn:
            left = conn.execute(select(instances.c.id).where(instances.c.kind == "web")).all()
    finally:
        engine.dispose()
    assert left == []
