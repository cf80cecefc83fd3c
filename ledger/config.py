"""Settings from the environment (CONTRACT.md section 5), read once per process, strictly.

Every environment variable the ledger reads is declared once below, in DECLARED: name,
default, parser (with its range), meaning, whether production requires it. `from_env`, the
settings reference (docs/reference/settings.md) and `deploy/ledger.env.example` come from
those declarations, and tests/unit/test_settings_declared.py fails when they disagree.

To add a setting: one `Setting(...)` in DECLARED and one field in Settings whose default is
`_default("LEDGER_…")`. A value that does not parse, or lies out of range, raises
SettingsError naming the variable: the process stops at start instead of running on a
silent default. An empty value counts as unset.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ledger.config_parsers import (
    FALSE_WORDS,
    MAX_DURATION_SECONDS,
    POSTGRESQL_PREFIXES,
    TRUE_WORDS,
    Bind,
    Boolean,
    Choice,
    Directory,
    HostsOrNetworks,
    Integer,
    Names,
    Periods,
    PostgresUrl,
    Real,
    Seconds,
    Setting,
    SettingsError,
    Text,
    url_scheme,
)

__all__ = [
    "DECLARED", "FALSE_WORDS", "MAX_DURATION_SECONDS", "TRUE_WORDS", "Settings",
    "SettingsError", "WebServerSettings", "declared",
]

# Retention default (docs/explanation/retention.md): the sender's maximum retry window
# (Stripe retries for up to 3 days; GitHub allows manual redelivery for 3 days) + an
# operational repair window of 4 days + a clock-skew allowance of 5 minutes.
SENDER_RETRY_WINDOW_SECONDS = 3 * 86400
REPAIR_WINDOW_SECONDS = 4 * 86400
CLOCK_SKEW_SECONDS = 300
DEFAULT_RETENTION_SECONDS = SENDER_RETRY_WINDOW_SECONDS + REPAIR_WINDOW_SECONDS + CLOCK_SKEW_SECONDS
# A failed work item keeps its payload for review this long, never longer than the retention.
REVIEW_WINDOW_CAP_SECONDS = 14 * 86400
# The delivery log: how long its rows are kept, and how many exact refusal rows per minute
# one process writes per integration (and per dead key) before it only counts them.
DEFAULT_DELIVERY_LOG_SECONDS = 14 * 86400
DEFAULT_DELIVERY_LOG_REFUSALS_PER_MINUTE = 60
# Share of wall time the retention purge may spend deleting (the Pacer,
# jobs/retention_batching.py); the rest is left to the intake. 1 = full speed.
DEFAULT_DUTY_CYCLE = 0.5
# Work items a worker claims and commits at once (ledger/worker/batch.py; 1 = one per claim).
# Unset, it is the measured best for the database (docs/explanation/capacity.md): 16 on
# PostgreSQL; 8 on SQLite, where a batch holds the one writer against the intake. A batch
# is one transaction with a savepoint per work item: past 64 of them PostgreSQL's per-backend
# subtransaction cache overflows and every other session's snapshot checks slow down.
DEFAULT_WORKER_BATCH = 8  # SQLite's, and any database but PostgreSQL
DEFAULT_WORKER_BATCH_POSTGRESQL = 16
MAX_WORKER_BATCH = 64
# Threads per gunicorn process when LEDGER_WEB_THREADS is unset (`_web_threads`).
WEB_THREADS = 4  # PostgreSQL, and any database but SQLite
WEB_THREADS_SQLITE = 16

ENVIRONMENTS = ("development", "production")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SQLITE_SYNCHRONOUS_MODES = ("FULL", "NORMAL", "EXTRA")
# Files under var/ that hold the keys generated for development.
SECRET_KEY_FILE = "flask-secret.key"
MASTER_KEY_FILE = "master.key"
LOG_HASH_KEY_FILE = "log-hash.key"
AUDIT_KEY_FILE = "audit.key"
DEFAULT_BIND = "127.0.0.1:8000"
# A body read deadline shorter than this would cut off senders on any real network.
MIN_BODY_READ_TIMEOUT_SECONDS = 0.1
_RANDOM = '<output of: python -c "import secrets; print(secrets.token_urlsafe(32))">'
_FERNET = ('<output of: python -c "from cryptography.fernet import Fernet; '
           'print(Fernet.generate_key().decode())">')


def _var_dir(env: Mapping[str, str]) -> Path:
    """Return LEDGER_VAR_DIR (default ./var), resolved."""
    raw = env.get("LEDGER_VAR_DIR")
    return Path(raw or "var").resolve()


def _sqlite_in_var(env: Mapping[str, str]) -> str:
    """Return the embedded SQLite ledger's URL, under LEDGER_VAR_DIR."""
    return f"sqlite:///{_var_dir(env) / 'ledger.sqlite3'}"


def _review_window(env: Mapping[str, str]) -> float:
    """Return the review window when unset: 14 days, or the retention when shorter."""
    retention: float = declared("LEDGER_RETENTION_SECONDS").read(env)
    return min(REVIEW_WINDOW_CAP_SECONDS, retention)


def _in_production(env: Mapping[str, str]) -> bool:
    """Return whether LEDGER_ENV says production (the cookie's `Secure` default)."""
    return bool(declared("LEDGER_ENV").read(env) == "production")


def _web_processes(_env: Mapping[str, str]) -> int:
    """Return WEB_CONCURRENCY's default: two processes per core, at least two."""
    # CPU, not the database, bounds a Python intake: a few processes per core.
    return max(2, multiprocessing.cpu_count() * 2)


def _web_threads(env: Mapping[str, str]) -> int:
    """Return LEDGER_WEB_THREADS' default for the database: 4 on PostgreSQL, 16 on SQLite."""
    # PostgreSQL: a process's threads share one interpreter lock, and past 4 they only
    # lengthen the tail. SQLite: the threads wait on its one writer, and more of them at
    # once fill each group commit (docs/explanation/performance.md, the sizing section).
    return WEB_THREADS_SQLITE if database_url_from_env(env).startswith("sqlite") else WEB_THREADS


_DB, _KEYS, _INTAKE, _WORK = "Database", "Keys and secrets", "Intake", "Processing"
_KEEP, _DASH, _SCHED, _WEB = "Retention", "Dashboard and API", "Scheduler", "Web server"
_OBS = "Logs and metrics"

DECLARED: tuple[Setting, ...] = (
    # General
    Setting(name="LEDGER_ENV", attribute="environment", parser=Choice(ENVIRONMENTS),
            default="development", example="production",
            meaning="`development` or `production`; production refuses to start without its "
                    "keys (none is generated there)"),
    Setting(name="LEDGER_VAR_DIR", attribute="var_dir", parser=Directory(),
            default_from=_var_dir, shown_default="`./var`", example="/var/lib/ledger",
            meaning="where the embedded SQLite file and the development keys live"),
    # Database
    Setting(name="DATABASE_URL", attribute="database_url", section=_DB,
            parser=Text("a SQLAlchemy URL"), default_from=_sqlite_in_var,
            shown_default="`sqlite:///<LEDGER_VAR_DIR>/ledger.sqlite3`",
            example="postgresql+psycopg://ledger@db.internal:5432/ledger",
            meaning="the ledger's database: `postgresql+psycopg://…` for a shared ledger, "
                    "the embedded SQLite file otherwise"),
    Setting(name="LEDGER_READ_DATABASE_URL", attribute="read_database_url", section=_DB,
            parser=PostgresUrl("a read replica is a PostgreSQL streaming standby"),
            meaning="a PostgreSQL streaming standby for the dashboard's and `/api/v1`'s "
                    "reads; needs a PostgreSQL `DATABASE_URL`"),
    Setting(name="LEDGER_READ_MAX_LAG_SECONDS", attribute="read_max_lag_seconds",
            section=_DB, parser=Seconds(0), shown_default="any lag",
            meaning="beyond this lag (or when it is unknown) those reads go to the primary; "
                    "needs `LEDGER_READ_DATABASE_URL`"),
    Setting(name="LEDGER_DB_POOL_SIZE", attribute="pool_size", section=_DB,
            parser=Integer(1), default=5, example="6",
            meaning="database connections per process, no overflow: at most this many of a "
                    "web process's threads use the database at once, the others wait"),
    Setting(name="LEDGER_DB_CLAIM_CONNECTIONS", attribute="claim_connections", section=_DB,
            parser=Integer(0), shown_default="`LEDGER_DB_POOL_SIZE`",
            meaning="PostgreSQL: how many of a web process's threads claim deliveries on a "
                    "connection of their own, outside the pool (one more server connection "
                    "each); `0` claims every delivery on a pooled connection, as a ledger "
                    "distributed by Citus always does"),
    Setting(name="LEDGER_DB_POOL_TIMEOUT_MS", attribute="pool_timeout_seconds", section=_DB,
            parser=Integer(1), default=2000, convert=lambda ms: ms / 1000, example="2000",
            meaning="how long a request waits for a pooled connection before it answers 503"),
    Setting(name="LEDGER_DB_STATEMENT_TIMEOUT_MS", attribute="statement_timeout_ms",
            section=_DB, parser=Integer(1), default=5000, example="5000",
            meaning="PostgreSQL `statement_timeout` of every connection"),
    Setting(name="LEDGER_DB_LOCK_TIMEOUT_MS", attribute="lock_timeout_ms", section=_DB,
            parser=Integer(1), default=2000, example="2000",
            meaning="PostgreSQL `lock_timeout` of every connection"),
    Setting(name="LEDGER_DB_PGBOUNCER", attribute="db_pgbouncer", section=_DB,
            parser=Boolean(), default=False,
            meaning="behind PgBouncer in transaction mode: no startup options, no prepared "
                    "statements (set the timeouts on the role)"),
    Setting(name="LEDGER_SQLITE_SYNCHRONOUS", attribute="sqlite_synchronous", section=_DB,
            parser=Choice(SQLITE_SYNCHRONOUS_MODES, upper=True), default="FULL",
            meaning="SQLite durability; `FULL` so that an acknowledged delivery survives "
                    "power loss"),
    # Keys and secrets
    Setting(name="LEDGER_SECRET_KEY", attribute="secret_key", section=_KEYS,
            parser=Text("a random string"), production=True, example=_RANDOM,
            shown_default="generated into `var/flask-secret.key` in development",
            meaning="signs dashboard sessions"),
    Setting(name="LEDGER_MASTER_KEY", attribute="master_key", section=_KEYS,
            parser=Text("comma-separated Fernet keys, newest first"), production=True,
            shown_default="generated into `var/master.key` in development, with a warning",
            example=_FERNET,
            meaning="encrypts stored signing secrets at rest; any listed key decrypts, new "
                    "secrets use the first (`ledger secrets rekey`)"),
    Setting(name="LEDGER_LOG_HASH_KEY", attribute="event_id_hash_key", section=_KEYS,
            parser=Text("a random string"), production=True, example=_RANDOM,
            shown_default="generated into `var/log-hash.key` in development",
            meaning="keys the privacy-safe `event_ref` in log lines"),
    Setting(name="LEDGER_AUDIT_KEY", attribute="audit_key", section=_KEYS,
            parser=Text("a random string"), production=True, example=_RANDOM,
            shown_default="generated into `var/audit.key` in development, with a warning",
            meaning="keys the audit log's HMAC chain and the credential fingerprints; keep a "
                    "copy away from the database's backups"),
    Setting(name="LEDGER_METRICS_TOKEN", attribute="metrics_token", section=_KEYS,
            parser=Text("a random string"), shown_default="unset: loopback clients only",
            meaning="when set, `/metrics` needs `Authorization: Bearer <token>`"),
    # Intake
    Setting(name="LEDGER_MAX_BODY_BYTES", attribute="max_body_bytes", section=_INTAKE,
            parser=Integer(1), default=1024 * 1024,
            meaning="largest accepted body (413 beyond), unless the integration sets its own"),
    Setting(name="LEDGER_MAX_JSON_DEPTH", attribute="max_json_depth", section=_INTAKE,
            parser=Integer(1), default=64, meaning="deepest nesting of an accepted body"),
    Setting(name="LEDGER_BODY_READ_TIMEOUT_SECONDS", attribute="body_read_timeout_seconds",
            section=_INTAKE, parser=Seconds(MIN_BODY_READ_TIMEOUT_SECONDS), default=10,
            meaning="a request body must arrive within this long, or 408"),
    Setting(name="LEDGER_REVOCATION_BOUND_SECONDS", attribute="revocation_bound_seconds",
            section=_INTAKE, parser=Seconds(1), default=30,
            meaning="the declared bound after which no instance accepts a revoked key"),
    Setting(name="LEDGER_TRUSTED_PROXIES", attribute="trusted_proxies", section=_INTAKE,
            parser=Integer(0), default=0, example="1",
            meaning="reverse proxies in front that append to `X-Forwarded-For`; the client "
                    "address is taken that many hops from the right, never otherwise"),
    # Processing
    Setting(name="LEDGER_MAX_ATTEMPTS", attribute="max_attempts", section=_WORK,
            parser=Integer(1), default=8, meaning="attempts before a receipt is `failed`"),
    Setting(name="LEDGER_RETRY_BASE_SECONDS", attribute="retry_base_seconds", section=_WORK,
            parser=Seconds(0), default=10, meaning="first retry's upper bound (full jitter)"),
    Setting(name="LEDGER_RETRY_CAP_SECONDS", attribute="retry_cap_seconds", section=_WORK,
            parser=Seconds(0), default=3600, meaning="longest wait between attempts"),
    Setting(name="LEDGER_MAX_EVENT_AGE_SECONDS", attribute="max_event_age_seconds",
            section=_WORK, parser=Seconds(1), default=259200,
            meaning="no retry starts later than this after acceptance"),
    Setting(name="LEDGER_LEASE_SECONDS", attribute="lease_seconds", section=_WORK,
            parser=Seconds(1), default=60,
            meaning="a claimed work item is claimable again after this (its worker died)"),
    Setting(name="LEDGER_WORKER_BATCH", attribute="worker_batch", section=_WORK,
            parser=Integer(1, MAX_WORKER_BATCH), shown_default="16 on PostgreSQL, 8 on SQLite",
            meaning="work items a worker claims and commits at once (`ledger worker --batch N`)"),
    Setting(name="LEDGER_HANDLER_MODULES", attribute="handler_modules", section=_WORK,
            parser=Names("comma-separated import paths"), default=(), shown_default="none",
            meaning="modules whose handlers every worker registers"),
    Setting(name="LEDGER_DEMO_HANDLERS", attribute="demo_handlers", section=_WORK,
            parser=Boolean(), default=False, meaning="register the demo handlers"),
    # Retention
    Setting(name="LEDGER_RETENTION_SECONDS", attribute="retention_seconds", section=_KEEP,
            parser=Seconds(1), default=DEFAULT_RETENTION_SECONDS,
            meaning="finished receipts older than this are purged: the sender's retry window "
                    "(3 days) + a repair window (4 days) + clock skew (5 minutes)"),
    Setting(name="LEDGER_REVIEW_WINDOW_SECONDS", attribute="review_window_seconds",
            section=_KEEP, parser=Seconds(1), default_from=_review_window,
            shown_default="14 days or the retention, whichever is shorter (605100)",
            meaning="a failed work item keeps its payload for review this long; never longer than "
                    "the retention"),
    Setting(name="LEDGER_CONFLICT_BODY_SECONDS", attribute="conflict_body_seconds",
            section=_KEEP, parser=Seconds(0), default=0, shown_default="0 (off)",
            meaning="the forensic window: a completed receipt's original body is kept this long "
                    "so that a conflict on its event id can be diffed; never longer than the "
                    "retention"),
    Setting(name="LEDGER_PURGE_DUTY_CYCLE", attribute="purge_duty_cycle", section=_KEEP,
            parser=Real("a number in (0, 1]", above=0, at_most=1), default=DEFAULT_DUTY_CYCLE,
            meaning="share of wall time the purge may spend deleting; 1 = full speed"),
    Setting(name="LEDGER_DELIVERY_LOG", attribute="delivery_log", section=_KEEP,
            parser=Boolean(), default=True,
            meaning="record every request to `/hooks/` in the delivery log"),
    Setting(name="LEDGER_DELIVERY_LOG_SECONDS", attribute="delivery_log_seconds",
            section=_KEEP, parser=Seconds(60), default=DEFAULT_DELIVERY_LOG_SECONDS,
            meaning="how long delivery log rows are kept"),
    Setting(name="LEDGER_DESTINATION_ALLOW", attribute="destination_allow", section=_WORK,
            parser=HostsOrNetworks(), default=(), shown_default="none",
            meaning="loopback, private or link-local networks and host names that destinations "
                    "may reach anyway (public addresses need no entry)"),
    Setting(name="LEDGER_DELIVERY_LOG_REFUSALS_PER_MINUTE",
            attribute="delivery_log_refusals_per_minute", section=_KEEP,
            parser=Integer(1, 100_000), default=DEFAULT_DELIVERY_LOG_REFUSALS_PER_MINUTE,
            meaning="exact refusal rows per minute, per process and integration; beyond "
                    "it refusals are only counted"),
    # Dashboard and API
    Setting(name="LEDGER_SESSION_IDLE_SECONDS", attribute="session_idle_seconds",
            section=_DASH, parser=Seconds(60), default=1800,
            meaning="a session unused this long ends"),
    Setting(name="LEDGER_SESSION_ABSOLUTE_SECONDS", attribute="session_absolute_seconds",
            section=_DASH, parser=Seconds(60), default=43200,
            meaning="a session ends this long after login, however busy"),
    Setting(name="LEDGER_COOKIE_SECURE", attribute="cookie_secure", section=_DASH,
            parser=Boolean(), default=False, default_from=_in_production,
            shown_default="on when LEDGER_ENV=production, else off", example="1",
            meaning="behind TLS: the session cookie carries `Secure`"),
    Setting(name="LEDGER_LOGIN_MAX_FAILURES", attribute="login_max_failures", section=_DASH,
            parser=Integer(1), default=5,
            meaning="failed logins per username and address within the window before 429; "
                    "also wrong password re-entries in a row per session"),
    Setting(name="LEDGER_LOGIN_WINDOW_SECONDS", attribute="login_window_seconds",
            section=_DASH, parser=Seconds(1), default=900,
            meaning="the window failed logins are counted in"),
    Setting(name="LEDGER_STUCK_PENDING_SECONDS", attribute="stuck_pending_seconds",
            section=_DASH, parser=Seconds(1), default=900,
            meaning="when due work counts as stuck"),
    Setting(name="LEDGER_DEMO_ADMIN_PASSWORD", attribute="demo_admin_password",
            section=_DASH, parser=Text("a password"), shown_default="random, printed once",
            meaning="password of the admin `ledger demo seed` creates"),
    # Scheduler
    Setting(name="LEDGER_SCHEDULER_PERIODS", attribute="scheduler_periods", section=_SCHED,
            parser=Periods(), default_from=lambda _env: {}, shown_default="each job's own",
            meaning="per-job period overrides in seconds"),
    Setting(name="LEDGER_SCHEDULER_PERIOD_SCALE", attribute="scheduler_period_scale",
            section=_SCHED, parser=Real("a number > 0", above=0), default=1.0,
            meaning="a factor applied to every period"),
    # Web server (gunicorn.conf.py)
    Setting(name="LEDGER_BIND", attribute="bind", owner="web", section=_WEB, parser=Bind(),
            default=DEFAULT_BIND, example=DEFAULT_BIND,
            meaning="where gunicorn listens (the proxy connects there)"),
    Setting(name="WEB_CONCURRENCY", attribute="workers", owner="web", section=_WEB,
            parser=Integer(1), default_from=_web_processes,
            shown_default="2 x cores (at least 2)", example="4",
            meaning="gunicorn processes: the intake is bound by their CPU, so size them with "
                    "the cores (2 per core) and keep the threads and the pool per process"),
    Setting(name="LEDGER_WEB_THREADS", attribute="threads", owner="web", section=_WEB,
            parser=Integer(1), default_from=_web_threads,
            shown_default=f"{WEB_THREADS} on PostgreSQL, {WEB_THREADS_SQLITE} on SQLite",
            meaning="threads per gunicorn process, each serving one request once the event "
                    "loop has read it (a body over 1 MiB is read by its thread, within the body "
                    "deadline); at most `LEDGER_DB_POOL_SIZE` of them use the database at once"),
    Setting(name="LEDGER_WEB_PRELOAD", attribute="preload", owner="web", section=_WEB,
            parser=Boolean(), default=True,
            meaning="build the app once in the master and fork the processes from it"),
    Setting(name="LEDGER_ACCESS_LOG", attribute="access_log", owner="web", section=_WEB,
            parser=Text("a file, or `-` for stderr"), shown_default="none",
            meaning="gunicorn's access log (the app logs JSON lines itself)"),
    # Logs and metrics
    Setting(name="LEDGER_LOG_LEVEL", attribute="log_level", section=_OBS,
            parser=Choice(LOG_LEVELS, upper=True), default="INFO",
            meaning="level of the JSON log lines"),
    Setting(name="PROMETHEUS_MULTIPROC_DIR", owner="process", section=_OBS,
            parser=Text("a directory"), shown_default="a private one set by gunicorn.conf.py",
            example="/run/ledger/metrics",
            meaning="where the processes of one host share their metric files"),
)
_BY_NAME = {setting.name: setting for setting in DECLARED}
PRODUCTION_KEYS = tuple(setting.name for setting in DECLARED if setting.production)


def declared(name: str) -> Setting:
    """Return the one declaration of the variable `name`."""
    return _BY_NAME[name]


def _default(name: str) -> Any:
    """Return a variable's declared default, for the field it fills."""
    return declared(name).read({})


def _environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    """Return `env`, or the process environment when None."""
    return os.environ if env is None else env


def _read_all(owner: str, env: Mapping[str, str]) -> dict[str, Any]:
    """Return every declared field of `owner` read from `env`, by attribute."""
    return {s.attribute: s.read(env) for s in DECLARED if s.owner == owner and s.attribute}


def check_duty_cycle(value: float, name: str = "duty_cycle") -> float:
    """Return a purge duty cycle, refusing one outside (0, 1]."""
    if not 0 < value <= 1:
        raise SettingsError(name, f"{name} must be > 0 and <= 1 (a share of wall time), "
                                  f"got {value}")
    return value


def default_worker_batch(dialect_name: str) -> int:
    """Return the worker's batch size when LEDGER_WORKER_BATCH is unset, for the database."""
    return DEFAULT_WORKER_BATCH_POSTGRESQL if dialect_name == "postgresql" else DEFAULT_WORKER_BATCH


def database_url_from_env(env: Mapping[str, str] | None = None) -> str:
    """Return DATABASE_URL, defaulting to the embedded SQLite file under var/."""
    url: str = declared("DATABASE_URL").read(_environ(env))
    return url


def metrics_multiproc_dir(env: Mapping[str, str] | None = None) -> str | None:
    """Return PROMETHEUS_MULTIPROC_DIR, where processes of one host share metric files."""
    path: str | None = declared("PROMETHEUS_MULTIPROC_DIR").read(_environ(env))
    return path


def log_level(env: Mapping[str, str] | None = None) -> str:
    """Return LEDGER_LOG_LEVEL (default INFO)."""
    level: str = declared("LEDGER_LOG_LEVEL").read(_environ(env))
    return level


def _refuse_production_without_keys(env: Mapping[str, str]) -> None:
    """In production every key must be configured: none is generated there."""
    missing = [name for name in PRODUCTION_KEYS if not env.get(name)]
    if missing:
        raise SettingsError(missing[0], f"LEDGER_ENV=production requires {', '.join(missing)} "
                                        "to be set (keys are generated only in development)")


def _check_together(values: dict[str, Any]) -> None:
    """Apply the rules that join settings: the replica's, the windows within the retention."""
    name = "LEDGER_READ_DATABASE_URL"
    if values["read_database_url"] and not values["database_url"].startswith(
            POSTGRESQL_PREFIXES):
        raise SettingsError(name, f"{name} needs a PostgreSQL DATABASE_URL (the primary it "
                                  f"replicates); DATABASE_URL is "
                                  f"{url_scheme(values['database_url'])!r}")
    if values["read_max_lag_seconds"] is not None and not values["read_database_url"]:
        raise SettingsError("LEDGER_READ_MAX_LAG_SECONDS", "LEDGER_READ_MAX_LAG_SECONDS "
                            "bounds the replica's lag: it needs LEDGER_READ_DATABASE_URL")
    values["review_window_seconds"] = min(values["review_window_seconds"],
                                          values["retention_seconds"])
    values["conflict_body_seconds"] = min(values["conflict_body_seconds"],
                                          values["retention_seconds"])


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

    bind: str = _default("LEDGER_BIND")
    workers: int = field(default_factory=lambda: _default("WEB_CONCURRENCY"))
    threads: int = _default("LEDGER_WEB_THREADS")
    preload: bool = _default("LEDGER_WEB_PRELOAD")
    access_log: str | None = _default("LEDGER_ACCESS_LOG")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WebServerSettings:
        """Read LEDGER_BIND, WEB_CONCURRENCY, LEDGER_WEB_THREADS, _PRELOAD, LEDGER_ACCESS_LOG."""
        return cls(**_read_all("web", _environ(env)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Every knob of the ledger; each default is its declaration's (DECLARED)."""

    database_url: str
    read_database_url: str | None = _default("LEDGER_READ_DATABASE_URL")
    read_max_lag_seconds: float | None = _default("LEDGER_READ_MAX_LAG_SECONDS")
    environment: str = _default("LEDGER_ENV")
    var_dir: Path = field(default_factory=lambda: _default("LEDGER_VAR_DIR"))
    master_key: str | None = _default("LEDGER_MASTER_KEY")
    audit_key: str | None = _default("LEDGER_AUDIT_KEY")
    metrics_token: str | None = _default("LEDGER_METRICS_TOKEN")
    revocation_bound_seconds: float = _default("LEDGER_REVOCATION_BOUND_SECONDS")
    retention_seconds: float = _default("LEDGER_RETENTION_SECONDS")
    review_window_seconds: float = _default("LEDGER_REVIEW_WINDOW_SECONDS")
    conflict_body_seconds: float = _default("LEDGER_CONFLICT_BODY_SECONDS")
    purge_duty_cycle: float = _default("LEDGER_PURGE_DUTY_CYCLE")
    max_body_bytes: int = _default("LEDGER_MAX_BODY_BYTES")
    max_json_depth: int = _default("LEDGER_MAX_JSON_DEPTH")
    body_read_timeout_seconds: float = _default("LEDGER_BODY_READ_TIMEOUT_SECONDS")
    max_attempts: int = _default("LEDGER_MAX_ATTEMPTS")
    retry_base_seconds: float = _default("LEDGER_RETRY_BASE_SECONDS")
    retry_cap_seconds: float = _default("LEDGER_RETRY_CAP_SECONDS")
    max_event_age_seconds: float = _default("LEDGER_MAX_EVENT_AGE_SECONDS")
    lease_seconds: float = _default("LEDGER_LEASE_SECONDS")
    worker_batch: int | None = _default("LEDGER_WORKER_BATCH")  # None: default_worker_batch
    demo_handlers: bool = _default("LEDGER_DEMO_HANDLERS")
    handler_modules: tuple[str, ...] = _default("LEDGER_HANDLER_MODULES")
    pool_size: int = _default("LEDGER_DB_POOL_SIZE")
    claim_connections: int | None = _default("LEDGER_DB_CLAIM_CONNECTIONS")  # None: pool_size
    pool_timeout_seconds: float = _default("LEDGER_DB_POOL_TIMEOUT_MS")
    statement_timeout_ms: int = _default("LEDGER_DB_STATEMENT_TIMEOUT_MS")
    lock_timeout_ms: int = _default("LEDGER_DB_LOCK_TIMEOUT_MS")
    db_pgbouncer: bool = _default("LEDGER_DB_PGBOUNCER")
    sqlite_synchronous: str = _default("LEDGER_SQLITE_SYNCHRONOUS")
    secret_key: str | None = _default("LEDGER_SECRET_KEY")
    event_id_hash_key: str | None = _default("LEDGER_LOG_HASH_KEY")
    log_level: str = _default("LEDGER_LOG_LEVEL")
    session_idle_seconds: float = _default("LEDGER_SESSION_IDLE_SECONDS")
    session_absolute_seconds: float = _default("LEDGER_SESSION_ABSOLUTE_SECONDS")
    cookie_secure: bool = _default("LEDGER_COOKIE_SECURE")
    login_max_failures: int = _default("LEDGER_LOGIN_MAX_FAILURES")
    login_window_seconds: float = _default("LEDGER_LOGIN_WINDOW_SECONDS")
    stuck_pending_seconds: float = _default("LEDGER_STUCK_PENDING_SECONDS")
    scheduler_periods: Mapping[str, float] = field(
        default_factory=lambda: _default("LEDGER_SCHEDULER_PERIODS"))
    scheduler_period_scale: float = _default("LEDGER_SCHEDULER_PERIOD_SCALE")
    demo_admin_password: str | None = _default("LEDGER_DEMO_ADMIN_PASSWORD")
    trusted_proxies: int = _default("LEDGER_TRUSTED_PROXIES")
    delivery_log: bool = _default("LEDGER_DELIVERY_LOG")
    delivery_log_seconds: float = _default("LEDGER_DELIVERY_LOG_SECONDS")
    delivery_log_refusals_per_minute: int = _default("LEDGER_DELIVERY_LOG_REFUSALS_PER_MINUTE")
    destination_allow: tuple[str, ...] = _default("LEDGER_DESTINATION_ALLOW")

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
        if declared("LEDGER_ENV").read(env) == "production":
            _refuse_production_without_keys(env)  # before any other complaint
        values = _read_all("settings", env)
        _check_together(values)
        return cls(**values)

    def with_(self, **changes: Any) -> Settings:
        """Return a copy with some fields changed (tests, the drill)."""
        return replace(self, **changes)
