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
from ledger.intake.signatures.catalog import help_text
from ledger.reads.admin import integrations_with_live_keys

# `--profile hmac` options (README, "The hmac profile"): flag → stored option.
HMAC_FLAGS = {
    "signature_header": "Header holding the signature (hmac profile).",
    "algorithm": "sha256 (default), sha1 or sha512 (hmac profile).",
    "encoding": "hex (default) or base64 (hmac profile).",
    "signature_prefix": "Text before the signature, e.g. 'sha256=' (hmac profile).",
    "signed_content": "Template: {body} once; {timestamp}, {id}, {method}, {url} anywhere; "
                      "default '{body}' (hmac profile).",
    "signature_entries": "The header is t=<ts>,v1=<sig>[,v1=<sig>...] (hmac profile).",
    "timestamp_header": "Header with the signed timestamp; freshness is checked (hmac profile).",
    "timestamp_format": "unix (default), unix-ms or rfc3339 (hmac profile).",
    "body_format": "json (default) or json-array: a batch, one receipt each (hmac profile).",
    "success_body": "Text answered instead of JSON on success, e.g. [accepted] (hmac profile).",
    "id_header": "Header holding the event id (hmac, token profiles).",
    "id_path": "Dotted body path of the event id (hmac, token profiles).",
    "type_header": "Header naming the event type (hmac, token profiles).",
}
# `--profile token` options (docs/senders/token.md); on/off ones are flags.
TOKEN_FLAGS = {
    "token_header": "Header carrying the shared token as-is (token profile).",
    "token_query": "Query parameter carrying the shared token (token profile).",
    "basic": "HTTP Basic auth; the secret is the whole user:password (token profile).",
    "allow_plaintext": "Accept the token over plain HTTP in production (token profile).",
}
SWITCHES = ("basic", "allow_plaintext", "signature_entries")
SHARED_TOKEN_PROFILES = ("token", "gitlab")  # a secret sent as-is: it signs nothing
FLAGS_OF = {"hmac": set(HMAC_FLAGS),
            "token": {*TOKEN_FLAGS, "id_header", "id_path", "type_header"}}
OPTION_OF_FLAG = {"signature_prefix": "prefix", "signed_content": "content",
                  "signature_entries": "entries"}


def profile_options(profile: str, values: dict[str, Any]) -> dict[str, Any]:
    """Return the hmac or token profile options given on the command line."""
    given = {flag for flag in (*HMAC_FLAGS, *TOKEN_FLAGS)
             if values.get(flag) not in (None, False)}
    stray = given - FLAGS_OF.get(profile, set())
    if stray:
        flags = ", ".join("--" + flag.replace("_", "-") for flag in sorted(stray))
        raise click.UsageError(f"{flags} do not apply to --profile {profile}")
    return {OPTION_OF_FLAG.get(flag, flag): values[flag] for flag in sorted(given)}


def _profile_flags(command: Any) -> Any:
    """Attach one --flag per hmac and token profile option."""
    for flag, text in reversed([*HMAC_FLAGS.items(), *TOKEN_FLAGS.items()]):
        name = "--" + flag.replace("_", "-")
        option = (click.option(name, flag, is_flag=True, help=text) if flag in SWITCHES
                  else click.option(name, flag, default=None, help=text))
        command = option(command)
    return command


@ledger_cli.group("integration")
def integration_group() -> None:
    """Integrations: one sender connected to one account."""


@integration_group.command("create", epilog=help_text())
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
              help="The endpoint URL as the sender signs it "
                   "(twilio, square, hubspot; hmac with {url}).")
@_profile_flags
@click.option("--secret-stdin", is_flag=True,
              help="Read the first secret (or the sender's public key) from stdin.")
@click.option("--label", default=None, help="A name for the first key, shown in listings.")
@json_option
@handles_ledger_errors
def integration_create(account: str, name: str, profile: str, tolerance: int,
                       max_body_bytes: int | None, type_path: str | None,
                       event_type: str | None, endpoint_url: str | None, secret_stdin: bool,
                       label: str | None, as_json: bool, **option_values: Any) -> None:
    """Create an integration and its first credential; the secret is printed once."""
    if type_path and event_type:
        raise click.UsageError("give --type-path or --event-type, not both")
    options = profile_options(profile, option_values)
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
                 else "public key stored")
             + ("\nnote: this token authenticates the sender, not the body (use HTTPS)"
                if profile in SHARED_TOKEN_PROFILES else "")))


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
