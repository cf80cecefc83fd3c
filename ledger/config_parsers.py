"""How a setting's text becomes a value: the parsers `ledger.config` declares settings with.

Each parser reads one non-empty string strictly and says in words what it accepts (the
settings reference shows that). A value that does not parse, or lies out of range, raises
SettingsError naming the variable. An empty value never reaches a parser: it counts as unset.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
# The longest duration accepted: ten years (a larger one overflows date arithmetic).
MAX_DURATION_SECONDS = 10 * 365 * 86400
# What a PostgreSQL URL starts with (the dialect, with or without a driver).
POSTGRESQL_PREFIXES = ("postgresql://", "postgresql+")


class SettingsError(ValueError):
    """A setting is malformed, out of range, or missing; the message names the variable."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class Parser(Protocol):
    """Turns a variable's text into its value."""

    @property
    def accepts(self) -> str:
        """Say in words which values are accepted (for the settings reference)."""

    def parse(self, name: str, raw: str) -> Any:
        """Return the value of `raw`, or raise SettingsError naming `name`."""


def _format(value: float) -> str:
    """Return a bound as the reference shows it (60, not 60.0)."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _number(name: str, raw: str, parse: Callable[[str], Any], expected: str,
            minimum: float | None, maximum: float | None) -> Any:
    """Return `raw` parsed and range-checked."""
    try:
        if raw != raw.strip():
            raise ValueError(raw)  # int() and float() would strip it silently
        value = parse(raw)
    except ValueError:
        raise SettingsError(name, f"{name} must be {expected}, got {raw!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise SettingsError(name, f"{name} must be {expected}, got {raw!r}")
    if minimum is not None and value < minimum:
        raise SettingsError(name, f"{name} must be >= {minimum}, got {raw!r}")
    if maximum is not None and value > maximum:
        raise SettingsError(name, f"{name} must be <= {maximum}, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class Integer:
    """A whole number within [minimum, maximum]."""

    minimum: int = 0
    maximum: int | None = None

    @property
    def accepts(self) -> str:
        """Say which whole numbers are accepted."""
        upper = f" and ≤ {self.maximum}" if self.maximum is not None else ""
        return f"an integer ≥ {self.minimum}{upper}"

    def parse(self, name: str, raw: str) -> int:
        """Return the integer."""
        value: int = _number(name, raw, int, "an integer", self.minimum, self.maximum)
        return value


@dataclass(frozen=True, slots=True)
class Seconds:
    """A duration in seconds, fractions allowed; a whole number stays an int."""

    minimum: float = 0
    maximum: float = MAX_DURATION_SECONDS

    @property
    def accepts(self) -> str:
        """Say which durations are accepted."""
        return f"a number of seconds ≥ {_format(self.minimum)} (fractions allowed)"

    def parse(self, name: str, raw: str) -> float:
        """Return the duration."""
        value: float = _number(name, raw, float, "a number of seconds", self.minimum,
                               self.maximum)
        return int(value) if value.is_integer() else value


@dataclass(frozen=True, slots=True)
class Real:
    """A number above `above` (exclusive) and at most `at_most`."""

    expected: str
    above: float | None = None
    at_most: float | None = None

    @property
    def accepts(self) -> str:
        """Say which numbers are accepted."""
        return self.expected

    def parse(self, name: str, raw: str) -> float:
        """Return the number."""
        value: float = _number(name, raw, float, self.expected, None, None)
        bounds = [f"> {_format(self.above)}"] if self.above is not None else []
        bounds += [f"<= {_format(self.at_most)}"] if self.at_most is not None else []
        too_low = self.above is not None and not value > self.above
        if too_low or (self.at_most is not None and value > self.at_most):
            raise SettingsError(name, f"{name} must be {' and '.join(bounds)}, got {raw!r}")
        return value


@dataclass(frozen=True, slots=True)
class Boolean:
    """1 true yes on / 0 false no off, in any case, nothing else."""

    @property
    def accepts(self) -> str:
        """Say which words are accepted."""
        return "a boolean: 1 true yes on / 0 false no off (any case)"

    def parse(self, name: str, raw: str) -> bool:
        """Return the boolean."""
        if raw.lower() in TRUE_WORDS:
            return True
        if raw.lower() in FALSE_WORDS:
            return False
        raise SettingsError(name, f"{name} must be a boolean (1, true, yes, on / 0, false, no, "
                                  f"off), got {raw!r}")


@dataclass(frozen=True, slots=True)
class Choice:
    """One of a few words, compared in any case, returned as listed."""

    choices: tuple[str, ...]
    upper: bool = False

    @property
    def accepts(self) -> str:
        """List the words."""
        return "one of " + ", ".join(f"`{c}`" for c in self.choices) + " (any case)"

    def parse(self, name: str, raw: str) -> str:
        """Return the word as listed."""
        value = raw.upper() if self.upper else raw.lower()
        if value not in self.choices:
            raise SettingsError(name, f"{name} must be one of {', '.join(self.choices)}, "
                                      f"got {raw!r}")
        return value


@dataclass(frozen=True, slots=True)
class Text:
    """Any text, taken as given (a key, a token, a URL, a file name)."""

    what: str = "text"

    @property
    def accepts(self) -> str:
        """Say what the text is."""
        return self.what

    def parse(self, name: str, raw: str) -> str:
        """Return the text."""
        return raw


@dataclass(frozen=True, slots=True)
class Directory:
    """A directory, resolved against the working directory."""

    @property
    def accepts(self) -> str:
        """Say what is accepted."""
        return "a directory path"

    def parse(self, name: str, raw: str) -> Path:
        """Return the resolved path."""
        return Path(raw).resolve()


@dataclass(frozen=True, slots=True)
class Names:
    """Comma-separated names (import paths, host names); blanks between commas are ignored."""

    what: str = "comma-separated names"

    @property
    def accepts(self) -> str:
        """Say what is accepted."""
        return self.what

    def parse(self, name: str, raw: str) -> tuple[str, ...]:
        """Return the names in order."""
        return tuple(m.strip() for m in raw.split(",") if m.strip())


@dataclass(frozen=True, slots=True)
class HostsOrNetworks:
    """Comma-separated CIDRs (or single addresses) and host names, normalised."""

    @property
    def accepts(self) -> str:
        """Say what is accepted."""
        return "comma-separated CIDRs, addresses or host names"

    def parse(self, name: str, raw: str) -> tuple[str, ...]:
        """Return each entry as a CIDR or a lower-case host name without a trailing dot."""
        from ledger.ids import HOST_NAME

        entries: list[str] = []
        for item in filter(None, (p.strip() for p in raw.split(","))):
            try:
                entries.append(str(ipaddress.ip_network(item, strict=False)))
            except ValueError:
                if not HOST_NAME.fullmatch(item.lower()):
                    raise SettingsError(name, f"{name} must be CIDRs or host names separated "
                                              f"by commas, bad entry {item!r}") from None
                entries.append(item.lower().rstrip("."))
        return tuple(entries)


@dataclass(frozen=True, slots=True)
class Periods:
    """`job=seconds` pairs separated by commas; 0 switches a job off."""

    @property
    def accepts(self) -> str:
        """Say what is accepted."""
        return "`job=seconds` pairs separated by commas (seconds ≥ 0; 0 switches a job off)"

    def parse(self, name: str, raw: str) -> dict[str, float]:
        """Return the period of each job named."""
        overrides: dict[str, float] = {}
        for item in filter(None, (p.strip() for p in raw.split(","))):
            job, _, value = item.partition("=")
            try:
                seconds = float(value)
            except ValueError:
                seconds = math.nan
            if not job.strip() or not math.isfinite(seconds) or seconds < 0:
                raise SettingsError(name, f"{name} must be job=seconds pairs separated by "
                                          f"commas (seconds >= 0), bad period in {item!r}")
            overrides[job.strip()] = seconds
        return overrides


@dataclass(frozen=True, slots=True)
class Bind:
    """Where gunicorn listens: host:port or unix:/path."""

    @property
    def accepts(self) -> str:
        """Say what is accepted."""
        return "`host:port` (port 1-65535) or `unix:/path`"

    def parse(self, name: str, raw: str) -> str:
        """Return the address."""
        host, _, port = raw.rpartition(":")
        if not raw.startswith("unix:") and not (host and port.isdigit()
                                                and 0 < int(port) < 65536):
            raise SettingsError(name, f"{name} must be host:port (port 1-65535) "
                                      f"or unix:/path, got {raw!r}")
        return raw


def url_scheme(url: str) -> str:
    """Return a URL's scheme only: the rest may hold a password."""
    return url.strip().partition(":")[0]


@dataclass(frozen=True, slots=True)
class PostgresUrl:
    """A PostgreSQL SQLAlchemy URL; an error never repeats it past its scheme."""

    why: str

    @property
    def accepts(self) -> str:
        """Say what is accepted."""
        return "a PostgreSQL URL (`postgresql+psycopg://…`)"

    def parse(self, name: str, raw: str) -> str:
        """Return the URL."""
        if raw != raw.strip() or not raw.startswith(POSTGRESQL_PREFIXES):
            what = "a SQLite URL" if raw.strip().startswith("sqlite") else repr(url_scheme(raw))
            raise SettingsError(name, f"{name} must be a PostgreSQL URL "
                                      f"(postgresql+psycopg://…), got {what}: {self.why}")
        return raw


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """One environment variable: its one declaration.

    `from_env`, the settings reference page and `deploy/ledger.env.example` all come from
    these fields; tests/unit/test_settings_declared.py fails when anything disagrees.
    """

    name: str
    meaning: str
    parser: Parser
    default: Any = None  # the value when unset; None: unset stays None
    # The default computed from the other variables (it wins over `default`), and how the
    # reference states it.
    default_from: Callable[[Mapping[str, str]], Any] | None = None
    shown_default: str | None = None
    attribute: str | None = None  # the field it fills; None: read where it is used
    convert: Callable[[Any], Any] | None = None  # from the parsed text to the field's unit
    production: bool = False  # LEDGER_ENV=production refuses to start without it
    example: str | None = None  # what deploy/ledger.env.example sets it to
    section: str = "General"
    # Who reads it: "settings" (a Settings field), "web" (WebServerSettings, gunicorn) or
    # "process" (read once where it is used, through a function of ledger.config).
    owner: str = "settings"

    def read(self, env: Mapping[str, str]) -> Any:
        """Return the variable's value in `env`: parsed, or its default when unset or empty."""
        raw = env.get(self.name)
        if raw:
            value = self.parser.parse(self.name, raw)
        else:
            value = self.default_from(env) if self.default_from else self.default
        return self.convert(value) if self.convert and value is not None else value
