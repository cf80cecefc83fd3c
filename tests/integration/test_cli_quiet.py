"""A read command prints its answer and nothing else: no warning on a ledger already set up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LEDGER = str(Path(sys.executable).parent / "ledger")

pytestmark = pytest.mark.slow


def _ledger(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed console script with `env`."""
    return subprocess.run([LEDGER, *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_read_commands_answer_without_warnings(db_url: str, tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")},
           "DATABASE_URL": db_url, "LEDGER_VAR_DIR": str(tmp_path / "var")}
    first = _ledger(env, "integration", "create", "--account", "acme", "--name", "quiet",
                    "--profile", "stripe", "--json")
    assert first.returncode == 0, first.stderr
    assert "master_key.development" in first.stderr  # generated now, said once
    listed = _ledger(env, "integration", "list", "--json")
    assert listed.returncode == 0 and listed.stderr == ""
    assert [r["scope"] for r in json.loads(listed.stdout)["integrations"]] == ["acme/quiet"]
    missing = _ledger(env, "receipt", "show", "--scope", "acme/quiet", "--event-id", "evt_x",
                      "--json")
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("error:") and "warning" not in missing.stderr
    helped = _ledger(env, "--help")
    assert helped.returncode == 0 and helped.stderr == "" and "integration" in helped.stdout
