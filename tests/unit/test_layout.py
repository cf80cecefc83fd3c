"""The house's rooms: inner rooms never import the outer ones (STYLE.md, "Our house")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTER = ("ledger.web", "ledger.cli")
# Only these rooms may import Flask or the outer rooms.
OUTER_DIRS = (ROOT / "ledger" / "web", ROOT / "ledger" / "cli")
INNER_FILES = sorted(
    p for p in [*(ROOT / "ledger").rglob("*.py"), *(ROOT / "jobs").rglob("*.py")]
    # ledger/app.py links to the outermost room, app.py; ledger/jobs to jobs/ (listed once).
    if not p.is_symlink() and not any(d in p.parents for d in OUTER_DIRS)
)


def _imports(path: Path) -> set[str]:
    """Return every module name the file imports, at any depth."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_inner_rooms_are_found() -> None:
    rooms = {p.relative_to(ROOT).parts[1] for p in INNER_FILES if len(p.parts) > 1}
    assert {"intake", "worker", "scheduling", "access", "reads", "db", "metrics"} <= rooms


@pytest.mark.parametrize("path", INNER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_inner_module_imports_flask_or_the_outer_rooms(path: Path) -> None:
    bad = sorted(name for name in _imports(path)
                 if name == "flask" or name.startswith(("flask.", *OUTER)))
    assert bad == [], f"{path.relative_to(ROOT)} imports {bad}"
