"""Scheduled jobs: plain functions of (engine, settings, clock), run by `ledger scheduler`.

Installed as `ledger.jobs` (ledger/jobs links here), the only name code inside `ledger`
imports them by; a user's own top-level `jobs` package cannot shadow them. The modules
import each other relatively, so they work under either name.
"""
