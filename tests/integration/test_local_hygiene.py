"""What a local user of the machine sees: the development ledger file is the owner's only,
a secret typed on a terminal is not echoed, a malformed master key is named, not traced."""

from __future__ import annotations

import os
import pty
import select
import stat
import subprocess
import time
from pathlib import Path

from app import create_app
from tests.conftest import TEST_AUDIT_KEY
from tests.dashboard_helpers import make_operator
from tests.servers import BIN


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.sqlite3'}",
            "LEDGER_VAR_DIR": str(tmp_path / "var"), "LEDGER_AUDIT_KEY": TEST_AUDIT_KEY,
            **extra}


def test_the_development_sqlite_file_and_its_wal_are_private(tmp_path: Path) -> None:
    database = tmp_path / "var" / "ledger.sqlite3"
    app = create_app({"DATABASE_URL": f"sqlite:///{database}",
                      "LEDGER_VAR_DIR": str(tmp_path / "var")})
    try:
        from ledger.db.engine import upgrade

        old = os.umask(0o022)  # the usual umask: files 0644 unless the ledger says otherwise
        try:
            upgrade(app.extensions["ledger"].engine)
            make_operator(app, "someone", "viewer")
            with app.extensions["ledger"].engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
                for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm")):
                    assert path.exists(), path
                    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
        finally:
            os.umask(old)
    finally:
        app.extensions["ledger"].close()


def test_a_malformed_master_key_is_named_without_a_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(BIN / "ledger"), "audit", "head"], capture_output=True, text=True, timeout=60,
        env=_env(tmp_path, LEDGER_MASTER_KEY="not-a-fernet-key"))
    assert result.returncode == 2
    assert "LEDGER_MASTER_KEY" in result.stderr and "Traceback" not in result.stderr


def _read_until(fd: int, needle: bytes, deadline: float) -> bytes:
    seen = b""
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_a_secret_typed_on_a_terminal_is_not_echoed(tmp_path: Path) -> None:
    from tests.conftest import TEST_MASTER_KEY

    env = _env(tmp_path, LEDGER_MASTER_KEY=TEST_MASTER_KEY)
    subprocess.run([str(BIN / "ledger"), "db", "upgrade"], env=env, check=True, timeout=120,
                   capture_output=True)
    secret = "typed-on-a-terminal-9f3k2"
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [str(BIN / "ledger"), "operator", "create", "--username", "typist", "--role",
         "viewer", "--password-stdin"], stdin=follower, stdout=follower, stderr=follower,
        env=env, start_new_session=True)
    os.close(follower)
    try:
        deadline = time.monotonic() + 60
        shown = _read_until(leader, b":", deadline)
        os.write(leader, secret.encode() + b"\n")
        shown += _read_until(leader, b"created", deadline)
        assert process.wait(timeout=60) == 0, shown
    finally:
        if process.poll() is None:
            process.kill()
        os.close(leader)
    assert b"created" in shown and secret.encode() not in shown
