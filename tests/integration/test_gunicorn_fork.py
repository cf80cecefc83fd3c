"""A worker forked from the preloaded app keeps sharing the master's memory through a full
garbage collection (gunicorn.conf.py's pre_fork freezes the master's objects)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import TEST_MASTER_KEY

ROOT = Path(__file__).resolve().parents[2]

# Build the app as gunicorn's preload does, run the config's pre_fork hook (or not), fork
# one "worker", and have it report how many KiB of shared pages a full collection copied.
PROBE = """
import gc, os, sys
from app import create_app
app = create_app()
import ledger.web.gunicorn_conf as conf
if sys.argv[1] == "hook":
    conf.pre_fork(None, None)
def private_dirty_kib():
    with open("/proc/self/smaps_rollup") as smaps:
        return next(int(line.split()[1]) for line in smaps if line.startswith("Private_Dirty:"))
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    before = private_dirty_kib()
    gc.collect()
    os.write(write, str(private_dirty_kib() - before).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(read, 64).decode())
"""


def _copied_kib(tmp_path: Path, mode: str) -> int:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'l.sqlite3'}",
           "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
           "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"), "LEDGER_LOG_LEVEL": "WARNING"}
    done = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_full_collection_in_a_worker_copies_none_of_the_preloaded_app(tmp_path: Path) -> None:
    without = _copied_kib(tmp_path, "none")
    frozen = _copied_kib(tmp_path, "hook")
    # Unfrozen, the collection writes the GC header of every shared object: tens of MB
    # copied (34 MB measured), and as long on the GIL. Frozen, next to nothing.
    assert without > 8 * 1024, without
    assert frozen < without / 8, (frozen, without)
