# Replay Ledger: `make run` and `make test` each work from a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
export LEDGER_DEMO_HANDLERS ?= 1
# The suite runs in TEST_WORKERS processes (pytest-xdist), each module whole in one of them
# so that its clusters and servers start once; TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope

.PHONY: run test test-pgbouncer lint docs env-example screenshots bench clean system-deps js-deps
# Run a second time through a private PgBouncer in transaction mode (LEDGER_DB_PGBOUNCER=1).
PGBOUNCER_TESTS := tests/integration/test_intake.py tests/integration/test_worker.py \
	tests/integration/test_scheduler.py tests/integration/test_scheduler_processes.py \
	tests/integration/test_credentials.py tests/integration/test_dashboard_pages.py \
	tests/integration/test_db_versions.py

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(RUN_STAMP)

## run: migrate the embedded SQLite ledger, seed a demo, serve on http://127.0.0.1:5000 (PORT=…)
PORT ?= 5000
run: $(RUN_STAMP)
	$(BIN)/ledger db upgrade
	$(BIN)/ledger dev --demo --port $(PORT)

## test: the whole suite on SQLite and PostgreSQL, then its core again through PgBouncer
test: $(TEST_STAMP) system-deps js-deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(MAKE) --no-print-directory docs
	$(PYTEST)
	$(MAKE) --no-print-directory test-pgbouncer

## test-pgbouncer: intake, worker, scheduler, credential and dashboard tests via PgBouncer
test-pgbouncer: $(TEST_STAMP) system-deps
	LEDGER_TEST_VIA_PGBOUNCER=1 LEDGER_DB_PGBOUNCER=1 $(PYTEST) $(PGBOUNCER_TESTS)

## js-deps: the senders' JavaScript libraries for the interop test (tests/js)
js-deps:
	@if command -v npm >/dev/null; then npm ci --prefix tests/js --no-audit --no-fund --silent; \
	else echo "npm not found: tests/unit/test_js_libraries.py will be skipped"; fi

## system-deps: Debian packages the tests drive (chromium, pgbouncer, pg_auto_failover)
system-deps:
	@bash scripts/system-deps.sh

## docs: build the documentation site strictly into var/site (a broken link or a page
## missing from mkdocs.yml's nav fails); the reference pages are generated from the code
docs: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## env-example: rewrite deploy/ledger.env.example from the settings' declarations
env-example: $(RUN_STAMP)
	$(BIN)/python -m ledger.config_render env-example > deploy/ledger.env.example

## screenshots: retake docs/screenshots/*.png from a freshly seeded demo (headless chromium)
screenshots: $(TEST_STAMP)
	$(BIN)/python scripts/dashboard_screenshots.py

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(TEST_STAMP)
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache
