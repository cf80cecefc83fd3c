"""A private pg_auto_failover formation: a monitor, a primary and a synchronous standby.

Debian's `pg_autoctl` (packages pg-auto-failover-cli and postgresql-NN-auto-failover,
installed by scripts/system-deps.sh) runs each node on a free loopback port with
trust auth, everything (data, config, logs) in one temp dir, never touching the
shared server. Each node runs in its own session, so `kill_primary()` can take
the whole primary down with SIGKILL, keeper and postmaster alike, as a lost host
would be. The monitor's health checks are tightened so a failover takes seconds,
not the default half-minute. As root every process runs as `postgres`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.integration.pg_cluster import _pg_version
from tests.servers import free_port

TIMEOUT = 90.0  # seconds: the bound of every wait here
# Monitor settings (milliseconds): check every second, give up on a node after ~2 s.
FAST_HEALTH_CHECKS = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 2000,
    "pgautofailover.primary_demote_timeout": 3000,
}


def available() -> str | None:
    """Return None when pg_autoctl and its extension are installed, else what is missing."""
    version = _pg_version()
    if shutil.which("pg_autoctl") is None:
        return "pg_autoctl is not installed"
    if version is None or not Path(f"/usr/lib/postgresql/{version}/lib/pgautofailover.so"
                                   ).exists():
        return f"the pgautofailover extension for PostgreSQL {version} is not installed"
    return None


def _text(value: object) -> str:
    """Return a text value: pg_autoctl's clusters are SQL_ASCII, whose text comes as bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Formation:
    """Monitor + two data nodes; `drop()` stops every process it started and removes the dir."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ledger-failover-"))
        self.monitor_port, self.ports = free_port(), [free_port(), free_port()]
        self._bin = f"/usr/lib/postgresql/{_pg_version()}/bin"
        self._root = os.geteuid() == 0
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        if self._root:
            shutil.chown(self.dir, user="postgres")

    @property
    def monitor_uri(self) -> str:
        """Return the monitor's URI as the nodes use it."""
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover"

    def url(self, database: str) -> str:
        """Return the ledger's multi-host URL: whichever node is the writer."""
        hosts = "&".join(f"host=127.0.0.1:{port}" for port in self.ports)
        return (f"postgresql+psycopg://postgres@/{database}?{hosts}"
                "&target_session_attrs=read-write")

    def start(self) -> None:
        """Start the monitor, then the primary, then the standby; wait until replicating."""
        self._spawn("monitor", "monitor", self.monitor_port)
        self._wait(lambda: self._query(self.monitor_port, "pg_auto_failover", "SELECT 1"),
                   "the monitor")
        settings = [f"ALTER SYSTEM SET {k} = {v}" for k, v in FAST_HEALTH_CHECKS.items()]
        self._query(self.monitor_port, "pg_auto_failover", *settings, "SELECT pg_reload_conf()")
        self._spawn("node1", "postgres", self.ports[0])
        self._wait(lambda: self._states() == ["single"], "the primary")
        self._spawn("node2", "postgres", self.ports[1])
        self._wait(lambda: self._states() == ["primary", "secondary"], "the standby")

    def primary_port(self) -> int:
        """Return the port of the node that accepts writes now."""
        for port in self.ports:
            if self._query(port, "postgres", "SELECT NOT pg_is_in_recovery()") == [(True,)]:
                return port
        raise RuntimeError("no node accepts writes")

    def sync_standby_names(self) -> str:
        """Return synchronous_standby_names on the primary."""
        return _text(self._query(self.primary_port(), "postgres",
                                 "SHOW synchronous_standby_names")[0][0])

    def kill_primary(self) -> int:
        """SIGKILL the primary's keeper and PostgreSQL (its whole session); return its port."""
        port = self.primary_port()
        name = f"node{self.ports.index(port) + 1}"
        os.killpg(self._processes[name].pid, signal.SIGKILL)
        self._processes[name].wait(timeout=TIMEOUT)
        return port

    def _spawn(self, name: str, kind: str, port: int) -> None:
        """Start `pg_autoctl create <kind> ... --run` in a session of its own."""
        env = {"PATH": f"{self._bin}:{os.environ.get('PATH', '')}",
               "XDG_CONFIG_HOME": str(self.dir / "config"),
               "XDG_DATA_HOME": str(self.dir / "share"), "HOME": str(self.dir)}
        command = ["pg_autoctl", "create", kind, "--pgdata", str(self.dir / name), "--pgport",
                   str(port), "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl",
                   "--run"]
        if kind == "postgres":
            command[-1:-1] = ["--monitor", self.monitor_uri]
        if self._root:
            command = ["runuser", "-u", "postgres", "--", *command]
        with (self.dir / f"{name}.log").open("wb") as log:
            self._processes[name] = subprocess.Popen(
                command, cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def _states(self) -> list[str]:
        """Return the reported states of the data nodes (from the monitor), sorted."""
        rows = self._query(self.monitor_port, "pg_auto_failover",
                           "SELECT reportedstate::text FROM pgautofailover.node")
        return sorted(_text(r[0]) for r in rows)

    def _query(self, port: int, database: str, *statements: str) -> list[tuple[object, ...]]:
        """Run statements on one node in autocommit; [] when it does not answer."""
        try:
            with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname=database,
                                 connect_timeout=2, autocommit=True) as conn:
                rows: list[tuple[object, ...]] = []
                for statement in statements:
                    cursor = conn.execute(statement)
                    rows = list(cursor.fetchall()) if cursor.description else []
                return rows
        except psycopg.Error:
            return []

    def _wait(self, predicate, what: str) -> None:  # type: ignore[no-untyped-def]
        """Poll until `predicate()` holds; fail with the logs' tails after TIMEOUT."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            for name, process in self._processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"pg_autoctl {name} exited: {self._logs()}")
            if predicate():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}: {self._logs()}")

    def _logs(self) -> str:
        """Return the last lines of every node's log."""
        return " | ".join(f"{p.stem}: " + " / ".join(
            p.read_text(errors="replace").splitlines()[-3:]) for p in self.dir.glob("*.log"))

    def drop(self) -> None:
        """Stop every session this formation started (TERM, then KILL), remove the dir."""
        for process in self._processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=20)
            with contextlib.suppress(ProcessLookupError):  # postmasters that outlived it
                os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)
