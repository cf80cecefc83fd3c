"""Destinations: an integration's accepted events forwarded to an HTTP endpoint (CONTRACT 8).

`store` keeps destinations and the answers to each attempt, `secrets` their signing
secrets, `admission` the backoff, rate and in-flight limits every worker shares;
`addresses` says which addresses a destination may reach and `guard` checks them at every
connection; `forward` makes the signed POST and maps the answer to an outcome (a
result_ref, or ledger.handlers' PermanentFailure and RetryAfter).
"""
