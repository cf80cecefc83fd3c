"""Domain errors. Each carries data; ledger.web.errors maps them to HTTP answers."""

from __future__ import annotations

from sqlalchemy import exc as sa_exc

ERROR_SUMMARY_LIMIT = 500


class LedgerError(Exception):
    """Base class of every error the ledger raises on purpose."""


class NotFound(LedgerError):
    """A record the caller named does not exist."""

    def __init__(self, what: str, key: str) -> None:
        super().__init__(f"{what} not found: {key}")
        self.what = what
        self.key = key


class Refused(LedgerError):
    """An action is not allowed in the record's current state."""


class TooLong(Refused):
    """A reason or note longer than the audit log keeps."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"{what} must be at most {limit} characters")
        self.what = what
        self.limit = limit


class BodyTooLarge(LedgerError):
    """The delivery body exceeds the configured limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"body exceeds {limit} bytes")
        self.limit = limit


class UnknownIntegration(LedgerError):
    """No integration has the public id in the path."""


class AuthenticationFailed(LedgerError):
    """The delivery did not authenticate; `reason` is for logs and metrics only."""

    def __init__(self, reason: str, *, key_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.key_id = key_id
        # The event id of a refusal whose signature verified (a dead key, a stale
        # timestamp): then it is the signer's, not a claim anyone could make.
        self.event_id: str | None = None


class InvalidEvent(LedgerError):
    """The authenticated delivery does not carry a valid event."""

    def __init__(self, detail: str, *, key_id: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        # The credential that signed the refused body (the delivery log names it).
        self.key_id = key_id


class UnreadableBody(InvalidEvent):
    """The server could not read the body (malformed chunked encoding, a cut-off upload)."""


class StorageUnavailable(LedgerError):
    """The database could not be reached or did not answer in time."""


class UnsupportedDatabase(LedgerError):
    """The database server (or SQLite library) is older than the ledger's SQL needs."""


def error_summary(error: BaseException) -> str:
    """Return "Class: first line of message" (at most 500 characters) for logs and rows.

    Only the first line, and for a SQLAlchemy statement error the driver's own
    error: never SQLAlchemy's [SQL]/[parameters] dump, a traceback or a payload.
    """
    if isinstance(error, sa_exc.StatementError) and error.orig is not None:
        error = error.orig
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else ""
    summary = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return summary[:ERROR_SUMMARY_LIMIT]
