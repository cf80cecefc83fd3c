"""Headers that keep the dashboard out of frames and its pages free of injected script.

The pages load only the vendored htmx and static/ledger.js; no template has an inline
script, handler or style (a test holds that), so the policy can forbid them all: an
injected `<script>` or `onclick` in a rendered value would not run. htmx's own
indicator styles are off (`includeIndicatorStyles` in base.html's htmx-config), so
`style-src 'self'` holds too.
"""

from __future__ import annotations

from flask import Flask, Response

CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate CSP 2
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def _add_headers(response: Response) -> Response:
    """Add the headers to every Flask answer (the intake's fast path answers JSON only)."""
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def init_app(app: Flask) -> None:
    """Install the headers on every response of the app."""
    app.after_request(_add_headers)
