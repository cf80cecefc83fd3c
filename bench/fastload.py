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
