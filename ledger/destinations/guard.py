"""The connection a destination makes: resolved, checked, connected to the checked address.

A destination URL is written by an operator, but the address it reaches is decided by
DNS at the moment of each connection, and DNS can change between a check and a connect
(rebinding). So the check happens in the connection itself: `GuardedBackend` (an
httpcore network backend) resolves the host, refuses the connection if ANY address is
internal (ledger.destinations.addresses), and connects to the address it checked, never
to the name again. Host and TLS SNI keep the URL's host name (httpcore takes them from
the request, not from here). Its streams also end every read and write by the forward's
total deadline.
"""

from __future__ import annotations

import contextvars
import socket
import time
import typing
from collections.abc import Callable, Iterable, Sequence

import httpcore

from ledger.destinations.addresses import AddressPolicy

Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """Return every address `host` resolves to (the operating system's resolver)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# The deadline of the forward in progress (time.monotonic), read by the guarded streams:
# httpcore's timeouts bound each read or write, this bounds the request as a whole.
DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "ledger_destination_deadline", default=None)


def _clamped(timeout: float | None) -> float | None:
    """Return `timeout` shortened to what is left before the deadline; raise when none is."""
    deadline = DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("the destination's total deadline passed")
    return left if timeout is None else min(timeout, left)


class GuardedStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the forward's total deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Read under the shorter of the read timeout and the time left."""
        return self._inner.read(max_bytes, _clamped(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Write under the shorter of the write timeout and the time left."""
        self._inner.write(buffer, _clamped(timeout))

    def close(self) -> None:
        """Close the connection."""
        self._inner.close()

    def start_tls(self, ssl_context: typing.Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        """Start TLS (certificate and SNI of the URL's host) within the deadline."""
        return GuardedStream(self._inner.start_tls(ssl_context, server_hostname,
                                                   _clamped(timeout)))

    def get_extra_info(self, info: str) -> typing.Any:
        """Pass through (httpcore asks for the socket, TLS object, peer address)."""
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore.NetworkBackend):
    """Resolve, check every address, connect only to a checked address."""

    def __init__(self, policy: AddressPolicy, *, resolver: Resolver = system_resolver,
                 inner: httpcore.NetworkBackend | None = None) -> None:
        self._policy = policy
        self._resolve = resolver
        self._inner = inner or httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[typing.Any] | None = None
                    ) -> httpcore.NetworkStream:
        """Connect to the first reachable checked address of `host`; refuse internal ones."""
        try:
            addresses = self._resolve(host, port)
        except OSError as error:
            raise httpcore.ConnectError(f"cannot resolve {host}: {error}") from None
        if not addresses:
            raise httpcore.ConnectError(f"{host} resolves to no address")
        for address in addresses:  # every one: a hostile zone mixes in an internal one
            self._policy.check(host, address)
        return self._connect_first(addresses, port, timeout, local_address, socket_options)

    def _connect_first(self, addresses: Sequence[str], port: int, timeout: float | None,
                       local_address: str | None,
                       socket_options: Iterable[typing.Any] | None) -> httpcore.NetworkStream:
        """Try the checked addresses in order; raise the last error if none answers."""
        error: Exception | None = None
        for address in addresses:
            try:
                stream = self._inner.connect_tcp(address, port, _clamped(timeout),
                                                 local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as failed:
                error = failed
                continue
            return GuardedStream(stream)
        raise error or httpcore.ConnectError("no address to connect to")

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[typing.Any] | None = None
                            ) -> httpcore.NetworkStream:
        """Refuse: a destination is a TCP endpoint."""
        raise httpcore.ConnectError("destinations do not use unix sockets")

    def sleep(self, seconds: float) -> None:
        """Sleep (httpcore's connection retries; the ledger configures none)."""
        self._inner.sleep(seconds)
