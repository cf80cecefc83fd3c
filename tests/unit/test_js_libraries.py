"""The senders' JavaScript libraries (svix, standardwebhooks, stripe, @octokit/webhooks-methods).

They run under Node from tests/js (`npm ci --prefix tests/js`, done by `make test`): each
signs a delivery that our profiles must verify, and verifies the headers our profiles sign.
Without Node or those modules the test is skipped with the reason, never passed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ledger.intake.signatures import PROFILES
from tests.profile_keys import KEYS

JS = Path(__file__).resolve().parents[1] / "js"
NODE = shutil.which("node")
BODY = '{"id":"evt_js","type":"demo.credit","data":{"amount":3}}'

MISSING = ("Node.js or tests/js/node_modules missing: run `npm ci --prefix tests/js`"
           if NODE is None or not (JS / "node_modules" / "svix").is_dir() else None)


@pytest.fixture(autouse=True)
def _javascript_libraries() -> None:
    """Skip loudly without Node.js and the senders' JS libraries; in CI (make test runs
    `npm ci`) their absence is a failure, never a skip."""
    if MISSING is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {MISSING}", pytrace=False)
    pytest.skip(MISSING)


def _run_node(now: int, ours: dict[str, object]) -> dict[str, dict[str, object]]:
    request = {"secrets": {"standard": KEYS["standard-webhooks"].stored,
                           "stripe": KEYS["stripe"].stored, "github": KEYS["github"].stored},
               "body": BODY, "timestamp": now, "ours": ours}
    done = subprocess.run([NODE or "node", str(JS / "interop.mjs")], input=json.dumps(request),
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def _received(headers: dict[str, str]) -> dict[str, list[str]]:
    return {name.lower(): [value] for name, value in headers.items()}


def test_javascript_libraries_and_ours_accept_each_other() -> None:
    now = int(time.time())
    body = BODY.encode()
    sign = {name: PROFILES[name].sign(KEYS[name].signing, body, event_id="msg_py",
                                      event_type="demo.credit", timestamp=now)
            for name in ("standard-webhooks", "stripe", "github")}
    result = _run_node(now, {"standard": sign["standard-webhooks"],
                             "stripe": sign["stripe"]["Stripe-Signature"],
                             "github": sign["github"]["X-Hub-Signature-256"]})
    assert result["accepted"] == {"svix_svix_headers": True, "svix_webhook_headers": True,
                                  "svix_both_sets": True, "standardwebhooks": True,
                                  "stripe": True,
                                  "stripe_potato": True, "octokit": True}
    signed = result["signed"]

    def verify(name: str, headers: dict[str, str]) -> int:
        return PROFILES[name].verify(_received(headers), body, [KEYS[name].stored], now=now,
                                     tolerance=300).secret_index

    assert verify("standard-webhooks", {"svix-id": "msg_js_svix", "svix-timestamp": str(now),
                                        "svix-signature": str(signed["svix"])}) == 0
    assert verify("standard-webhooks", {"webhook-id": "msg_js_std",
                                        "webhook-timestamp": str(now),
                                        "webhook-signature": str(signed["standardwebhooks"])}) == 0
    both = {f"{prefix}-{part}": value for prefix in ("svix", "webhook") for part, value in
            (("id", "msg_js_svix"), ("timestamp", str(now)), ("signature", str(signed["svix"])))}
    assert verify("standard-webhooks", both) == 0  # both sets, one message (third edition)
    assert verify("stripe", {"Stripe-Signature": str(signed["stripe"]) + ",v1=potato"}) == 0
    assert verify("github", {"X-Hub-Signature-256": str(signed["octokit"])}) == 0
