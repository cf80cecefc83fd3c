"""The import graph: nothing imported by the scheduler imports it back (no cycle through it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path) -> str:
    """Return the installed name of a source file (jobs/ is installed as ledger.jobs)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "jobs":
        parts = ["ledger", *parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    """Return each ledger module's imports of other ledger modules, at any depth."""
    files = [p for base in ("ledger", "jobs") for p in (ROOT / base).rglob("*.py")
             if not p.is_symlink() and "migrations" not in p.parts]
    modules = {_module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Return every module `start` imports, directly or not."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return seen


def test_the_graph_is_found() -> None:
    graph = _graph()
    assert "ledger.scheduling.runner" in graph and "ledger.jobs.rollup_band" in graph


def test_no_import_cycle_runs_through_the_scheduler() -> None:
    graph = _graph()
    looped = sorted(name for name in graph if name.startswith("ledger.scheduling")
                    and name in _reaches(graph, name))
    assert looped == [], f"import cycles through {looped}"


def test_the_scheduler_never_imports_the_jobs_it_runs() -> None:
    graph = _graph()
    for name in (n for n in graph if n.startswith("ledger.scheduling")):
        assert not {t for t in _reaches(graph, name) if t.startswith("ledger.jobs")}, name
