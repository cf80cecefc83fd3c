"""Evidence for a conflict: the kept conflicting body against the original payload."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from ledger.db.schema import conflicts, jobs
from ledger.errors import NotFound
from ledger.reads.receipts import conflict_item, payload_value, scope_names

# A diff longer than this is cut (and said so): a page of 10,000 changed paths helps no one.
DIFF_LIMIT = 500
# Values in the diff are shown up to this many characters.
VALUE_LIMIT = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One structural difference: `op` is added, removed or changed, at a JSON path."""

    op: str
    path: str
    old: str | None = None
    new: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConflictEvidence:
    """A conflict row with what is still retained of both bodies, and their diff."""

    conflict: dict[str, Any]
    original_retained: bool
    incoming_retained: bool
    changes: list[Change] | None  # None unless both bodies are retained
    truncated: bool


def _shown(value: Any) -> str:
    """Return a compact JSON rendering of a value, cut to VALUE_LIMIT characters."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= VALUE_LIMIT else text[:VALUE_LIMIT] + "…"


def _key_path(path: str, key: str) -> str:
    """Append an object key to a JSON path ($.a.b, or $["odd key"])."""
    simple = key.isidentifier()
    return f"{path}.{key}" if simple else f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def json_diff(old: Any, new: Any, path: str = "$", out: list[Change] | None = None,
              limit: int = DIFF_LIMIT) -> list[Change]:
    """Return the added, removed and changed paths from `old` to `new` (at most `limit` + 1)."""
    out = [] if out is None else out
    if len(out) > limit:
        return out
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            sub = _key_path(path, key)
            if key not in new:
                out.append(Change(op="removed", path=sub, old=_shown(old[key])))
            elif key not in old:
                out.append(Change(op="added", path=sub, new=_shown(new[key])))
            else:
                json_diff(old[key], new[key], sub, out, limit)
    elif isinstance(old, list) and isinstance(new, list):
        for index in range(max(len(old), len(new))):
            sub = f"{path}[{index}]"
            if index >= len(new):
                out.append(Change(op="removed", path=sub, old=_shown(old[index])))
            elif index >= len(old):
                out.append(Change(op="added", path=sub, new=_shown(new[index])))
            else:
                json_diff(old[index], new[index], sub, out, limit)
    elif type(old) is not type(new) or old != new:
        out.append(Change(op="changed", path=path, old=_shown(old), new=_shown(new)))
    return out


def read_conflict_evidence(conn: Connection, conflict_id: int) -> ConflictEvidence:
    """Return a conflict and, while both bodies are retained, their structural diff."""
    row = conn.execute(select(conflicts).where(conflicts.c.id == conflict_id)).first()
    if row is None:
        raise NotFound("conflict", str(conflict_id))
    original = conn.execute(
        select(jobs.c.payload).where(jobs.c.scope_id == row.scope_id,
                                     jobs.c.event_id == row.original_event_id)).scalar()
    scope, public_id = scope_names(conn, {row.scope_id}).get(row.scope_id,
                                                             (str(row.scope_id), ""))
    item = {k: v for k, v in conflict_item(row).items() if k != "incoming_body"}
    item.update(scope=scope, integration=public_id)
    changes = truncated = None
    if original is not None and row.incoming_body is not None:
        changes = json_diff(payload_value(original), payload_value(row.incoming_body))
        truncated = len(changes) > DIFF_LIMIT
        changes = changes[:DIFF_LIMIT]
    return ConflictEvidence(conflict=item, original_retained=original is not None,
                            incoming_retained=row.incoming_body is not None,
                            changes=changes, truncated=bool(truncated))
