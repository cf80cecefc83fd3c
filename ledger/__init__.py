"""Replay Ledger: authenticated, scoped, exactly-once webhook intake."""

__version__ = "0.1.0"
