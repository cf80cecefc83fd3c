"""A private, throwaway PostgreSQL cluster that a test may stop and start.

The shared server at 127.0.0.1:5432 serves everyone's tests and is never
stopped. As root with the Debian wrappers, `pg_createcluster` makes a cluster
on a free port (trust auth, never started at boot) and `pg_ctlcluster` runs it
as the postgres user; otherwise `initdb` + `pg_ctl` run it from a temp dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from tests.servers import BIN, ROOT, free_port

TIMEOUT = 60  # seconds: the bound of every cluster command


def _pg_version() -> str | None:
    """Return the newest installed major version under /etc/postgresql or /usr/lib."""
    for base in (Path("/etc/postgresql"), Path("/usr/lib/postgresql")):
        versions = sorted((p.name for p in base.glob("*") if p.name.isdigit()), key=int)
        if versions:
            return versions[-1]
    return None


class PrivateCluster:
    """One throwaway cluster on a loopback port; `drop()` removes every trace."""

    def __init__(self, tmp: Path, settings: dict[str, str] | None = None) -> None:
        self.version = _pg_version()
        if self.version is None:
            raise RuntimeError("no PostgreSQL installation found")
        self.port = free_port()
        self.name = f"ledger_fault_{uuid.uuid4().hex[:8]}"
        self._debian = os.geteuid() == 0 and shutil.which("pg_createcluster") is not None
        self._datadir = tmp / "pgdata"
        self._bin = Path(f"/usr/lib/postgresql/{self.version}/bin")
        self._log = tmp / "pg.log"
        self._settings = dict(settings or {})  # postgresql.conf lines (e.g. preload libraries)
        self._runner: list[str] = []  # runs pg_ctl as another user (a standby made as root)
        self._home: Path | None = None  # a directory of the standby's own, removed by drop()

    @property
    def admin_url(self) -> str:
        """Return the URL of the cluster's `postgres` database."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        """Return the URL of one database in this cluster."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create(self) -> None:
        """Initialise the cluster (not started)."""
        if self._debian:
            self._run("pg_createcluster", self.version, self.name, "--port", str(self.port),
                      "--start-conf", "manual", "--", "--auth=trust")
            conf = Path(f"/etc/postgresql/{self.version}/{self.name}/postgresql.conf")
        else:
            self._run(str(self._bin / "initdb"), "-D", str(self._datadir), "-U", "postgres",
                      "--auth=trust")
            conf = self._datadir / "postgresql.conf"
        with conf.open("a") as lines:
            lines.writelines(f"{name} = '{value}'\n" for name, value in self._settings.items())

    def create_standby(self, primary: PrivateCluster) -> None:
        """Make this cluster a streaming standby of `primary` (running); not started.

        No initdb: `pg_basebackup -R` copies the primary's data and writes standby.signal
        and primary_conninfo, so the server streams from the primary once started. It runs
        with pg_ctl from a directory of its own (as the postgres user when root).
        """
        self._debian = False
        if os.geteuid() == 0:
            self._runner = ["runuser", "-u", "postgres", "--"]
            home = Path(tempfile.mkdtemp(prefix="ledger-standby-"))
            shutil.chown(home, user="postgres")
            self._home, self._datadir, self._log = home, home / "pgdata", home / "pg.log"
        self._run(*self._runner, str(self._bin / "pg_basebackup"), "-D", str(self._datadir),
                  "-R", "-X", "stream", "-c", "fast", "-h", "127.0.0.1", "-p",
                  str(primary.port), "-U", "postgres")
        # A Debian primary keeps its configuration outside the data directory.
        (self._datadir / "postgresql.conf").write_text(
            "".join(f"{name} = '{value}'\n" for name, value in self._settings.items()))
        (self._datadir / "pg_hba.conf").write_text("local all all trust\n"
                                                   "host all all 127.0.0.1/32 trust\n")
        (self._datadir / "pg_ident.conf").write_text("")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        if self._debian:
            self._run("pg_ctlcluster", self.version, self.name, "start")
        else:
            self._run(*self._runner, str(self._bin / "pg_ctl"), "-D", str(self._datadir), "-l",
                      str(self._log),
                      "-w", "-o", f"-p {self.port} -k {self._datadir} -h 127.0.0.1", "start")

    def stop(self) -> None:
        """Stop the server (fast shutdown: open connections are cut)."""
        if self._debian:
            self._run("pg_ctlcluster", "--mode", "fast", self.version, self.name, "stop")
        else:
            self._run(*self._runner, str(self._bin / "pg_ctl"), "-D", str(self._datadir), "-m",
                      "fast", "-w", "stop")

    def drop(self) -> None:
        """Stop and delete the cluster (best effort, for finally blocks)."""
        if self._debian:
            subprocess.run(["pg_dropcluster", "--stop", self.version, self.name],
                           capture_output=True, timeout=TIMEOUT, check=False)
        else:
            subprocess.run([*self._runner, str(self._bin / "pg_ctl"), "-D", str(self._datadir),
                            "-m", "immediate", "-w", "stop"], capture_output=True,
                           timeout=TIMEOUT, check=False)
            shutil.rmtree(self._datadir, ignore_errors=True)
            if self._home is not None:
                shutil.rmtree(self._home, ignore_errors=True)

    def _run(self, *args: str) -> None:
        """Run one cluster command; raise with its output on failure."""
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=TIMEOUT,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stdout}{done.stderr}")


def ledger_env(url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """Environment of ledger processes on `url` (demo handlers on, quiet logs)."""
    from tests.conftest import TEST_MASTER_KEY

    return {"DATABASE_URL": url, "LEDGER_MASTER_KEY": TEST_MASTER_KEY,
            "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_SECRET_KEY": "cluster-tests",
            "LEDGER_DEMO_HANDLERS": "1", "LEDGER_LOG_LEVEL": "WARNING", **extra}


def migrate(env: dict[str, str]) -> None:
    """Run `ledger db upgrade` on the environment's database, as an operator would."""
    done = subprocess.run([str(BIN / "ledger"), "db", "upgrade"], cwd=str(ROOT),
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
