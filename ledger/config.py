"""Settings from the environment (CONTRACT.md section 5), read once per process, strictly.

Every environment variable the ledger reads is read here and nowhere else. A
value that does not parse, or lies out of range, raises SettingsError naming
the variable: the process stops at start instead of running on a silent
default. An empty value counts as unset.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import secrets
import tempfile
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
# The delivery log (README "Delivery log"): how long its rows are kept, and how many
# exact refusal rows per minute one process writes per integration (and per dead key)
# before it only counts them.
DEFAULT_DELIVERY_LOG_SECONDS = 14 * 86400
DEFAULT_DELIVERY_LOG_REFUSALS_PER_MINUTE = 60
# Share of wall time the retention purge may spend deleting (jobs/retention.py
# Pacer); the rest is left to the intake. 1 = full speed.
DEFAULT_DUTY_CYCLE = 0.5
# The longest duration accepted: ten years (a larger one overflows date arithmetic).
MAX_DURATION_SECONDS = 10 * 365 * 86400
# Jobs a worker claims and commits at once (ledger/worker/batch.py; 1 = one per claim).
# Unset, it is the measured best for the database (bench/README.md, "Workers", seventh
# round): 16 on PostgreSQL; 8 on SQLite, where a batch holds the one writer against the
# intake. A batch is one transaction with a subtransaction (savepoint) per job: past 64
# of them PostgreSQL's per-backend subtransaction cache overflows and every other
# session's snapshot checks slow down, hence the ceiling.
DEFAULT_WORKER_BATCH = 8  # SQLite's, and any database but PostgreSQL
DEFAULT_WORKER_BATCH_POSTGRESQL = 16
MAX_WORKER_BATCH = 64

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
ENVIRONMENTS = ("development", "production")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SQLITE_SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")
# Without these a production process refuses to start (no key is generated there).
PRODUCTION_KEYS = ("LEDGER_SECRET_KEY", "LEDGER_MASTER_KEY", "LEDGER_LOG_HASH_KEY",
                   "LEDGER_AUDIT_KEY")
# Files under var/ that hold the keys generated for development.
SECRET_KEY_FILE = "flask-secret.key"
MASTER_KEY_FILE = "master.key"
LOG_HASH_KEY_FILE = "log-hash.key"
AUDIT_KEY_FILE = "audit.key"
DEFAULT_BIND = "127.0.0.1:8000"
# What a PostgreSQL URL starts with (the dialect, with or without a driver).
POSTGRESQL_PREFIXES = ("postgresql://", "postgresql+")
# A body read deadline shorter than this would cut off senders on any real network.
MIN_BODY_READ_TIMEOUT_SECONDS = 0.1


class SettingsError(ValueError):
    """A setting is malformed, out of range, or missing; the message names the variable."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def _environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    """Return `env`, or the process environment when None."""
    return os.environ if env is None else env


def _raw(env: Mapping[str, str], name: str) -> str | None:
    """Return the variable's text, None when unset or empty."""
    raw = env.get(name)
    return raw if raw else None


def _number(env: Mapping[str, str], name: str, parse: Callable[[str], Any], expected: str,
            minimum: float | None, maximum: float | None) -> Any:
    """Return the variable parsed and range-checked, None when unset."""
    raw = _raw(env, name)
    if raw is None:
        return None
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


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0,
         maximum: int | None = None) -> int:
    """Read an integer setting."""
    value = _number(env, name, int, "an integer", minimum, maximum)
    return default if value is None else value


def default_worker_batch(dialect_name: str) -> int:
    """Return the worker's batch size when LEDGER_WORKER_BATCH is unset, for the database."""
    return DEFAULT_WORKER_BATCH_POSTGRESQL if dialect_name == "postgresql" else DEFAULT_WORKER_BATCH


def _seconds(env: Mapping[str, str], name: str, default: float, minimum: float = 0,
             maximum: float = MAX_DURATION_SECONDS) -> float:
    """Read a duration in seconds; fractions allowed (a whole number stays an int)."""
    value = _number(env, name, float, "a number of seconds", minimum, maximum)
    if value is None:
        return default
    return int(value) if value.is_integer() else value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    """Read a boolean: 1 true yes on / 0 false no off, in any case, nothing else."""
    raw = _raw(env, name)
    if raw is None:
        return default
    if raw.lower() in TRUE_WORDS:
        return True
    if raw.lower() in FALSE_WORDS:
        return False
    raise SettingsError(name, f"{name} must be a boolean (1, true, yes, on / 0, false, no, "
                              f"off), got {raw!r}")


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...],
            *, upper: bool) -> str:
    """Read one of a few words (compared in any case, returned as listed)."""
    raw = _raw(env, name)
    if raw is None:
        return default
    value = raw.upper() if upper else raw.lower()
    if value not in choices:
        raise SettingsError(name, f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return value


def check_duty_cycle(value: float, name: str = "duty_cycle") -> float:
    """Return a purge duty cycle, refusing one outside (0, 1]."""
    if not 0 < value <= 1:
        raise SettingsError(name, f"{name} must be > 0 and <= 1 (a share of wall time), "
                                  f"got {value}")
    return value


def _duty_cycle(env: Mapping[str, str], name: str) -> float:
    """Read LEDGER_PURGE_DUTY_CYCLE, a share of wall time in (0, 1]."""
    value = _number(env, name, float, "a number in (0, 1]", None, None)
    return DEFAULT_DUTY_CYCLE if value is None else check_duty_cycle(value, name)


def _periods(env: Mapping[str, str], name: str) -> dict[str, float]:
    """Read LEDGER_SCHEDULER_PERIODS ("sweep=5,rollups=30"); 0 switches a job off."""
    overrides: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in (_raw(env, name) or "").split(","))):
        job, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not job.strip() or not math.isfinite(seconds) or seconds < 0:
            raise SettingsError(name, f"{name} must be job=seconds pairs separated by commas "
                                      f"(seconds >= 0), bad period in {item!r}")
        overrides[job.strip()] = seconds
    return overrides


def _scale(env: Mapping[str, str], name: str) -> float:
    """Read LEDGER_SCHEDULER_PERIOD_SCALE, a factor > 0 applied to every period."""
    value: float | None = _number(env, name, float, "a number > 0", None, None)
    if value is None:
        return 1.0
    if not value > 0:
        raise SettingsError(name, f"{name} must be > 0, got {env[name]!r}")
    return value


def database_url_from_env(env: Mapping[str, str] | None = None) -> str:
    """Return DATABASE_URL, defaulting to the embedded SQLite file under var/."""
    env = _environ(env)
    return _raw(env, "DATABASE_URL") or f"sqlite:///{_var_dir(env) / 'ledger.sqlite3'}"


def read_database_url(env: Mapping[str, str], primary: str) -> str | None:
    """Return LEDGER_READ_DATABASE_URL (a PostgreSQL read replica), None when unset.

    A replica serves reads only (README "A read replica for the dashboard"): it must be
    PostgreSQL, and so must the primary it replicates. SQLite has no streaming replica.
    """
    name = "LEDGER_READ_DATABASE_URL"
    raw = _raw(env, name)
    if raw is None:
        return None
    if raw != raw.strip() or not raw.startswith(POSTGRESQL_PREFIXES):
        what = "a SQLite URL" if raw.strip().startswith("sqlite") else repr(_url_scheme(raw))
        raise SettingsError(name, f"{name} must be a PostgreSQL URL "
                                  f"(postgresql+psycopg://…), got {what}: a read replica "
                                  "is a PostgreSQL streaming standby")
    if not primary.startswith(POSTGRESQL_PREFIXES):
        raise SettingsError(name, f"{name} needs a PostgreSQL DATABASE_URL (the primary it "
                                  f"replicates); DATABASE_URL is {_url_scheme(primary)!r}")
    return raw


def _url_scheme(url: str) -> str:
    """Return a URL's scheme only: the rest may hold a password."""
    return url.strip().partition(":")[0]


def _max_lag(env: Mapping[str, str]) -> float | None:
    """Read LEDGER_READ_MAX_LAG_SECONDS; None (unset) means any lag is served."""
    value = _number(env, "LEDGER_READ_MAX_LAG_SECONDS", float, "a number of seconds", 0,
                    MAX_DURATION_SECONDS)
    if value is None:
        return None
    if "LEDGER_READ_DATABASE_URL" not in env or not env["LEDGER_READ_DATABASE_URL"]:
        raise SettingsError("LEDGER_READ_MAX_LAG_SECONDS", "LEDGER_READ_MAX_LAG_SECONDS "
                            "bounds the replica's lag: it needs LEDGER_READ_DATABASE_URL")
    return int(value) if value.is_integer() else value


def _var_dir(env: Mapping[str, str]) -> Path:
    """Return LEDGER_VAR_DIR (default ./var), resolved."""
    return Path(_raw(env, "LEDGER_VAR_DIR") or "var").resolve()


def _refuse_production_without_keys(env: Mapping[str, str]) -> None:
    """In production every key must be configured: none is generated there."""
    missing = [name for name in PRODUCTION_KEYS if not _raw(env, name)]
    if missing:
        raise SettingsError(missing[0], f"LEDGER_ENV=production requires {', '.join(missing)} "
                                        "to be set (keys are generated only in development)")


def metrics_multiproc_dir(env: Mapping[str, str] | None = None) -> str | None:
    """Return PROMETHEUS_MULTIPROC_DIR, where processes of one host share metric files."""
    return _raw(_environ(env), "PROMETHEUS_MULTIPROC_DIR")


def log_level(env: Mapping[str, str] | None = None) -> str:
    """Return LEDGER_LOG_LEVEL (default INFO)."""
    return _choice(_environ(env), "LEDGER_LOG_LEVEL", "INFO", LOG_LEVELS, upper=True)


def development_key(var_dir: Path, filename: str, generate: Callable[[], str]) -> str:
    """Return the key kept in var_dir/filename, generating it (mode 0600) on first use.

    The key is written to a private temporary file and linked into place, so
    processes starting together all read the one key that won, never a half
    written file.
    """
    path = Path(var_dir) / filename
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{filename}.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(generate())
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process generated it first: use theirs
        finally:
            os.unlink(temporary)
    return path.read_text().strip()


def log_hash_key(settings: Settings) -> str:
    """Return the key of the privacy-safe event_ref: configured, or generated into var/."""
    if settings.event_id_hash_key:
        return settings.event_id_hash_key
    return development_key(settings.var_dir, LOG_HASH_KEY_FILE, lambda: secrets.token_urlsafe(32))


@dataclass(frozen=True, slots=True, kw_only=True)
class WebServerSettings:
    """What gunicorn.conf.py reads: bind address, processes, threads, preload, access log."""

    bind: str = DEFAULT_BIND
    workers: int = 2
    # 16, not 4: a slow sender holds a thread until its body deadline
    # (LEDGER_BODY_READ_TIMEOUT_SECONDS), so the threads are how many of them a process
    # absorbs while it keeps serving others. At most LEDGER_DB_POOL_SIZE threads use the
    # database at once; the others wait for a connection (at most the pool timeout, then
    # 503). Measured faster than 4 too (bench/README.md, "Web server").
    threads: int = 16
    preload: bool = True
    access_log: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WebServerSettings:
        """Read LEDGER_BIND, WEB_CONCURRENCY, LEDGER_WEB_THREADS, _PRELOAD, LEDGER_ACCESS_LOG."""
        env = _environ(env)
        bind = _raw(env, "LEDGER_BIND") or DEFAULT_BIND
        host, _, port = bind.rpartition(":")
        if not bind.startswith("unix:") and not (host and port.isdigit()
                                                 and 0 < int(port) < 65536):
            raise SettingsError("LEDGER_BIND", "LEDGER_BIND must be host:port (port 1-65535) "
                                               f"or unix:/path, got {bind!r}")
        # CPU, not the database, bounds a Python intake (MEASUREMENTS.md): a few
        # processes per core, each with a few threads for requests waiting on commits.
        cores = max(2, multiprocessing.cpu_count() * 2)
        return cls(bind=bind, workers=_int(env, "WEB_CONCURRENCY", cores, 1),
                   threads=_int(env, "LEDGER_WEB_THREADS", 16, 1),
                   preload=_bool(env, "LEDGER_WEB_PRELOAD", True),
                   access_log=_raw(env, "LEDGER_ACCESS_LOG"))



@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every knob of the ledger, with the contract's defaults."""

    database_url: str
    # A PostgreSQL streaming standby for the dashboard's and the API's reads (optional).
    read_database_url: str | None = None
    read_max_lag_seconds: float | None = None  # beyond it those reads go to the primary
    environment: str = "development"
    var_dir: Path = field(default_factory=lambda: Path("var").resolve())
    master_key: str | None = None
    audit_key: str | None = None
    metrics_token: str | None = None  # unset: /metrics answers loopback clients only
    revocation_bound_seconds: float = 30
    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    review_window_seconds: float = DEFAULT_REVIEW_WINDOW_SECONDS
    # The forensic window: how long a completed receipt's original body is kept so that a
    # conflict on its event id can be diffed (0: off; at most the retention).
    conflict_body_seconds: float = 0
    purge_duty_cycle: float = DEFAULT_DUTY_CYCLE
    max_body_bytes: int = 1024 * 1024
    max_json_depth: int = 64
    body_read_timeout_seconds: float = 10.0  # a slow sender gets 408 (web/body_deadline.py)
    max_attempts: int = 8
    retry_base_seconds: float = 10
    retry_cap_seconds: float = 3600
    max_event_age_seconds: float = 259200
    lease_seconds: float = 60
    worker_batch: int | None = None  # None: by database (default_worker_batch)
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
    log_level: str = "INFO"
    # Dashboard sessions and logins (README "Dashboard").
    session_idle_seconds: float = 1800
    session_absolute_seconds: float = 12 * 3600
    cookie_secure: bool = False
    login_max_failures: int = 5
    login_window_seconds: float = 900
    stuck_pending_seconds: float = 900
    # `ledger scheduler`: per-job period overrides (seconds) and a factor on every period.
    scheduler_periods: Mapping[str, float] = field(default_factory=dict)
    scheduler_period_scale: float = 1.0
    demo_admin_password: str | None = None
    # Reverse proxies in front that set X-Forwarded-For (README "Behind a proxy").
    trusted_proxies: int = 0
    # The delivery log: on by default; off only for a bench or an emergency.
    delivery_log: bool = True
    delivery_log_seconds: float = DEFAULT_DELIVERY_LOG_SECONDS
    delivery_log_refusals_per_minute: int = DEFAULT_DELIVERY_LOG_REFUSALS_PER_MINUTE

    @property
    def production(self) -> bool:
        """Tell whether this is a production process (LEDGER_ENV=production)."""
        return self.environment == "production"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *,
                 overrides: Mapping[str, object] | None = None) -> Settings:
        """Build settings from environment variables (os.environ by default).

        `overrides` replaces variables by name (create_app's test_config).
        """
        env = {**_environ(env), **{k: str(v) for k, v in (overrides or {}).items()}}
        environment = _choice(env, "LEDGER_ENV", "development", ENVIRONMENTS, upper=False)
        if environment == "production":
            _refuse_production_without_keys(env)
        retention = _seconds(env, "LEDGER_RETENTION_SECONDS", DEFAULT_RETENTION_SECONDS, 1)
        modules = tuple(m.strip() for m in env.get("LEDGER_HANDLER_MODULES", "").split(",")
                        if m.strip())
        primary = database_url_from_env(env)
        return cls(
            database_url=primary,
            read_database_url=read_database_url(env, primary),
            read_max_lag_seconds=_max_lag(env),
            environment=environment,
            var_dir=_var_dir(env),
            master_key=_raw(env, "LEDGER_MASTER_KEY"),
            audit_key=_raw(env, "LEDGER_AUDIT_KEY"),
            metrics_token=_raw(env, "LEDGER_METRICS_TOKEN"),
            revocation_bound_seconds=_seconds(env, "LEDGER_REVOCATION_BOUND_SECONDS", 30, 1),
            retention_seconds=retention,
            review_window_seconds=min(
                _seconds(env, "LEDGER_REVIEW_WINDOW_SECONDS", DEFAULT_REVIEW_WINDOW_SECONDS, 1),
                retention),
            conflict_body_seconds=min(_seconds(env, "LEDGER_CONFLICT_BODY_SECONDS", 0), retention),
            purge_duty_cycle=_duty_cycle(env, "LEDGER_PURGE_DUTY_CYCLE"),
            max_body_bytes=_int(env, "LEDGER_MAX_BODY_BYTES", 1024 * 1024, 1),
            max_json_depth=_int(env, "LEDGER_MAX_JSON_DEPTH", 64, 1),
            body_read_timeout_seconds=_seconds(env, "LEDGER_BODY_READ_TIMEOUT_SECONDS", 10,
                                               MIN_BODY_READ_TIMEOUT_SECONDS),
            max_attempts=_int(env, "LEDGER_MAX_ATTEMPTS", 8, 1),
            retry_base_seconds=_seconds(env, "LEDGER_RETRY_BASE_SECONDS", 10),
            retry_cap_seconds=_seconds(env, "LEDGER_RETRY_CAP_SECONDS", 3600),
            max_event_age_seconds=_seconds(env, "LEDGER_MAX_EVENT_AGE_SECONDS", 259200, 1),
            lease_seconds=_seconds(env, "LEDGER_LEASE_SECONDS", 60, 1),
            worker_batch=_number(env, "LEDGER_WORKER_BATCH", int, "an integer", 1,
                                 MAX_WORKER_BATCH),
            demo_handlers=_bool(env, "LEDGER_DEMO_HANDLERS", False),
            handler_modules=modules,
            pool_size=_int(env, "LEDGER_DB_POOL_SIZE", 5, 1),
            pool_timeout_seconds=_int(env, "LEDGER_DB_POOL_TIMEOUT_MS", 2000, 1) / 1000,
            statement_timeout_ms=_int(env, "LEDGER_DB_STATEMENT_TIMEOUT_MS", 5000, 1),
            lock_timeout_ms=_int(env, "LEDGER_DB_LOCK_TIMEOUT_MS", 2000, 1),
            db_pgbouncer=_bool(env, "LEDGER_DB_PGBOUNCER", False),
            sqlite_synchronous=_choice(env, "LEDGER_SQLITE_SYNCHRONOUS", "FULL",
                                       SQLITE_SYNCHRONOUS_MODES, upper=True),
            secret_key=_raw(env, "LEDGER_SECRET_KEY"),
            event_id_hash_key=_raw(env, "LEDGER_LOG_HASH_KEY"),
            log_level=log_level(env),
            session_idle_seconds=_seconds(env, "LEDGER_SESSION_IDLE_SECONDS", 1800, 60),
            session_absolute_seconds=_seconds(env, "LEDGER_SESSION_ABSOLUTE_SECONDS", 43200, 60),
            cookie_secure=_bool(env, "LEDGER_COOKIE_SECURE", False),
            login_max_failures=_int(env, "LEDGER_LOGIN_MAX_FAILURES", 5, 1),
            login_window_seconds=_seconds(env, "LEDGER_LOGIN_WINDOW_SECONDS", 900, 1),
            stuck_pending_seconds=_seconds(env, "LEDGER_STUCK_PENDING_SECONDS", 900, 1),
            scheduler_periods=_periods(env, "LEDGER_SCHEDULER_PERIODS"),
            scheduler_period_scale=_scale(env, "LEDGER_SCHEDULER_PERIOD_SCALE"),
            demo_admin_password=_raw(env, "LEDGER_DEMO_ADMIN_PASSWORD"),
            trusted_proxies=_int(env, "LEDGER_TRUSTED_PROXIES", 0),
            delivery_log=_bool(env, "LEDGER_DELIVERY_LOG", True),
            delivery_log_seconds=_seconds(env, "LEDGER_DELIVERY_LOG_SECONDS",
                                          DEFAULT_DELIVERY_LOG_SECONDS, 60),
            delivery_log_refusals_per_minute=_int(
                env, "LEDGER_DELIVERY_LOG_REFUSALS_PER_MINUTE",
                DEFAULT_DELIVERY_LOG_REFUSALS_PER_MINUTE, 1, 100_000),
        )

    def with_(self, **changes: Any) -> Settings:
        """Return a copy with some fields changed (tests, the drill)."""
        return replace(self, **changes)
