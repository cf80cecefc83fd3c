"""Structured JSON logs (structlog) and the privacy-safe event reference."""

from __future__ import annotations

import hmac
import logging
import os
import sys
from typing import Any

import structlog
from structlog.typing import EventDict, WrappedLogger

_configured = False
# Keys whose values must never be logged, whatever a caller passes.
FORBIDDEN_KEYS = frozenset({"secret", "signature", "body", "payload", "password", "token"})


def _drop_forbidden(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    """Remove fields that could carry secrets or payloads (defence in depth)."""
    for key in FORBIDDEN_KEYS.intersection(event_dict):
        event_dict[key] = "[redacted]"
    return event_dict


def configure_logging(level: str | None = None) -> None:
    """Send JSON lines to stderr through the standard logging module (idempotent)."""
    global _configured
    if _configured:
        return
    _configured = True
    # The documented logging optimisations ("Logging HOWTO", Optimization): no
    # caller lookup (a stack walk), thread or multiprocessing lookups per record.
    # Our lines carry their context as fields, the formatter prints only the JSON
    # message, and these lookups cost the worker and the intake a few percent of
    # their CPU (bench/README.md, "Workers").
    # The process id stays (one getpid() per record): gunicorn's own lines print it
    # with %(process)d, which fails on None and loses the line.
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    level_name = (level or os.environ.get("LEDGER_LOG_LEVEL", "INFO")).upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("ledger")
    root.addHandler(handler)
    root.setLevel(level_name)
    root.propagate = True
    structlog.configure(
        processors=[
            # First: a line below the level is dropped before it is rendered
            # (without it, every DEBUG line was built into JSON, then discarded).
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _drop_forbidden,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> Any:
    """Return a structlog logger writing under `name`."""
    configure_logging()
    return structlog.get_logger(name)


def event_ref(scope: str, event_id: str, key: str | None = None) -> str:
    """Return a keyed hash that correlates log lines without exposing the event id."""
    secret = (key or os.environ.get("LEDGER_LOG_HASH_KEY") or "replay-ledger").encode()
    return "ev_" + hmac.digest(secret, f"{scope}\x00{event_id}".encode(), "sha256").hex()[:16]
