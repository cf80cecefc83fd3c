"""`ledger destination create|list|pause|resume|rotate` (CONTRACT sections 4 and 8)."""

from __future__ import annotations

import getpass
import json
from datetime import datetime, timedelta

from cryptography.fernet import Fernet
from sqlalchemy import func, select

from ledger.access.secrets_box import SecretBox
from ledger.db.schema import audit_log, destination_secrets, destinations
from ledger.destinations.secrets import live_secrets
from tests.helpers import make_sender

URL = "https://orders.example.com/hooks/ledger"


def _json(result, code: int = 0) -> dict:  # type: ignore[no-untyped-def,type-arg]
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def _audit(app) -> list:  # type: ignore[no-untyped-def,type-arg]
    with app.extensions["ledger"].engine.connect() as conn:
        return conn.execute(select(audit_log).order_by(audit_log.c.id)).all()


def _count(app, table) -> int:  # type: ignore[no-untyped-def]
    with app.extensions["ledger"].engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _create(runner, integration: str, *extra: str):  # type: ignore[no-untyped-def]
    return runner.invoke(args=["ledger", "destination", "create", "--integration", integration,
                               *extra, "--json"])


def test_create_prints_the_secret_once_and_list_never_shows_it(app, runner):
    sender = make_sender(app)
    out = _json(_create(runner, sender.public_id, "--url", URL, "--event-type", "order.paid",
                        "--event-type", "order.refunded", "--timeout", "2.5",
                        "--max-in-flight", "4", "--rate", "20"))
    assert set(out) == {"destination", "integration", "url", "event_types", "signing_secret"}
    assert out["destination"].startswith("dst_") and len(out["destination"]) == 26
    assert (out["integration"], out["url"]) == (sender.public_id, URL)
    assert out["event_types"] == ["order.paid", "order.refunded"]
    assert out["signing_secret"].startswith("whsec_")
    listed = runner.invoke(args=["ledger", "destination", "list", "--json"])
    (item,) = _json(listed)["destinations"]
    assert item == {"destination": out["destination"], "integration": sender.public_id,
                    "url": URL, "event_types": ["order.paid", "order.refunded"],
                    "state": "active", "created_at": item["created_at"]}
    assert out["signing_secret"] not in listed.output
    (row,) = [r for r in _audit(app) if r.action == "destination.create"]
    assert (row.target, row.actor) == (out["destination"], f"cli:{getpass.getuser()}")
    assert out["signing_secret"][6:] not in (row.detail or "")
    with app.extensions["ledger"].engine.connect() as conn:
        stored = conn.execute(select(destination_secrets.c.secret_enc)).scalar_one()
        dst = conn.execute(select(destinations)).one()
    assert out["signing_secret"] not in stored  # encrypted at rest
    assert (dst.timeout_seconds, dst.max_in_flight, dst.rate_per_second) == (2.5, 4, 20.0)


def test_a_type_with_a_python_handler_is_refused(app, runner):
    sender = make_sender(app)  # the test app runs the demo handlers (demo.credit, …)
    for args in (["--event-type", "demo.credit"], []):
        refused = _create(runner, sender.public_id, "--url", URL, *args)
        assert refused.exit_code == 1
        body = json.loads(refused.stdout)
        assert body["error"] == "refused" and "demo.credit" in body["detail"]
    assert _count(app, destinations) == 0 and _count(app, destination_secrets) == 0
    assert "destination.create" not in [r.action for r in _audit(app)]


def test_two_destinations_may_not_take_one_type_of_an_integration(app, runner):
    sender = make_sender(app)
    other = make_sender(app, name="other")
    _json(_create(runner, sender.public_id, "--url", URL, "--event-type", "a.b"))
    overlap = _create(runner, sender.public_id, "--url", URL, "--event-type", "a.b",
                      "--event-type", "c.d")
    assert overlap.exit_code == 1
    _json(_create(runner, sender.public_id, "--url", URL, "--event-type", "c.d"))
    _json(_create(runner, other.public_id, "--url", URL, "--event-type", "a.b"))
    assert _count(app, destinations) == 3


def test_every_type_is_the_default_when_no_handler_runs(test_env):
    from app import create_app

    application = create_app({**test_env, "LEDGER_DEMO_HANDLERS": "0"})
    try:
        sender = make_sender(application)
        runner = application.test_cli_runner()
        out = _json(_create(runner, sender.public_id, "--url", URL))
        assert out["event_types"] == []
        again = _create(runner, sender.public_id, "--url", URL, "--event-type", "x.y")
        assert again.exit_code == 1  # the first takes every type already
    finally:
        application.extensions["ledger"].close()


def test_bad_input_is_refused_and_writes_nothing(app, runner):
    sender = make_sender(app)
    refused_urls = ["ftp://example.com/x", "https://user:pw@example.com/x", "not a url",
                    "http://127.0.0.1:8080/x", "http://169.254.169.254/latest/meta-data",
                    "http://[::ffff:10.0.0.1]/x", "http://localhost/x", "http://0x7f.1/x",
                    "http://2130706433/x", "https:///nohost",
                    "https://example.com/x#frag"]
    for url in refused_urls:
        result = _create(runner, sender.public_id, "--url", url, "--event-type", "a.b")
        assert result.exit_code == 1, url
        assert json.loads(result.stdout)["error"] == "refused"
    usage = [["--url", URL, "--timeout", "0"], ["--url", URL, "--max-in-flight", "0"],
             ["--url", URL, "--rate", "-1"], ["--url", URL, "--timeout", "abc"]]
    for args in usage:
        assert _create(runner, sender.public_id, *args, "--event-type", "a.b").exit_code == 2
    bad_type = _create(runner, sender.public_id, "--url", URL, "--event-type", "no spaces")
    assert bad_type.exit_code == 1
    missing = _create(runner, "in_" + "0" * 22, "--url", URL, "--event-type", "a.b")
    assert missing.exit_code == 1 and json.loads(missing.stdout)["error"] == "not_found"
    assert _count(app, destinations) == 0 and _count(app, destination_secrets) == 0


def test_loopback_is_accepted_when_the_allow_list_names_it(test_env):
    from app import create_app

    application = create_app({**test_env, "LEDGER_DESTINATION_ALLOW": "127.0.0.1,svc.internal"})
    try:
        sender = make_sender(application)
        runner = application.test_cli_runner()
        for url, event_type in (("http://127.0.0.1:9/x", "a.a"),
                                ("http://svc.internal/x", "b.b")):
            _json(_create(runner, sender.public_id, "--url", url, "--event-type", event_type))
        assert _create(runner, sender.public_id, "--url", "http://10.1.2.3/x",
                       "--event-type", "z.z").exit_code == 1
    finally:
        application.extensions["ledger"].close()


def test_pause_and_resume_need_a_reason_and_are_audited(app, runner):
    sender = make_sender(app)
    dst = _json(_create(runner, sender.public_id, "--url", URL, "--event-type", "a.b"))
    base = ["ledger", "destination"]
    dst_args = ["--destination", dst["destination"]]
    assert runner.invoke(args=[*base, "pause", *dst_args, "--json"]).exit_code == 2
    assert runner.invoke(args=[*base, "pause", *dst_args, "--reason", " ", "--json"]
                         ).exit_code == 1
    paused = _json(runner.invoke(args=[*base, "pause", *dst_args, "--reason", "maintenance",
                                       "--json"]))
    assert paused == {"destination": dst["destination"], "state": "paused"}
    again = runner.invoke(args=[*base, "pause", *dst_args, "--reason", "again", "--json"])
    assert again.exit_code == 1
    listed = _json(runner.invoke(args=[*base, "list", "--integration", sender.public_id,
                                       "--json"]))["destinations"]
    assert [d["state"] for d in listed] == ["paused"]
    resumed = _json(runner.invoke(args=[*base, "resume", *dst_args, "--reason", "back",
                                        "--json"]))
    assert resumed["state"] == "active"
    rows = [(r.action, r.reason) for r in _audit(app) if r.target == dst["destination"]]
    assert rows == [("destination.create", None), ("destination.pause", "maintenance"),
                    ("destination.resume", "back")]
    unknown = runner.invoke(args=[*base, "pause", "--destination", "dst_nope", "--reason", "x",
                                  "--json"])
    assert unknown.exit_code == 1 and json.loads(unknown.stdout)["error"] == "not_found"


def test_rotate_keeps_the_old_secret_signing_through_the_overlap(app, runner):
    sender = make_sender(app)
    dst = _json(_create(runner, sender.public_id, "--url", URL, "--event-type", "a.b"))
    out = _json(runner.invoke(args=["ledger", "destination", "rotate", "--destination",
                                    dst["destination"], "--overlap", "600", "--json"]))
    assert out["signing_secret"].startswith("whsec_")
    assert out["signing_secret"] != dst["signing_secret"]
    (retiring,) = out["retiring"]
    svc = app.extensions["ledger"]
    (row,) = [r for r in _audit(app) if r.action == "destination.rotate"]
    assert datetime.fromisoformat(retiring["expires_at"]) - row.at == timedelta(seconds=600)
    with svc.engine.connect() as conn:
        dst_id = conn.execute(select(destinations.c.id)).scalar_one()
        during = live_secrets(conn, svc.box, dst_id, now=row.at + timedelta(seconds=599))
        after = live_secrets(conn, svc.box, dst_id, now=row.at + timedelta(seconds=600))
    assert during == [out["signing_secret"], dst["signing_secret"]]
    assert after == [out["signing_secret"]]
    assert dst["signing_secret"] not in (row.detail or "")
    assert out["signing_secret"] not in (row.detail or "")


def test_secrets_rekey_reencrypts_destination_secrets(app, runner, test_env):
    from app import create_app

    sender = make_sender(app)
    dst = _json(_create(runner, sender.public_id, "--url", URL, "--event-type", "a.b"))
    new_key = Fernet.generate_key().decode()
    rekeyed = create_app({**test_env,
                          "LEDGER_MASTER_KEY": f"{new_key},{test_env['LEDGER_MASTER_KEY']}"})
    try:
        out = _json(rekeyed.test_cli_runner().invoke(args=["ledger", "secrets", "rekey",
                                                           "--json"]))
        assert out["reencrypted"] == 2  # the integration's credential and the destination's
    finally:
        rekeyed.extensions["ledger"].close()
    with app.extensions["ledger"].engine.connect() as conn:
        stored = conn.execute(select(destination_secrets.c.secret_enc)).scalar_one()
    assert SecretBox([new_key]).decrypt(stored) == dst["signing_secret"]
