"""Settings read from the environment: the purge's duty cycle, the body read deadline."""

from __future__ import annotations

import pytest

from ledger.config import DEFAULT_DUTY_CYCLE, Settings

BASE = {"DATABASE_URL": "sqlite:///unused.sqlite3"}


def test_the_purge_duty_cycle_defaults_to_half_and_reads_the_environment() -> None:
    assert Settings.from_env(BASE).purge_duty_cycle == DEFAULT_DUTY_CYCLE == 0.5
    assert Settings.from_env({**BASE, "LEDGER_PURGE_DUTY_CYCLE": "1"}).purge_duty_cycle == 1.0
    assert Settings.from_env({**BASE, "LEDGER_PURGE_DUTY_CYCLE": "0.25"}).purge_duty_cycle == 0.25
    assert Settings.from_env({**BASE, "LEDGER_PURGE_DUTY_CYCLE": ""}).purge_duty_cycle == 0.5


@pytest.mark.parametrize("raw", ["0", "-0.5", "1.01", "2", "nan", "inf", "half", "50%"])
def test_a_purge_duty_cycle_outside_zero_to_one_is_refused_by_name(raw: str) -> None:
    with pytest.raises(ValueError, match=r"LEDGER_PURGE_DUTY_CYCLE must be .*\(0, 1\]|"
                                         r"LEDGER_PURGE_DUTY_CYCLE must be > 0 and <= 1"):
        Settings.from_env({**BASE, "LEDGER_PURGE_DUTY_CYCLE": raw})


def test_the_body_read_timeout_defaults_to_ten_seconds_and_reads_the_environment() -> None:
    assert Settings.from_env(BASE).body_read_timeout_seconds == 10.0
    env = {**BASE, "LEDGER_BODY_READ_TIMEOUT_SECONDS": "2.5"}
    assert Settings.from_env(env).body_read_timeout_seconds == 2.5


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "ten"])
def test_a_body_read_timeout_that_is_not_a_positive_number_is_refused_by_name(raw: str) -> None:
    with pytest.raises(ValueError, match="LEDGER_BODY_READ_TIMEOUT_SECONDS must be a number"):
        Settings.from_env({**BASE, "LEDGER_BODY_READ_TIMEOUT_SECONDS": raw})
