"""How long the `ledger` command takes to answer, and whether it prints a warning.

`ledger --help`, and `ledger receipt show` of an unknown event on a migrated SQLite
ledger (exit 1, CONTRACT section 4): each run `RUNS` times as a fresh process, as an
operator types it; the median wall time is the figure, the target one second.
"""

from __future__ import annotations

import os
import subprocess
import time
from statistics import median
from typing import Any

from bench import env as benv

RUNS = 5
COMMANDS = {"ledger --help": ["--help"],
            "ledger receipt show": ["receipt", "show", "--scope", "bench", "--event-id",
                                    "evt_missing", "--json"]}


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Run `ledger args` once; return its wall seconds and its stderr."""
    started = time.perf_counter()
    done = subprocess.run([str(benv.BIN / "ledger"), *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60, check=False)
    return time.perf_counter() - started, done.stderr


def measure(e: benv.BenchEnv) -> dict[str, Any]:
    """Return each command's median start time and any warning it printed."""
    env = e.app_env(e.sqlite_url("cli"))
    out: dict[str, Any] = {}
    for name, args in COMMANDS.items():
        runs = [_timed(args, env) for _ in range(RUNS)]
        warnings = sorted({line for _, err in runs for line in err.splitlines()
                           if "warning" in line.lower()})
        out[name] = {"median_s": round(median(s for s, _ in runs), 3),
                     "runs_s": [round(s, 3) for s, _ in runs], "warnings": warnings}
    return out
