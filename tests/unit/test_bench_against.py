"""`--against`: the load is signed as Stripe signs, and the verdict is read within the noise."""

from __future__ import annotations

import random
import time

import stripe

from bench import against, run
from bench.loadgen import body_for, stripe_request


def test_the_load_is_signed_as_stripe_signs() -> None:
    """Stripe's own library verifies the pre-signed request's header over its body."""
    body = body_for("evt_1", random.Random(1))
    raw = stripe_request("/hooks/x", against.STRIPE_SECRET, "evt_1", body, int(time.time()))
    head, sent = raw.split(b"\r\n\r\n", 1)
    header = next(line.split(b": ", 1)[1] for line in head.split(b"\r\n")
                  if line.startswith(b"Stripe-Signature"))
    assert sent == body
    assert stripe.WebhookSignature.verify_header(sent.decode(), header.decode(),
                                                 against.STRIPE_SECRET, tolerance=300)


def record(pairs: list[float]) -> dict[str, object]:
    """An --against record whose accepted/s ratio is the mean of `pairs`."""
    ratio = sum(pairs) / len(pairs)
    return {"ref": "HEAD~1", "sha": "0" * 40, "pair_ratios": {"accepted": pairs, "p99": pairs},
            "accepted_noise": against.noise(pairs), "p99_noise": against.noise(pairs),
            "current_accepted_per_s": 100 * ratio, "against_accepted_per_s": 100.0,
            "current_p99_ms": 50.0, "against_p99_ms": 50.0, "current_errors": 0,
            "against_errors": 0}


def test_a_drop_within_the_pairs_noise_is_met_and_a_steady_one_is_missed() -> None:
    noisy = run.against_figures(record([0.7, 1.3, 0.8, 0.8, 0.9, 0.9]))[0]
    steady = run.against_figures(record([0.9, 0.91, 0.89, 0.9, 0.9, 0.9]))[0]
    assert noisy.ratio < 1.0 and noisy.met
    assert steady.ratio < 1.0 and not steady.met
