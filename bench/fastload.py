"""Load millions of receipts on PostgreSQL inside the server: INSERT ... generate_series.

bench/datagen.py builds every row in Python (about 40 s per million receipts
here, before COPY); at 10M that is most of an hour. This loader writes the
same shape of ledger with set-returning SQL, a million receipts per statement:
receipts in accepted_at order over the last 7 days, random base62-like ids
(`evt_` + 24, so the primary key fills as in production), the newest 2 %
pending, ~1 % failed after 8 attempts, a few stuck pending, the rest complete
with 1 attempt; a job for every unfinished receipt; one attempts row per
attempt. Not written (datagen has them): conflicts, demo balances, 2-3-attempt
retries. The scopes: the first through datagen.create_scopes (a real integration with
its credential and audit rows), the rest copied from it in two statements
(`copy_scopes`; no audit rows of their own: 10,000 one by one took 1-6 minutes here).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, select, text

from bench.datagen import FAIL_ERROR, Generated, create_scopes
from ledger.access.secrets_box import SecretBox
from ledger.db.schema import integrations
from ledger.domain import Integration, ReceiptState
from ledger.worker.failure_groups import error_signature, group_id, rebuild_counters

BATCH = 1_000_000
SPAN = timedelta(days=7)

RECEIPTS = """
INSERT INTO receipts (accepted_at, completed_at, scope_id, state, attempts, event_id,
                      event_type, body_sha256, result_ref)
SELECT accepted, CASE WHEN state = 0 THEN NULL ELSE accepted + interval '500 ms' END,
       scope_id, state, CASE state WHEN 2 THEN 8 WHEN 0 THEN 0 ELSE 1 END, eid, etype,
       sha256(convert_to(eid, 'UTF8')),
       CASE WHEN state = 1 THEN CASE WHEN etype = 'demo.credit' THEN 'credit:' || g
                                     ELSE 'ignored:no-handler' END END
FROM (
  SELECT g, CAST(:start AS timestamptz) + (:span * g / :n) * interval '1 second' AS accepted,
         (CAST(:ids AS int[]))[1 + floor(random() * :scopes)::int] AS scope_id,
         CASE WHEN g >= :n - :pending THEN 0
              WHEN u < 0.01 THEN 2 WHEN u < 0.0105 THEN 0 ELSE 1 END AS state,
         'evt_' || translate(substr(encode(sha256(convert_to(CAST(:seed AS text) || g,
                                                              'UTF8')), 'base64'),
                                    1, 24), '+/', 'xy') AS eid,
         CASE WHEN t < 0.40 THEN 'demo.credit' WHEN t < 0.60 THEN 'invoice.paid'
              WHEN t < 0.75 THEN 'charge.succeeded' WHEN t < 0.90 THEN 'payment_intent.succeeded'
              ELSE 'customer.subscription.updated' END AS etype
  FROM (SELECT g, random() AS u, random() AS t
        FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) g) r
) s
"""

JOBS = """
INSERT INTO jobs (scope_id, event_id, event_type, accepted_at, run_at, status, attempts,
                  lease_token, payload)
SELECT scope_id, event_id, event_type, accepted_at, accepted_at,
       CASE WHEN state = 2 THEN 1 ELSE 0 END, attempts, attempts,
       json_build_object('type', event_type, 'data', json_build_object('amount', 1,
                         'id', event_id))::text
FROM receipts WHERE state <> 1
"""

ATTEMPTS = """
INSERT INTO attempts (scope_id, event_id, number, worker_id, lease_token, started_at,
                      finished_at, outcome, error)
SELECT r.scope_id, r.event_id, n, 'bench-host:4242:fastload', n,
       r.accepted_at + (n - 1) * interval '10 s',
       r.accepted_at + (n - 1) * interval '10 s' + interval '15 ms',
       CASE WHEN n < r.attempts THEN 'retry' WHEN r.state = 1 THEN 'complete' ELSE 'failed' END,
       CASE WHEN r.state = 1 AND n = r.attempts THEN NULL
            ELSE 'DemoFailure: demo.fail always fails' END
FROM receipts r CROSS JOIN LATERAL generate_series(1, r.attempts) n
WHERE r.accepted_at >= :lo AND r.accepted_at < :hi
"""


def load(engine: Engine, box: SecretBox, receipts: int, scopes: int,
         end: datetime | None = None) -> Generated:
    """Create `scopes` integrations, then `receipts` receipts with jobs and attempts."""
    end = end or datetime.now(UTC)
    made = create_scopes(engine, box, scopes, now=end - SPAN)
    return load_receipts(engine, made, receipts, end)


def copy_scopes(engine: Engine, box: SecretBox, count: int, *, now: datetime
                ) -> list[Integration]:
    """Create one scope for real, then `count - 1` copies of it (`acct-000001`, ...).

    Each copy is an integration row like the first (profile, settings) with a fresh
    public id and a credential holding the same encrypted secret under a fresh key id.
    """
    first = create_scopes(engine, box, 1, now=now)[0]
    columns = [c.name for c in integrations.c if c.name not in ("id", "public_id", "account")]
    copied = ", ".join(f"f.{c}" for c in columns)
    with engine.begin() as conn:
        conn.execute(text(
            f"INSERT INTO integrations (public_id, account, {', '.join(columns)}) "
            f"SELECT 'in_' || substr(md5(random()::text || g), 1, 22),"
            f" 'acct-' || lpad(g::text, 6, '0'), {copied} "
            "FROM integrations f, generate_series(1, CAST(:n AS int) - 1) g WHERE f.id = :first"),
            {"n": count, "first": first.id})
        conn.execute(text(
            "INSERT INTO credentials (key_id, integration_id, secret_enc, fingerprint, state,"
            " created_at) SELECT 'key_' || substr(md5(random()::text || i.id), 1, 22), i.id,"
            " c.secret_enc, c.fingerprint, c.state, c.created_at"
            " FROM integrations i JOIN credentials c ON c.integration_id = :first"
            " WHERE i.id <> :first"), {"first": first.id})
        rows = conn.execute(select(integrations).order_by(integrations.c.id)).all()
    return [Integration.from_row(r) for r in rows]


def load_receipts(engine: Engine, made: list[Integration], receipts: int,
                  end: datetime) -> Generated:
    """Write `receipts` receipts over the existing scopes `made`, with jobs and attempts."""
    start = end - SPAN
    scopes = len(made)
    ids = "{" + ",".join(str(s.id) for s in made) + "}"
    for lo in range(0, receipts, BATCH):
        with engine.begin() as conn:
            conn.execute(text("SELECT setseed(:s)"), {"s": (lo // BATCH % 100) / 100})
            conn.execute(text(RECEIPTS), {
                "start": start, "span": SPAN.total_seconds(), "n": receipts, "ids": ids,
                "scopes": scopes, "pending": int(receipts * 0.02), "seed": "ledger-bench-",
                "lo": lo, "hi": min(lo + BATCH, receipts) - 1})
    with engine.begin() as conn:
        conn.execute(text(JOBS))
    step = SPAN / max(receipts // BATCH, 1)
    lo_at = start
    while lo_at < end + timedelta(seconds=1):
        with engine.begin() as conn:
            conn.execute(text(ATTEMPTS), {"lo": lo_at, "hi": lo_at + step})
        lo_at += step
    _group_failures(engine, start)
    return _generated(engine, made)


def _group_failures(engine: Engine, start: datetime) -> None:
    """Store each failure's group and count them, as the worker does when a receipt fails."""
    with engine.begin() as conn:
        types = list(conn.execute(text(
            "SELECT DISTINCT event_type FROM receipts WHERE state = 2")).scalars())
        signature = error_signature(FAIL_ERROR)
        for event_type in types:
            gid = group_id(event_type, signature)
            conn.execute(text(
                "INSERT INTO failure_members (scope_id, event_id, group_id, failed_at) "
                "SELECT scope_id, event_id, :gid, completed_at FROM receipts "
                "WHERE state = 2 AND event_type = :t ON CONFLICT DO NOTHING"),
                {"gid": gid, "t": event_type})
            conn.execute(text(
                "INSERT INTO failure_signatures (id, event_type, signature, example, first_seen)"
                " VALUES (:gid, :t, :sig, :ex, :at) ON CONFLICT DO NOTHING"),
                {"gid": gid, "t": event_type, "sig": signature, "ex": FAIL_ERROR, "at": start})
        rebuild_counters(conn)


def _generated(engine: Engine, made: list[Integration]) -> Generated:
    """Describe what was written, as datagen does (counts and one sample per state)."""
    with engine.connect() as conn:
        by_state = {ReceiptState.from_code(s): int(n) for s, n in conn.execute(text(
            "SELECT state, count(*) FROM receipts GROUP BY state"))}
        samples = {ReceiptState.from_code(s): (int(sc), e) for s, sc, e in conn.execute(text(
            "SELECT DISTINCT ON (state) state, scope_id, event_id FROM receipts"
            " ORDER BY state, accepted_at DESC"))}
        counts = {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                  for t in ("attempts", "jobs")}
    for state in ReceiptState:
        by_state.setdefault(state, 0)
    return Generated(scopes=tuple(made), by_state=by_state, samples=samples,
                     conflicts=0, **counts)


# The tables the newer pages read, at a normal ledger's proportions: the delivery log
# (one accepted row per receipt, a duplicate for 8 % of them, refusals about 1 %, so
# `accepted` is about 90 % of the log), conflicts (0.1 % of completed receipts, the
# conflicting body kept for those inside the review window), the forensic window's
# original bodies (the last day of completed receipts), a revoked key with its
# replacement on 1 % of scopes (per web instance refreshed, a few deliveries accepted
# inside the bound, refusals after it as the log's per-minute count rows), web and
# worker instances (live ones and a restart history), jobs held by the live workers,
# bulk requeues (one of 20,000 failures and smaller ones), destinations on 1 % of scopes
# with an attempt per forwarded receipt, labelled credentials and audit rows.
DELIVERIES = """
INSERT INTO deliveries (at, integration_id, public_id, outcome, http_status, key_id,
                        event_id, client, reason, count, latency_us)
SELECT r.accepted_at + d.lag, r.scope_id, i.public_id, d.outcome, d.status, c.key_id,
       CASE WHEN d.outcome = 'unauthenticated' THEN 'evt_x' || substr(r.event_id, 6)
            ELSE r.event_id END,
       '10.' || (r.scope_id % 250) || '.' || (r.scope_id / 250 % 250) || '.7',
       CASE WHEN d.outcome = 'unauthenticated' THEN 'no signature matches' END,
       1, 800 + (random() * 4000)::int
FROM receipts r
JOIN integrations i ON i.id = r.scope_id
JOIN credentials c ON c.integration_id = r.scope_id AND c.state = 'active'
CROSS JOIN LATERAL (
  SELECT 'accepted' AS outcome, 200 AS status, interval '0' AS lag
  UNION ALL SELECT 'duplicate', 200, interval '30 s' WHERE random() < 0.08
  UNION ALL SELECT 'unauthenticated', 401, interval '1 s' WHERE random() < 0.01
) d
WHERE r.accepted_at >= :lo AND r.accepted_at < :hi
"""

CONFLICTS = """
INSERT INTO conflicts (scope_id, event_id, kind, original_event_id, original_sha256,
                       incoming_sha256, first_seen, last_seen, count, incoming_body,
                       incoming_size)
SELECT scope_id, event_id, 'different_body', event_id, body_sha256,
       sha256(convert_to(event_id || '-other', 'UTF8')), completed_at + interval '1 min',
       completed_at + interval '2 min', 1,
       CASE WHEN completed_at > :review THEN
         '{"type":"' || event_type || '","data":{"amount"\\:2,"id":"' || event_id || '"}}' END,
       70
FROM receipts TABLESAMPLE BERNOULLI (0.1) REPEATABLE (7) WHERE state = 1
"""

CONFLICT_DELIVERIES = """
INSERT INTO deliveries (at, integration_id, public_id, outcome, http_status, key_id,
                        event_id, client, reason, count, latency_us)
SELECT f.first_seen, f.scope_id, i.public_id, 'conflict', 409, c.key_id, f.event_id,
       '10.0.0.9', NULL, 1, 1200
FROM conflicts f JOIN integrations i ON i.id = f.scope_id
JOIN credentials c ON c.integration_id = f.scope_id AND c.state = 'active'
"""

FORENSIC_BODIES = """
INSERT INTO conflict_bodies (scope_id, event_id, body, kept_at, expires_at)
SELECT scope_id, event_id,
       '{"type":"' || event_type || '","data":{"amount"\\:1,"id":"' || event_id || '"}}',
       completed_at, completed_at + interval '1 day'
FROM receipts WHERE state = 1 AND completed_at > :since
"""

REVOKE = """
WITH picked AS (SELECT id FROM integrations WHERE id % 100 = 7),
old AS (
  UPDATE credentials c SET state = 'revoked', revoked_at = :revoked_at,
         revoked_reason = 'rotated after a leak', label = 'Stripe dashboard, first key'
  FROM picked WHERE c.integration_id = picked.id RETURNING c.*)
INSERT INTO credentials (key_id, integration_id, secret_enc, fingerprint, state, created_at,
                         label)
SELECT 'key_' || substr(md5('new' || old.key_id), 1, 22), old.integration_id, old.secret_enc,
       old.fingerprint, 'active', :revoked_at - interval '1 hour', 'Stripe dashboard, rotated'
FROM old
"""

# After the bound every delivery signs with the new key: re-key the log's rows, then
# add the old key's refusals, one count row per minute for a day after the revocation.
REKEY = """
UPDATE deliveries d SET key_id = n.key_id
FROM credentials o JOIN credentials n ON n.integration_id = o.integration_id
     AND n.state = 'active'
WHERE o.state = 'revoked' AND d.key_id = o.key_id AND d.at > o.revoked_at + interval '3 s'
"""

REVOKED_REFUSALS = """
INSERT INTO deliveries (at, integration_id, public_id, outcome, http_status, key_id,
                        event_id, client, reason, count, latency_us)
SELECT o.revoked_at + m * interval '1 min', o.integration_id, i.public_id,
       'unauthenticated', 401, o.key_id, NULL, NULL, 'key revoked', 3, NULL
FROM credentials o JOIN integrations i ON i.id = o.integration_id
CROSS JOIN generate_series(1, 1440) m
WHERE o.state = 'revoked'
"""

INSTANCES = """
INSERT INTO instances (id, kind, hostname, pid, started_at, heartbeat_at,
                       credentials_refreshed_at, handles)
SELECT kind || '-' || host || ':' || (1000 + g) || ':' || substr(md5(kind || host || g), 1, 8),
       kind, host, 1000 + g, started, CASE WHEN g = 0 THEN :now ELSE started + interval '1 day' END,
       CASE WHEN kind = 'web' THEN CASE WHEN g = 0 THEN :now ELSE started + interval '1 day' END
       END,
       CASE WHEN kind = 'worker' THEN '["demo.credit", "invoice.paid", "charge.succeeded"]' END
FROM (VALUES ('web'), ('worker')) k(kind)
CROSS JOIN (VALUES ('app-1'), ('app-2')) h(host)
CROSS JOIN LATERAL (SELECT g, :now - (g + 1) * interval '1 day' AS started
                    FROM generate_series(0, 6) g) s
"""

REFRESHES = """
INSERT INTO revocation_refreshes (key_id, instance_id, refreshed_at, seen_at)
SELECT c.key_id, i.id, c.revoked_at + interval '2 s', c.revoked_at + interval '2 s'
FROM credentials c CROSS JOIN instances i
WHERE c.state = 'revoked' AND i.kind = 'web' AND i.heartbeat_at = :now
"""

RUNNING = """
UPDATE jobs j SET leased_by = w.id, leased_until = :now + interval '25 s',
       run_at = :now + interval '25 s', lease_token = j.lease_token + 1
FROM (SELECT scope_id, event_id FROM jobs WHERE status = 0 ORDER BY run_at LIMIT 32) p,
     (SELECT id FROM instances WHERE kind = 'worker' AND heartbeat_at = :now
      ORDER BY id LIMIT 1) w
WHERE j.scope_id = p.scope_id AND j.event_id = p.event_id
"""

REQUEUES = """
INSERT INTO requeue_members (batch_id, scope_id, event_id, requeued_at)
SELECT substr(md5('batch' || b.n), 1, 16), f.scope_id, f.event_id, :at - b.n * interval '1 h'
FROM (VALUES (0, 20000), (1, 2000), (2, 200), (3, 20)) b(n, size)
CROSS JOIN LATERAL (SELECT scope_id, event_id FROM receipts
                    WHERE state = 2 AND scope_id % 4 = b.n LIMIT b.size) f
"""

DESTINATIONS = """
INSERT INTO destinations (public_id, integration_id, url, event_types, state,
                          state_changed_at, timeout_seconds, max_in_flight, created_at)
SELECT 'ds_' || substr(md5('dest' || id), 1, 22), id,
       'https://hooks.example.com/' || id, NULL, 'active', :since, 10, 200, :since
FROM integrations WHERE id % 100 = 3
"""

DESTINATION_ATTEMPTS = """
INSERT INTO destination_attempts (destination_id, scope_id, event_id, number, started_at,
                                  latency_ms, http_status, outcome, error)
SELECT d.id, r.scope_id, r.event_id, 1, r.completed_at - interval '20 ms', 18.5,
       CASE WHEN r.state = 1 THEN 200 ELSE 500 END,
       CASE WHEN r.state = 1 THEN 'complete' ELSE 'failed' END,
       CASE WHEN r.state = 2 THEN 'HTTP 500' END
FROM destinations d JOIN receipts r ON r.scope_id = d.integration_id AND r.state <> 0
"""


DRILL_RUN = "0123456789ab"  # the leaked-key drill run recorded in the audit log
REQUEUE_BATCH = "0cf372b6aa6561e8"  # md5('batch0')[:16]: the 20,000-receipt bulk requeue


def load_page_tables(engine: Engine, end: datetime) -> dict[str, int]:
    """Fill the tables the newer pages read (see above); return each table's row count."""
    start = end - SPAN
    step = SPAN / 14
    lo_at = start
    while lo_at < end + timedelta(seconds=1):
        with engine.begin() as conn:
            conn.execute(text(DELIVERIES), {"lo": lo_at, "hi": lo_at + step})
        lo_at += step
    load_sampled_pages(engine, end)  # conflicts, revoked keys, requeues and their audit rows
    _run_steps(engine, [
        (CONFLICT_DELIVERIES, {}), (REKEY, {}), (REVOKED_REFUSALS, {}),
        (INSTANCES, {"now": end}), (REFRESHES, {"now": end}), (RUNNING, {"now": end}),
        (DESTINATIONS, {"since": start}), (DESTINATION_ATTEMPTS, {}),
        ("UPDATE credentials SET label = 'Stripe dashboard' WHERE label IS NULL", {})])
    with engine.connect() as conn:
        return {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                for t in ("audit_log", "deliveries", "conflicts", "conflict_bodies",
                          "revocation_refreshes", "instances", "requeue_members",
                          "destinations", "destination_attempts")}


def load_sampled_pages(engine: Engine, end: datetime) -> None:
    """Fill what the pages that show one item need a sample of, beside bench.datagen's ledger
    (which has none of them): a conflict with its kept body, revoked keys, bulk requeues and
    a drill run, in the proportions above."""
    _run_steps(engine, [(CONFLICTS, {"review": end - timedelta(days=14)}),
                        (FORENSIC_BODIES, {"since": end - timedelta(days=1)}),
                        (REVOKE, {"revoked_at": end - timedelta(days=2)}),
                        (REQUEUES, {"at": end})])
    _audit_rows(engine, end)


def _run_steps(engine: Engine, steps: list[tuple[str, dict[str, object]]]) -> None:
    """Run each statement with its parameters, a transaction each."""
    for sql, params in steps:
        with engine.begin() as conn:
            conn.execute(text(sql), params)


def _audit_rows(engine: Engine, end: datetime) -> None:
    """Audit the revocations and each bulk-requeued receipt through the real hash chain."""
    from ledger.access import audit

    actor = audit.Actor(name="oncall", role="oncall")
    with engine.begin() as conn:
        revoked = conn.execute(text(
            "SELECT c.key_id, c.revoked_at, i.account || '/' || i.name AS scope"
            " FROM credentials c JOIN integrations i ON i.id = c.integration_id"
            " WHERE c.state = 'revoked' ORDER BY c.id")).all()
        for r in revoked:
            audit.record(conn, actor, "credential.revoke", r.key_id, at=r.revoked_at,
                         scope=r.scope, reason="rotated after a leak",
                         detail={"fingerprint": "sha256:bench"})
        members = conn.execute(text(
            "SELECT m.batch_id, m.requeued_at, m.event_id, i.account || '/' || i.name AS scope"
            " FROM requeue_members m JOIN integrations i ON i.id = m.scope_id"
            " ORDER BY m.requeued_at, m.scope_id, m.event_id")).all()
        for m in members:
            audit.record(conn, actor, "receipt.requeue", f"{m.scope}:{m.event_id}",
                         at=m.requeued_at, scope=m.scope, reason="upstream fixed",
                         detail={"batch": m.batch_id})
        security = audit.Actor(name="security", role="security")
        steps = [{"name": n, "passed": True} for n in ("sign", "revoke", "refused")]
        audit.record(conn, security, "drill.start", f"drill:{DRILL_RUN}",
                     at=end - timedelta(minutes=5))
        audit.record(conn, security, "drill.finish", f"drill:{DRILL_RUN}",
                     at=end - timedelta(minutes=4),
                     detail={"run_id": DRILL_RUN, "passed": True, "steps": steps})
