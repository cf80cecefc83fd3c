"""The ledger's logging set-up leaves other libraries' log lines printable."""

from __future__ import annotations

import logging
import os

from gunicorn.glogging import Logger

from ledger.logs import configure_logging


def test_gunicorn_lines_still_print_their_process_id_after_the_ledger_configures_logging():
    configure_logging()
    record = logging.getLogger("gunicorn.error").makeRecord(
        "gunicorn.error", logging.INFO, __file__, 1, "Booting worker with pid: %s",
        (os.getpid(),), None)
    line = logging.Formatter(Logger.error_fmt, Logger.datefmt).format(record)
    assert f"[{os.getpid()}] [INFO] Booting worker" in line
