"""Take the on-call guide's screenshots (docs/how-to/on-call.md) from the demo ledger.

Usage: python scripts/oncall_screenshots.py  (writes docs/screenshots/oncall/*.png)

Seeds the demo as scripts/dashboard_screenshots.py does (and its leaked key), with the
forensic window on and the attempt limit at 1 so that failures show at once; adds the
incident the guide walks through: a handler holding its job past the lease on a live
worker, a drill run, the revocation check, a bulk requeue. Each shot is one element of a
page at a narrow width, so the images stay small.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots" / "oncall"
VIEWPORT = {"width": 1000, "height": 700}
NARROW = {"width": 390, "height": 700}


def _app(tmp: Path) -> tuple[Any, dict[str, str]]:
    """Return the seeded demo app (forensic window on, one attempt) and its subjects."""
    import app as app_module
    from scripts import dashboard_screenshots as base

    original = app_module.create_app

    def create(config: dict[str, str]) -> Any:  # the base script imports create_app late
        return original({**config, "LEDGER_CONFLICT_BODY_SECONDS": "86400",
                         "LEDGER_MAX_ATTEMPTS": "1", "LEDGER_REVOCATION_BOUND_SECONDS": "2"})

    app_module.create_app = create
    try:
        return base._seeded_app(tmp)
    finally:
        app_module.create_app = original


def _in_flight(app: Any) -> None:
    """A live worker whose handler holds evt_45 of globex past its 60 s lease."""
    from sqlalchemy import insert

    from ledger.db.schema import attempts, instances, jobs, receipts

    svc = app.extensions["ledger"]
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        conn.execute(insert(instances).values(
            id="worker-a:4242:demo", kind="worker", hostname="worker-a", pid=4242,
            started_at=now - timedelta(hours=1), heartbeat_at=now))
        row = conn.execute(receipts.select().limit(1)).first()
        conn.execute(insert(receipts).values(
            accepted_at=now - timedelta(seconds=301), scope_id=row.scope_id, state=0,
            attempts=1, event_id="evt_slow_export", event_type="demo.slow",
            body_sha256=b"\x07" * 32))
        conn.execute(insert(jobs).values(
            scope_id=row.scope_id, event_id="evt_slow_export", event_type="demo.slow",
            accepted_at=now - timedelta(seconds=301), run_at=now - timedelta(seconds=240),
            status=0, attempts=1, lease_token=9, leased_by="worker-a:4242:demo",
            leased_until=now - timedelta(seconds=240), payload="{}"))
        conn.execute(insert(attempts).values(
            scope_id=row.scope_id, event_id="evt_slow_export", number=1,
            worker_id="worker-a:4242:demo", lease_token=9, started_at=now - timedelta(seconds=300)))


def _web_instance(app: Any) -> None:
    """The demo's web process beating now, as `ledger dev` registers it (this seeding
    process does not), its credentials refreshed after the revocation."""
    from sqlalchemy import delete, insert

    from ledger.db.schema import instances

    svc = app.extensions["ledger"]
    now = svc.clock.now()
    with svc.engine.begin() as conn:
        conn.execute(delete(instances).where(instances.c.id == "demo-web:1:dev"))
        conn.execute(insert(instances).values(
            id="demo-web:1:dev", kind="web", hostname="demo-web", pid=1,
            started_at=now - timedelta(hours=1), heartbeat_at=now,
            credentials_refreshed_at=now))


def _shot(page: Any, name: str, selector: str) -> None:
    """Save one element of the current page."""
    page.wait_for_load_state("networkidle")
    page.locator(selector).first.screenshot(path=str(OUT / f"{name}.png"))


def _login(page: Any, base: str, password: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def _incident(page: Any, base: str, app: Any, subjects: dict[str, str], password: str) -> None:
    """Walk the guide's questions, one shot each."""
    from jobs.credential_jobs import check_revocation_propagation
    from scripts import dashboard_screenshots as shots

    svc = app.extensions["ledger"]
    pid, key_id = subjects["public_id"], subjects["key_id"]
    shots._work(app)
    _in_flight(app)
    page.goto(f"{base}/stuck")
    _shot(page, "running-now", "#stuck section")
    page.goto(f"{base}/")
    _shot(page, "throughput", "#throughput")
    page.goto(f"{base}/deliveries?event_id=evt_47")
    _shot(page, "refusal-found", "#deliveries")
    page.goto(f"{base}/conflicts/{subjects['conflict']}")
    _shot(page, "conflict", "dl.facts")
    page.goto(f"{base}/credentials")
    page.locator("#drill input[name=password]").fill(password)
    page.locator("#drill button").click()
    page.locator("#drill-status strong").filter(has_text="passed").or_(
        page.locator("#drill-status strong").filter(has_text="FAILED")).wait_for(timeout=90_000)
    page.reload()
    _shot(page, "drill", "#drill-status")
    page.locator("#identify input[name=secret]").fill(subjects["secret"])
    page.locator("#identify input[name=password]").fill(password)
    page.locator("#identify button").click()
    page.locator("#identify-result p").first.wait_for()
    _shot(page, "which-key", "#identify")
    _web_instance(app)
    check_revocation_propagation(svc.engine, svc.settings, svc.clock)
    _web_instance(app)  # still live when the page is read
    page.goto(f"{base}/credentials/{pid}")
    _shot(page, "revocation", f"#revocation-{key_id}")
    page.goto(f"{base}/failures/groups")
    row = page.locator("#groups-table tbody tr").first
    row.locator("input[name=reason]").fill("handler fixed in v2.3.1")
    row.locator("button", has_text="Requeue group").click()
    page.locator("#bulk .confirm button.danger").click()
    page.locator("#bulk .followup").wait_for()
    _shot(page, "requeue-followup", "#bulk")
    shots._work(app)  # the requeued receipts run again; the box counts what became of them
    page.locator("#bulk .followup", has_text="0 pending").wait_for(timeout=30_000)
    _shot(page, "requeue-outcome", "#bulk")
    page.goto(f"{base}/capacity")
    _shot(page, "retention-preview", "#purge-preview")
    page.goto(f"{base}/audit")
    _shot(page, "audit", "#audit-table")


def main() -> int:
    """Seed, serve, and take the guide's screenshots."""
    sys.path.insert(0, str(ROOT))
    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from scripts.dashboard_screenshots import PASSWORD

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ledger-oncall-") as tmp:
        app, subjects = _app(Path(tmp))
        server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_port}"
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                    headless=True, args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
                logged_out = browser.new_context(viewport=NARROW).new_page()
                logged_out.goto(f"{base}/login?next=/stuck&expired=1")
                _shot(logged_out, "session-ended", "main")
                page = browser.new_context(viewport=VIEWPORT).new_page()
                _login(page, base, PASSWORD)
                _incident(page, base, app, subjects, PASSWORD)
                phone = browser.new_context(viewport=NARROW).new_page()
                _login(phone, base, PASSWORD)
                phone.goto(f"{base}/")
                phone.screenshot(path=str(OUT / "phone-overview.png"))
                browser.close()
        finally:
            server.shutdown()
            app.extensions["ledger"].close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
