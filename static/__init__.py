"""Vendored htmx, css and icons, installed as the package `ledger.static` (pyproject.toml)."""
