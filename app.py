"""Application factory: config, services, blueprints and the CLI. Nothing runs at import."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Flask

from ledger.clock import Clock
from ledger.config import Settings, project_root
from ledger.logs import configure_logging


def _secret_key(settings: Settings) -> str:
    """Return the session signing key: configured, or generated into var/ for development."""
    if settings.secret_key:
        return settings.secret_key
    path = Path(settings.var_dir) / "flask-secret.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48))
    return path.read_text().strip()


def create_app(test_config: Mapping[str, Any] | None = None, *,
               clock: Clock | None = None) -> Flask:
    """Create the web app. `test_config` overrides environment variables by name."""
    from ledger.cli import ledger_cli
    from ledger.services import build_services
    from ledger.web import body_deadline, ingest, ops, request_log
    from ledger.web.dashboard import register_dashboard
    from ledger.web.errors import register_error_handlers

    configure_logging((test_config or {}).get("LEDGER_LOG_LEVEL"))
    root = project_root()
    app = Flask(__name__, template_folder=str(root / "templates"),
                static_folder=str(root / "static"))
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (test_config or {}).items()})
    settings = Settings.from_env(env)
    app.config.update(SECRET_KEY=_secret_key(settings), JSON_SORT_KEYS=False)
    app.extensions["ledger"] = build_services(settings, clock=clock)
    # A process that serves requests registers itself in `instances` (revocation propagation).
    app.before_request(app.extensions["ledger"].heartbeat.ensure_started)
    request_log.init_app(app)
    register_error_handlers(app)
    ingest.init_app(app)  # the intake's WSGI fast path goes in front of Flask
    body_deadline.init_app(app, settings.body_read_timeout_seconds)  # in front of both
    app.register_blueprint(ops.bp)
    register_dashboard(app)  # sessions, CSRF, dashboard pages, /api/v1
    app.cli.add_command(ledger_cli)
    return app
