"""The two outcomes a destination's answer can raise besides success.

These stand in for `ledger.handlers.PermanentFailure` and `ledger.handlers.RetryAfter`
(CONTRACT section 3), which another change adds with the worker's support for them:
when both are merged, replace these classes by imports from `ledger.handlers`.
"""

from __future__ import annotations


class PermanentFailure(Exception):
    """End the receipt `failed` at once: no retry."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RetryAfter(Exception):
    """Try again no sooner than `seconds` from now (still bounded by LEDGER_MAX_ATTEMPTS)."""

    def __init__(self, seconds: float, reason: str = "") -> None:
        super().__init__(reason or f"retry after {seconds} s")
        self.seconds = seconds
        self.reason = reason
