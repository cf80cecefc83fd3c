"""Pages and htmx partials, installed as the package `ledger.templates` (pyproject.toml)."""
