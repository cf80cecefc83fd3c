"""Accessibility a user notices: a label on every input, a skip link, times as <time>."""

from __future__ import annotations

import pytest

from tests.a11y import unlabelled_controls
from tests.dashboard_helpers import (
    add_conflict,
    add_receipt,
    fast_hashes,  # noqa: F401  (autouse fixture)
    logged_in,
)
from tests.helpers import make_sender


@pytest.mark.parametrize("role", ["viewer", "admin"])
def test_every_input_has_a_label_and_pages_have_a_skip_link(app, role) -> None:  # type: ignore[no-untyped-def]
    sender = make_sender(app)
    add_receipt(app, sender.scope_id, "evt_f", state=2)
    add_receipt(app, sender.scope_id, "evt_p", state=0)
    add_receipt(app, sender.scope_id, "evt_c", state=1)
    conflict = add_conflict(app, sender.scope_id, "evt_c")
    client = logged_in(app, role)
    pages = ["/", "/receipts", "/stuck", "/failures", "/conflicts", "/credentials",
             f"/credentials/{sender.public_id}", "/audit", "/capacity",
             f"/receipts/{sender.public_id}/evt_f", f"/receipts/{sender.public_id}/evt_c",
             f"/receipts/{sender.public_id}/evt_p", f"/conflicts/{conflict}"]
    if role == "admin":
        pages.append("/operators")
    for path in pages:
        answer = client.get(path)
        assert answer.status_code == 200, path
        html = answer.get_data(as_text=True)
        assert unlabelled_controls(html) == [], path
        assert '<a class="skip" href="#main">' in html and 'id="main"' in html, path
    assert "<time datetime=" in client.get(f"/receipts/{sender.public_id}/evt_f").get_data(
        as_text=True)
