"""The built wheel, installed into a fresh venv away from the checkout, migrates and serves.

Nothing here may come from the repository: the venv has no system site-packages, every
command runs from a directory outside the checkout, and the wheel is built from a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from cryptography.fernet import Fernet

from tests.helpers import Sender, event_body, signed_headers
from tests.servers import ROOT, free_port, wait_until_up

pytestmark = pytest.mark.slow

INSTALL_WAIT = 120  # seconds: building and installing a wheel into a fresh venv
# Build artefacts and local state that never belong in a wheel's source copy.
NOT_SOURCES = {".git", ".venv", "build", "dist", "var", "docs", "__pycache__",
               ".pytest_cache", ".ruff_cache", ".hypothesis"}


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """Run a command, failing the test with its output when it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=INSTALL_WAIT, check=False,
                          **kwargs)
    assert done.returncode == 0, f"{args[:3]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


def _ignore(_dir: str, names: list[str]) -> set[str]:
    """Leave build output, venvs and caches out of the source copy."""
    return {n for n in names if n in NOT_SOURCES or n.endswith(".egg-info")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the wheel from a copy of the checkout (no build/ left behind, nothing stale)."""
    work = tmp_path_factory.mktemp("wheel-build")
    source = work / "src"
    shutil.copytree(ROOT, source, ignore=_ignore)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
          str(work / "dist"), str(source)])
    (built,) = (work / "dist").glob("replay_ledger-*.whl")
    return built


@pytest.fixture(scope="module")
def venv_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Install the wheel and its dependencies (from the configured index) in a fresh venv."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    # No pip inside: this environment's pip installs into it (`--python`), which skips
    # ensurepip's seconds. Dependencies come from pip's usual index and cache.
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
          "--quiet", str(wheel)])
    return venv / "bin"


def _clean_env(**extra: str) -> dict[str, str]:
    """Return an environment that points nothing at the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(extra, PYTHONUNBUFFERED="1")
    return env


def test_wheel_holds_only_ledger_with_every_resource(wheel: Path):
    """No generic top-level name lands in site-packages, and nothing of the package is left out.

    The repository's app.py, jobs/, templates/ and static/ are installed inside `ledger`.
    """
    names = set(zipfile.ZipFile(wheel).namelist())
    top = {name.split("/", 1)[0] for name in names}
    assert top == {"ledger", "replay_ledger-0.1.0.dist-info"}
    linked = {"app.py", "jobs", "templates", "static"}  # ledger/<name> links to the top's
    expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ledger").rglob("*")
                if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts
                and p.relative_to(ROOT / "ledger").parts[0] not in linked}
    for base in ("jobs", "templates", "static"):
        expected |= {f"ledger/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / base).rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts}
    expected.add("ledger/app.py")
    assert not expected - names, f"missing from the wheel: {sorted(expected - names)}"
    assert {"ledger/db/migrations/script.py.mako", "ledger/db/migrations/env.py",
            "ledger/templates/login.html", "ledger/static/ledger.css",
            "ledger/jobs/retention.py"} <= names


def test_the_wheel_needs_no_compiler_and_offers_the_c_parser_as_an_extra(wheel: Path):
    """gunicorn_h1c (built from source where no wheel exists) is only in the `fast` extra."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("replay_ledger-0.1.0.dist-info/METADATA").decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    h1c = [line for line in requires if "gunicorn_h1c" in line or "gunicorn-h1c" in line]
    assert h1c and all('extra == "fast"' in line for line in h1c), h1c
    assert "Provides-Extra: fast" in metadata and "Provides-Extra: test" in metadata


def test_a_users_own_jobs_package_leaves_the_scheduled_jobs_alone(venv_bin: Path,
                                                                   tmp_path: Path):
    """A project with its own `jobs` (and `app`) on sys.path still gets every ledger job."""
    project = tmp_path / "project"
    (project / "jobs").mkdir(parents=True)
    (project / "jobs" / "__init__.py").write_text("MINE = True\n")
    (project / "app.py").write_text("MINE = True\n")
    script = ("import app, jobs; assert app.MINE and jobs.MINE\n"
              "from ledger.app import create_cli_app\n"
              "from ledger.scheduling.runner import default_jobs\n"
              "svc = create_cli_app().extensions['ledger']\n"
              "print(' '.join(sorted(j.name for j in default_jobs(svc.settings))))")
    env = _clean_env(LEDGER_VAR_DIR=str(tmp_path / "var"))
    names = _run([str(venv_bin / "python"), "-c", script], cwd=project, env=env).stdout.split()
    assert names == sorted(["credential_expiry", "delivery_log_retention", "retention",
                            "revocation_propagation", "rollups", "sweep"]), names


@contextmanager
def _serving(args: list[str], env: dict[str, str], cwd: Path, base_url: str) -> Iterator[None]:
    """Run a server we start, in its own session, until the block ends; then stop it."""
    with (cwd / f"server-{uuid.uuid4().hex[:6]}.log").open("wb") as log:
        process = subprocess.Popen(args, cwd=str(cwd), env=env, stdout=log, stderr=log,
                                   start_new_session=True)
        try:
            try:
                wait_until_up(base_url, process, timeout=60)
            except (RuntimeError, TimeoutError):
                log.flush()
                pytest.fail(Path(log.name).read_text()[-3000:])
            yield
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the session we started, only
                process.wait(timeout=10)


def _check_pages_and_intake(base_url: str, sender: Sender, event_id: str, amount: int) -> None:
    """/login renders its template, a static file is served, a signed delivery is accepted."""
    login = requests.get(f"{base_url}/login", timeout=10)
    assert login.status_code == 200
    assert 'name="csrf_token"' in login.text and "</html>" in login.text
    css = requests.get(f"{base_url}/static/ledger.css", timeout=10)
    assert css.status_code == 200 and css.headers["Content-Type"].startswith("text/css")
    assert css.content == (ROOT / "static" / "ledger.css").read_bytes()
    # GitHub does not sign the delivery id: each delivery needs its own body (digest guard).
    body = event_body(sender.profile, event_id, data={"amount": amount})
    answer = requests.post(f"{base_url}/hooks/{sender.public_id}", data=body, timeout=10,
                           headers=signed_headers(sender, body, event_id))
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"status": "accepted", "event_id": event_id, "state": "pending"}


def test_installed_wheel_migrates_and_serves_from_outside_the_checkout(
        venv_bin: Path, empty_db_url: str, tmp_path: Path):
    """`ledger db upgrade`, `ledger integration create`, gunicorn and `ledger dev` all work."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = _clean_env(DATABASE_URL=empty_db_url, LEDGER_VAR_DIR=str(tmp_path / "var"),
                     LEDGER_MASTER_KEY=Fernet.generate_key().decode(),
                     LEDGER_SECRET_KEY="wheel-test-secret", LEDGER_DEMO_HANDLERS="1",
                     PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"))
    where = _run([str(venv_bin / "python"), "-c", "import ledger.app, ledger.jobs; "
                  "print(ledger.app.__file__); print(ledger.jobs.__file__)"],
                 cwd=cwd, env=env).stdout.split()
    assert all(path.startswith(str(venv_bin.parent)) for path in where), where
    for generic in ("app", "jobs"):  # the wheel puts no generic name into site-packages
        missing = subprocess.run([str(venv_bin / "python"), "-c", f"import {generic}"],
                                 cwd=cwd, env=env, capture_output=True, check=False)
        assert missing.returncode != 0
    _run([str(venv_bin / "ledger"), "db", "upgrade"], cwd=cwd, env=env)
    created = json.loads(_run([str(venv_bin / "ledger"), "integration", "create", "--account",
                               "acme", "--name", "from-wheel", "--profile", "github", "--json"],
                              cwd=cwd, env=env).stdout)
    sender = Sender(created["integration"], "github", created["credential"]["secret"],
                    created["scope"], 0, created["credential"]["key_id"])
    port = free_port()
    gunicorn = [str(venv_bin / "gunicorn"), "-c", "python:ledger.web.gunicorn_conf",
                "ledger.app:create_app()"]
    with _serving(gunicorn, {**env, "LEDGER_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "1"},
                  cwd, f"http://127.0.0.1:{port}"):
        _check_pages_and_intake(f"http://127.0.0.1:{port}", sender, "wheel-gunicorn-1", 1)
    port = free_port()
    with _serving([str(venv_bin / "ledger"), "dev", "--port", str(port)], env, cwd,
                  f"http://127.0.0.1:{port}"):
        _check_pages_and_intake(f"http://127.0.0.1:{port}", sender, "wheel-dev-1", 2)
        # `ledger dev` runs a worker too: both deliveries reach the demo handler.
        _wait_for_balance(venv_bin, cwd, env, created["scope"], 3)


def _wait_for_balance(venv_bin: Path, cwd: Path, env: dict[str, str], scope: str,
                      expected: int) -> None:
    """Poll the installed `ledger demo balance` until the scope's balance is `expected`."""
    deadline = time.monotonic() + 30
    balance = None
    while time.monotonic() < deadline:
        balance = json.loads(_run([str(venv_bin / "ledger"), "demo", "balance", "--scope",
                                   scope, "--json"], cwd=cwd, env=env).stdout)["balance"]
        if balance == expected:
            return
        time.sleep(0.5)
    raise AssertionError(f"balance of {scope} is {balance}, expected {expected}")
