"""Take the README's dashboard screenshots from a seeded ledger (`make run`'s demo).

Usage: LEDGER_VAR_DIR=var LEDGER_DEMO_ADMIN_PASSWORD=... python scripts/dashboard_screenshots.py
Serves the app on a free loopback port, logs in as the demo admin with headless chromium
and writes docs/screenshots/*.png.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

from werkzeug.serving import make_server

ROOT = Path(__file__).resolve().parent.parent
PAGES = (("overview", "/"), ("receipts", "/receipts"), ("failures", "/failures"),
         ("stuck", "/stuck"), ("conflicts", "/conflicts?open=0"), ("audit", "/audit"),
         ("capacity", "/capacity"))


def main() -> int:
    """Serve, log in, and screenshot each main page."""
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import sync_playwright

    from app import create_app

    app = create_app()
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    out = ROOT / "docs" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=shutil.which("chromium") or "/usr/bin/chromium", headless=True,
                args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            page.goto(f"{base}/login")
            page.fill("input[name=username]", os.environ.get("DEMO_USER", "admin"))
            page.fill("input[name=password]", os.environ["LEDGER_DEMO_ADMIN_PASSWORD"])
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/")
            for name, path in PAGES:
                page.goto(f"{base}{path}")
                page.wait_for_load_state("networkidle")
                page.screenshot(path=str(out / f"{name}.png"))
            browser.close()
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
