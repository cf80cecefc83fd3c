"""One declaration per setting: from_env, dataclass defaults, reference, env example agree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ledger.config import (
    DECLARED,
    DEFAULT_RETENTION_SECONDS,
    PRODUCTION_KEYS,
    Settings,
    SettingsError,
    WebServerSettings,
)
from ledger.config_render import _env_value, env_example, reference_markdown

ROOT = Path(__file__).resolve().parents[2]
URL = "sqlite:///declared.sqlite3"


def _fields(cls: type) -> set[str]:
    """Return the names of a settings dataclass's fields."""
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(("cls", "owner"), [(Settings, "settings"),
                                            (WebServerSettings, "web")])
def test_every_field_has_exactly_one_declaration(cls: type, owner: str) -> None:
    attributes = [s.attribute for s in DECLARED if s.owner == owner]
    assert len(attributes) == len(set(attributes))
    assert set(attributes) == _fields(cls)


def test_every_variable_is_declared_once() -> None:
    names = [s.name for s in DECLARED]
    assert len(names) == len(set(names))


def test_the_dataclass_defaults_are_what_an_empty_environment_reads() -> None:
    assert Settings(database_url=URL) == Settings.from_env({"DATABASE_URL": URL})
    assert WebServerSettings() == WebServerSettings.from_env({})


def test_the_review_window_default_is_never_longer_than_the_retention() -> None:
    s = Settings(database_url=URL)
    assert s.review_window_seconds == s.retention_seconds == DEFAULT_RETENTION_SECONDS
    longer = Settings.from_env({"LEDGER_RETENTION_SECONDS": str(30 * 86400)})
    assert longer.review_window_seconds == 14 * 86400


@pytest.mark.parametrize("setting", [s for s in DECLARED if _env_value(s) is not None],
                         ids=lambda s: s.name)
def test_a_declared_default_written_out_reads_back_as_itself(setting: object) -> None:
    from ledger.config_parsers import Setting

    assert isinstance(setting, Setting)
    written = _env_value(setting)
    assert written is not None
    assert setting.read({setting.name: written}) == setting.read({})


def test_production_requires_exactly_the_declared_keys() -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"LEDGER_ENV": "production"})
    assert all(name in str(caught.value) for name in PRODUCTION_KEYS)
    assert set(PRODUCTION_KEYS) == {"LEDGER_SECRET_KEY", "LEDGER_MASTER_KEY",
                                    "LEDGER_LOG_HASH_KEY", "LEDGER_AUDIT_KEY"}
    keys = {name: "k" for name in PRODUCTION_KEYS}
    assert Settings.from_env({"LEDGER_ENV": "production", **keys}).production


def test_the_env_example_is_written_from_the_declarations() -> None:
    shipped = (ROOT / "deploy" / "ledger.env.example").read_text()
    assert shipped == env_example(), (
        "run: python -m ledger.config_render env-example > deploy/ledger.env.example")
    set_there = {line.split("=", 1)[0] for line in shipped.splitlines()
                 if line and not line.startswith("#")}
    assert set(PRODUCTION_KEYS) <= set_there
    assert "LEDGER_ENV" in set_there


def test_the_reference_names_every_variable_and_marks_production_keys() -> None:
    page = reference_markdown()
    for s in DECLARED:
        row = next(line for line in page.splitlines() if f"`{s.name}` |" in line)
        assert f'id="{s.name}"' in row
        assert ("Required in production" in row) == s.production
