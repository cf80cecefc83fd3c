"""The shared test helpers stay shared: each is defined in one test module only.

A copy of `send` or a `live` server fixture in a second module drifts from the first
(different defaults, a forgotten status check); the copies are imported instead, from
tests/helpers.py, tests/servers.py or a conftest.py.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SHARED = ("_send", "send", "live", "WAIT")


def _module_level_names(tree: ast.Module) -> set[str]:
    """Return the names a module defines at its top level: functions, fixtures, constants."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def definitions(root: Path) -> dict[str, list[str]]:
    """Return, for each shared helper name, the test modules under `root` that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        defined = _module_level_names(ast.parse(path.read_text(encoding="utf-8")))
        for name in SHARED:
            if name in defined:
                found[name].append(str(path.relative_to(root)))
    return found


def test_each_shared_helper_is_defined_in_one_test_module() -> None:
    twice = {name: where for name, where in definitions(TESTS).items() if len(where) > 1}
    assert not twice, f"defined in more than one test module (import the shared one): {twice}"


def test_the_scan_finds_a_second_definition(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("WAIT = 60\n\ndef send(app):\n    return app\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_b.py").write_text(
        "import pytest\n\nWAIT: int = 30\n\n@pytest.fixture\ndef live(app):\n    yield app\n\n"
        "def send(app):\n    return app\n")
    (tmp_path / "test_c.py").write_text("def test_x():\n    def send():\n        pass\n")
    assert definitions(tmp_path) == {"WAIT": ["sub/test_b.py", "test_a.py"],
                                     "send": ["sub/test_b.py", "test_a.py"],
                                     "live": ["sub/test_b.py"]}
