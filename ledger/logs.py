"""Structured JSON logs (structlog) and the privacy-safe event reference."""

from __future__ import annotations

import hmac
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

import structlog
from structlog.contextvars import get_contextvars
from structlog.typing import EventDict, WrappedLogger

from ledger.config import SettingsError, log_level

_configured = False
# The key of event_ref, installed once per process by build_services (LEDGER_LOG_HASH_KEY).
_event_ref_key: list[bytes] = []
# JSONRenderer(sort_keys=True)'s encoding (structlog falls back to repr() as well), built once.
_LINE_ENCODER = json.JSONEncoder(sort_keys=True, default=repr)
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
    # their CPU. The process id stays (one getpid):
    # gunicorn's own format prints `[%(process)d]`, and without it every one of
    # its lines (boot, worker exits, bad requests) failed with "Logging error".
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    level_name = (level or _level_from_env()).upper()
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


def _level_from_env() -> str:
    """Return LEDGER_LOG_LEVEL; a bad one is refused by Settings.from_env, so INFO till then."""
    try:
        return log_level()
    except SettingsError:
        return "INFO"  # logging starts at import; create_app stops the process, naming it


def get_logger(name: str) -> Any:
    """Return a structlog logger writing under `name`."""
    configure_logging()
    return structlog.get_logger(name)


class LineLogger:
    """An INFO line of a per-delivery call site, rendered as configure_logging renders it.

    structlog's processor chain costs the intake about as much CPU as the rest of the line.
    For a line whose fields are plain JSON values, this renders the same JSON (the
    log context such as request_id, the level, the UTC ISO timestamp, forbidden keys
    redacted, keys sorted) in one step and hands it to the same standard-library logger:
    the same levels, handlers and captures as every other line.
    """

    __slots__ = ("_logger",)

    def __init__(self, name: str) -> None:
        configure_logging()
        self._logger = logging.getLogger(name)

    def info(self, event: str, **fields: Any) -> None:
        """Write one INFO line with `event` and `fields` (when INFO is enabled)."""
        logger = self._logger
        if not logger.isEnabledFor(logging.INFO):
            return
        line = {"event": event, **fields}
        for key, value in get_contextvars().items():
            line.setdefault(key, value)  # the call's own fields win, as merge_contextvars
        line["level"] = "info"
        line["timestamp"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        for key in FORBIDDEN_KEYS.intersection(line):
            line[key] = "[redacted]"
        logger.info(_LINE_ENCODER.encode(line))


def use_event_ref_key(key: str) -> None:
    """Install the process's event_ref key (configured, or generated into var/ in development)."""
    _event_ref_key[:] = [key.encode()]


def event_ref(scope: str, event_id: str, key: str | None = None) -> str:
    """Return a keyed hash that correlates log lines without exposing the event id."""
    if key is not None:
        secret = key.encode()
    elif _event_ref_key:
        secret = _event_ref_key[0]
    else:  # never a public fallback key: a known key would let anyone test event ids
        raise RuntimeError("no event_ref key installed: build_services() installs "
                           "LEDGER_LOG_HASH_KEY (or the key generated into var/)")
    return "ev_" + hmac.digest(secret, f"{scope}\x00{event_id}".encode(), "sha256").hex()[:16]
