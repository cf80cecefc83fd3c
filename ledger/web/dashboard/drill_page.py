"""The leaked-key drill from the Credentials page: security starts it, watches each step.

The drill runs in a background thread of this process against an in-process loopback
server of this same app (ledger.web.loopback), on the deployment's database: its
revocation step also waits for every live web instance of the deployment to report
credentials newer than the revocation. One run at a time per process; every run
writes drill.start and drill.finish audit rows, from which another process answers a
status poll (without the live per-step view).
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flask import Flask, Response, abort, current_app, request
from sqlalchemy import Select, select

from ledger.access import audit
from ledger.db.schema import audit_log
from ledger.drill.run import Drill, DrillReport, DrillStep
from ledger.logs import get_logger
from ledger.web.auth import actor, confirm_password, requires, services
from ledger.web.dashboard import bp, render
from ledger.web.loopback import local_server

log = get_logger("ledger.drill")
POLL_SECONDS = 1
KEPT_RUNS = 20  # the audit log keeps every run; the page only follows recent ones
RUN_ID = re.compile(r"[0-9a-f]{12}")


@dataclass(slots=True, kw_only=True)
class DrillRun:
    """One run: who started it, when, and the report its thread fills step by step."""

    run_id: str
    started_by: str
    started_at: datetime
    report: DrillReport = field(default_factory=DrillReport)
    done: bool = False
    crashed: str | None = None

    @property
    def passed(self) -> bool:
        """Tell whether the run ended with every step passed."""
        return self.done and self.crashed is None and self.report.passed


class DrillRuns:
    """This process's drill runs; at most one runs at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, DrillRun] = {}
        self.active: DrillRun | None = None

    def start(self, run: DrillRun) -> bool:
        """Register `run` as the active one; False when another is still running."""
        with self._lock:
            if self.active is not None and not self.active.done:
                return False
            self.active = run
            self._runs[run.run_id] = run
            for old in list(self._runs)[:-KEPT_RUNS]:
                del self._runs[old]
            return True

    def get(self, run_id: str) -> DrillRun | None:
        """Return a recent run by id."""
        with self._lock:
            return self._runs.get(run_id)


def drill_runs(app: Flask) -> DrillRuns:
    """Return the app's drill registry (created on first use)."""
    runs: DrillRuns = app.extensions.setdefault("ledger_drills", DrillRuns())
    return runs


def _finish(app: Flask, run: DrillRun, who: audit.Actor) -> None:
    """Record how the run ended in the audit log, then mark it done."""
    steps = [{"name": s.name, "passed": s.passed} for s in run.report.steps]
    failed = next((s for s in run.report.steps if not s.passed), None)
    # The outcome as it will read once done is set (run.passed is False until then).
    passed = run.crashed is None and run.report.passed
    detail: dict[str, Any] = {"run_id": run.run_id, "passed": passed, "steps": steps}
    if failed is not None:
        detail["failed_step"] = {"name": failed.name, "detail": failed.detail[:300]}
    if run.crashed:
        detail["error"] = run.crashed
    svc = app.extensions["ledger"]
    try:
        with svc.engine.begin() as conn:
            audit.record(conn, who, "drill.finish", f"drill:{run.run_id}", at=svc.clock.now(),
                         detail=detail)
    finally:
        run.done = True
    log.info("drill.finish", run_id=run.run_id, passed=passed, actor=who.name)


def _execute(app: Flask, run: DrillRun, who: audit.Actor) -> None:
    """Thread body: serve this app on loopback, run every step, always record the end."""
    try:
        with app.app_context(), local_server(app) as url:
            Drill(url, app.extensions["ledger"], who).run(run.report)
    except Exception as error:  # the run must end in the audit log whatever happened
        run.crashed = type(error).__name__
    finally:
        _finish(app, run, who)


def _status(run: DrillRun, status: int = 200) -> Response:
    """Render the run's status fragment (it polls itself while the run is going)."""
    return render("drill.html", "partials/_drill_status.html", status=status, run=run,
                  poll_seconds=POLL_SECONDS)


@bp.post("/credentials/drill")
@requires("security", session_only=True)
def drill_start() -> Response:
    """Start the leaked-key drill after re-entering the password; answer its status."""
    refused = confirm_password(request.form.get("password", ""))
    if refused:
        return render("drill.html", "partials/_drill_status.html", status=403, run=None,
                      error=refused)
    # why: the run thread needs the app itself, not the request-bound proxy; Flask types
    # current_app as the app, so mypy does not see the proxy's accessor.
    svc, app = services(), current_app._get_current_object()  # type: ignore[attr-defined]
    who = actor()
    run = DrillRun(run_id=secrets.token_hex(6), started_by=who.name,
                   started_at=svc.clock.now())
    runs = drill_runs(app)
    if not runs.start(run):
        return render("drill.html", "partials/_drill_status.html", status=409,
                      run=runs.active, error="A drill is already running; follow it below.",
                      poll_seconds=POLL_SECONDS)
    with svc.engine.begin() as conn:
        audit.record(conn, who, "drill.start", f"drill:{run.run_id}", at=run.started_at,
                     detail={"run_id": run.run_id})
    threading.Thread(target=_execute, args=(app, run, who), name=f"drill-{run.run_id}",
                     daemon=True).start()
    return _status(run, 202)


def run_from_audit(run_id: str) -> DrillRun | None:
    """Rebuild a run another process started from its audit rows (steps once it finished).

    Under gunicorn a status poll may reach a worker that is not running the drill: it
    answers from the drill.start and drill.finish rows every process shares.
    """
    if not RUN_ID.fullmatch(run_id):
        return None
    with services().engine.connect() as conn:
        rows = {r.action: r for r in conn.execute(
            select(audit_log.c.action, audit_log.c.actor, audit_log.c.at, audit_log.c.detail)
            .where(audit_log.c.target == f"drill:{run_id}",
                   audit_log.c.action.in_(("drill.start", "drill.finish"))))}
    start, finish = rows.get("drill.start"), rows.get("drill.finish")
    if start is None:
        return None
    run = DrillRun(run_id=run_id, started_by=start.actor, started_at=start.at)
    if finish is not None:
        detail = json.loads(finish.detail or "{}")
        failed = detail.get("failed_step") or {}
        run.report.steps.extend(
            DrillStep(name=str(s.get("name")), passed=bool(s.get("passed")),
                      detail=failed.get("detail", "") if s.get("name") == failed.get("name")
                      else "(run in another process: details in the audit log)")
            for s in detail.get("steps", []))
        run.crashed = detail.get("error")
        run.done = True
    return run


def last_start_stmt() -> Select[Any]:
    """The newest drill.start row's target: one step down ix_audit_action."""
    return (select(audit_log.c.target).where(audit_log.c.action == "drill.start")
            .order_by(audit_log.c.action.desc(), audit_log.c.id.desc()).limit(1))


def last_run() -> DrillRun | None:
    """Return the newest drill run of the deployment: this process's, else from the audit log."""
    active = drill_runs(current_app).active
    with services().engine.connect() as conn:
        newest = conn.execute(last_start_stmt()).scalar()
    if newest is None:
        return active
    run_id = newest.removeprefix("drill:")
    if active is not None and active.run_id == run_id:
        return active
    return drill_runs(current_app).get(run_id) or run_from_audit(run_id)


@bp.get("/credentials/drill/<run_id>")
@requires("security")
def drill_status(run_id: str) -> Response:
    """A run's steps so far; the fragment stops polling once the run is done."""
    run = drill_runs(current_app).get(run_id) or run_from_audit(run_id)
    if run is None:
        abort(404)
    return _status(run)
