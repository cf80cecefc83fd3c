"""A bulk requeue followed through: live counts of what became of its receipts, the lists
refreshed at once, and a group's link listing its own members."""

from __future__ import annotations

import re

from flask import Flask

from ledger.worker.failure_groups import error_signature, group_id
from ledger.worker.loop import Worker
from tests.dashboard_helpers import add_receipt, fast_hashes, logged_in, post
from tests.helpers import make_sender

__all__ = ["fast_hashes"]
BOOM = "RuntimeError: boom"


def seed_groups(app: Flask) -> str:
    """Three failures of one group, one of another error of the same type; return the id."""
    sender = make_sender(app)
    for i in range(3):
        add_receipt(app, sender.scope_id, f"evt_boom_{i}", state=2, error=BOOM)
    add_receipt(app, sender.scope_id, "evt_key", state=2, error="KeyError: 'customer'")
    return group_id("demo.credit", error_signature(BOOM))


def test_the_group_links_to_its_own_members(app: Flask) -> None:
    gid = seed_groups(app)
    viewer = logged_in(app, "viewer")
    groups = viewer.get("/failures/groups").get_data(as_text=True)
    assert f"group={gid}" in groups
    members = viewer.get(f"/failures?group={gid}").get_data(as_text=True)
    assert all(f"evt_boom_{i}" in members for i in range(3)) and "evt_key" not in members
    assert viewer.get("/failures?group=nothex").status_code == 400


def test_a_bulk_requeue_reports_what_became_of_it(app: Flask) -> None:
    gid = seed_groups(app)
    oncall = logged_in(app, "oncall")
    form = {"group": gid, "reason": "bad deploy rolled back", "total": "3"}
    done = post(oncall, "/failures/requeue-all", form, htmx=True)
    html = done.get_data(as_text=True)
    assert "Done: 3 requeued" in html and done.headers["HX-Trigger"] == "failures-changed"
    assert "0 complete" in html and "3 pending" in html
    batch = re.search(r'id="followup-([0-9a-f]{16})"', html).group(1)  # type: ignore[union-attr]
    Worker(app.extensions["ledger"], worker_id="w-test").run(burst=True)
    later = oncall.get(f"/failures/requeued/{batch}", headers={"HX-Request": "true"})
    text = later.get_data(as_text=True)
    assert "3 complete" in text and "0 pending" in text and "0 failed again" in text
    assert "hx-trigger" not in text  # nothing pending: it stops polling
    assert oncall.get("/failures/requeued/zz").status_code == 404
