"""A database that cannot be reached gives 503 with Retry-After, never a 500 or a hang."""

from __future__ import annotations

import pytest

from app import create_app
from tests.conftest import TEST_MASTER_KEY
from tests.servers import free_port


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://postgres@127.0.0.1:{port}/nowhere",
    "sqlite:///{tmp}/missing-dir/is-a-dir/",
], ids=["postgresql-down", "sqlite-unopenable"])
def test_unreachable_database_answers_503_with_retry_after(url, tmp_path):
    (tmp_path / "missing-dir" / "is-a-dir").mkdir(parents=True)
    app = create_app({"DATABASE_URL": url.format(port=free_port(), tmp=tmp_path),
                      "LEDGER_MASTER_KEY": TEST_MASTER_KEY, "LEDGER_VAR_DIR": str(tmp_path),
                      "LEDGER_SECRET_KEY": "t"})
    response = app.test_client().post("/hooks/in_AAAAAAAAAAAAAAAAAAAAAA", data=b"{}")
    assert response.status_code == 503
    assert response.get_json() == {"error": "unavailable"}
    assert int(response.headers["Retry-After"]) > 0
    ready = app.test_client().get("/readyz")
    assert ready.status_code == 503
    assert ready.get_json()["status"] == "unready"
    assert app.test_client().get("/healthz").get_json() == {"status": "ok"}
    app.extensions["ledger"].close()


def test_readyz_is_ready_on_a_migrated_database(client):
    assert client.get("/readyz").get_json() == {"status": "ready"}


def test_readyz_is_unready_before_migrations(tmp_path):
    app = create_app({"DATABASE_URL": f"sqlite:///{tmp_path}/empty.sqlite3",
                      "LEDGER_MASTER_KEY": TEST_MASTER_KEY, "LEDGER_VAR_DIR": str(tmp_path),
                      "LEDGER_SECRET_KEY": "t"})
    ready = app.test_client().get("/readyz")
    assert ready.status_code == 503
    assert "head is" in ready.get_json()["detail"]
    app.extensions["ledger"].close()
