"""Acme's migrations: its own Alembic scripts and version table, beside the ledger's.

The ledger's schema is migrated by `ledger db upgrade` (version table
`alembic_version`); Acme's by `acme-handlers-migrate` (version table
`acme_alembic_version`). Each history moves on its own, in the same database.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine

VERSION_TABLE = "acme_alembic_version"


def alembic_config() -> Config:
    """Return the Alembic config of Acme's migrations (found inside the installed package)."""
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).resolve().parent / "migrations"))
    return config


def upgrade(engine: Engine) -> None:
    """Migrate Acme's tables in the database behind `engine` to the newest revision."""
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")


def main() -> None:
    """Migrate the database named by DATABASE_URL (as the ledger reads it)."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        sys.exit("acme-handlers-migrate: set DATABASE_URL (the ledger's database)")
    engine = create_engine(url)
    try:
        upgrade(engine)
    finally:
        engine.dispose()
    print("acme tables migrated")
