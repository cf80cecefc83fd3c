"""The example handler package, installed from wheels beside the ledger's, as a user installs it.

The ledger's wheel and the example's are built and installed (no dependencies) into
a fresh venv whose dependencies come from this environment through a `.pth` line:
offline, and nothing of the checkout is importable there. The example's own tests
run in it, and one real delivery reaches its handler through `ledger worker --burst`
(registered by its entry point alone) on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest
from sqlalchemy import text

from app import create_app
from ledger.reads.receipts import get_receipt
from tests.helpers import deliver, make_sender
from tests.integration.test_wheel import _clean_env, _ignore, _run
from tests.integration.test_wheel import wheel as wheel  # the ledger's wheel (a fixture)
from tests.servers import ROOT

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "acme_handlers"


@pytest.fixture(scope="module")
def venv_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Install the ledger's wheel and the example's into a fresh venv; return its bin/."""
    work = tmp_path_factory.mktemp("example")
    source = work / "acme_handlers"
    shutil.copytree(EXAMPLE, source, ignore=_ignore)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
          str(work / "dist"), str(source)])
    (example,) = (work / "dist").glob("acme_handlers-*.whl")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = str(venv / "bin" / "python")
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   env=_clean_env()).stdout.strip()
    # The two wheels go into the venv itself, ahead of this environment's packages, which
    # only lend the dependencies (and pytest): a .pth path line adds no editable finder.
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--quiet",
          str(wheel), str(example)])
    return venv / "bin"


def test_the_example_package_passes_its_own_tests_against_the_installed_wheels(
        venv_bin: Path, pg_admin_url: str | None, tmp_path: Path):
    tests = tmp_path / "acme-tests"
    shutil.copytree(EXAMPLE / "tests", tests)
    env = _clean_env(**({"ACME_TEST_POSTGRES_URL": pg_admin_url} if pg_admin_url else {}))
    where = _run([str(venv_bin / "python"), "-c", "import acme_handlers, ledger; "
                  "print(acme_handlers.__file__); print(ledger.__file__)"],
                 cwd=tmp_path, env=env).stdout.split()
    assert all(path.startswith(str(venv_bin.parent)) for path in where), where
    done = _run([str(venv_bin / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 "--rootdir", str(tests), str(tests)], cwd=tmp_path, env=env)
    assert ("8 passed" if pg_admin_url else "4 passed") in done.stdout, done.stdout


def test_a_delivery_reaches_the_installed_handler_through_ledger_worker(
        venv_bin: Path, test_env: dict[str, str], tmp_path: Path):
    app = create_app(test_env)  # the intake, in this process, on the same database
    try:
        sender = make_sender(app)
        answer = deliver(app.test_client(), sender, "evt_acme_1", "acme.invoice.paid",
                         {"invoice": "in_1", "amount_cents": 700})
        assert answer.status_code == 202, answer.get_json()
        env = _clean_env(**test_env)  # no LEDGER_HANDLER_MODULES: the entry point alone
        _run([str(venv_bin / "acme-handlers-migrate")], cwd=tmp_path, env=env)
        done = _run([str(venv_bin / "ledger"), "worker", "--burst"], cwd=tmp_path, env=env)
        (start,) = [json.loads(line) for line in done.stderr.splitlines()
                    if '"worker.start"' in line]
        assert "acme.invoice.paid" in start["handlers"]
        with app.extensions["ledger"].engine.connect() as conn:
            receipt = get_receipt(conn, sender.scope, "evt_acme_1")
            paid = conn.execute(text("SELECT invoice_id, amount_cents FROM acme_invoices")).all()
        assert (receipt.state.value, receipt.result_ref) == ("complete", "acme-invoice:in_1")
        assert [tuple(row) for row in paid] == [("in_1", 700)]
    finally:
        app.extensions["ledger"].close()

