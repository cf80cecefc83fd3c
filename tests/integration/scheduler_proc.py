"""A scheduler process with test jobs, for tests/integration/test_scheduler_processes.py.

Run as `python -m tests.integration.scheduler_proc LOGFILE`. Environment: DATABASE_URL,
LEDGER_MASTER_KEY and TEST_SLOW_SECONDS. Jobs (period 1 s each):
- `tick` appends "tick <pid>" to LOGFILE: one line per execution, whoever runs it;
- `slow` appends "slow-start <pid>", sleeps TEST_SLOW_SECONDS, appends "slow-end <pid>".
"""

from __future__ import annotations

import os
import sys
import time

from ledger.config import Settings
from ledger.scheduling.runner import ScheduledJob, run_scheduler
from ledger.services import build_services


def _append(path: str, line: str) -> None:
    """Append one line atomically (O_APPEND) so concurrent processes never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def main(logfile: str) -> None:
    """Run the test jobs on the real scheduler until SIGTERM."""
    pid = os.getpid()
    slow_seconds = float(os.environ.get("TEST_SLOW_SECONDS", "2.5"))

    def tick(engine, settings, clock) -> int:  # type: ignore[no-untyped-def]
        _append(logfile, f"tick {pid}")
        return 1

    def slow(engine, settings, clock) -> int:  # type: ignore[no-untyped-def]
        _append(logfile, f"slow-start {pid}")
        time.sleep(slow_seconds)
        _append(logfile, f"slow-end {pid}")
        return 1

    jobs = [ScheduledJob(name="tick", period_seconds=1, func=tick),
            ScheduledJob(name="slow", period_seconds=1, func=slow)]
    services = build_services(Settings.from_env())
    _append(logfile, f"ready {pid}")
    run_scheduler(services, jobs=jobs)


if __name__ == "__main__":
    main(sys.argv[1])
