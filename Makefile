# Set-up is idempotent: every target installs what it needs and skips what is already there.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup jars lint test run spark-sql-demo clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

jars: $(STAMP)
	$(BIN)/python -m jobs.jars

setup: $(STAMP) jars

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

run: setup
	$(BIN)/txn-recon sql "SHOW TABLES IN txn_recon"

clean:
	rm -rf warehouse .pytest_cache .mypy_cache .ruff_cache
