"""Which addresses a destination may reach: never an internal one unless the operator says so.

Internal means loopback, private, link-local, CGNAT (shared), multicast, unspecified,
reserved and documentation ranges, the cloud metadata addresses, and IPv6 forms that
carry an IPv4 address (IPv4-mapped, 6to4, NAT64, Teredo) of any of these.
LEDGER_DESTINATION_ALLOW lists CIDRs and host names that may be reached anyway.
The check on every connection is ledger.destinations.guard's; docs/explanation/
security-destinations.md lists the cases the tests prove.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ledger.config import Settings
from ledger.errors import LedgerError, Refused
from ledger.ids import HOST_NAME

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4_INTERNAL = (
    ("0.0.0.0/8", "unspecified"), ("10.0.0.0/8", "private"), ("100.64.0.0/10", "CGNAT"),
    ("127.0.0.0/8", "loopback"), ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"), ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"), ("192.88.99.0/24", "6to4 relay"),
    ("192.168.0.0/16", "private"), ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"), ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"), ("240.0.0.0/4", "reserved"),
)
_V6_INTERNAL = (
    ("::/128", "unspecified"), ("::1/128", "loopback"), ("100::/64", "discard"),
    ("2001:db8::/32", "documentation"), ("fc00::/7", "private (unique local)"),
    ("fe80::/10", "link-local"), ("fec0::/10", "site-local"), ("ff00::/8", "multicast"),
)
# Metadata services on public addresses (the others sit in 169.254/16, 100.64/10 and
# fc00::/7 above): Azure's WireServer. 169.254.169.254 is named for a clearer message.
_METADATA = (("169.254.169.254/32", "cloud metadata"), ("168.63.129.16/32", "cloud metadata"),
             ("fd00:ec2::254/128", "cloud metadata"))
INTERNAL_NETWORKS: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(cidr), why) for cidr, why in (*_METADATA, *_V4_INTERNAL, *_V6_INTERNAL))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_TEREDO = ipaddress.ip_network("2001::/32")


class AddressRefused(LedgerError):
    """A destination's host resolved to an address it may not reach; nothing was sent."""

    def __init__(self, host: str, address: str, why: str) -> None:
        super().__init__(f"{host} resolves to {address} ({why}): not allowed for destinations "
                         "(LEDGER_DESTINATION_ALLOW)")
        self.host = host
        self.address = address
        self.why = why


def embedded_v4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """Return the IPv4 address an IPv6 form carries (mapped, 6to4, NAT64, Teredo), or None."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.teredo is not None:
        return address.teredo[1]  # the client's address; the server's is public by design
    return None


def internal_reason(address: IPAddress) -> str | None:
    """Return why `address` is internal (a range's name), or None for a public address."""
    for network, why in INTERNAL_NETWORKS:
        if address.version == network.version and address in network:
            return why
    inner = embedded_v4(address)
    if inner is not None:
        inner_why = internal_reason(inner)
        return f"{inner_why}, inside an IPv6 address" if inner_why else None
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class AddressPolicy:
    """Which internal addresses and host names destinations may reach anyway."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: Settings) -> AddressPolicy:
        """Return the policy of LEDGER_DESTINATION_ALLOW."""
        return cls.from_entries(settings.destination_allow)

    @classmethod
    def from_entries(cls, entries: Iterable[str]) -> AddressPolicy:
        """Build from LEDGER_DESTINATION_ALLOW's entries: CIDRs (or addresses), host names."""
        networks: list[Network] = []
        hosts: set[str] = set()
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                if not HOST_NAME.fullmatch(entry.lower()):
                    raise ValueError(f"{entry!r} is neither a CIDR nor a host name") from None
                hosts.add(entry.lower().rstrip("."))
        return cls(networks=tuple(networks), hosts=frozenset(hosts))

    def check(self, host: str, address: str) -> None:
        """Raise AddressRefused unless `host` may connect to `address`."""
        if host.lower().rstrip(".") in self.hosts:
            return
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
        if any(ip.version == net.version and ip in net for net in self.networks):
            return
        why = internal_reason(ip)
        if why is not None:
            raise AddressRefused(host, str(ip), why)


def literal_address(host: str) -> IPAddress:
    """Return the address a host written as one means, legacy forms too (0x7f.1, 2130706433).

    Raises ValueError for a host name. The system resolver reads those legacy forms as
    addresses without asking DNS, so they are addresses here as well.
    """
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            raise ValueError(f"{host!r} is not an address") from None


def check_url(url: str, policy: AddressPolicy) -> str:
    """Return the URL if a destination may use it, else raise Refused (no DNS look-up).

    An address literal or `localhost` is checked here, at creation, for a clear early
    answer; every name is checked again on its resolved addresses at each connection.
    """
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as error:
        raise Refused(f"not a usable URL: {error}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise Refused("a destination URL is http:// or https:// with a host")
    if parts.username is not None or parts.password is not None:
        raise Refused("a destination URL carries no user or password (it is listed)")
    if parts.fragment or any(c.isspace() or ord(c) < 32 for c in url):
        raise Refused("a destination URL has no fragment, spaces or control characters")
    if port == 0:
        raise Refused("a destination URL's port is 1-65535")
    literal = host.rstrip(".").lower()
    try:
        policy.check(literal, str(literal_address(literal)))
    except ValueError:
        if literal == "localhost" or literal.endswith(".localhost"):
            policy.check(literal, "127.0.0.1")
        elif not HOST_NAME.fullmatch(literal):
            raise Refused(f"{host!r} is not a host name") from None
    except AddressRefused as error:
        raise Refused(str(error)) from None
    return url
