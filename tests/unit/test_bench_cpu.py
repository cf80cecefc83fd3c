"""The bench's CPU accounting (bench/cpu.py) and the "missed, and why" it feeds: a miss is
explained by the CPU this run measured, per delivery, against what the target allows."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench import cpu, run

SPIN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"
# A master that forks a worker which burns CPU and exits, then burns some itself and
# waits: the exited worker's CPU is in the master's children counters.
TREE = """
import os, sys, time
def spin(s):
    end = time.process_time() + s
    while time.process_time() < end:
        pass
sys.stdin.readline()
if os.fork() == 0:
    spin(0.4)
    os._exit(0)
spin(0.2)
os.wait()
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


def test_a_servers_cpu_counts_its_workers_even_those_that_exited_during_the_run() -> None:
    with subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as master:
        assert master.stdin is not None and master.stdout is not None
        time.sleep(0.3)  # the interpreter's start-up is not part of the run
        with cpu.measured(master.pid) as use:
            master.stdin.write("go\n")
            master.stdin.flush()
            assert master.stdout.readline() == "done\n"
        master.stdin.write("end\n")
        master.stdin.flush()
    assert 0.55 <= use.web <= 1.0  # 0.4 s in the exited worker + 0.2 s in the master
    assert use.busy >= use.web * 0.9  # the machine saw it too
    assert use.wall > 0 and use.cores == (os.cpu_count() or 1)


def test_a_waited_for_load_generator_is_counted_apart_from_the_server() -> None:
    with cpu.measured(None) as use:
        subprocess.run([sys.executable, "-c", SPIN.format(seconds=0.3)], check=True)
    assert use.web == 0.0
    assert 0.25 <= use.wrk <= 0.8
    figures = use.per_request_ms(100)
    assert figures["wrk_ms"] == pytest.approx(1000 * use.wrk / 100, rel=0.01)
    assert 0.0 <= figures["idle_share"] <= 1.0 and 0.0 <= figures["stolen_share"] <= 1.0


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budgets below are worked out for this machine's 2 cores."""
    monkeypatch.setattr(run.os, "cpu_count", lambda: 2)


def _measured(web_ms: float, rest_ms: float, wrk_ms: float = 0.05, idle: float = 0.02,
              stolen: float = 0.0) -> dict[str, float]:
    return {"web_ms": web_ms, "rest_ms": rest_ms, "wrk_ms": wrk_ms, "idle_share": idle,
            "stolen_share": stolen}


def _intake(ours: dict[str, float], thin: dict[str, float],
            hmac: dict[str, float] | None) -> dict[str, object]:
    ceilings = {"postgres": {"tps": 6000.0, "clients": 16},
                "hmac_only": {"answered_per_s": 3800.0, "p99_ms": 20.0}}
    if hmac is not None:
        ceilings["hmac_only"]["cpu"] = hmac  # type: ignore[assignment]
    return {"ours_accepted_per_s": 1300.0, "thin_accepted_per_s": 1300.0,
            "ours_p99_ms": 60.0, "thin_p99_ms": 57.0, "thin_wraps": 0, "ours_wraps": 0,
            "ours_cpu": ours, "thin_cpu": thin, "ceilings": ceilings,
            "runs": {"ours": [{"p99_ms": 50.0}, {"p99_ms": 70.0}],
                     "thin": [{"p99_ms": 55.0}, {"p99_ms": 59.0}]},
            "duplicates": {"dup_per_s": 1500.0, "new_accepted_per_s": 1300.0,
                           "dup_new_receipts": 0}}


def test_a_miss_the_hmac_check_alone_could_not_meet_says_so_with_this_runs_figures() -> None:
    # 2.0x of 1,300/s is 2,600/s: 2 cores leave 0.77 ms a delivery; the HMAC check, our
    # database share and wrk's take 0.42 + 0.30 + 0.05 = 0.77... ms: more.
    r = _intake(_measured(1.09, 0.31), _measured(1.10, 0.35), _measured(0.42, 0.0))
    figures = run.intake_figures(r)
    why = run.explain(figures[0], figures)
    assert "leaves 0.77 ms of the 2 cores per delivery" in why
    assert "ours 1.09 ms in the web processes + 0.31 ms in the database" in why
    assert "the HMAC-only server 0.42 ms" in why
    assert "(0.78 ms) is more than that: no intake served by gunicorn" in why
    assert "3,800/s" in why  # the ceilings' explanation follows


def test_a_miss_within_reach_says_how_far_the_web_processes_must_fall() -> None:
    r = _intake(_measured(1.09, 0.20), _measured(1.10, 0.35), _measured(0.30, 0.0))
    why = run.explain(run.intake_figures(r)[0])
    assert "Ours spends 1.34 ms: the web processes would have to fall from 1.09 to 0.52" in why
    assert "no intake" not in why


def test_a_miss_with_cores_to_spare_is_waiting_not_cpu() -> None:
    r = _intake(_measured(0.50, 0.10, idle=0.4), _measured(1.10, 0.35), None)
    r["thin_accepted_per_s"] = 500.0  # 2.0x is 1,000/s: 2 ms a delivery, 0.65 spent
    assert "bounds it is waiting, not CPU" in run.explain(run.intake_figures(r)[0])


def test_time_the_host_took_shrinks_the_budget_and_is_printed() -> None:
    r = _intake(_measured(1.0, 0.3, stolen=0.25), _measured(1.0, 0.3), None)
    why = run.explain(run.intake_figures(r)[0])
    assert "25% taken by the host" in why
    assert "leaves 0.58 ms of the 2 cores" in why  # 2 x 0.75 / 2,600 per s


def test_the_p99_miss_prints_every_runs_tail() -> None:
    r = _intake(_measured(1.0, 0.3), _measured(1.0, 0.3), None)
    p99 = run.intake_figures(r)[1]
    assert not p99.met
    assert "ours 50, 70, thin 55, 59" in run.explain(p99)


def test_the_p99_miss_says_what_throughput_or_tail_the_target_takes() -> None:
    r = _intake(_measured(1.0, 0.3), _measured(1.0, 0.3), _measured(0.42, 0.0))
    r["runs"] = {"ours": [{"p50_ms": 20.0, "p99_ms": 60.0}, {"p50_ms": 25.0, "p99_ms": 100.0}],
                 "thin": [{"p50_ms": 20.0, "p99_ms": 50.0}, {"p50_ms": 20.0, "p99_ms": 70.0}]}
    why = run.explain(run.intake_figures(r)[1])
    assert "p50 ours 20, 25, thin 20, 20: p99 / p50 ours 3.5, thin 3.0" in why
    # 16 in flight: 0.7x the p99 takes 1/0.7 x 1,300/s = 1,857/s, 1.08 ms a delivery on
    # 2 cores; ours spends 1.35 ms, the HMAC-only floor 0.77 ms fits.
    assert "takes 1.43x its deliveries/s at the same p99 / p50" in why
    assert "a p99 / p50 of 2.1" in why
    assert "1.43x the thin intake is 1,857 deliveries/s, which leaves 1.08 ms" in why
    assert "the web processes would have to fall from 1.00 to 0.73 ms" in why


def test_a_run_without_cpu_figures_keeps_the_general_explanation() -> None:
    r = _intake(_measured(1.0, 0.3), _measured(1.0, 0.3), None)
    del r["ours_cpu"]
    intake = run.intake_figures(r)[0]
    assert intake.profile == ""
    assert "CPU-bound" in run.explain(intake)


def _with_floor(accepted: float, p99: float) -> dict[str, object]:
    r = _intake(_measured(1.0, 0.3), _measured(1.0, 0.3), None)
    return r | {"floor_accepted_per_s": accepted, "floor_p99_ms": p99,
                "floor_cpu": _measured(0.45, 0.25)}


def test_a_floor_under_the_target_puts_it_out_of_gunicorns_reach() -> None:
    # thin 1,300/s, the floor 1,950/s: 1.50x; ours 1,300/s is 67% of the floor's.
    r = _with_floor(1950.0, 30.0)
    why = run.explain(run.intake_figures(r)[0])
    assert "reached 1.50x the thin intake's accepted/s, short of 2.0x itself" in why
    assert "no intake served by gunicorn onto this PostgreSQL met the target in this run" in why
    assert "The floor's web processes spent 0.45 ms per delivery, ours 1.00." in why
    assert "ours reached 67% of the floor's accepted/s" in why
    assert "Measured in this run (CPU per delivery" in why  # the CPU profile follows


def test_a_floor_over_the_target_says_the_target_is_within_gunicorns_reach() -> None:
    why = run.explain(run.intake_figures(_with_floor(2860.0, 30.0))[0])
    assert "reached 2.20x the thin intake's accepted/s, within the target" in why
    assert "no intake served" not in why


def test_the_p99_row_compares_the_floors_tail_with_the_thin_intakes() -> None:
    # thin p99 57 ms: a floor at 45.6 ms is 0.80x, over 0.7x; at 28.5 ms 0.50x, within.
    slow = run.explain(run.intake_figures(_with_floor(1950.0, 45.6))[1])
    assert "reached 0.80x the thin intake's p99, short of 0.7x itself" in slow
    assert "ours' p99 was 1.32x the floor's" in slow  # 60 / 45.6
    fast = run.explain(run.intake_figures(_with_floor(1950.0, 28.5))[1])
    assert "0.50x the thin intake's p99, within the target" in fast


def test_the_floor_row_is_shown_and_absent_when_the_floor_was_not_run() -> None:
    shown = run.intake_figures(_with_floor(1950.0, 30.0))[-1]
    assert shown.measure == "where the rest goes: our accepted/s vs the gunicorn floor"
    assert shown.met and "thin intake 1300/s = 67% of it" in shown.note
    assert not any("gunicorn floor" in f.measure for f in run.intake_figures(
        _intake(_measured(1.0, 0.3), _measured(1.0, 0.3), None)))
