"""MkDocs hook: write the reference pages from the code, and fit optional pages into the nav.

Generated at every build, never stored: docs/reference/settings.md (ledger.config's
declarations), cli.md (each command's --help), http-api.md (ledger.web.openapi.document()),
metrics.md (ledger.metrics and the scrape-time gauges), profiles.md (the sender profiles'
declarations). So a reference page cannot drift from the code it describes.

The nav in mkdocs.yml may name pages that other changes add (OPTIONAL_PAGES); while such
a page is absent its entry is dropped. Every docs/senders/<profile>.md is listed under
"Senders" by name. Strict builds still fail on a broken link or a page left out of the nav.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from mkdocs.structure.files import File, Files

OPTIONAL_PAGES = frozenset({
    "how-to/handlers.md", "how-to/audit-anchor.md", "how-to/on-call.md",
    "how-to/destinations.md", "explanation/security.md", "explanation/signed-content.md",
})
SENDERS_SECTION = "Senders"


def _prune(nav: list[Any], docs_dir: Path) -> list[Any]:
    """Return the nav without the optional pages that do not exist (yet)."""
    kept: list[Any] = []
    for entry in nav:
        target = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(target, list):
            kept.append({next(iter(entry)): _prune(target, docs_dir)})
        elif target in OPTIONAL_PAGES and not (docs_dir / target).exists():
            continue
        else:
            kept.append(entry)
    return kept


def _add_senders(nav: list[Any], docs_dir: Path) -> None:
    """List every docs/senders/<profile>.md under the Senders section, by file name."""
    pages = sorted(p for p in (docs_dir / "senders").glob("*.md") if p.name != "index.md")
    for entry in nav:
        if isinstance(entry, dict) and SENDERS_SECTION in entry:
            section = entry[SENDERS_SECTION]
            listed = {next(iter(e.values())) if isinstance(e, dict) else e for e in section}
            section += [f"senders/{p.name}" for p in pages if f"senders/{p.name}" not in listed]


def on_config(config: Any) -> Any:
    """Fit the optional pages and the senders' pages into the nav."""
    docs_dir = Path(config["docs_dir"])
    config["nav"] = _prune(config["nav"], docs_dir)
    _add_senders(config["nav"], docs_dir)
    return config


def on_files(files: Files, config: Any) -> Files:
    """Add the generated reference pages to the build."""
    pages = {"reference/settings.md": settings_page, "reference/cli.md": cli_page,
             "reference/http-api.md": http_api_page, "reference/metrics.md": metrics_page,
             "reference/profiles.md": profiles_page}
    for path, render in pages.items():
        files.append(File.generated(config, path, content=render()))
    return files


def settings_page() -> str:
    """Return the settings reference (ledger/config.py's declarations)."""
    from ledger.config_render import reference_markdown

    return reference_markdown()


def _commands(group: click.Group, prefix: str) -> list[tuple[str, click.Command]]:
    """Return every command under `group` with its full name, depth first, sorted."""
    found: list[tuple[str, click.Command]] = []
    context = click.Context(group)
    for name in group.list_commands(context):  # loads each lazily listed command
        command = group.get_command(context, name)
        if command is None:
            continue
        full = f"{prefix} {name}"
        found.append((full, command))
        if isinstance(command, click.Group):
            found += _commands(command, full)
    return found


def cli_page() -> str:
    """Return the command-line reference: each command's --help, as `ledger` prints it."""
    from ledger.cli import ledger_cli

    lines = ["# Command line", "",
             "Every `ledger` command's `--help`, generated from the commands themselves. The",
             "same group answers as `flask --app app ledger`. `--json` prints one JSON object",
             "on stdout and nothing else there; exit 0 on success, 1 on a refused action or a",
             "missing record, 2 on a usage error or a refused setting.", ""]
    everything = [("ledger", ledger_cli), *_commands(ledger_cli, "ledger")]
    for full, command in everything:
        context = click.Context(command, info_name=full, terminal_width=88,
                                max_content_width=88)
        lines += [f"## `{full}`", "", "```text", command.get_help(context), "```", ""]
    return "\n".join(lines)


def _schema_text(schema: dict[str, Any]) -> str:
    """Return a response schema as compact JSON for a table cell."""
    return json.dumps(schema, separators=(", ", ": "))


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    """Return one operation's section: summary, parameters, responses."""
    lines = [f"### `{method.upper()} {path}`", "", op.get("summary", ""), ""]
    if op.get("description"):
        lines += [op["description"], ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | meaning |", "|---|---|---|"]
        lines += [f"| `{p['name']}` | {p['in']} | {p.get('description', '')} |"
                  for p in params]
        lines.append("")
    lines += ["| status | meaning |", "|---|---|"]
    for status, answer in op.get("responses", {}).items():
        lines.append(f"| {status} | {answer.get('description', '')} |")
    lines.append("")
    for status, answer in op.get("responses", {}).items():
        schema = answer.get("content", {}).get("application/json", {}).get("schema")
        if schema:
            lines += [f"??? note \"{status} body schema\"", "",
                      "    ```json", "    " + _schema_text(schema), "    ```", ""]
    return lines


def http_api_page() -> str:
    """Return the HTTP reference, generated from the OpenAPI document the server serves."""
    from ledger.web.openapi import document

    doc = document()
    lines = ["# HTTP API", "",
             "Generated from the OpenAPI document the server answers at `GET /openapi.json`",
             "(`ledger/web/openapi.py`; `tests/integration/test_schemathesis.py` checks live",
             "answers against it). `/api/v1` takes a signed-in session or",
             "`Authorization: Bearer <token>` from `ledger operator token`. Every answer carries",
             "`X-Request-Id`. Times are ISO 8601 UTC; pages pass `next_cursor` back as `cursor`.",
             ""]
    groups = {"Intake": [], "Operations": [], "Read API": []}  # type: dict[str, list[str]]
    for path, methods in doc["paths"].items():
        group = ("Intake" if path.startswith("/hooks") else
                 "Read API" if path.startswith("/api/") else "Operations")
        for method, op in methods.items():
            groups[group] += _operation(path, method, op)
    for group, body in groups.items():
        lines += [f"## {group}", "", *body]
    return "\n".join(lines)


def metrics_page() -> str:
    """Return every metric: the process registry's and the gauges read at scrape time."""
    from prometheus_client.metrics import MetricWrapperBase

    import ledger.metrics as process_metrics
    from ledger.metrics.export import STATE_GAUGES

    lines = ["# Metrics", "",
             "Generated from `ledger/metrics/__init__.py` (counted by each process, summed over",
             "the processes sharing `PROMETHEUS_MULTIPROC_DIR`) and the gauges",
             "`ledger/metrics/export.py` reads from the database at each scrape of",
             "`GET /metrics` (the same whichever process answers).", "",
             "| metric | type | labels | meaning |", "|---|---|---|---|"]
    for value in vars(process_metrics).values():
        if isinstance(value, MetricWrapperBase):
            # why: prometheus-client keeps the name, type and help on private attributes.
            name, kind = value._name, value._type
            suffix = "_total" if kind == "counter" else ""
            labels = ", ".join(value._labelnames) or "—"
            lines.append(f"| `{name}{suffix}` | {kind} | {labels} | "
                         f"{value._documentation} |")
    for name, (meaning, labels) in STATE_GAUGES.items():
        lines.append(f"| `{name}` | gauge (read at scrape) | {', '.join(labels) or '—'} | "
                     f"{meaning} |")
    return "\n".join(lines) + "\n"


def profiles_page() -> str:
    """Return every sender profile from its card (ledger/intake/signatures/catalog.py)."""
    from ledger.intake.signatures.catalog import cards

    lines = ["# Sender profiles", "",
             "Generated from each profile's declaration, through the same cards that",
             "`ledger integration create --help` and the dashboard's *Connect a sender* show.",
             "*Unsigned id*: the signature does not cover the event id, so the body-digest",
             "guard applies (the same body under another id is a duplicate). *Freshness*: a",
             "signed timestamp checked against the integration's tolerance (default 300 s).",
             "How to connect each sender: [Senders](../senders/index.md).", "",
             "| profile | the signature covers | event id | event type | freshness |",
             "|---|---|---|---|---|"]
    for found in cards():
        cells = [f"`{found.name}`", found.covers, found.event_id, found.event_type,
                 found.freshness]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"
