"""A private Citus cluster (a coordinator and worker nodes) from the installed binaries.

Each node is a PrivateCluster on its own loopback port with Citus preloaded; the
shared server at 5432 is never touched. Citus itself is not packaged for this
machine's PostgreSQL: `citus_missing()` says why a cluster cannot be made, and
the tests that need one skip with that reason (README, "Scaling past one database").
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine, text

from tests.integration.pg_cluster import PrivateCluster, _pg_version

DATABASE = "ledger"
NODE_SETTINGS = {
    "shared_preload_libraries": "citus",
    # Two-phase commits need prepared transactions on the workers.
    "max_prepared_transactions": "100",
    # Keep every two-phase commit's record in pg_dist_transaction (the coordinator
    # otherwise recovers and deletes them within a minute): the tests count them.
    "citus.recover_2pc_interval": "-1",
    # Loopback only: the nodes talk without TLS.
    "citus.node_conninfo": "sslmode=disable",
    "listen_addresses": "127.0.0.1",
}


# Reasons the Citus tests were skipped, printed in pytest's summary (tests/conftest.py).
LOUD_SKIPS: list[str] = []


def note_skip(reason: str) -> None:
    """Record a skip that pytest's summary must show, not only count."""
    if reason not in LOUD_SKIPS:
        LOUD_SKIPS.append(reason)


def citus_skip_reason() -> str | None:
    """The summary line of the Citus tests skipped on this machine, or None if they run."""
    missing = citus_missing()
    if missing is None:
        return None
    return f"tests/integration/test_citus.py: every test on a Citus cluster SKIPPED: {missing}"


def citus_missing() -> str | None:
    """Return why no Citus cluster can be started here, or None when one can."""
    version = _pg_version()
    if version is None:
        return "no PostgreSQL installation found"
    lib = Path(f"/usr/lib/postgresql/{version}/lib/citus.so")
    control = Path(f"/usr/share/postgresql/{version}/extension/citus.control")
    if not lib.exists() or not control.exists():
        return (f"the Citus extension is not installed for PostgreSQL {version} "
                f"({lib} / {control} missing): build a 13.x release of citusdata/citus "
                "against this PostgreSQL to run these tests")
    return None


class CitusCluster:
    """A coordinator and `workers` worker nodes, each with the `ledger` database and Citus."""

    def __init__(self, tmp: Path, workers: int = 2) -> None:
        self.coordinator = PrivateCluster(tmp / "coordinator", NODE_SETTINGS)
        self.workers = [PrivateCluster(tmp / f"worker{i}", NODE_SETTINGS)
                        for i in range(workers)]

    @property
    def nodes(self) -> list[PrivateCluster]:
        """Return every node, coordinator first."""
        return [self.coordinator, *self.workers]

    @property
    def url(self) -> str:
        """Return the URL of the ledger database on the coordinator (the app's DATABASE_URL)."""
        return self.coordinator.url(DATABASE)

    def start(self) -> None:
        """Create and start every node, create the extension, register the workers."""
        for node in self.nodes:
            node.create()
            node.start()
            _execute(node.admin_url, f'CREATE DATABASE "{DATABASE}"')
            _execute(node.url(DATABASE), "CREATE EXTENSION citus")
        _execute(self.url, f"SELECT citus_set_coordinator_host('127.0.0.1', "
                           f"{self.coordinator.port})")
        for worker in self.workers:
            _execute(self.url, f"SELECT citus_add_node('127.0.0.1', {worker.port})")

    def drop(self) -> None:
        """Stop and delete every node (best effort)."""
        for node in self.nodes:
            node.drop()


def _execute(url: str, sql: str) -> None:
    """Run one statement in autocommit."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
    finally:
        engine.dispose()
