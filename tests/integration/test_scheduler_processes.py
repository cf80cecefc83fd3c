"""Real scheduler processes against one database: once per period, and survival of a kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from ledger.db.schema import scheduler_runs
from ledger.scheduling import runs

ROOT = Path(__file__).resolve().parents[2]
LEDGER = str(Path(sys.executable).parent / "ledger")
pytestmark = pytest.mark.slow


def _wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    """Poll `predicate` until it returns something truthy, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def _stop(procs: list[subprocess.Popen]) -> None:
    """Terminate our processes (SIGTERM, then SIGKILL) and reap them."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _runs(engine, job: str) -> list:
    with engine.connect() as conn:
        return conn.execute(select(scheduler_runs).where(scheduler_runs.c.job == job)
                            .order_by(scheduler_runs.c.period_start)).all()


def _lines(log: Path) -> Counter:
    text = log.read_text() if log.exists() else ""
    return Counter(line.split()[0] for line in text.splitlines())


def _ticks_by_pid(log: Path) -> Counter:
    """Return how many ticks each scheduler process ran, from its lines in the log."""
    return Counter(int(line.split()[1]) for line in log.read_text().splitlines()
                   if line.startswith("tick "))


def _pid(run) -> int:  # type: ignore[no-untyped-def]
    """Return the pid of the scheduler instance that claimed `run` (host:pid:token)."""
    return int(run.instance.split(":")[1])


def _holders_inside_slow(engine, log: Path) -> list:  # type: ignore[no-untyped-def]
    """Return the running slow runs whose holder has started the job and not ended it."""
    inside = _inside_slow(log)
    return [r for r in _runs(engine, "slow") if r.outcome == "running" and _pid(r) in inside]


def _inside_slow(log: Path) -> set[int]:
    """Return the pids that started a slow run and have not ended it."""
    inside: Counter = Counter()
    for line in (log.read_text() if log.exists() else "").splitlines():
        word, pid = line.split()
        inside[int(pid)] += {"slow-start": 1, "slow-end": -1}.get(word, 0)
    return {pid for pid, open_runs in inside.items() if open_runs > 0}


def test_three_schedulers_run_each_period_once_and_survive_a_killed_holder(test_env, tmp_path):
    """PostgreSQL: the advisory xact lock + runs row; SQLite: the write lock + runs row."""
    # A lease of 2 s, shorter than a slow run: live holders must renew it to keep it.
    env = {**os.environ, **test_env, "TEST_SLOW_SECONDS": "2.5", "LEDGER_LEASE_SECONDS": "2"}
    log = tmp_path / "executions.log"
    engine = create_engine(test_env["DATABASE_URL"])
    procs = [subprocess.Popen([sys.executable, "-m", "tests.integration.scheduler_proc",
                               str(log)], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
             for _ in range(3)]
    try:
        _wait_for(lambda: _lines(log)["ready"] == 3, 30, "three schedulers to start")
        _wait_for(lambda: len(_runs(engine, "tick")) >= 5, 30, "five periods of tick")
        # kill -9 whoever is inside a slow run right now: its run claimed and executing (a
        # holder killed between its claim and the job's first line would leave a claimed
        # run that never executed, which the count below would read as a lost execution)
        running = _wait_for(lambda: _holders_inside_slow(engine, log), 15,
                            "a slow run in progress")
        victim = running[-1]
        pid = _pid(victim)
        assert pid in {p.pid for p in procs}
        os.kill(pid, signal.SIGKILL)
        killed_at = datetime.now(UTC)
        _wait_for(lambda: [r for r in _runs(engine, "slow") if r.outcome == "ok"
                           and r.period_start > killed_at], 30, "a slow run after the kill")
        _wait_for(lambda: [r for r in _runs(engine, "tick") if r.period_start > killed_at
                           and r.outcome == "ok"], 15, "a tick after the kill")
        # the killed holder's run is abandoned once its lease runs out (a later claim of
        # the job marks it); no sweep and no operator needed
        abandoned = _wait_for(lambda: [r for r in _runs(engine, "slow") if r.id == victim.id
                                       and r.outcome == "abandoned"], 15, "the abandoned mark")
    finally:
        _stop(procs)
    ticks, slows = _runs(engine, "tick"), _runs(engine, "slow")
    executions = _lines(log)
    # every recorded run executed exactly once: no period ran twice. The one exception is
    # the killed holder's: a tick it had claimed and not yet run when it was killed is lost
    # with it (like its slow run, the lease runs out and the run is not ok), and one it had
    # run but not yet recorded is not ok either.
    ticks_run = _ticks_by_pid(log)
    for holder, claimed in Counter(_pid(r) for r in ticks).items():
        if holder != pid:
            assert ticks_run[holder] == claimed, (holder, ticks_run, claimed)
    victims = [r for r in ticks if _pid(r) == pid]
    recorded_ok = sum(r.outcome == "ok" for r in victims)
    assert recorded_ok <= ticks_run[pid] <= len(victims) <= recorded_ok + 1, (
        ticks_run[pid], [r.outcome for r in victims])
    assert executions["slow-start"] == len(slows)
    starts = [r.period_start.timestamp() for r in ticks]
    assert len(starts) == len(set(starts))
    # and the schedulers kept the cadence: few periods in the observed span went unrun
    span = int(starts[-1] - starts[0]) + 1
    assert len(starts) >= 0.8 * span, (len(starts), span)
    assert len({r.instance for r in ticks + slows}) >= 2  # the work did move between them
    marked = abandoned[0].finished_at - abandoned[0].leased_until  # its last renewal
    print(f"\nkilled holder's run marked abandoned {marked.total_seconds():.2f} s after "
          "its lease ran out")
    # Marked by the next claim of `slow` after that: each survivor, busy 2.5 s per run,
    # claims one every 3 s.
    assert marked.total_seconds() < 4
    # every live run renewed its lease: the victim is the only abandoned run
    assert [r.id for r in slows if r.outcome == runs.RunOutcome.ABANDONED] == [victim.id]
    engine.dispose()


def test_ledger_scheduler_command_runs_the_jobs_and_stops_on_sigterm(test_env, tmp_path):
    env = {**os.environ, **test_env,
           "LEDGER_SCHEDULER_PERIODS": "retention=1,sweep=1,rollups=1"}
    proc = subprocess.Popen([LEDGER, "scheduler"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    engine = create_engine(test_env["DATABASE_URL"])
    try:
        def jobs_done() -> set[str]:
            with engine.connect() as conn:
                return set(conn.execute(select(scheduler_runs.c.job).where(
                    scheduler_runs.c.outcome == "ok")).scalars())

        _wait_for(lambda: {"retention", "sweep", "rollups"} <= jobs_done(), 30,
                  "one run of each job")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        _stop([proc])
        engine.dispose()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert out == b""  # logs go to stderr
    logged = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    assert any(entry.get("event") == "scheduled job ran" for entry in logged)
