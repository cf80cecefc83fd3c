"""`ledger destination …`: forward an integration's events to an HTTP service (CONTRACT 8)."""

from __future__ import annotations

from collections.abc import Callable

import click

from ledger.access import audit
from ledger.access.credentials import DEFAULT_OVERLAP_SECONDS, MAX_OVERLAP_SECONDS
from ledger.access.integrations import get_integration
from ledger.cli import ledger_cli
from ledger.cli.common import emit, handles_ledger_errors, json_option, services
from ledger.config import Settings
from ledger.destinations.addresses import AddressPolicy
from ledger.destinations.secrets import rotate_secret
from ledger.destinations.store import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_TIMEOUT_SECONDS,
    MAX_IN_FLIGHT,
    MAX_RATE_PER_SECOND,
    MAX_TIMEOUT_SECONDS,
    DestinationSettings,
    DestinationState,
    create_destination,
    list_destinations,
    set_destination_state,
)
from ledger.errors import Refused
from ledger.worker.handlers import load_registry

DESTINATION_ID_HELP = "Destination id (dst_…)."


@ledger_cli.group("destination")
def destination_group() -> None:
    """Destinations: an integration's events forwarded to an HTTP endpoint."""


def handled_types(settings: Settings) -> list[str]:
    """Return the event types the configured Python handlers take (a destination may not)."""
    try:
        return load_registry(settings).types()
    except ValueError as error:  # a handler module that does not import
        raise Refused(f"cannot tell which types have a Python handler: {error}") from None


@destination_group.command("create")
@click.option("--integration", "public_id", required=True, help="Integration id (in_…).")
@click.option("--url", required=True, help="The endpoint that receives each event (POST).")
@click.option("--event-type", "event_types", multiple=True,
              help="Forward only this type (repeat for more); default: every type.")
@click.option("--timeout", type=click.FloatRange(0, MAX_TIMEOUT_SECONDS, min_open=True),
              default=DEFAULT_TIMEOUT_SECONDS, show_default=True,
              help="Seconds one request may take in all.")
@click.option("--max-in-flight", type=click.IntRange(1, MAX_IN_FLIGHT),
              default=DEFAULT_MAX_IN_FLIGHT, show_default=True,
              help="Requests in progress at once, across all workers.")
@click.option("--rate", type=click.FloatRange(0, MAX_RATE_PER_SECOND, min_open=True),
              default=None, help="Requests per second at most.")
@json_option
@handles_ledger_errors
def destination_create(public_id: str, url: str, event_types: tuple[str, ...], timeout: float,
                       max_in_flight: int, rate: float | None, as_json: bool) -> None:
    """Create a destination; its signing secret (whsec_…) is printed once."""
    svc = services()
    wanted = DestinationSettings(url=url, event_types=event_types, timeout_seconds=timeout,
                                 max_in_flight=max_in_flight, rate_per_second=rate)
    handled = handled_types(svc.settings)
    with svc.engine.begin() as conn:
        integration = get_integration(conn, public_id)
        created = create_destination(conn, svc.box, audit.Actor.cli(), integration, wanted,
                                     policy=AddressPolicy.from_settings(svc.settings),
                                     handled_types=handled, now=svc.clock.now())
    emit(as_json, created.to_json(),
         text=f"destination {created.destination.public_id} → {url}\n"
              f"signing secret (shown once): {created.signing_secret}")


@destination_group.command("list")
@click.option("--integration", "public_id", default=None, help="Only this integration's.")
@json_option
@handles_ledger_errors
def destination_list(public_id: str | None, as_json: bool) -> None:
    """List destinations with their state (never a secret)."""
    svc = services()
    with svc.engine.connect() as conn:
        integration_id = get_integration(conn, public_id).id if public_id else None
        rows = [d.to_json() for d in list_destinations(conn, integration_id=integration_id)]
    emit(as_json, {"destinations": rows},
         text="\n".join(f"{r['destination']}  {r['state']:<6}  {r['url']}" for r in rows))


def _change_state(public_id: str, state: DestinationState, reason: str, as_json: bool) -> None:
    """Pause or resume, audited, and print the new state."""
    svc = services()
    with svc.engine.begin() as conn:
        destination = set_destination_state(conn, audit.Actor.cli(), public_id, state,
                                            reason=reason, now=svc.clock.now())
    emit(as_json, {"destination": destination.public_id, "state": destination.state.value},
         text=f"{destination.public_id} is {destination.state.value}")


def _state_options(func: Callable[..., None]) -> Callable[..., None]:
    """Give pause and resume their shared options: the destination, a reason, --json."""
    for option in reversed((
            click.option("--destination", "public_id", required=True, help=DESTINATION_ID_HELP),
            click.option("--reason", required=True, help="Why (kept in the audit log)."),
            json_option, handles_ledger_errors)):
        func = option(func)
    return func


@destination_group.command("pause")
@_state_options
def destination_pause(public_id: str, reason: str, as_json: bool) -> None:
    """Hold the destination's events (no attempt spent) until `resume`."""
    _change_state(public_id, DestinationState.PAUSED, reason, as_json)


@destination_group.command("resume")
@_state_options
def destination_resume(public_id: str, reason: str, as_json: bool) -> None:
    """Deliver the destination's events again."""
    _change_state(public_id, DestinationState.ACTIVE, reason, as_json)


@destination_group.command("rotate")
@click.option("--destination", "public_id", required=True, help=DESTINATION_ID_HELP)
@click.option("--overlap", type=click.IntRange(0, MAX_OVERLAP_SECONDS),
              default=DEFAULT_OVERLAP_SECONDS, show_default=True,
              help="Seconds the old secret keeps signing beside the new one.")
@click.option("--reason", default=None, help="Why (kept in the audit log).")
@json_option
@handles_ledger_errors
def destination_rotate(public_id: str, overlap: int, reason: str | None, as_json: bool) -> None:
    """Make a new signing secret; the old one also signs until the overlap ends."""
    svc = services()
    with svc.engine.begin() as conn:
        rotation = rotate_secret(conn, svc.box, audit.Actor.cli(), public_id,
                                 now=svc.clock.now(), overlap_seconds=overlap, reason=reason)
    retiring = "\n".join(f"retiring {f} until {at.isoformat()}" for f, at in rotation.retiring)
    emit(as_json, rotation.to_json(),
         text=f"signing secret (shown once): {rotation.signing_secret}\n{retiring}".strip())
