"""Migration 0004_profiles: adds the profile settings columns and takes them away again."""

from __future__ import annotations

from alembic import command
from sqlalchemy import create_engine, inspect

from ledger.db.engine import alembic_config

COLUMNS = {"type_path", "fixed_event_type", "endpoint_url", "hmac_options"}


def _columns(engine) -> set[str]:  # type: ignore[no-untyped-def]
    return {c["name"] for c in inspect(engine).get_columns("integrations")}


def test_profiles_migration_downgrades_and_upgrades(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        assert _columns(engine) >= COLUMNS  # the template is at head
        cfg = alembic_config()
        for target, present in (("0001", False), ("head", True)):
            with engine.begin() as conn:
                cfg.attributes["connection"] = conn
                (command.downgrade if target == "0001" else command.upgrade)(cfg, target)
            assert (_columns(engine) >= COLUMNS) is present
            assert (COLUMNS & _columns(engine) == set()) is not present
    finally:
        engine.dispose()
