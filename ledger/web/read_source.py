"""Which database a dashboard page or an /api/v1 read is served from, and saying so.

With LEDGER_READ_DATABASE_URL set, the read-only pages and API reads run through
`replica_read()` (ledger.db.replica): on the replica when it is fit to serve, else on
the primary. Each such answer says where it read: the page shows a line with the
replica's lag (or why the primary was read), the API answers headers, so its JSON
keys stay as the contract has them. Everything else (actions, logins, sessions,
tokens, credential management, audit verification) uses the primary engine directly.

Read-your-writes: after a POST from a signed-in session, the primary's WAL position
is kept in the session; after a write with an API token, in the token's row
(`api_tokens.wrote_at`). That session's or token's reads go to the primary until the
replica has replayed that far.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

from flask import Flask, Response, g, request, session
from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc

from ledger.access.operators import Operator, note_token_write
from ledger.db.replica import ReadSource, primary_position
from ledger.web.auth import UNSAFE_METHODS, services

T = TypeVar("T")
SOURCE_HEADER = "X-Ledger-Read-Source"  # replica | primary
LAG_HEADER = "X-Ledger-Replica-Lag-Seconds"  # seconds, or "unknown"
WROTE_AT = "wrote_at"  # session key: the primary's WAL position after this session's last POST


def replica_read(read: Callable[[Connection], T]) -> T:
    """Run `read(conn)` where this request's reads belong; remember where for the answer."""
    svc = services()
    if svc.reads.replica is None:
        with svc.reads.local.connect() as conn:
            return read(conn)
    token = _token_operator()
    wrote_at = session.get(WROTE_AT) if token is None else token.token_wrote_at
    result, source = svc.reads.run(read, wrote_at=wrote_at)
    if source.replica and wrote_at is not None and token is None:
        session.pop(WROTE_AT, None)  # the replica has this session's writes now
    g.read_source = source
    return result


def _token_operator() -> Operator | None:
    """The operator of this request when an API token authenticated it, else None."""
    operator: Operator | None = g.get("operator")
    return operator if operator is not None and operator.token_row is not None else None


def primary_read(read: Callable[[Connection], T]) -> T:
    """Run `read(conn)` on the primary: the page shown right after an action."""
    with services().reads.local.connect() as conn:
        return read(conn)


def lag_text(source: ReadSource) -> str:
    """Return the lag as the header carries it: seconds with a millisecond, or unknown."""
    return "unknown" if source.lag_seconds is None else f"{source.lag_seconds:.3f}"


def _tell_source(response: Response) -> Response:
    """Add where the reads ran to the answer; after a session's POST, keep the write position."""
    svc = services()
    if svc.reads.replica is None:
        return response
    source: ReadSource | None = g.get("read_source")
    if source is not None:
        response.headers[SOURCE_HEADER] = "replica" if source.replica else "primary"
        if source.replica or source.lag_seconds is not None:
            response.headers[LAG_HEADER] = lag_text(source)
    if request.method not in UNSAFE_METHODS or request.path.startswith("/hooks/"):
        return response
    token = _token_operator()
    if token is None and not session.get("sid"):
        return response
    # The primary away: the action's own answer said so; the older position stays.
    with contextlib.suppress(sa_exc.DBAPIError, sa_exc.TimeoutError), \
            svc.engine.begin() as conn:
        position = primary_position(conn)
        if token is None:
            session[WROTE_AT] = position
        elif token.token_row is not None and response.status_code < 400:
            note_token_write(conn, token.token_row, position)
    return response


def _template_source() -> dict[str, ReadSource | None]:
    """Expose this request's read source to templates (None without a replica)."""
    return {"read_source": g.get("read_source")}


def init_app(app: Flask) -> None:
    """Install the headers and the template variable."""
    app.after_request(_tell_source)
    app.context_processor(_template_source)
