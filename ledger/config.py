"""Settings from the environment (CONTRACT.md section 5), read once per process."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# Retention default, documented in README ("Retention"): the sender's maximum
# retry window (Stripe retries for up to 3 days; GitHub allows manual
# redelivery for 3 days) + an operational repair window of 4 days + a
# clock-skew allowance of 5 minutes.
SENDER_RETRY_WINDOW_SECONDS = 3 * 86400
REPAIR_WINDOW_SECONDS = 4 * 86400
CLOCK_SKEW_SECONDS = 300
DEFAULT_RETENTION_SECONDS = SENDER_RETRY_WINDOW_SECONDS + REPAIR_WINDOW_SECONDS + CLOCK_SKEW_SECONDS
DEFAULT_REVIEW_WINDOW_SECONDS = 14 * 86400
# Share of wall time the retention purge may spend deleting (jobs/retention.py
# Pacer); the rest is left to the intake. 1 = full speed.
DEFAULT_DUTY_CYCLE = 0.5


def project_root() -> Path:
    """Return the directory holding app.py, templates/, static/ and migrations/."""
    return Path(__file__).resolve().parent.parent


def database_url_from_env(env: Mapping[str, str] | None = None) -> str:
    """Return DATABASE_URL, defaulting to the embedded SQLite file under var/."""
    env = os.environ if env is None else env
    url = env.get("DATABASE_URL")
    if url:
        return url
    return f"sqlite:///{Path(env.get('LEDGER_VAR_DIR', 'var')).resolve() / 'ledger.sqlite3'}"


def _parsed(env: Mapping[str, str], name: str, parse: Callable[[str], Any],
            expected: str) -> Any:
    """Return the setting parsed, None when unset; garbage is refused with a clear message."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return parse(raw)
    except ValueError:
        raise ValueError(f"{name} must be {expected}, got {raw!r}") from None


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    """Read an integer setting, refusing garbage with a clear message."""
    value: int | None = _parsed(env, name, int, "an integer")
    if value is None:
        return default
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_duty_cycle(value: float, name: str = "duty_cycle") -> float:
    """Return a purge duty cycle, refusing one outside (0, 1]."""
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be > 0 and <= 1 (a share of wall time), got {value}")
    return value


def _duty_cycle(env: Mapping[str, str], name: str) -> float:
    """Read LEDGER_PURGE_DUTY_CYCLE, refusing garbage with a clear message."""
    value = _parsed(env, name, float, "a number in (0, 1]")
    if value is None:
        return DEFAULT_DUTY_CYCLE
    if value != value:  # NaN passes no comparison, so check_duty_cycle would let it through
        raise ValueError(f"{name} must be a number in (0, 1], got {env[name]!r}")
    return check_duty_cycle(value, name)


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """Read a positive, finite number of seconds, refusing garbage with a clear message."""
    value = _parsed(env, name, float, "a number of seconds > 0")
    if value is None:
        return default
    if not 0 < value < float("inf"):  # NaN fails too
        raise ValueError(f"{name} must be a number of seconds > 0, got {env[name]!r}")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every knob of the ledger, with the contract's defaults."""

    database_url: str
    var_dir: Path = field(default_factory=lambda: Path("var").resolve())
    master_key: str | None = None
    revocation_bound_seconds: int = 30
    retention_seconds: int = DEFAULT_RETENTION_SECONDS
    review_window_seconds: int = DEFAULT_REVIEW_WINDOW_SECONDS
    purge_duty_cycle: float = DEFAULT_DUTY_CYCLE
    max_body_bytes: int = 1024 * 1024
    body_read_timeout_seconds: float = 10.0  # a slow sender gets 408 (web/body_deadline.py)
    max_attempts: int = 8
    retry_base_seconds: int = 10
    retry_cap_seconds: int = 3600
    max_event_age_seconds: int = 259200
    lease_seconds: int = 60
    demo_handlers: bool = False
    handler_modules: tuple[str, ...] = ()
    pool_size: int = 5
    pool_timeout_seconds: float = 2.0
    statement_timeout_ms: int = 5000
    lock_timeout_ms: int = 2000
    # Behind PgBouncer transaction pooling: no startup options, no prepared statements.
    db_pgbouncer: bool = False
    sqlite_synchronous: str = "FULL"
    secret_key: str | None = None
    event_id_hash_key: str | None = None
    # Dashboard sessions and logins (README "Dashboard").
    session_idle_seconds: int = 1800
    session_absolute_seconds: int = 12 * 3600
    cookie_secure: bool = False
    login_max_failures: int = 5
    login_window_seconds: int = 900
    stuck_pending_seconds: int = 900

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from environment variables (os.environ by default)."""
        env = os.environ if env is None else env
        retention = _int(env, "LEDGER_RETENTION_SECONDS", DEFAULT_RETENTION_SECONDS, 1)
        modules = tuple(m.strip() for m in env.get("LEDGER_HANDLER_MODULES", "").split(",")
                        if m.strip())
        return cls(
            database_url=database_url_from_env(env),
            var_dir=Path(env.get("LEDGER_VAR_DIR", "var")).resolve(),
            master_key=env.get("LEDGER_MASTER_KEY") or None,
            revocation_bound_seconds=_int(env, "LEDGER_REVOCATION_BOUND_SECONDS", 30),
            retention_seconds=retention,
            review_window_seconds=min(
                _int(env, "LEDGER_REVIEW_WINDOW_SECONDS", DEFAULT_REVIEW_WINDOW_SECONDS, 1),
                retention),
            purge_duty_cycle=_duty_cycle(env, "LEDGER_PURGE_DUTY_CYCLE"),
            max_body_bytes=_int(env, "LEDGER_MAX_BODY_BYTES", 1024 * 1024, 1),
            body_read_timeout_seconds=_seconds(env, "LEDGER_BODY_READ_TIMEOUT_SECONDS", 10.0),
            max_attempts=_int(env, "LEDGER_MAX_ATTEMPTS", 8, 1),
            retry_base_seconds=_int(env, "LEDGER_RETRY_BASE_SECONDS", 10),
            retry_cap_seconds=_int(env, "LEDGER_RETRY_CAP_SECONDS", 3600),
            max_event_age_seconds=_int(env, "LEDGER_MAX_EVENT_AGE_SECONDS", 259200, 1),
            lease_seconds=_int(env, "LEDGER_LEASE_SECONDS", 60, 1),
            demo_handlers=env.get("LEDGER_DEMO_HANDLERS", "") in ("1", "true", "yes"),
            handler_modules=modules,
            pool_size=_int(env, "LEDGER_DB_POOL_SIZE", 5, 1),
            pool_timeout_seconds=float(_int(env, "LEDGER_DB_POOL_TIMEOUT_MS", 2000, 1)) / 1000,
            statement_timeout_ms=_int(env, "LEDGER_DB_STATEMENT_TIMEOUT_MS", 5000, 1),
            lock_timeout_ms=_int(env, "LEDGER_DB_LOCK_TIMEOUT_MS", 2000, 1),
            db_pgbouncer=env.get("LEDGER_DB_PGBOUNCER", "") in ("1", "true", "yes"),
            sqlite_synchronous=env.get("LEDGER_SQLITE_SYNCHRONOUS", "FULL").upper(),
            secret_key=env.get("LEDGER_SECRET_KEY") or None,
            event_id_hash_key=env.get("LEDGER_LOG_HASH_KEY") or None,
            session_idle_seconds=_int(env, "LEDGER_SESSION_IDLE_SECONDS", 1800, 60),
            session_absolute_seconds=_int(env, "LEDGER_SESSION_ABSOLUTE_SECONDS", 43200, 60),
            cookie_secure=env.get("LEDGER_COOKIE_SECURE", "") in ("1", "true", "yes"),
            login_max_failures=_int(env, "LEDGER_LOGIN_MAX_FAILURES", 5, 1),
            login_window_seconds=_int(env, "LEDGER_LOGIN_WINDOW_SECONDS", 900, 1),
            stuck_pending_seconds=_int(env, "LEDGER_STUCK_PENDING_SECONDS", 900, 1),
        )

    def with_(self, **changes: Any) -> Settings:
        """Return a copy with some fields changed (tests, the drill)."""
        return replace(self, **changes)
