"""Settings read from the environment: every variable strictly, with one default each."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ledger import logs
from ledger.access.secrets_box import MasterKeyError, load_box
from ledger.config import (
    DEFAULT_DUTY_CYCLE,
    DEFAULT_RETENTION_SECONDS,
    MAX_DURATION_SECONDS,
    Settings,
    SettingsError,
    WebServerSettings,
    default_worker_batch,
    development_key,
    log_hash_key,
    metrics_multiproc_dir,
)

BASE = {"DATABASE_URL": "sqlite:///unused.sqlite3"}
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def settings(**env: str) -> Settings:
    """Return the settings of an environment holding BASE and `env`."""
    return Settings.from_env({**BASE, **env})


def refused(name: str, raw: str, match: str = "") -> str:
    """Return the message of the SettingsError raised for NAME=raw (it must name NAME)."""
    with pytest.raises(SettingsError) as caught:
        settings(**{name: raw})
    assert caught.value.name == name
    message = str(caught.value)
    assert message.startswith(name) and repr(raw) in message and match in message
    return message


def test_every_default_is_the_contracts() -> None:
    s = Settings.from_env({})
    assert s.database_url == f"sqlite:///{Path('var').resolve() / 'ledger.sqlite3'}"
    assert (s.environment, s.production, s.var_dir) == ("development", False,
                                                        Path("var").resolve())
    assert (s.revocation_bound_seconds, s.retention_seconds) == (30, DEFAULT_RETENTION_SECONDS)
    assert DEFAULT_RETENTION_SECONDS == 3 * 86400 + 4 * 86400 + 300
    assert (s.max_body_bytes, s.max_attempts, s.max_event_age_seconds) == (1048576, 8, 259200)
    assert (s.retry_base_seconds, s.retry_cap_seconds, s.lease_seconds) == (10, 3600, 60)
    assert (s.demo_handlers, s.db_pgbouncer, s.cookie_secure) == (False, False, False)
    assert (s.sqlite_synchronous, s.log_level, s.purge_duty_cycle) == ("FULL", "INFO", 0.5)
    assert (s.master_key, s.secret_key, s.event_id_hash_key) == (None, None, None)
    assert (s.scheduler_periods, s.scheduler_period_scale) == ({}, 1.0)
    assert s.demo_admin_password is None


INTEGERS = [  # variable, field, minimum
    ("LEDGER_MAX_BODY_BYTES", "max_body_bytes", 1),
    ("LEDGER_MAX_ATTEMPTS", "max_attempts", 1),
    ("LEDGER_DB_POOL_SIZE", "pool_size", 1),
    ("LEDGER_DB_STATEMENT_TIMEOUT_MS", "statement_timeout_ms", 1),
    ("LEDGER_DB_LOCK_TIMEOUT_MS", "lock_timeout_ms", 1),
    ("LEDGER_LOGIN_MAX_FAILURES", "login_max_failures", 1),
]


@pytest.mark.parametrize(("name", "attr", "minimum"), INTEGERS)
def test_an_integer_setting_reads_whole_numbers_and_refuses_the_rest(
        name: str, attr: str, minimum: int) -> None:
    assert getattr(settings(**{name: "7"}), attr) == 7
    assert getattr(settings(**{name: str(minimum)}), attr) == minimum
    refused(name, "lots", "must be an integer")
    refused(name, "2.5", "must be an integer")
    refused(name, " 7", "must be an integer")
    refused(name, str(minimum - 1), f"must be >= {minimum}")


def test_the_pool_timeout_is_read_in_milliseconds() -> None:
    assert settings(LEDGER_DB_POOL_TIMEOUT_MS="250").pool_timeout_seconds == 0.25
    refused("LEDGER_DB_POOL_TIMEOUT_MS", "0", "must be >= 1")
    refused("LEDGER_DB_POOL_TIMEOUT_MS", "2s", "must be an integer")


def test_the_worker_batch_is_a_count_from_1_to_64() -> None:
    assert settings().worker_batch is None  # unset: the database's default
    assert default_worker_batch("postgresql") == 16
    assert default_worker_batch("sqlite") == 8
    assert settings(LEDGER_WORKER_BATCH="1").worker_batch == 1
    assert settings(LEDGER_WORKER_BATCH="64").worker_batch == 64
    refused("LEDGER_WORKER_BATCH", "0", "must be >= 1")
    refused("LEDGER_WORKER_BATCH", "65", "must be <= 64")
    refused("LEDGER_WORKER_BATCH", "8.5", "must be an integer")
    refused("LEDGER_WORKER_BATCH", "eight", "must be an integer")


DURATIONS = [  # variable, field, minimum
    ("LEDGER_REVOCATION_BOUND_SECONDS", "revocation_bound_seconds", 1),
    ("LEDGER_RETENTION_SECONDS", "retention_seconds", 1),
    ("LEDGER_RETRY_BASE_SECONDS", "retry_base_seconds", 0),
    ("LEDGER_RETRY_CAP_SECONDS", "retry_cap_seconds", 0),
    ("LEDGER_MAX_EVENT_AGE_SECONDS", "max_event_age_seconds", 1),
    ("LEDGER_LEASE_SECONDS", "lease_seconds", 1),
    ("LEDGER_SESSION_IDLE_SECONDS", "session_idle_seconds", 60),
    ("LEDGER_SESSION_ABSOLUTE_SECONDS", "session_absolute_seconds", 60),
    ("LEDGER_LOGIN_WINDOW_SECONDS", "login_window_seconds", 1),
    ("LEDGER_STUCK_PENDING_SECONDS", "stuck_pending_seconds", 1),
]


@pytest.mark.parametrize(("name", "attr", "minimum"), DURATIONS)
def test_a_duration_may_be_fractional_and_is_range_checked(
        name: str, attr: str, minimum: int) -> None:
    assert getattr(settings(**{name: f"{minimum}.05"}), attr) == pytest.approx(minimum + 0.05)
    assert getattr(settings(**{name: "120"}), attr) == 120
    assert getattr(settings(**{name: "1.2e2"}), attr) == 120
    refused(name, "soon", "must be a number of seconds")
    refused(name, "10s", "must be a number of seconds")
    refused(name, "nan", "must be a number of seconds")
    refused(name, "inf", "must be a number of seconds")
    refused(name, "60 ", "must be a number of seconds")
    refused(name, str(minimum - 0.5), f"must be >= {minimum}")
    refused(name, str(MAX_DURATION_SECONDS + 1), f"must be <= {MAX_DURATION_SECONDS}")


def test_the_retry_base_of_the_issue_is_accepted() -> None:
    assert settings(LEDGER_RETRY_BASE_SECONDS="0.05").retry_base_seconds == 0.05


def test_the_review_window_is_a_duration_never_longer_than_the_retention() -> None:
    assert settings(LEDGER_REVIEW_WINDOW_SECONDS="3600.5").review_window_seconds == 3600.5
    assert settings(LEDGER_REVIEW_WINDOW_SECONDS="9000",
                    LEDGER_RETENTION_SECONDS="100").review_window_seconds == 100
    refused("LEDGER_REVIEW_WINDOW_SECONDS", "two weeks", "must be a number of seconds")
    refused("LEDGER_REVIEW_WINDOW_SECONDS", "0", "must be >= 1")


BOOLEANS = [("LEDGER_COOKIE_SECURE", "cookie_secure"), ("LEDGER_DEMO_HANDLERS", "demo_handlers"),
            ("LEDGER_DB_PGBOUNCER", "db_pgbouncer")]


@pytest.mark.parametrize(("name", "attr"), BOOLEANS)
@pytest.mark.parametrize("raw", ["1", "true", "yes", "on", "TRUE", "On", "Yes", "tRuE"])
def test_a_boolean_is_on_for_1_true_yes_on_in_any_case(name: str, attr: str, raw: str) -> None:
    assert getattr(settings(**{name: raw}), attr) is True


@pytest.mark.parametrize(("name", "attr"), BOOLEANS)
@pytest.mark.parametrize("raw", ["0", "false", "no", "off", "FALSE", "Off", "NO", ""])
def test_a_boolean_is_off_for_0_false_no_off_in_any_case(name: str, attr: str, raw: str) -> None:
    assert getattr(settings(**{name: raw}), attr) is False


@pytest.mark.parametrize(("name", "attr"), BOOLEANS)
@pytest.mark.parametrize("raw", ["True ", " on", "maybe", "2", "enabled", "y", "-1"])
def test_anything_else_as_a_boolean_is_refused_by_name(name: str, attr: str, raw: str) -> None:
    refused(name, raw, "must be a boolean (1, true, yes, on / 0, false, no, off)")


def test_cookie_secure_true_in_capitals_now_means_secure() -> None:
    assert settings(LEDGER_COOKIE_SECURE="True").cookie_secure is True


@pytest.mark.parametrize(("name", "attr", "raw", "value"), [
    ("LEDGER_SQLITE_SYNCHRONOUS", "sqlite_synchronous", "normal", "NORMAL"),
    ("LEDGER_SQLITE_SYNCHRONOUS", "sqlite_synchronous", "EXTRA", "EXTRA"),
    ("LEDGER_LOG_LEVEL", "log_level", "debug", "DEBUG"),
    ("LEDGER_LOG_LEVEL", "log_level", "Warning", "WARNING"),
    ("LEDGER_ENV", "environment", "Development", "development"),
])
def test_a_word_setting_reads_its_words_in_any_case(name: str, attr: str, raw: str,
                                                    value: str) -> None:
    assert getattr(settings(**{name: raw}), attr) == value


@pytest.mark.parametrize(("name", "raw"), [
    ("LEDGER_SQLITE_SYNCHRONOUS", "OFF"), ("LEDGER_SQLITE_SYNCHRONOUS", "full; DROP"),
    ("LEDGER_LOG_LEVEL", "loud"), ("LEDGER_LOG_LEVEL", "INFO "),
    ("LEDGER_ENV", "staging"), ("LEDGER_ENV", "prod"),
])
def test_a_word_setting_refuses_other_words_listing_the_allowed_ones(name: str,
                                                                     raw: str) -> None:
    assert "must be one of" in refused(name, raw)


def test_the_purge_duty_cycle_defaults_to_half_and_reads_the_environment() -> None:
    assert settings().purge_duty_cycle == DEFAULT_DUTY_CYCLE == 0.5
    assert settings(LEDGER_PURGE_DUTY_CYCLE="1").purge_duty_cycle == 1.0
    assert settings(LEDGER_PURGE_DUTY_CYCLE="0.25").purge_duty_cycle == 0.25
    assert settings(LEDGER_PURGE_DUTY_CYCLE="").purge_duty_cycle == 0.5


@pytest.mark.parametrize("raw", ["0", "-0.5", "1.01", "2", "nan", "inf", "half", "50%"])
def test_a_purge_duty_cycle_outside_zero_to_one_is_refused_by_name(raw: str) -> None:
    with pytest.raises(SettingsError, match=r"LEDGER_PURGE_DUTY_CYCLE must be .*\(0, 1\]|"
                                            r"LEDGER_PURGE_DUTY_CYCLE must be > 0 and <= 1"):
        settings(LEDGER_PURGE_DUTY_CYCLE=raw)


def test_scheduler_periods_are_job_equals_seconds_pairs() -> None:
    assert settings(LEDGER_SCHEDULER_PERIODS="sweep=0.5, retention=0").scheduler_periods == {
        "sweep": 0.5, "retention": 0.0}
    for raw in ("sweep", "sweep=soon", "=5", "sweep=-1", "sweep=nan"):
        with pytest.raises(SettingsError, match=r"^LEDGER_SCHEDULER_PERIODS must be job=seconds"):
            settings(LEDGER_SCHEDULER_PERIODS=raw)


def test_the_scheduler_period_scale_is_a_positive_factor() -> None:
    assert settings(LEDGER_SCHEDULER_PERIOD_SCALE="0.01").scheduler_period_scale == 0.01
    refused("LEDGER_SCHEDULER_PERIOD_SCALE", "0", "must be > 0")
    refused("LEDGER_SCHEDULER_PERIOD_SCALE", "fast", "must be a number > 0")
    refused("LEDGER_SCHEDULER_PERIOD_SCALE", "inf", "must be a number > 0")


def test_text_settings_are_taken_as_given() -> None:
    s = settings(LEDGER_VAR_DIR="/tmp/x", LEDGER_HANDLER_MODULES="a.b, c",
                 LEDGER_DEMO_ADMIN_PASSWORD="pw", LEDGER_MASTER_KEY="k1,k2",
                 LEDGER_SECRET_KEY="s", LEDGER_LOG_HASH_KEY="h")
    assert (s.var_dir, s.handler_modules, s.demo_admin_password) == (Path("/tmp/x"),
                                                                     ("a.b", "c"), "pw")
    assert (s.master_key, s.secret_key, s.event_id_hash_key) == ("k1,k2", "s", "h")
    assert Settings.from_env({"LEDGER_VAR_DIR": "/tmp/x"}).database_url == (
        "sqlite:////tmp/x/ledger.sqlite3")


def test_overrides_replace_variables_by_name() -> None:
    s = Settings.from_env({**BASE, "LEDGER_MAX_ATTEMPTS": "3"},
                          overrides={"LEDGER_MAX_ATTEMPTS": 4, "LEDGER_COOKIE_SECURE": True})
    assert (s.max_attempts, s.cookie_secure) == (4, True)


PRODUCTION_KEYS = {"LEDGER_SECRET_KEY": "s", "LEDGER_MASTER_KEY": "m", "LEDGER_LOG_HASH_KEY": "h",
                   "LEDGER_AUDIT_KEY": "a"}


def test_production_starts_with_its_four_keys() -> None:
    s = settings(LEDGER_ENV="production", **PRODUCTION_KEYS)
    assert s.production and s.environment == "production"


@pytest.mark.parametrize("missing", sorted(PRODUCTION_KEYS))
def test_production_refuses_to_start_without_a_key_naming_it(missing: str) -> None:
    env = {k: v for k, v in PRODUCTION_KEYS.items() if k != missing}
    with pytest.raises(SettingsError) as caught:
        settings(LEDGER_ENV="production", **env, **{missing: ""})
    assert caught.value.name == missing
    assert str(caught.value) == (f"LEDGER_ENV=production requires {missing} to be set "
                                 "(keys are generated only in development)")


def test_production_names_every_missing_key_at_once() -> None:
    with pytest.raises(SettingsError, match="requires LEDGER_SECRET_KEY, LEDGER_MASTER_KEY, "
                                            "LEDGER_LOG_HASH_KEY, LEDGER_AUDIT_KEY to be set"):
        settings(LEDGER_ENV="production")


def test_no_master_key_is_generated_in_production(tmp_path: Path) -> None:
    with pytest.raises(MasterKeyError, match="LEDGER_MASTER_KEY must be set in production"):
        load_box(None, tmp_path, production=True)
    assert list(tmp_path.iterdir()) == []


def test_a_development_key_is_generated_once_private_to_its_owner(tmp_path: Path) -> None:
    calls: list[int] = []

    def generate() -> str:
        calls.append(1)
        return f"key-{len(calls)}"

    var = tmp_path / "var"
    assert development_key(var, "some.key", generate) == "key-1"
    assert development_key(var, "some.key", generate) == "key-1"
    assert calls == [1]
    assert stat.S_IMODE((var / "some.key").stat().st_mode) == 0o600
    assert sorted(p.name for p in var.iterdir()) == ["some.key"]  # no temporary file left


def test_every_generated_key_goes_through_the_one_writer(tmp_path: Path) -> None:
    from app import _secret_key

    s = settings(LEDGER_VAR_DIR=str(tmp_path))
    load_box(None, tmp_path)
    first = (log_hash_key(s), _secret_key(s))
    assert first == (log_hash_key(s), _secret_key(s))  # kept, not regenerated
    for name in ("master.key", "log-hash.key", "flask-secret.key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert log_hash_key(s.with_(event_id_hash_key="configured")) == "configured"


def test_event_ref_has_no_public_fallback_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_event_ref_key", [])
    with pytest.raises(RuntimeError, match="LEDGER_LOG_HASH_KEY"):
        logs.event_ref("acme", "evt_1")
    logs.use_event_ref_key("one key")
    one = logs.event_ref("acme", "evt_1")
    assert one.startswith("ev_") and one == logs.event_ref("acme", "evt_1", "one key")
    assert one != logs.event_ref("acme", "evt_1", "another key")
    assert one != logs.event_ref("acme", "evt_1", "replay-ledger")  # the old public key


def test_the_web_server_settings_read_gunicorns_variables() -> None:
    web = WebServerSettings.from_env({"LEDGER_BIND": "0.0.0.0:8080", "WEB_CONCURRENCY": "3",
                                      "LEDGER_WEB_THREADS": "8", "LEDGER_WEB_PRELOAD": "Off",
                                      "LEDGER_ACCESS_LOG": "-"})
    assert (web.bind, web.workers, web.threads, web.preload, web.access_log) == (
        "0.0.0.0:8080", 3, 8, False, "-")
    default = WebServerSettings.from_env({})
    assert (default.bind, default.threads, default.preload, default.access_log) == (
        "127.0.0.1:8000", 16, True, None)  # the embedded SQLite ledger
    shared = WebServerSettings.from_env({"DATABASE_URL": "postgresql+psycopg://db/ledger"})
    assert shared.threads == 4
    assert default.workers >= 2
    assert WebServerSettings.from_env({"LEDGER_BIND": "unix:/run/ledger.sock"}).bind == (
        "unix:/run/ledger.sock")


@pytest.mark.parametrize(("name", "raw", "match"), [
    ("LEDGER_BIND", "8000", "must be host:port"),
    ("LEDGER_BIND", "host:99999", "must be host:port"),
    ("LEDGER_BIND", "host:http", "must be host:port"), ("WEB_CONCURRENCY", "0", "must be >= 1"),
    ("WEB_CONCURRENCY", "many", "must be an integer"),
    ("LEDGER_WEB_THREADS", "0", "must be >= 1"),
    ("LEDGER_WEB_PRELOAD", "maybe", "must be a boolean"),
])
def test_bad_web_server_settings_are_refused_by_name(name: str, raw: str, match: str) -> None:
    with pytest.raises(SettingsError, match=f"^{name} {match}"):
        WebServerSettings.from_env({name: raw})


def test_the_metrics_directory_is_read_through_config() -> None:
    assert metrics_multiproc_dir({"PROMETHEUS_MULTIPROC_DIR": "/tmp/m"}) == "/tmp/m"
    assert metrics_multiproc_dir({"PROMETHEUS_MULTIPROC_DIR": ""}) is None


def test_create_app_raises_the_settings_error(tmp_path: Path) -> None:
    from app import create_app

    with pytest.raises(SettingsError, match=r"^LEDGER_COOKIE_SECURE must be a boolean"):
        create_app({**BASE, "LEDGER_VAR_DIR": str(tmp_path), "LEDGER_COOKIE_SECURE": "maybe"})


def _run(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a command from the project directory with a clean ledger environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**clean, "DATABASE_URL": f"sqlite:///{tmp_path}/l.sqlite3",
                               "LEDGER_VAR_DIR": str(tmp_path), **env})


@pytest.mark.parametrize(("name", "raw"), [("LEDGER_COOKIE_SECURE", "True "),
                                           ("LEDGER_LEASE_SECONDS", "soon"),
                                           ("LEDGER_LOG_LEVEL", "loud")])
def test_the_ledger_cli_stops_at_start_naming_the_variable(tmp_path: Path, name: str,
                                                           raw: str) -> None:
    done = _run([str(BIN / "ledger"), "capacity"], tmp_path, **{name: raw})
    assert done.returncode == 2
    assert done.stderr.startswith(f"Error: {name} must be ") and repr(raw) in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "l.sqlite3").exists()  # stopped before touching the database


def test_the_ledger_cli_refuses_production_without_its_keys(tmp_path: Path) -> None:
    done = _run([str(BIN / "ledger"), "capacity"], tmp_path, LEDGER_ENV="production",
                LEDGER_MASTER_KEY="m")
    assert done.returncode == 2
    assert "LEDGER_ENV=production requires LEDGER_SECRET_KEY, LEDGER_LOG_HASH_KEY" in done.stderr
    assert not (tmp_path / "flask-secret.key").exists()


def test_gunicorn_does_not_boot_on_a_bad_setting(tmp_path: Path) -> None:
    done = _run([str(BIN / "gunicorn"), "--check-config", "app:create_app()"], tmp_path,
                LEDGER_WEB_PRELOAD="yes please")
    assert done.returncode != 0
    assert "LEDGER_WEB_PRELOAD must be a boolean" in done.stderr


def test_the_body_read_timeout_defaults_to_ten_seconds_and_reads_the_environment() -> None:
    assert settings().body_read_timeout_seconds == 10
    assert settings(LEDGER_BODY_READ_TIMEOUT_SECONDS="2.5").body_read_timeout_seconds == 2.5


@pytest.mark.parametrize("raw", ["0", "-1", "0.05"])
def test_a_body_read_timeout_below_a_tenth_of_a_second_is_refused_by_name(raw: str) -> None:
    refused("LEDGER_BODY_READ_TIMEOUT_SECONDS", raw, "must be >= 0.1")


@pytest.mark.parametrize("raw", ["nan", "inf", "ten"])
def test_a_body_read_timeout_that_is_not_a_number_is_refused_by_name(raw: str) -> None:
    refused("LEDGER_BODY_READ_TIMEOUT_SECONDS", raw, "must be a number of seconds")


PG = "postgresql+psycopg://ledger:pw@db1/ledger"
REPLICA = "postgresql+psycopg://ledger:s3cret@db2/ledger"


def test_a_read_replica_is_optional_and_taken_when_both_are_postgresql() -> None:
    assert settings().read_database_url is None and settings().read_max_lag_seconds is None
    chosen = settings(DATABASE_URL=PG, LEDGER_READ_DATABASE_URL=REPLICA,
                      LEDGER_READ_MAX_LAG_SECONDS="2.5")
    assert chosen.read_database_url == REPLICA and chosen.read_max_lag_seconds == 2.5
    assert settings(DATABASE_URL=PG, LEDGER_READ_DATABASE_URL="").read_database_url is None


@pytest.mark.parametrize(("raw", "shown"), [
    ("sqlite:///var/replica.sqlite3", "a SQLite URL"),
    ("mysql://u:s3cret@db/ledger", "'mysql'"),
    ("db2:5432", "'db2'"),
    (f" {REPLICA}", "'postgresql+psycopg'"),
])
def test_a_read_replica_that_is_not_postgresql_is_refused_by_name(raw: str, shown: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(DATABASE_URL=PG, LEDGER_READ_DATABASE_URL=raw)
    message = str(caught.value)
    assert caught.value.name == "LEDGER_READ_DATABASE_URL"
    assert message.startswith("LEDGER_READ_DATABASE_URL must be a PostgreSQL URL")
    assert shown in message and "s3cret" not in message  # never the password


def test_a_read_replica_of_a_sqlite_ledger_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"LEDGER_READ_DATABASE_URL needs a PostgreSQL "
                                            r"DATABASE_URL .*'sqlite'") as caught:
        settings(LEDGER_READ_DATABASE_URL=REPLICA)  # BASE: a SQLite DATABASE_URL
    assert caught.value.name == "LEDGER_READ_DATABASE_URL"


@pytest.mark.parametrize("raw", ["-1", "soon", "nan", "inf", "5s", " 2"])
def test_the_replica_lag_bound_is_a_duration(raw: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(DATABASE_URL=PG, LEDGER_READ_DATABASE_URL=REPLICA,
                 LEDGER_READ_MAX_LAG_SECONDS=raw)
    assert caught.value.name == "LEDGER_READ_MAX_LAG_SECONDS"


def test_a_lag_bound_without_a_replica_is_refused() -> None:
    with pytest.raises(SettingsError, match="needs LEDGER_READ_DATABASE_URL"):
        settings(DATABASE_URL=PG, LEDGER_READ_MAX_LAG_SECONDS="5")
