"""What the next scheduled purge will do, and what the forensic window costs.

The Capacity page and `ledger purge --preview` (CONTRACT section 4) answer from here:
the next run of the `retention` job (its periods are aligned, ledger/scheduling/runner.py),
the receipts it will expire (per scope), the failed payloads and conflict bodies it will
drop, and how long its last run took. The page counts at most `cap` expired receipts
(an index range of receipts by accepted_at) and says when it stopped there; the CLI
counts them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, func, select, text

from ledger.config import Settings
from ledger.db.schema import conflict_bodies, conflicts, receipts, scheduler_runs
from ledger.reads.receipts import scope_names
from ledger.scheduling.runner import default_jobs, period_start

from .retention_payloads import count_expired_payloads
from .retention_receipts import FINISHED

JOB = "retention"
PAGE_CAP = 100_000
PAGE_SCOPES = 20  # scopes the Capacity page lists by name


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgePreview:
    """The next purge's work, as far as it can be known now."""

    next_run_at: datetime | None  # None: the retention job is switched off
    expired_receipts: int
    capped: bool  # True: at least `expired_receipts`, counting stopped at the cap
    payloads_dropped: int
    conflict_bodies_dropped: int  # incoming bodies past review, forensic originals expired
    by_scope: list[dict[str, Any]] = field(default_factory=list)
    last_run_at: datetime | None = None
    last_run_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the CONTRACT's `ledger purge --preview --json` object."""
        return {"next_run_at": self.next_run_at.isoformat() if self.next_run_at else None,
                "expired_receipts": self.expired_receipts,
                "payloads_dropped": self.payloads_dropped, "by_scope": self.by_scope}


def retention_period(settings: Settings) -> float:
    """Return the retention job's period as the scheduler runs it (<= 0: off)."""
    default = next(j.period_seconds for j in default_jobs(settings) if j.name == JOB)
    return settings.scheduler_periods.get(JOB, default * settings.scheduler_period_scale)


def preview(conn: Connection, settings: Settings, now: datetime, *,
            cap: int | None = None, named: int | None = None) -> PurgePreview:
    """Return what the next scheduled purge will do (from `now` if it is off).

    `named`: resolve the scope names of the first `named` scopes of `by_scope` only (the
    ones a page shows); the others keep their internal id as `scope`.
    """
    period = retention_period(settings)
    next_run = period_start(now, period) + timedelta(seconds=period) if period > 0 else None
    at = next_run or now
    cutoff = at - timedelta(seconds=settings.retention_seconds)
    review_cutoff = at - timedelta(seconds=settings.review_window_seconds)
    per_scope, capped = _expired_by_scope(conn, cutoff, cap)
    ordered = sorted(per_scope.items(), key=lambda kv: (-kv[1], kv[0]))
    names = scope_names(conn, {sid for sid, _ in ordered[:named]})
    by_scope = [{"scope": names.get(sid, (str(sid), ""))[0], "expired_receipts": n}
                for sid, n in ordered]
    last = conn.execute(
        select(scheduler_runs.c.started_at, scheduler_runs.c.finished_at)
        .where(scheduler_runs.c.job == JOB, scheduler_runs.c.finished_at.is_not(None))
        .order_by(scheduler_runs.c.period_start.desc()).limit(1)).first()
    return PurgePreview(
        next_run_at=next_run, expired_receipts=sum(per_scope.values()), capped=capped,
        payloads_dropped=count_expired_payloads(conn, review_cutoff),
        conflict_bodies_dropped=_bodies_due(conn, review_cutoff, at), by_scope=by_scope,
        last_run_at=last.started_at if last else None,
        last_run_seconds=(last.finished_at - last.started_at).total_seconds() if last else None)


def expired_by_scope_stmt(cutoff: datetime, cap: int | None) -> Select[Any]:
    """Finished receipts accepted before `cutoff` (at most cap + 1 read), counted per scope."""
    due = (select(receipts.c.scope_id)
           .where(receipts.c.accepted_at < cutoff, receipts.c.state.in_(FINISHED)))
    if cap is not None:
        due = due.limit(cap + 1)
    rows = due.subquery()
    return select(rows.c.scope_id, func.count()).group_by(rows.c.scope_id)


def _expired_by_scope(conn: Connection, cutoff: datetime,
                      cap: int | None) -> tuple[dict[int, int], bool]:
    """Return {scope_id: finished receipts accepted before cutoff}, read up to `cap` rows."""
    counts = {sid: int(n) for sid, n in conn.execute(expired_by_scope_stmt(cutoff, cap))}
    if cap is None or sum(counts.values()) <= cap:
        return counts, False
    return counts, True


def _bodies_due(conn: Connection, review_cutoff: datetime, at: datetime) -> int:
    """Count the conflict bodies the purge drops: incoming past review, forensic expired."""
    incoming = conn.execute(select(func.count()).select_from(conflicts).where(
        conflicts.c.incoming_body.is_not(None), conflicts.c.first_seen < review_cutoff)
    ).scalar_one()
    forensic = conn.execute(select(func.count()).select_from(conflict_bodies)
                            .where(conflict_bodies.c.expires_at < at)).scalar_one()
    return int(incoming) + int(forensic)


def forensic_cost(conn: Connection, cap: int = PAGE_CAP) -> dict[str, Any]:
    """Return the forensic window's bodies (counted up to `cap`) and bytes now.

    PostgreSQL gives the table's size on disk; SQLite sums the bodies' lengths.
    """
    kept = select(conflict_bodies.c.body).limit(cap + 1).subquery()
    rows = int(conn.execute(select(func.count()).select_from(kept)).scalar_one())
    if conn.dialect.name == "postgresql":
        size = conn.execute(text("SELECT pg_total_relation_size('conflict_bodies')")).scalar()
    else:
        size = conn.execute(select(func.coalesce(
            func.sum(func.length(conflict_bodies.c.body)), 0))).scalar()
    return {"rows": min(rows, cap), "capped": rows > cap, "bytes": int(size or 0)}
