"""Integrations: one sender on one account, the scope its receipts are kept in."""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection, bindparam, insert, select
from sqlalchemy.exc import IntegrityError

from ledger.access import audit
from ledger.access.secrets_box import SecretBox
from ledger.db.schema import integrations
from ledger.domain import Integration, scope_name
from ledger.errors import NotFound, Refused
from ledger.ids import EVENT_TYPE, INTEGRATION_ID, SLUG, new_integration_id
from ledger.intake.signatures import HMAC, PROFILE_NAMES, PROFILES
from ledger.intake.signatures.configurable import check_options
from ledger.intake.signatures.token_profile import TOKEN, check_token_options

if TYPE_CHECKING:
    from ledger.access.credentials import NewCredential

# The profiles an integration describes itself (options stored in `hmac_options`).
OPTION_CHECKS = {HMAC: check_options, TOKEN: check_token_options}
TYPE_PATH = re.compile(r"[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}")
URL = re.compile(r"https?://[!-~]{1,2040}")
# The largest body limit an integration may set (`--max-body-bytes`).
MAX_BODY_BYTES_LIMIT = 64 * 1024 * 1024


def profile_settings(profile: str, *, type_path: str | None = None,
                     event_type: str | None = None, endpoint_url: str | None = None,
                     hmac_options: dict[str, Any] | None = None) -> dict[str, str | None]:
    """Return an integration's profile settings as stored, or refuse what cannot work."""
    if profile not in PROFILE_NAMES:
        raise Refused(f"unknown profile {profile!r}; choose one of {list(PROFILE_NAMES)}")
    if type_path and event_type:
        raise Refused("give --type-path or --event-type, not both")
    if type_path and not TYPE_PATH.fullmatch(type_path):
        raise Refused("type-path is a dotted path of field names, e.g. data.kind")
    if event_type and not EVENT_TYPE.fullmatch(event_type):
        raise Refused("event-type must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
    options = _profile_options(profile, hmac_options)
    if (type_path or event_type) and (hmac_options or {}).get("type_header"):
        raise Refused("give one type source: --type-header, --type-path or --event-type")
    preset = PROFILES.get(profile)
    needs_url = bool(preset and getattr(preset.scheme, "needs_url", False)) or (
        profile == HMAC and "{url}" in str(json.loads(options or "{}").get("content", "")))
    if needs_url and not endpoint_url:
        raise Refused(f"{profile} signs the endpoint URL: give --url as configured there")
    if endpoint_url and not needs_url:
        raise Refused(f"{profile} does not sign the endpoint URL; --url is not used")
    if endpoint_url and not URL.fullmatch(endpoint_url):
        raise Refused("url must be an http(s) URL of printable ASCII")
    return {"type_path": type_path or None, "fixed_event_type": event_type or None,
            "endpoint_url": endpoint_url or None, "hmac_options": options}


def _profile_options(profile: str, given: dict[str, Any] | None) -> str | None:
    """Return the hmac or token options as stored (JSON), or refuse them."""
    check = OPTION_CHECKS.get(profile)
    if check is None:
        if given:
            raise Refused("hmac and token options apply to --profile hmac or token only")
        return None
    try:
        return json.dumps(check(given or {}), sort_keys=True)
    except ValueError as error:
        raise Refused(str(error)) from None


def create_integration(
    conn: Connection, box: SecretBox, actor: audit.Actor, *, account: str, name: str,
    profile: str, now: datetime, tolerance: int = 300, max_body_bytes: int | None = None,
    secret: str | None = None, sandbox: bool = False,
    settings: dict[str, str | None] | None = None, label: str | None = None,
) -> tuple[Integration, NewCredential]:
    """Create an integration with its first active credential; audited."""
    for what, slug in (("account", account), ("name", name)):
        if not SLUG.fullmatch(slug):
            raise Refused(f"{what} {slug!r} must match [a-z0-9][a-z0-9_-]{{0,62}}")
    settings = settings if settings is not None else profile_settings(profile)
    if tolerance < 1 or tolerance > 86400:
        raise Refused("tolerance must be between 1 and 86400 seconds")
    if max_body_bytes is not None and not 1 <= max_body_bytes <= MAX_BODY_BYTES_LIMIT:
        raise Refused(f"max-body-bytes must be between 1 and {MAX_BODY_BYTES_LIMIT}")
    try:
        with conn.begin_nested():
            new_id = conn.execute(
                insert(integrations).values(
                    public_id=new_integration_id(), account=account, name=name, profile=profile,
                    tolerance_seconds=tolerance, max_body_bytes=max_body_bytes,
                    sandbox=sandbox, created_at=now, **settings,
                ).returning(integrations.c.id)
            ).scalar_one()
    except IntegrityError:
        raise Refused(f"integration {account}/{name} already exists") from None
    integration = get_integration_by_id(conn, new_id)
    audit.record(conn, actor, "integration.create", integration.public_id, at=now,
                 scope=integration.scope,
                 detail={"profile": profile, **{k: v for k, v in settings.items() if v}})
    # credentials.py looks integrations up, so it is imported here, not at the top.
    from ledger.access.credentials import add_credential

    credential = add_credential(conn, box, actor, integration, now=now, secret=secret,
                                label=label)
    return integration, credential


def get_integration(conn: Connection, public_id: str) -> Integration:
    """Return the integration with this public id, or raise NotFound."""
    if not INTEGRATION_ID.fullmatch(public_id):
        raise NotFound("integration", public_id)
    row = conn.execute(select(integrations).where(integrations.c.public_id == public_id)).first()
    if row is None:
        raise NotFound("integration", public_id)
    return Integration.from_row(row)


def get_integration_by_id(conn: Connection, integration_id: int) -> Integration:
    """Return the integration with this internal id (the scope id)."""
    row = conn.execute(select(integrations).where(integrations.c.id == integration_id)).first()
    if row is None:
        raise NotFound("integration", str(integration_id))
    return Integration.from_row(row)


class ScopeName(NamedTuple):
    """How pages and logs name a scope: `account/integration`, and its public id."""

    scope: str
    integration: str


_SCOPE_NAMES = (select(integrations.c.id, integrations.c.account, integrations.c.name,
                       integrations.c.public_id)
                .where(integrations.c.id.in_(bindparam("ids", expanding=True))))


def scope_names(conn: Connection, integration_ids: Collection[int]) -> dict[int, ScopeName]:
    """Return the scope and public id of each of these internal ids that exists.

    One statement for many: a worker's batch names the scopes of all its work items at once,
    and a page the scopes of all its rows.
    """
    if not integration_ids:
        return {}
    rows = conn.execute(_SCOPE_NAMES, {"ids": sorted(integration_ids)})
    return {int(row.id): ScopeName(scope_name(row.account, row.name), row.public_id)
            for row in rows}


def get_integration_by_scope(conn: Connection, scope: str) -> Integration:
    """Return the integration named by `account/name`, or raise NotFound."""
    account, _, name = scope.partition("/")
    if not (SLUG.fullmatch(account) and SLUG.fullmatch(name)):
        raise NotFound("scope", scope)  # no query for what no scope can be (NUL, spaces…)
    row = conn.execute(
        select(integrations).where(integrations.c.account == account,
                                   integrations.c.name == name)
    ).first()
    if row is None:
        raise NotFound("scope", scope)
    return Integration.from_row(row)
