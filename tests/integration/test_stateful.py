"""A stateful property test of the whole ledger (hypothesis RuleBasedStateMachine, both databases).

Rules: deliver, redeliver, send a conflicting body, rotate, revoke, advance the clock,
run a worker, crash a worker (claim, then abandon), purge. Invariants, after every step:
- every 2xx delivery has its receipt (inside retention); no other answer made one;
- one business effect per (scope, event id) inside retention: each scope's demo balance
  is exactly the amounts of its complete receipts (plus those purged after completing);
- a revoked key never authenticates once the revocation bound has passed;
- nothing done to one scope shows in another (receipts, conflicts, balances).
Each example uses two fresh scopes on the test's database and one shared FixedClock.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import func, select

from app import create_app
from jobs.retention import purge
from ledger.access import audit
from ledger.access.credentials import revoke_credential, rotate_credential
from ledger.access.integrations import get_integration
from ledger.clock import FixedClock, unix
from ledger.db.schema import conflicts, receipts
from ledger.demo.seed import balance
from ledger.domain import ReceiptState
from ledger.worker.loop import Worker
from ledger.worker.store import lease_job, select_due_job
from tests.helpers import Sender, deliver, make_sender

BOUND = 30
RETENTION = 600
EVENT_IDS = ("e1", "e2", "e3", "e4")
ACTOR = audit.Actor(name="stateful", role="admin")
_examples = itertools.count()


@dataclass(slots=True)
class Key:
    """A signing key as the model knows it."""

    secret: str
    key_id: str
    created_at: datetime
    expires_at: datetime | None = None
    expiry_set_at: datetime | None = None  # when a rotation gave it its expires_at
    revoked_at: datetime | None = None


@dataclass(slots=True)
class Scope:
    """One integration: its keys, the events it holds, and the effects purged away."""

    sender: Sender
    keys: list[Key]
    events: dict[str, int] = field(default_factory=dict)  # event id -> amount of its body
    acked: set[str] = field(default_factory=set)
    purged_effects: int = 0
    conflicts_sent: int = 0


def auth_expectation(key: Key, now: datetime) -> str:
    """Return 'must' (authenticates), 'never' (401) or 'may' (either, inside the bound)."""
    bound = timedelta(seconds=BOUND)
    if key.revoked_at is not None:
        return "never" if now >= key.revoked_at + bound else "may"
    if key.expires_at is not None and now >= key.expires_at:
        # Expiry is checked at verification, against the expires_at the process's
        # cached view holds: a rotation reaches every view within the bound.
        settled = key.expiry_set_at is not None and now >= key.expiry_set_at + bound
        return "never" if settled else "may"
    # A new key reaches every process's cached view within the bound.
    return "must" if now >= key.created_at + bound else "may"


class LedgerMachine(RuleBasedStateMachine):
    """The ledger against a model of what each scope must hold."""

    def __init__(self, app) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.app = app
        self.svc = app.extensions["ledger"]
        self.client = app.test_client()
        self.worker = Worker(self.svc, worker_id="stateful")
        n = next(_examples)
        self.scopes = [self._scope(f"sm{n}{side}") for side in ("a", "b")]
        # Every example starts alike (replayable): an empty view, no due job.
        self.svc.view.invalidate()

    def teardown(self) -> None:
        """Drain every job this example left, so the next one starts with an empty queue."""
        self.svc.clock.advance(self.svc.settings.lease_seconds + 1)
        for _ in range(200):
            if not self.worker.process_one():
                break

    def _scope(self, account: str) -> Scope:
        """Connect one fresh integration."""
        sender = make_sender(self.app, account=account, name="hooks")
        key = Key(sender.secret, sender.key_id, self.now - timedelta(seconds=BOUND))
        return Scope(sender=sender, keys=[key])

    @property
    def now(self) -> datetime:
        """Return the shared clock's time."""
        return self.svc.clock.now()

    def _send(self, scope: Scope, event_id: str, amount: int, key: Key):  # type: ignore[no-untyped-def]
        """Deliver with one key and check the answer against the model."""
        expected_auth = auth_expectation(key, self.now)
        response = deliver(self.client, scope.sender, event_id, "demo.credit",
                           {"amount": amount}, secret=key.secret, timestamp=unix(self.now))
        status, body = response.status_code, response.get_json()
        if status == 401:
            assert expected_auth != "must", (key, self.now)
            return
        assert expected_auth != "never", f"a dead key authenticated: {key} at {self.now}"
        known = scope.events.get(event_id)
        if known is None:
            assert (status, body["status"]) == (202, "accepted"), body
            scope.events[event_id] = amount
            scope.acked.add(event_id)
        elif known != amount:
            assert (status, body) == (409, {"status": "conflict", "event_id": event_id})
            scope.conflicts_sent += 1
        else:
            assert status in (200, 202) and body["status"] == "duplicate", body
            scope.acked.add(event_id)

    @rule(side=st.integers(0, 1), event_id=st.sampled_from(EVENT_IDS),
          amount=st.integers(1, 3), key=st.integers(0, 5))
    def deliver_event(self, side: int, event_id: str, amount: int, key: int) -> None:
        """Deliver an event (new, duplicate or conflicting) signed with any key ever issued."""
        scope = self.scopes[side]
        self._send(scope, event_id, amount, scope.keys[key % len(scope.keys)])

    @precondition(lambda self: any(k.revoked_at or k.expires_at
                                   for s in self.scopes for k in s.keys))
    @rule(event_id=st.sampled_from(EVENT_IDS), amount=st.integers(1, 3))
    def deliver_with_dead_key(self, event_id: str, amount: int) -> None:
        """Replay with the key revoked or retired last (a leaked key's use)."""
        dead = [(max(k.revoked_at or k.created_at, k.expiry_set_at or k.created_at), i, k)
                for i, s in enumerate(self.scopes) for k in s.keys
                if k.revoked_at or k.expires_at]
        _, side, key = max(dead, key=lambda d: (d[0], d[1]))
        self._send(self.scopes[side], event_id, amount, key)

    @rule(side=st.integers(0, 1), event_id=st.sampled_from(EVENT_IDS),
          wait=st.integers(1, BOUND + 5))
    def leak_drill(self, side: int, event_id: str, wait: int) -> None:
        """Use a live key (every cache now holds it), revoke it, wait, replay with it."""
        scope = self.scopes[side]
        live = [k for k in scope.keys if auth_expectation(k, self.now) == "must"]
        if not live:
            return
        key = live[-1]
        self._send(scope, event_id, 1, key)
        with self.svc.engine.begin() as conn:
            revoke_credential(conn, ACTOR, key.key_id, reason="leaked", now=self.now)
        key.revoked_at = self.now
        self.svc.clock.advance(wait)
        self._send(scope, f"{event_id}-leaked", 1, key)

    @precondition(lambda self: any(s.events for s in self.scopes))
    @rule(side=st.integers(0, 1), pick=st.integers(0, 10))
    def redeliver(self, side: int, pick: int) -> None:
        """Send a known event again, same body, with the newest key."""
        scope = self.scopes[side] if self.scopes[side].events else self.scopes[1 - side]
        event_id = sorted(scope.events)[pick % len(scope.events)]
        self._send(scope, event_id, scope.events[event_id], scope.keys[-1])

    @precondition(lambda self: any(s.events for s in self.scopes))
    @rule(side=st.integers(0, 1), pick=st.integers(0, 10))
    def conflicting_body(self, side: int, pick: int) -> None:
        """Send a known event id with a different body."""
        scope = self.scopes[side] if self.scopes[side].events else self.scopes[1 - side]
        event_id = sorted(scope.events)[pick % len(scope.events)]
        self._send(scope, event_id, scope.events[event_id] + 10, scope.keys[-1])

    @rule(side=st.integers(0, 1), overlap=st.sampled_from([0, 20, 120]))
    def rotate(self, side: int, overlap: int) -> None:
        """Rotate: a new key; live keys retire at now + overlap (never later than before)."""
        scope, now = self.scopes[side], self.now
        with self.svc.engine.begin() as conn:
            integration = get_integration(conn, scope.sender.public_id)
            rotation = rotate_credential(conn, self.svc.box, ACTOR, integration, now=now,
                                         overlap_seconds=overlap)
        until = now + timedelta(seconds=overlap)
        for key in scope.keys:
            live = key.revoked_at is None and (key.expires_at is None or now < key.expires_at)
            # An already retiring key keeps its earlier end.
            if live and (key.expires_at is None or until < key.expires_at):
                key.expires_at, key.expiry_set_at = until, now
        scope.keys.append(Key(rotation.secret, rotation.key_id, now))

    @rule(side=st.integers(0, 1), pick=st.integers(0, 5))
    def revoke(self, side: int, pick: int) -> None:
        """Revoke a key that is not revoked yet (other scopes must not notice)."""
        scope = self.scopes[side]
        candidates = [k for k in scope.keys if k.revoked_at is None]
        if not candidates:
            return
        key = candidates[pick % len(candidates)]
        with self.svc.engine.begin() as conn:
            revoke_credential(conn, ACTOR, key.key_id, reason="stateful test", now=self.now)
        key.revoked_at = self.now

    @rule(seconds=st.sampled_from([16, 31, 200, 700]))
    def advance_clock(self, seconds: int) -> None:
        """Let time pass (view ttl, revocation bound, leases, retention)."""
        self.svc.clock.advance(seconds)

    @rule(seconds=st.integers(1, 20))
    def short_pause(self, seconds: int) -> None:
        """Let a little time pass: inside the view's ttl and the revocation bound."""
        self.svc.clock.advance(seconds)

    @rule(jobs=st.integers(1, 6))
    def run_worker(self, jobs: int) -> None:
        """Process up to `jobs` due jobs."""
        for _ in range(jobs):
            if not self.worker.process_one():
                break

    @rule()
    def crash_worker(self) -> None:
        """Claim the oldest due job and die without finishing it."""
        now = self.now
        with self.svc.engine.begin() as conn:
            due = select_due_job(conn, now)
            if due is not None:
                lease_job(conn, due, worker_id="crashed", now=now,
                          lease_seconds=self.svc.settings.lease_seconds)

    @rule()
    def run_purge(self) -> None:
        """Purge: only finished receipts past retention go; the model forgets exactly those."""
        before = {side: self._receipts(scope) for side, scope in enumerate(self.scopes)}
        cutoff = self.now - timedelta(seconds=RETENTION)
        purge(self.svc.engine, self.svc.settings, self.svc.clock)
        for side, scope in enumerate(self.scopes):
            after = self._receipts(scope)
            for event_id, (state, accepted_at) in before[side].items():
                due = state != ReceiptState.PENDING and accepted_at < cutoff
                assert (event_id not in after) == due, (event_id, state, accepted_at, cutoff)
                if due:
                    if state == ReceiptState.COMPLETE:
                        scope.purged_effects += scope.events[event_id]
                    del scope.events[event_id]
                    scope.acked.discard(event_id)

    def _receipts(self, scope: Scope) -> dict[str, tuple[ReceiptState, datetime]]:
        """Return the scope's receipts: event id -> (state, accepted_at)."""
        with self.svc.engine.connect() as conn:
            rows = conn.execute(select(receipts.c.event_id, receipts.c.state,
                                       receipts.c.accepted_at)
                                .where(receipts.c.scope_id == scope.sender.scope_id)).all()
        return {r.event_id: (ReceiptState.from_code(r.state), r.accepted_at) for r in rows}

    @invariant()
    def ledger_matches_the_model(self) -> None:
        """Receipts, effects and conflicts of each scope are exactly what the model allows."""
        for scope in self.scopes:
            held = self._receipts(scope)
            assert scope.acked <= set(held), "an acknowledged event has no receipt"
            assert set(held) <= set(scope.events), "a receipt nobody was answered 2xx for"
            complete = sum(scope.events[e] for e, (state, _) in held.items()
                           if state == ReceiptState.COMPLETE)
            with self.svc.engine.connect() as conn:
                effect = balance(conn, scope.sender.scope_id)
                kept = conn.execute(select(func.coalesce(func.sum(conflicts.c.count), 0))
                                    .where(conflicts.c.scope_id == scope.sender.scope_id)
                                    ).scalar()
            assert effect == complete + scope.purged_effects, "effects != complete receipts"
            assert kept <= scope.conflicts_sent, "a conflict recorded in the wrong scope"


@pytest.fixture
def machine_app(test_env):
    """One app per database, on a FixedClock, with a short retention for purges."""
    app = create_app({**test_env, "LEDGER_REVOCATION_BOUND_SECONDS": str(BOUND),
                      "LEDGER_RETENTION_SECONDS": str(RETENTION),
                      "LEDGER_REVIEW_WINDOW_SECONDS": str(RETENTION),
                      "LEDGER_LEASE_SECONDS": "20", "LEDGER_LOG_LEVEL": "WARNING"},
                     clock=FixedClock(datetime.now(UTC)))
    yield app
    app.extensions["ledger"].close()


def test_ledger_state_machine(machine_app):
    """Run the rules in random orders; every invariant holds after every step."""
    run_state_machine_as_test(
        lambda: LedgerMachine(machine_app),
        settings=settings(max_examples=25, stateful_step_count=30, deadline=None,
                          database=None,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.filter_too_much]))
