"""The audit page's rows as an operator reads them: detail shown, noise grouped.

A bulk requeue writes one row per receipt and each drill run some fifty rows for its
sandbox: consecutive rows of one kind are shown as one group (expandable), so the
two revocations of an incident stay in sight. Grouping never hides a row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

SANDBOX_ROLE = "sandbox"  # the drill's actor (ledger/drill/sandbox.py)
DETAIL_SHOWN = 300


def _kind(row: Mapping[str, Any]) -> tuple[str, ...]:
    """Return what makes consecutive rows one group."""
    if row["role"] == SANDBOX_ROLE:
        return ("sandbox", row["actor"])
    return (row["actor"], row["action"], row.get("reason") or "")


def _with_detail(row: Mapping[str, Any]) -> dict[str, Any]:
    """Add the parsed detail: the client address apart, the rest as short text."""
    try:
        detail = json.loads(row.get("detail") or "{}")
    except ValueError:
        detail = {"detail": row.get("detail")}
    client = detail.pop("client", None) if isinstance(detail, dict) else None
    text = json.dumps(detail, sort_keys=True, ensure_ascii=False) if detail else ""
    if len(text) > DETAIL_SHOWN:
        text = text[:DETAIL_SHOWN] + "…"
    return dict(row, client=client, detail_text=text)


def grouped(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return groups of consecutive rows of one kind: {"rows", "label"}, in page order."""
    groups: list[dict[str, Any]] = []
    for row in map(_with_detail, items):
        if groups and _kind(groups[-1]["rows"][-1]) == _kind(row):
            groups[-1]["rows"].append(row)
            continue
        groups.append({"rows": [row]})
    for group in groups:
        first = group["rows"][0]
        group["label"] = (f"drill sandbox: {len(group['rows'])} rows"
                          if first["role"] == SANDBOX_ROLE
                          else f"{first['action']}: {len(group['rows'])} rows")
    return groups
