# Set-up is idempotent: every target installs what it needs and skips what is already there.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup jars browser lint test run bench-sim bench-ingest bench-reconcile clean

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

# The dashboard test drives Debian's Chromium through ChromeDriver; install both once (as root or via sudo).
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  $(SUDO) apt-get install -y -q chromium chromium-driver || \
	  { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium chromium-driver; }; }

# Two workers, one test file each at a time: Spark tests wait on latency as much as on CPU.
test: lint browser
	$(BIN)/pytest -n 2 --dist loadfile

# The main job: simulate the default profile (100,000 transactions) into landing/demo, ingest,
# reconcile, check data quality, write the dashboard, and score the anomalies against the model's truth.
run: setup
	$(BIN)/txn-recon demo --out landing/demo --transactions 100000 --profile default

# Simulation throughput and memory: one million transactions of the default profile, one core.
bench-sim: setup
	rm -rf landing/bench-sim
	$(BIN)/txn-recon simulate --out landing/bench-sim --transactions 1000000 --benchmark
	rm -rf landing/bench-sim

# Ingest throughput from JSON Lines and from Parquet, about a million events each.
bench-ingest: setup
	$(BIN)/python -m tests.bench.bench_ingest

# Reconcile time and peak driver memory (BENCH_TRANSACTIONS="1000000 5000000" for both sizes).
bench-reconcile: setup
	$(BIN)/python -m tests.bench.bench_reconcile

clean:
	rm -rf warehouse landing .pytest_cache .mypy_cache .ruff_cache
