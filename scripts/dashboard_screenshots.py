"""Take the docs' dashboard screenshots from `make run`'s demo ledger, freshly seeded.

Usage: make screenshots, or python scripts/dashboard_screenshots.py (writes docs/screenshots/*.png)

Seeds the demo into a throwaway SQLite ledger exactly as `make run` does (`ledger demo seed`),
then adds what the demo lacks to show the incident pages: a key that signs one accepted
delivery, is revoked, and signs again (a refused delivery with its key). Serves the app on a
free loopback port and drives Debian's chromium headless as the demo admin. The conflict's
diff is taken before any worker runs (the original body leaves with its completed job); the
rest after one burst of the worker, so failures, retries and stuck work all show.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from werkzeug.serving import make_server

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
PASSWORD = "screenshots-demo-password"
VIEWPORT = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}


def _seeded_app(tmp: Path) -> tuple[Any, dict[str, str]]:
    """Return the app over a freshly seeded demo ledger and the pages' subjects."""
    from app import create_app
    from ledger.cli.demo_cmds import seed_demo
    from ledger.db.engine import upgrade

    app = create_app({"DATABASE_URL": f"sqlite:///{tmp / 'ledger.sqlite3'}",
                      "LEDGER_VAR_DIR": str(tmp), "LEDGER_DEMO_HANDLERS": "1",
                      "LEDGER_SECRET_KEY": "screenshots", "LEDGER_DEMO_ADMIN_PASSWORD": PASSWORD})
    upgrade(app.extensions["ledger"].engine)
    with app.app_context():
        seed_demo()
    return app, _leaked_key(app)


def _leaked_key(app: Any) -> dict[str, str]:
    """Add a key to acme/stripe-prod, sign with it, revoke it, sign again (refused: 401)."""
    from sqlalchemy import select

    from ledger.access import audit
    from ledger.access.credentials import add_credential, revoke_credential
    from ledger.access.integrations import get_integration_by_scope
    from ledger.db.schema import conflicts
    from ledger.demo.seed import deliver

    svc = app.extensions["ledger"]
    client = app.test_client()

    def post(path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        response = client.post(path, data=body, headers=headers)
        return response.status_code, response.get_json()

    ops = audit.Actor(name="sec-oncall", role="security")
    with svc.engine.begin() as conn:
        integration = get_integration_by_scope(conn, "acme/stripe-prod")
        key = add_credential(conn, svc.box, ops, integration, now=svc.clock.now(),
                             reason="laptop key for the migration")
    svc.view.invalidate()
    deliver(svc, post, integration.public_id, "stripe", key.secret, event_id="evt_46",
            event_type="demo.credit", data={"amount": 7})
    with svc.engine.begin() as conn:
        revoke_credential(conn, ops, key.key_id, reason="key leaked in a CI log",
                          now=svc.clock.now())
        conflict = conn.execute(select(conflicts.c.id).where(
            conflicts.c.scope_id == integration.id, conflicts.c.event_id == "evt_43")
        ).scalar_one()
    svc.view.invalidate()
    deliver(svc, post, integration.public_id, "stripe", key.secret, event_id="evt_47",
            event_type="demo.credit", data={"amount": 7000})
    return {"public_id": integration.public_id, "key_id": key.key_id,
            "conflict": str(conflict), "secret": key.secret}


def _work(app: Any) -> None:
    """Run the worker until nothing is due, then recompute the overview's rollups."""
    from jobs.rollups import refresh
    from ledger.worker.loop import process_one

    svc = app.extensions["ledger"]
    while process_one(svc, "demo-host:1:worker"):
        pass
    refresh(svc.engine, svc.clock, full_series=True)


def _shoot(page: Any, base: str, name: str, path: str) -> None:
    """Open a page, let htmx settle, and save its screenshot."""
    page.goto(f"{base}{path}")
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(OUT / f"{name}.png"))


def _browse(app: Any, subjects: dict[str, str]) -> None:
    """Serve the app and take every screenshot the README shows."""
    from playwright.sync_api import sync_playwright

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    pid = subjects["public_id"]
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                headless=True, args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
            context = browser.new_context(viewport=VIEWPORT)
            page = context.new_page()
            page.goto(f"{base}/login")
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/")
            _shoot(page, base, "conflict-diff", f"/conflicts/{subjects['conflict']}")
            _shoot(page, base, "receipt", f"/receipts/{pid}/evt_43")
            _work(app)
            for name, path in (
                    ("overview", "/"), ("failures", "/failures/groups"),
                    ("failures-flat", "/failures"), ("stuck", "/stuck"),
                    ("deliveries", "/deliveries?integration=acme/stripe-prod"),
                    ("credentials", f"/credentials/{pid}"), ("search", "/search?q=evt_42"),
                    ("receipts", "/receipts"), ("conflicts", "/conflicts?open=0"),
                    ("audit", "/audit"), ("capacity", "/capacity")):
                _shoot(page, base, name, path)
            page.emulate_media(color_scheme="dark")
            _shoot(page, base, "dark-mode", "/")
            narrow = browser.new_context(viewport=NARROW, storage_state=context.storage_state(),
                                         color_scheme="light")
            _shoot(narrow.new_page(), base, "narrow-390", "/failures/groups")
            browser.close()
    finally:
        server.shutdown()


def main() -> int:
    """Seed, serve, and screenshot."""
    sys.path.insert(0, str(ROOT))
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ledger-shots-") as tmp:
        app, subjects = _seeded_app(Path(tmp))
        try:
            _browse(app, subjects)
        finally:
            app.extensions["ledger"].close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
