"""A private PgBouncer in transaction mode in front of the shared PostgreSQL.

It listens on a free loopback port with its own ini, userlist, log and pid file
in a temp dir, and serves any database name (`* = host=... port=...`), so each
test's database, created directly on the server, is reachable through it under
the same name. It never touches the server's configuration. As root it runs as
the `postgres` user (PgBouncer refuses to run as root).
"""

from __future__ import annotations

import configparser
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.servers import free_port

START_TIMEOUT = 15.0
SHIPPED_INI = Path(__file__).resolve().parents[2] / "deploy" / "pgbouncer.ini"
# The settings of the shipped ini that bound a client's wait: the tests run with them.
SHIPPED_BOUNDS = ("query_wait_timeout", "server_connect_timeout", "server_login_retry")


def shipped_bounds() -> dict[str, str]:
    """Return the client-wait bounds that deploy/pgbouncer.ini ships."""
    parser = configparser.ConfigParser()
    parser.read(SHIPPED_INI)
    return {name: parser["pgbouncer"][name] for name in SHIPPED_BOUNDS}


class PrivatePgBouncer:
    """One PgBouncer process; `stop()` ends it (by its pid) and removes its directory."""

    def __init__(self, server_url: str) -> None:
        server = make_url(server_url)
        # Its own directory right under the temp root: as root, PgBouncer runs as
        # `postgres`, which cannot enter pytest's root-only directories.
        self.tmp = Path(tempfile.mkdtemp(prefix="ledger-pgbouncer-"))
        self.port = free_port()
        self.server_host = server.host or "127.0.0.1"
        self.server_port = server.port or 5432
        self.user = server.username or "postgres"
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        """Return the URL of `database` through this PgBouncer."""
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def _write_config(self) -> Path:
        """Write the ini and userlist: transaction pooling, no reset query between clients.

        Debian's PgBouncer (1.18) does not track protocol-level prepared
        statements, so a client that prepares them breaks here, as it would in
        production; no `ignore_startup_parameters`, so startup options are refused.
        """
        (self.tmp / "userlist.txt").write_text(f'"{self.user}" ""\n')
        bounds = "\n".join(f"{name} = {value}" for name, value in shipped_bounds().items())
        ini = self.tmp / "pgbouncer.ini"
        ini.write_text(f"""[databases]
* = host={self.server_host} port={self.server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.tmp / "userlist.txt"}
pool_mode = transaction
default_pool_size = 40
max_client_conn = 400
server_reset_query =
server_check_delay = 0
logfile = {self.tmp / "pgbouncer.log"}
pidfile = {self.tmp / "pgbouncer.pid"}
admin_users = {self.user}
{bounds}
""")
        return ini

    def start(self) -> None:
        """Start PgBouncer and wait until it accepts connections; raise with its log."""
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise RuntimeError("pgbouncer is not installed (scripts/system-deps.sh installs it)")
        ini = self._write_config()
        command = [binary, str(ini)]
        if os.geteuid() == 0:
            shutil.chown(self.tmp, user="postgres")
            for path in self.tmp.iterdir():
                shutil.chown(path, user="postgres")
            command = [binary, "-u", "postgres", str(ini)]
        with (self.tmp / "stderr.log").open("wb") as stderr:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        self._wait_until_up()

    def _wait_until_up(self) -> None:
        """Poll until a query passes through PgBouncer, failing fast if it exited."""
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.process.returncode}: "
                                   f"{self._output()}")
            try:
                with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user,
                                     dbname="postgres", connect_timeout=2,
                                     prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.Error as error:
                last = error
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"pgbouncer did not accept connections in {START_TIMEOUT}s: "
                           f"{last}; {self._output()}")

    def _output(self) -> str:
        """Return the tail of PgBouncer's log (and stderr) for an error message."""
        text = ""
        log = self.tmp / "pgbouncer.log"
        if log.exists():
            text = log.read_text(errors="replace")[-2000:]
        stderr = self.tmp / "stderr.log"
        if stderr.exists():
            text += stderr.read_text(errors="replace")[-2000:]
        return text

    def stop(self) -> None:
        """Stop the process this object started (SIGINT: immediate shutdown)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)
