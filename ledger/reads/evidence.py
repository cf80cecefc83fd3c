"""Evidence for a conflict: the kept conflicting body against the original payload."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from ledger.db.schema import conflict_bodies, conflicts, jobs, receipts
from ledger.domain import ReceiptState
from ledger.errors import NotFound
from ledger.reads.models import ListedConflict
from ledger.reads.receipts import conflict_item, payload_value, pretty_payload, scope_names

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

    conflict: ListedConflict
    original_retained: bool
    incoming_retained: bool
    changes: list[Change] | None  # None unless both bodies are retained
    truncated: bool
    # What the ledger still knows of the original receipt: digest, times, state, result
    # (None once the retention purge expired it).
    original: dict[str, Any] | None = None
    # "job" (its work item: not yet completed), "forensic window"
    # (LEDGER_CONFLICT_BODY_SECONDS) or None.
    original_source: str | None = None
    incoming_body: str | None = None  # pretty-printed, for the roles that see payloads


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
    original, source = _original_body(conn, row.scope_id, row.original_event_id)
    scope, public_id = scope_names(conn, {row.scope_id}).get(row.scope_id,
                                                             (str(row.scope_id), ""))
    item = ListedConflict(**conflict_item(row), scope=scope, integration=public_id)
    changes = truncated = None
    if original is not None and row.incoming_body is not None:
        changes = json_diff(payload_value(original), payload_value(row.incoming_body))
        truncated = len(changes) > DIFF_LIMIT
        changes = changes[:DIFF_LIMIT]
    return ConflictEvidence(conflict=item, original_retained=original is not None,
                            incoming_retained=row.incoming_body is not None,
                            changes=changes, truncated=bool(truncated),
                            original=_original_facts(conn, row.scope_id, row.original_event_id),
                            original_source=source,
                            incoming_body=None if row.incoming_body is None
                            else pretty_payload(row.incoming_body))


def _original_body(conn: Connection, scope_id: int, event_id: str) -> tuple[str | None, str | None]:
    """Return the original's body and where it was found: its work item, or the forensic window."""
    body = conn.execute(select(jobs.c.payload).where(
        jobs.c.scope_id == scope_id, jobs.c.event_id == event_id)).scalar()
    if body is not None:
        return body, "job"
    kept = conn.execute(select(conflict_bodies.c.body).where(
        conflict_bodies.c.scope_id == scope_id, conflict_bodies.c.event_id == event_id)).scalar()
    return (kept, "forensic window") if kept is not None else (None, None)


def _original_facts(conn: Connection, scope_id: int, event_id: str) -> dict[str, Any] | None:
    """Return the original receipt's digest, times, state and result (primary-key probe)."""
    row = conn.execute(select(
        receipts.c.body_sha256, receipts.c.accepted_at, receipts.c.completed_at,
        receipts.c.state, receipts.c.result_ref).where(
        receipts.c.scope_id == scope_id, receipts.c.event_id == event_id)).first()
    if row is None:
        return None
    return {"body_sha256": bytes(row.body_sha256).hex(), "accepted_at": row.accepted_at,
            "completed_at": row.completed_at, "result_ref": row.result_ref,
            "state": ReceiptState.from_code(row.state).value}
