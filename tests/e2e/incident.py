"""Shared pieces of the incident browser tests: a served app on either database, a login."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import Flask

from ledger.web.loopback import loopback_server
from tests.dashboard_helpers import PASSWORD


@contextmanager
def serving(app: Flask) -> Iterator[str]:
    """Serve `app` on a free loopback port; stop it however the test ends."""
    server = loopback_server(app)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def login(page: Any, url: str, username: str, path: str = "/") -> None:
    """Log in through the form and land on `path`."""
    page.goto(f"{url}{path}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(rf"{re.escape(url)}{re.escape(path)}$"))
