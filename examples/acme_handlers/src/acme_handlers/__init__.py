"""Acme's handlers for Replay Ledger: paid invoices land in the `acme_invoices` table."""
