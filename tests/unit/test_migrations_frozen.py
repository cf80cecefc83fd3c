"""Migrations never import live code: what they need is copied as of their revision."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

VERSIONS = Path(__file__).resolve().parents[2] / "ledger" / "db" / "migrations" / "versions"
# The column type every table is declared with; it stores what the schema stores.
ALLOWED = {"ledger.db.schema.UTCDateTime"}


@pytest.mark.parametrize("path", sorted(VERSIONS.glob("*.py")), ids=lambda p: p.stem)
def test_a_migration_imports_no_live_code(path: Path) -> None:
    imported = {f"{node.module}.{alias.name}"
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ledger")
                for alias in node.names}
    imported |= {alias.name for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Import) for alias in node.names
                 if alias.name.startswith("ledger")}
    assert imported <= ALLOWED, f"{path.name} imports {sorted(imported - ALLOWED)}"
