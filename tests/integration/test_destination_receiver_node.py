"""The how-to's Node.js receiver (examples/destination-receiver-node) against our forwarder.

It verifies each request with the `standardwebhooks` npm package and applies each event
once by its Idempotency-Key. Runs under Node with tests/js's modules (`npm ci --prefix
tests/js`, done by `make test`); without them the test is skipped with the reason, and
in CI their absence is a failure.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.forward import Forwarder, ForwardEvent, ForwardTarget, Outcome
from ledger.destinations.secrets import new_signing_secret

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "destination-receiver-node" / "server.mjs"
MODULES = ROOT / "tests" / "js" / "node_modules"
NODE = shutil.which("node")
MISSING = ("Node.js or tests/js/node_modules missing: run `npm ci --prefix tests/js`"
           if NODE is None or not (MODULES / "standardwebhooks").is_dir() else None)
BODY = b'{"id":"evt_9","type":"order.paid","data":{"order":"A-1"}}'


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Run the example on a free loopback port; yield its URL and secret; stop it."""
    if MISSING is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {MISSING}", pytrace=False)
        pytest.skip(MISSING)
    shutil.copy(EXAMPLE, tmp_path / "server.mjs")
    (tmp_path / "node_modules").symlink_to(MODULES)
    secret = new_signing_secret()
    process = subprocess.Popen(
        [NODE or "node", str(tmp_path / "server.mjs")], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PORT": "0", "LEDGER_DESTINATION_SECRET": secret})
    try:
        port = json.loads(_first_line(process))["listening"]
        yield f"http://127.0.0.1:{port}/ledger", secret
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def _first_line(process: subprocess.Popen) -> str:  # type: ignore[type-arg]
    """Return the server's first line of output (its port), failing if it never comes."""
    assert process.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            return process.stdout.readline().decode()
        if process.poll() is not None:
            break
    pytest.fail("the Node receiver did not start")


def test_the_node_receiver_verifies_and_applies_each_event_once(receiver):
    url, secret = receiver
    sender = Forwarder(policy=AddressPolicy.from_entries(["127.0.0.1"]), retry_cap_seconds=60)
    try:
        results = [sender.forward(
            ForwardTarget(url=url, timeout_seconds=10, secrets=[secret]),
            ForwardEvent(scope="acme/shop", event_id="evt_9", event_type="order.paid",
                         attempt=attempt), BODY, "application/json") for attempt in (1, 2)]
        other = sender.forward(
            ForwardTarget(url=url, timeout_seconds=10, secrets=[secret]),
            ForwardEvent(scope="acme/shop", event_id="evt_10", event_type="order.paid",
                         attempt=1), BODY, "application/json")
        forged = sender.forward(
            ForwardTarget(url=url, timeout_seconds=10, secrets=[new_signing_secret()]),
            ForwardEvent(scope="acme/shop", event_id="evt_11", event_type="order.paid",
                         attempt=1), BODY, "application/json")
    finally:
        sender.close()
    # A repeat of one event (a second attempt) answers the first outcome: one effect.
    assert [(r.outcome, r.result_ref) for r in results] == [(Outcome.COMPLETE, "order:1")] * 2
    assert (other.outcome, other.result_ref) == (Outcome.COMPLETE, "order:2")
    assert (forged.outcome, forged.http_status) == (Outcome.FAILED, 401)
