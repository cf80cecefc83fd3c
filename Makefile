# Replay Ledger: `make run` and `make test` each work from a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
export LEDGER_DEMO_HANDLERS ?= 1

.PHONY: run test lint bench clean system-deps

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

## test: the whole suite on SQLite and PostgreSQL
test: $(TEST_STAMP) system-deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

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
