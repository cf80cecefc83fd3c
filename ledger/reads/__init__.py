"""Read-side SQL for the dashboard and the JSON API (keyset pages, no OFFSET, bounded counts).

Every list is a keyset page shaped to an index that already exists:
- receipts by time: the btree on accepted_at, read backwards in growing time windows;
- pending and failed receipts: the partial index (state, accepted_at) WHERE state <> 1;
- receipts by event id prefix: the primary key (scope_id, event_id);
- conflicts by last_seen, audit rows by id, work items by run_at (partial index on queued ones).
"""

from __future__ import annotations

from ledger.reads.cursor import BadCursor, Page, decode_cursor, encode_cursor

__all__ = ["BadCursor", "Page", "decode_cursor", "encode_cursor"]
