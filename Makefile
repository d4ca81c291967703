# Set-up is idempotent: every target installs what it needs and skips what is already there.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup jars lint test run bench-sim bench-ingest clean

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

# The main job. Until ingest and reconcile land, it runs what exists: the broker model's default
# profile into landing/demo (recreated on every run).
run: setup
	rm -rf landing/demo
	$(BIN)/txn-recon simulate --out landing/demo --transactions 100000 --profile default

# Simulation throughput and memory: one million transactions of the default profile, one core.
bench-sim: setup
	rm -rf landing/bench-sim
	$(BIN)/txn-recon simulate --out landing/bench-sim --transactions 1000000 --benchmark
	rm -rf landing/bench-sim

# Ingest throughput from JSON Lines and from Parquet, about a million events each.
bench-ingest: setup
	$(BIN)/python -m tests.bench.bench_ingest

clean:
	rm -rf warehouse landing .pytest_cache .mypy_cache .ruff_cache
