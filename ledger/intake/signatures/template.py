"""Signed-content templates and the endpoint URL's spellings, for the SignedContent scheme."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

_PLACEHOLDER = re.compile(r"(\{id\}|\{timestamp\}|\{body\}|\{url\}|\{method\})")
METHOD = "POST"  # the intake receives POST only: `{method}` is always this
DEFAULT_PORTS = {"https": 443, "http": 80}


def _format_string(parts: list[str]) -> str:
    """Join template parts into a str.format string, literal braces escaped."""
    return "".join(part if _PLACEHOLDER.fullmatch(part)
                   else part.replace("{", "{{").replace("}", "}}") for part in parts)


@dataclass(frozen=True, slots=True)
class Template:
    """A signed-content template: `{body}` once, and `{id}`, `{timestamp}`, `{method}`,
    `{url}` anywhere around it (HubSpot v3 puts the timestamp after the body)."""

    text: str
    # Compiled once, so the hot path pays one str.format and one encode: the text
    # before `{body}` as a format string, the text after it as bytes when it is
    # literal (every preset but HubSpot), else as a format string too.
    _head: str = field(init=False, repr=False)
    _tail: bytes = field(init=False, repr=False)
    _tail_format: str | None = field(init=False, repr=False)
    _names: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        parts = _PLACEHOLDER.split(self.text)
        names = tuple(part[1:-1] for part in parts if _PLACEHOLDER.fullmatch(part))
        if names.count("body") != 1:
            raise ValueError("the signed content holds {body} exactly once")
        at = parts.index("{body}")
        after = parts[at + 1:]
        templated = any(_PLACEHOLDER.fullmatch(part) for part in after)
        object.__setattr__(self, "_head", _format_string(parts[:at]))
        object.__setattr__(self, "_tail", b"" if templated else "".join(after).encode())
        object.__setattr__(self, "_tail_format", _format_string(after) if templated else None)
        object.__setattr__(self, "_names", names)

    def __call__(self, msg_id: str, raw_timestamp: str, body: bytes, url: str) -> bytes:
        """Return the bytes the sender signs."""
        head = self._head.format(id=msg_id, timestamp=raw_timestamp, url=url,
                                 method=METHOD).encode()
        if self._tail_format is not None:
            return head + body + self._tail_format.format(
                id=msg_id, timestamp=raw_timestamp, url=url, method=METHOD).encode()
        return head + body + self._tail if self._tail else head + body

    @property
    def placeholders(self) -> set[str]:
        """Return the placeholders the template uses."""
        return {"{" + name + "}" for name in self._names}


def default_port_variant(url: str) -> str | None:
    """Return `url` with its scheme's default port added, or removed when it has it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    default = DEFAULT_PORTS.get(parts.scheme)
    if default is None or not parts.hostname:
        return None
    host = parts.netloc.rpartition("@")[2]
    userinfo = parts.netloc[:len(parts.netloc) - len(host)]
    if port is None:
        netloc = f"{userinfo}{host}:{default}"
    elif port == default:
        netloc = userinfo + host.rsplit(":", 1)[0]
    else:
        return None
    return urlunsplit(parts._replace(netloc=netloc))
