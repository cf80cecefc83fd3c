"""The one Flask-aware corner of the ledger: blueprints, error mapping, services."""
