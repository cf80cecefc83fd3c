"""Citus: the distributed layout (`ledger db distribute`) and how the ledger sees it.

The ledger tables are distributed by `scope_id` and co-located, so the rows of one
scope (receipt, work item, attempts, conflicts, unsigned bodies, demo balance) live in
one shard group on one node; every other table is a reference table, copied to
every node. A statement that names one scope with `scope_id = :value` is then
routed to that one node; the intake's claim, the worker's claim and the purge
are written so (README, "Scaling past one database").

Whether a database is laid out so is read from Citus's own catalog, once per
engine for the hot paths (`distributed`) and afresh by `layout` for commands
and scheduled jobs: a process started before `ledger db distribute` keeps its
first answer until restarted.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text

from ledger.db.schema import metadata
from ledger.errors import LedgerError

# Distributed by scope_id, co-located with the first.
DISTRIBUTED = ("receipts", "jobs", "attempts", "conflicts", "unsigned_bodies", "demo_balances",
               "failure_members", "failure_group_scopes", "conflict_bodies", "sender_tokens")
# Everything else is small, read by every node (integrations, credentials) or written
# rarely (operators, audit, scheduler bookkeeping, rollups): a reference table.
REFERENCE = tuple(sorted(name for name in metadata.tables if name not in DISTRIBUTED))

# The audit log's append-only triggers: Citus refuses triggers on distributed and
# reference tables unless told they are safe. They are: a statement trigger that
# only raises, it reads and writes nothing, and it fires on every placement.
_UNSAFE_TRIGGERS = ("audit_log",)


class CitusUnavailable(LedgerError):
    """The database has no Citus extension, so it cannot be distributed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LayoutMismatch(LedgerError):
    """A table is distributed in a way the ledger does not expect (or only some are)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """How each ledger table is laid out: 'distributed', 'reference' or None (local)."""

    tables: dict[str, str | None]

    @property
    def distributed(self) -> bool:
        """Tell whether the ledger tables are distributed (the layout the code must follow)."""
        return self.tables.get("jobs") == "distributed"

    def problems(self) -> list[str]:
        """Return what differs from `ledger db distribute`'s layout (none when local)."""
        if all(kind is None for kind in self.tables.values()):
            return []
        wrong = []
        for name in DISTRIBUTED:
            if self.tables.get(name) != "distributed":
                wrong.append(f"{name} is {self.tables.get(name) or 'local'}, "
                             "expected distributed by scope_id")
        for name in REFERENCE:
            if self.tables.get(name) != "reference":
                wrong.append(f"{name} is {self.tables.get(name) or 'local'}, "
                             "expected a reference table")
        return wrong


def has_citus(conn: Connection) -> bool:
    """Tell whether the Citus extension is created in this database."""
    if conn.dialect.name != "postgresql":
        return False
    return bool(conn.execute(text(
        "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")).scalar_one())


# Hash-distributed on scope_id, or a reference table ('n'); anything else is unexpected.
_LAYOUT = text("""
SELECT c.relname AS name, p.partmethod AS method,
       CASE WHEN p.partmethod = 'h'
            THEN column_to_column_name(p.logicalrelid, p.partkey) END AS column,
       p.colocationid AS colocation
FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema()
""")


def layout(conn: Connection) -> Layout:
    """Read the layout of every ledger table from Citus's catalog (all local without Citus)."""
    tables: dict[str, str | None] = dict.fromkeys(metadata.tables)
    if not has_citus(conn):
        return Layout(tables=tables)
    colocations = set()
    for row in conn.execute(_LAYOUT):
        if row.name not in tables:
            continue
        if row.method == "n":
            tables[row.name] = "reference"
        elif row.method == "h" and row.column == "scope_id":
            tables[row.name] = "distributed"
            colocations.add(row.colocation)
        else:
            tables[row.name] = f"distributed by {row.column or row.method}"
    if len(colocations) > 1:
        raise LayoutMismatch("the scope-keyed tables are not co-located: "
                             "one scope's rows would live on several nodes")
    return Layout(tables=tables)


_KNOWN: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def distributed(engine: Engine) -> bool:
    """Tell whether `engine`'s ledger tables are distributed; read once per engine (pool)."""
    if engine.dialect.name != "postgresql":
        return False
    key = engine.pool  # shared by engine.execution_options(...) copies
    known = _KNOWN.get(key)
    if known is None:
        with engine.connect() as conn:
            known = _KNOWN[key] = layout(conn).distributed
    return known


def use_scoped_statements(engine: Engine, on: bool = True) -> None:
    """Make `engine` run the statements written for a distributed layout (tests on PostgreSQL).

    They are correct on a plain PostgreSQL too: the tests run them there in CI,
    where Citus is not installed, and on a real cluster where it is.
    """
    _KNOWN[engine.pool] = on


def distribute(engine: Engine) -> dict[str, list[str]]:
    """Distribute the ledger tables by scope_id and make the rest reference tables.

    Idempotent: a table already laid out as wanted is left alone, so a run that
    stopped half way is finished by running it again. Each table is converted in
    a transaction of its own; its rows move to the shards and the coordinator's
    copy is emptied. Returns what was done per kind.
    """
    with engine.connect() as conn:
        if not has_citus(conn):
            raise CitusUnavailable(
                "the citus extension is not created in this database "
                "(CREATE EXTENSION citus, then add the worker nodes)")
        current = layout(conn).tables
    done: dict[str, list[str]] = {"distributed": [], "reference": [], "unchanged": []}
    for name in REFERENCE:
        _convert(engine, name, current[name], "reference", done)
    for name in DISTRIBUTED:
        _convert(engine, name, current[name], "distributed", done)
    with engine.connect() as conn:
        problems = layout(conn).problems()
    if problems:
        raise LayoutMismatch("; ".join(problems))
    _KNOWN.pop(engine.pool, None)
    return done


def _convert(engine: Engine, name: str, now: str | None, want: str,
             done: dict[str, list[str]]) -> None:
    """Make one table `want` ('distributed' or 'reference') unless it already is."""
    if now == want:
        done["unchanged"].append(name)
        return
    if now is not None:
        raise LayoutMismatch(f"{name} is already {now}, expected {want}: "
                             "undistribute it first (undistribute_table)")
    with engine.begin() as conn:
        if name in _UNSAFE_TRIGGERS:
            conn.execute(text("SET LOCAL citus.enable_unsafe_triggers = on"))
        if want == "reference":
            conn.execute(text("SELECT create_reference_table(:t)"), {"t": name})
        else:
            conn.execute(text(
                "SELECT create_distributed_table(:t, 'scope_id', colocate_with => :with)"),
                {"t": name, "with": "none" if name == DISTRIBUTED[0] else DISTRIBUTED[0]})
        if name not in _UNSAFE_TRIGGERS:  # the append-only trigger refuses a TRUNCATE
            # The rows were copied to the shards; the coordinator's shell keeps none.
            conn.execute(text("SELECT truncate_local_data_after_distributing_table(:t)"),
                         {"t": name})
    done[want].append(name)
