"""Pure parts of the scheduler: periods, overrides, advisory keys, error text."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import exc as sa_exc

from ledger.config import Settings, SettingsError
from ledger.errors import error_summary
from ledger.scheduling.runner import advisory_key, period_start

NOW = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)


def test_period_start_is_the_floor_of_now_over_the_period():
    assert period_start(NOW, 60) == datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    assert period_start(NOW, 3600) == datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    assert period_start(NOW, 7) == datetime.fromtimestamp(NOW.timestamp() // 7 * 7, UTC)
    # every instant of one period maps to the same start, the next period to a new one
    assert period_start(datetime(2026, 6, 1, 12, 0, 59, tzinfo=UTC), 60) == period_start(NOW, 60)
    assert period_start(datetime(2026, 6, 1, 12, 1, tzinfo=UTC), 60) != period_start(NOW, 60)


def test_period_settings_read_overrides_and_refuse_garbage():
    def settings(**env: str) -> Settings:
        return Settings.from_env({"DATABASE_URL": "sqlite://", **env})

    assert settings(LEDGER_SCHEDULER_PERIODS="sweep=1, rollups=2.5").scheduler_periods == {
        "sweep": 1.0, "rollups": 2.5}
    assert settings().scheduler_periods == {}
    with pytest.raises(SettingsError, match="LEDGER_SCHEDULER_PERIODS"):
        settings(LEDGER_SCHEDULER_PERIODS="sweep=soon")
    assert settings(LEDGER_SCHEDULER_PERIOD_SCALE="0.01").scheduler_period_scale == 0.01
    with pytest.raises(SettingsError, match="PERIOD_SCALE"):
        settings(LEDGER_SCHEDULER_PERIOD_SCALE="-1")


def test_advisory_keys_are_stable_distinct_signed_64_bit():
    keys = {name: advisory_key(name) for name in ("retention", "sweep", "rollups")}
    assert len(set(keys.values())) == 3
    assert all(-(2**63) <= key < 2**63 for key in keys.values())
    assert advisory_key("sweep") == keys["sweep"]


def test_error_text_names_the_driver_error_without_sql_or_parameters():
    error = sa_exc.OperationalError("DELETE FROM jobs WHERE payload = %(p)s",
                                    {"p": "card=4242"}, TimeoutError("lock timeout\nDETAIL x"))
    # the scheduler's run rows and the worker's attempt rows share this one format
    assert error_summary(error) == "TimeoutError: lock timeout"
    assert error_summary(RuntimeError()) == "RuntimeError"
    assert error_summary(ValueError("x" * 2000)) == ("ValueError: " + "x" * 2000)[:500]
