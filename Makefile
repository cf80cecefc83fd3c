# Replay Ledger: `make run` and `make test` each work from a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
export LEDGER_DEMO_HANDLERS ?= 1

.PHONY: run test lint bench clean system-deps js-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(RUN_STAMP)

## run: migrate the embedded SQLite ledger, seed a demo, serve on http://127.0.0.1:5000
run: $(RUN_STAMP)
	$(BIN)/ledger db upgrade
	$(BIN)/ledger demo seed
	$(BIN)/ledger dev

## test: the whole suite on SQLite and PostgreSQL
test: $(TEST_STAMP) system-deps js-deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

## js-deps: the senders' JavaScript libraries for the interop test (tests/js)
js-deps:
	@if command -v npm >/dev/null; then npm ci --prefix tests/js --no-audit --no-fund --silent; \
	else echo "npm not found: tests/unit/test_js_libraries.py will be skipped"; fi

## system-deps: Debian packages the tests drive (chromium for browser tests)
system-deps:
	@bash scripts/system-deps.sh

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(TEST_STAMP)
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache
