"""The ledger's logging set-up leaves other libraries' log lines printable."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import structlog
from gunicorn.glogging import Logger

from ledger.logs import LineLogger, configure_logging, get_logger


def test_gunicorn_lines_still_print_their_process_id_after_the_ledger_configures_logging():
    configure_logging()
    record = logging.getLogger("gunicorn.error").makeRecord(
        "gunicorn.error", logging.INFO, __file__, 1, "Booting worker with pid: %s",
        (os.getpid(),), None)
    line = logging.Formatter(Logger.error_fmt, Logger.datefmt).format(record)
    assert f"[{os.getpid()}] [INFO] Booting worker" in line


def _lines(caplog: Any, name: str) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == name]


def test_a_hot_line_is_the_line_structlog_writes_for_the_same_call(caplog: Any):
    configure_logging()
    fields = {"outcome": "accepted", "scope": "acme/billing", "event_ref": "ev_0123",
              "http_status": 202, "latency_ms": 1.25, "request_id": "from-the-call",
              "signature": "v1,abc"}
    structlog.contextvars.bind_contextvars(request_id="from-context", client="10.0.0.1")
    try:
        with caplog.at_level(logging.INFO, logger="ledger.test_hot"):
            get_logger("ledger.test_hot").info("delivery.accepted", **fields)
            LineLogger("ledger.test_hot").info("delivery.accepted", **fields)
    finally:
        structlog.contextvars.clear_contextvars()
    chained, hot = _lines(caplog, "ledger.test_hot")
    assert hot.pop("timestamp").endswith("Z") and chained.pop("timestamp").endswith("Z")
    assert hot == chained
    assert hot["request_id"] == "from-the-call" and hot["client"] == "10.0.0.1"
    assert hot["signature"] == "[redacted]"


def test_a_hot_line_below_the_level_is_not_written(caplog: Any):
    configure_logging()
    with caplog.at_level(logging.WARNING, logger="ledger.test_hot_quiet"):
        LineLogger("ledger.test_hot_quiet").info("delivery.accepted", outcome="accepted")
    assert _lines(caplog, "ledger.test_hot_quiet") == []
