"""The bench's CPU accounting (bench/cpu.py): a server's CPU counts its exited workers, its
kernel time is told apart from the rest, and the load generator's CPU is counted apart from
the server's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench import cpu

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


def _run_tree(script: str) -> cpu.CpuUse:
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as master:
        assert master.stdin is not None and master.stdout is not None
        time.sleep(0.3)  # the interpreter's start-up is not part of the run
        with cpu.measured(master.pid) as use:
            master.stdin.write("go\n")
            master.stdin.flush()
            assert master.stdout.readline() == "done\n"
        master.stdin.write("end\n")
        master.stdin.flush()
    return use


def test_a_servers_cpu_counts_its_workers_even_those_that_exited_during_the_run() -> None:
    use = _run_tree(TREE)
    assert 0.55 <= use.web <= 1.0  # 0.4 s in the exited worker + 0.2 s in the master
    assert use.busy >= use.web * 0.9  # the machine saw it too
    assert use.wall > 0 and use.cores == (os.cpu_count() or 1)


# A master that forks a worker which spends its CPU in system calls (reads of /dev/zero: the
# kernel fills each buffer), then exits; the master only waits for it. The work is a fixed
# amount, so a loaded machine makes it slower, not smaller.
KERNEL_TREE = """
import os, sys
sys.stdin.readline()
if os.fork() == 0:
    fd = os.open("/dev/zero", os.O_RDONLY)
    for _ in range(30_000):
        os.read(fd, 1 << 20)
    os._exit(0)
os.wait()
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


# A master whose forked worker spins in user space, a fixed number of turns with no system
# call (reading time.process_time() in the loop would make one every turn).
USER_TREE = """
import os, sys
sys.stdin.readline()
if os.fork() == 0:
    for _ in range(20_000_000):
        pass
    os._exit(0)
os.wait()
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.readline()
"""


def test_a_servers_kernel_time_is_told_apart_from_its_user_time() -> None:
    in_kernel = _run_tree(KERNEL_TREE)
    assert in_kernel.web >= 0.15
    # The kernel splits a process's time by sampling at each clock tick, so the shares are
    # compared, not exact seconds: the worker's reads are mostly system time.
    assert in_kernel.web_system >= 0.6 * in_kernel.web
    in_user = _run_tree(USER_TREE)
    assert in_user.web >= 0.15
    assert in_user.web_system <= 0.2 * in_user.web
    figures = in_kernel.per_request_ms(100)
    assert figures["web_system_ms"] == pytest.approx(1000 * in_kernel.web_system / 100, rel=0.01)
    summed = cpu.summed([in_kernel, in_user], 200)
    assert summed["web_system_ms"] == pytest.approx(
        1000 * (in_kernel.web_system + in_user.web_system) / 200, rel=0.01)


def test_a_waited_for_load_generator_is_counted_apart_from_the_server() -> None:
    with cpu.measured(None) as use:
        subprocess.run([sys.executable, "-c", SPIN.format(seconds=0.3)], check=True)
    assert use.web == 0.0
    assert 0.25 <= use.wrk <= 0.8
    figures = use.per_request_ms(100)
    assert figures["wrk_ms"] == pytest.approx(1000 * use.wrk / 100, rel=0.01)
    assert 0.0 <= figures["idle_share"] <= 1.0 and 0.0 <= figures["stolen_share"] <= 1.0
