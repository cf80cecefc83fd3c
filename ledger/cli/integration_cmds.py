"""`ledger integration …`: connect a sender to an account."""

from __future__ import annotations

from typing import Any

import click

from ledger.access import audit
from ledger.access.integrations import create_integration, profile_settings
from ledger.cli import ledger_cli
from ledger.cli.common import (
    emit,
    handles_ledger_errors,
    json_option,
    read_stdin_secret,
    services,
)
from ledger.intake.signatures import PROFILE_NAMES
from ledger.reads.admin import integrations_with_live_keys

# `--profile hmac` options (README, "The hmac profile"): flag → stored option.
HMAC_FLAGS = {
    "signature_header": "Header holding the signature (hmac profile).",
    "algorithm": "sha256 (default), sha1 or sha512 (hmac profile).",
    "encoding": "hex (default) or base64 (hmac profile).",
    "signature_prefix": "Text before the signature, e.g. 'sha256=' (hmac profile).",
    "signed_content": "Template over {body}, {timestamp}, {id}; default '{body}' (hmac profile).",
    "timestamp_header": "Header with unix seconds; freshness is checked (hmac profile).",
    "id_header": "Header holding the event id (hmac profile).",
    "id_path": "Dotted body path of the event id (hmac profile).",
    "type_header": "Header naming the event type (hmac profile).",
}
OPTION_OF_FLAG = {"signature_prefix": "prefix", "signed_content": "content"}


def hmac_options(values: dict[str, Any]) -> dict[str, Any]:
    """Return the hmac profile options given on the command line."""
    return {OPTION_OF_FLAG.get(flag, flag): values[flag] for flag in HMAC_FLAGS
            if values.get(flag) is not None}


def _hmac_flags(command: Any) -> Any:
    """Attach one --flag per hmac profile option."""
    for flag, text in reversed(HMAC_FLAGS.items()):
        command = click.option("--" + flag.replace("_", "-"), flag, default=None,
                               help=text)(command)
    return command


@ledger_cli.group("integration")
def integration_group() -> None:
    """Integrations: one sender connected to one account."""


@integration_group.command("create")
@click.option("--account", required=True, help="Account slug.")
@click.option("--name", required=True, help="Integration slug, unique within the account.")
@click.option("--profile", required=True, type=click.Choice(PROFILE_NAMES))
@click.option("--tolerance", type=int, default=300, show_default=True,
              help="Freshness window in seconds.")
@click.option("--max-body-bytes", type=int, default=None, help="Override the body limit.")
@click.option("--type-path", default=None,
              help="Read the event type from this dotted body path instead.")
@click.option("--event-type", default=None, help="Fix the event type (events carry none).")
@click.option("--url", "endpoint_url", default=None,
              help="The endpoint URL as the sender signs it (twilio, square).")
@_hmac_flags
@click.option("--secret-stdin", is_flag=True,
              help="Read the first secret (or the sender's public key) from stdin.")
@click.option("--label", default=None, help="A name for the first key, shown in listings.")
@json_option
@handles_ledger_errors
def integration_create(account: str, name: str, profile: str, tolerance: int,
                       max_body_bytes: int | None, type_path: str | None,
                       event_type: str | None, endpoint_url: str | None, secret_stdin: bool,
                       label: str | None, as_json: bool, **hmac_values: Any) -> None:
    """Create an integration and its first credential; the secret is printed once."""
    if type_path and event_type:
        raise click.UsageError("give --type-path or --event-type, not both")
    options = hmac_options(hmac_values)
    if options and profile != "hmac":
        raise click.UsageError("the hmac options apply to --profile hmac only")
    settings = profile_settings(profile, type_path=type_path, event_type=event_type,
                                endpoint_url=endpoint_url, hmac_options=options)
    secret = read_stdin_secret("secret") if secret_stdin else None
    svc = services()
    with svc.engine.begin() as conn:
        integration, credential = create_integration(
            conn, svc.box, audit.Actor.cli(), account=account, name=name, profile=profile,
            now=svc.clock.now(), tolerance=tolerance, max_body_bytes=max_body_bytes,
            secret=secret, settings=settings, label=label)
    emit(as_json, {
        "integration": integration.public_id, "scope": integration.scope,
        "profile": integration.profile,
        "credential": {"key_id": credential.key_id, "secret": credential.shown_secret},
    }, text=(f"integration {integration.public_id} scope {integration.scope}\n"
             f"POST /hooks/{integration.public_id}\n"
             f"key {credential.key_id} " + (
                 f"secret (shown once): {credential.secret}" if not credential.public
                 else "public key stored")))


@integration_group.command("list")
@click.option("--account", default=None, help="Only this account's integrations.")
@json_option
@handles_ledger_errors
def integration_list(account: str | None, as_json: bool) -> None:
    """List integrations by scope with their profile and how many keys still verify."""
    svc = services()
    with svc.engine.connect() as conn:
        rows = integrations_with_live_keys(conn, account=account, now=svc.clock.now())
    emit(as_json, {"integrations": rows},
         text="\n".join(f"{r['integration']}  {r['scope']:<40}  {r['profile']:<18}  "
                        f"{r['live_keys']} live" for r in rows))
