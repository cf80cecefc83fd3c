"""Where a load run's CPU went: the web server's processes, wrk, and the rest of the machine.

Measured around each load run from the kernel's own counters (`/proc`), so a miss
on a CPU-bound 2-core machine is explained by this run's figures, not by an earlier
profile:

- the web server: its master and every worker, live or exited during the run
  (gunicorn recycles workers; an exited worker's CPU moves into the master's
  children's counters, which are read too), and of that the system time: the
  kernel's work for its processes (their sockets, and the waits and wake-ups of
  threads handing work and the interpreter's lock to one another);
- wrk: this process's waited-for children (`RUSAGE_CHILDREN`);
- the rest: the machine's busy time (`/proc/stat`) minus both: PostgreSQL's
  backends on the intake runs, and whatever else the machine runs (its idle
  services; nothing else of ours runs during a bench);
- idle: the share of both cores' time nobody used;
- stolen: the share the hypervisor gave to other guests (`steal` in `/proc/stat`):
  on a shared host this, not the code, can be what slows a whole run.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bench import env as benv

TICK = float(os.sysconf("SC_CLK_TCK"))


@dataclass(slots=True)
class CpuUse:
    """CPU seconds spent during one run, by whom, over `wall` seconds."""

    web: float = 0.0
    web_system: float = 0.0  # the part of `web` spent in the kernel
    wrk: float = 0.0
    busy: float = 0.0
    stolen: float = 0.0
    wall: float = 0.0
    cores: int = 1

    @property
    def rest(self) -> float:
        """Return the machine's busy seconds not spent by the web server or wrk."""
        return max(0.0, self.busy - self.web - self.wrk)

    @property
    def idle_share(self) -> float:
        """Return the share of the cores' time that was idle."""
        available = self.wall * self.cores
        return max(0.0, 1.0 - (self.busy + self.stolen) / available) if available else 0.0

    @property
    def stolen_share(self) -> float:
        """Return the share of the cores' time the hypervisor gave to other guests."""
        available = self.wall * self.cores
        return self.stolen / available if available else 0.0

    def __add__(self, other: CpuUse) -> CpuUse:
        return CpuUse(web=self.web + other.web, web_system=self.web_system + other.web_system,
                      wrk=self.wrk + other.wrk,
                      busy=self.busy + other.busy,
                      stolen=self.stolen + other.stolen, wall=self.wall + other.wall,
                      cores=max(self.cores, other.cores))

    def per_request_ms(self, requests: int) -> dict[str, float]:
        """Return milliseconds of CPU per request, by whom, and the idle share."""
        shares = {"idle_share": round(self.idle_share, 3),
                  "stolen_share": round(self.stolen_share, 3)}
        if requests <= 0:
            return {"web_ms": 0.0, "web_system_ms": 0.0, "rest_ms": 0.0, "wrk_ms": 0.0,
                    **shares}
        return {"web_ms": round(1000 * self.web / requests, 3),
                "web_system_ms": round(1000 * self.web_system / requests, 3),
                "rest_ms": round(1000 * self.rest / requests, 3),
                "wrk_ms": round(1000 * self.wrk / requests, 3), **shares}


class Ticks(NamedTuple):
    """The whole machine's CPU time since boot, in clock ticks (`/proc/stat`)."""

    busy: int  # user, nice, system, irq, softirq (guest time is inside user)
    idle: int  # idle + iowait
    stolen: int  # steal
    all: int  # the eight together


def machine_ticks() -> Ticks:
    """Return the machine's CPU ticks so far, by kind."""
    with open("/proc/stat") as stat:
        # user nice system idle iowait irq softirq steal
        f = [int(x) for x in stat.readline().split()[1:9]]
    return Ticks(busy=f[0] + f[1] + f[2] + f[5] + f[6], idle=f[3] + f[4], stolen=f[7],
                 all=sum(f))


def _stat(pid: int) -> list[str] | None:
    """Return the fields of /proc/<pid>/stat after the command name, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()  # [0] is the state, field 3 of proc(5)


class Seconds(NamedTuple):
    """CPU seconds used so far: in all (user + system), and of them in the kernel."""

    all: float
    system: float


def pid_times(pids: Iterable[int]) -> Seconds:
    """Return the CPU seconds the live processes `pids` used so far."""
    user = system = 0
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            user += int(fields[11])  # utime: field 14 of proc(5)
            system += int(fields[12])  # stime: field 15
    return Seconds((user + system) / TICK, system / TICK)


def pid_seconds(pids: Iterable[int]) -> float:
    """Return the user + system CPU seconds the live processes `pids` used so far."""
    return pid_times(pids).all


def tree_times(master_pid: int) -> Seconds:
    """Return the CPU seconds of a server's master, its live workers and its exited ones."""
    master = _stat(master_pid)
    if master is None:
        return Seconds(0.0, 0.0)
    # utime, stime, cutime, cstime are fields 14-17 of proc(5): [11:15] here.
    own = sum(int(x) for x in master[11:15]) / TICK
    own_system = (int(master[12]) + int(master[14])) / TICK
    workers = pid_times(benv.worker_pids(master_pid))
    return Seconds(own + workers.all, own_system + workers.system)


def _waited_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def measured(master_pid: int | None) -> Iterator[CpuUse]:
    """Fill a CpuUse with what the `with` block's run cost (wrk must be waited for in it)."""
    use = CpuUse(cores=os.cpu_count() or 1)
    web0 = tree_times(master_pid) if master_pid else Seconds(0.0, 0.0)
    wrk0, ticks0, wall0 = _waited_children(), machine_ticks(), time.monotonic()
    yield use
    use.wall = time.monotonic() - wall0
    ticks = machine_ticks()
    use.busy, use.stolen = (ticks.busy - ticks0.busy) / TICK, (ticks.stolen - ticks0.stolen) / TICK
    use.wrk = _waited_children() - wrk0
    if master_pid:
        web = tree_times(master_pid)
        use.web, use.web_system = web.all - web0.all, web.system - web0.system


def summed(uses: list[CpuUse], requests: int) -> dict[str, Any]:
    """Return the per-request figures of several runs taken together."""
    total = CpuUse(cores=os.cpu_count() or 1)
    for use in uses:
        total = total + use
    return total.per_request_ms(requests)
