"""gunicorn reads ./gunicorn.conf.py when run from the project directory (the Procfile's `web`).

The settings live in the package, so an installed wheel serves the same way with
`gunicorn -c python:ledger.web.gunicorn_conf 'ledger.app:create_app()'` from any directory.
"""

from ledger.web.gunicorn_conf import *  # noqa: F403
