"""PostgreSQL advisory lock keys: one stable 64-bit key per name, the same on every host."""

from __future__ import annotations

import hashlib


def advisory_key(job: str) -> int:
    """Return the job's 64-bit advisory lock key (stable across processes and hosts)."""
    # The prefix names the module that first owned the key: changing it would let old and
    # new processes of a rolling deploy take different locks for the same job.
    digest = hashlib.sha256(f"ledger.scheduling.runner:{job}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
