"""Application factory: config, services, blueprints and the CLI. Nothing runs at import.

Installed as `ledger.app` (ledger/app.py links here): code inside `ledger` imports it by
that name, and `gunicorn 'app:create_app()'` keeps working from the repository.
"""

from __future__ import annotations

import importlib.util
import secrets
from collections.abc import Mapping
from typing import Any

from flask import Flask
from werkzeug.middleware.proxy_fix import ProxyFix

from ledger.clock import Clock
from ledger.config import SECRET_KEY_FILE, Settings, development_key
from ledger.logs import configure_logging


def _secret_key(settings: Settings) -> str:
    """Return the session signing key: configured, or generated into var/ for development."""
    if settings.secret_key:
        return settings.secret_key
    return development_key(settings.var_dir, SECRET_KEY_FILE, lambda: secrets.token_urlsafe(48))


def _package_dir(name: str) -> str:
    """Return the directory of a resource package such as `ledger.templates`.

    templates/ and static/ are installed as ledger.templates and ledger.static
    (pyproject.toml), so they are found through the installed package, in a
    wheel and in the editable install alike, never through the working directory.
    """
    spec = importlib.util.find_spec(name)  # finds without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{name} is not installed: reinstall replay-ledger")
    return str(next(iter(spec.submodule_search_locations)))


def _core_app(test_config: Mapping[str, Any] | None, clock: Clock | None) -> Flask:
    """Return an app holding the settings, the services and the CLI, with no pages yet."""
    from ledger.cli import ledger_cli
    from ledger.jobs.catalogue import scheduled_jobs
    from ledger.scheduling.runner import register_jobs
    from ledger.services import build_services

    settings = Settings.from_env(overrides=test_config)
    configure_logging(settings.log_level)
    app = Flask(__name__, template_folder=_package_dir("ledger.templates"),
                static_folder=_package_dir("ledger.static"))
    app.config.update(SECRET_KEY=_secret_key(settings), JSON_SORT_KEYS=False)
    app.extensions["ledger"] = build_services(settings, clock=clock)
    app.cli.add_command(ledger_cli)
    register_jobs(scheduled_jobs)  # the scheduler runs what this outer layer names
    return app


def create_cli_app(test_config: Mapping[str, Any] | None = None, *,
                   clock: Clock | None = None) -> Flask:
    """Create the app a command that serves nothing needs: settings, services, the CLI.

    `ledger receipt show` and its kind skip importing and registering the web pages.
    """
    return _core_app(test_config, clock)


def create_app(test_config: Mapping[str, Any] | None = None, *,
               clock: Clock | None = None) -> Flask:
    """Create the web app. `test_config` overrides environment variables by name.

    A malformed or missing setting raises ledger.config.SettingsError naming the variable.
    """
    from ledger.web import (
        body_deadline,
        ingest,
        input_guard,
        ops,
        read_source,
        request_log,
        security_headers,
    )
    from ledger.web.dashboard import register_dashboard
    from ledger.web.errors import register_error_handlers

    app = _core_app(test_config, clock)
    settings = app.extensions["ledger"].settings
    # A process that serves requests registers itself in `instances` (revocation propagation).
    app.before_request(app.extensions["ledger"].heartbeat.ensure_started)
    request_log.init_app(app)
    input_guard.init_app(app)  # before the routes: it bounds their `<int:…>` ids
    security_headers.init_app(app)
    register_error_handlers(app)
    ingest.init_app(app)  # the intake's WSGI fast path goes in front of Flask
    body_deadline.init_app(app, settings.body_read_timeout_seconds)  # in front of both
    if settings.trusted_proxies:
        # Outermost, so the intake fast path sees the same client address as Flask.
        # why (the ignore): wrapping wsgi_app is Flask's documented middleware hook; mypy
        # sees a method being replaced.
        app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            app.wsgi_app, x_for=settings.trusted_proxies, x_proto=settings.trusted_proxies)
    app.register_blueprint(ops.bp)
    register_dashboard(app)  # sessions, CSRF, dashboard pages, /api/v1
    read_source.init_app(app)  # where the dashboard's and the API's reads ran
    return app
