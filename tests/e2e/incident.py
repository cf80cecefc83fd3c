"""Shared pieces of the incident browser tests: a login (tests.servers serves the app)."""

from __future__ import annotations

import re
from typing import Any

from tests.dashboard_helpers import PASSWORD


def login(page: Any, url: str, username: str, path: str = "/") -> None:
    """Log in through the form and land on `path`."""
    page.goto(f"{url}{path}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(rf"{re.escape(url)}{re.escape(path)}$"))
