# Set-up is idempotent: every target installs what it needs and skips what is already there.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup jars classes rocketmq browser promtool airflow package lint test run bench bench-sim bench-ingest bench-reconcile \
	bench-export bench-collect bench-serve fuzz docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

jars: $(STAMP)
	$(BIN)/python -m jobs.jars

# The driver JVM's class archive (jobs/class_archive.py): each job then starts some 4 s sooner.
classes: jars
	$(BIN)/python -m jobs.class_archive

setup: $(STAMP) jars classes

# The real RocketMQ the tests start (name server, broker, client, tools), with its dependencies, copied once
# per version from Maven Central into .jars/rocketmq/<version>. The first version is the suite's broker for
# every real-broker test and its client drives them all; the others run the version matrix
# (tests/test_rocketmq_versions.py). `make test ROCKETMQ_VERSIONS=5.3.3` runs the main version alone.
ROCKETMQ_VERSIONS ?= 5.3.3 4.9.7 5.5.0
export ROCKETMQ_VERSIONS
.jars/rocketmq/%/.fetched: tests/rocketmq/pom.xml
	rm -rf .jars/rocketmq/$*
	mvn -B -q -f tests/rocketmq/pom.xml -Drocketmq.version=$* dependency:copy-dependencies \
	  -DoutputDirectory=$(CURDIR)/.jars/rocketmq/$*
	touch $@
rocketmq: $(foreach v,$(ROCKETMQ_VERSIONS),.jars/rocketmq/$(v)/.fetched)

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

# The alerting rules are checked and unit-tested with promtool, from Debian's prometheus package.
promtool:
	@command -v promtool >/dev/null || { \
	  $(SUDO) apt-get install -y -q prometheus || \
	  { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q prometheus; }; }

# Airflow only parses the example DAG in a test; its own virtualenv keeps its pins away from ours.
AIRFLOW_VENV := .venv-airflow
AIRFLOW_PINS := apache-airflow==3.3.2 apache-airflow-providers-apache-spark==6.3.4
$(AIRFLOW_VENV)/.installed-stamp: Makefile
	$(PYTHON) -m venv $(AIRFLOW_VENV)
	$(AIRFLOW_VENV)/bin/python -m pip install -q --upgrade pip
	$(AIRFLOW_VENV)/bin/python -m pip install -q $(AIRFLOW_PINS)
	touch $@
airflow: $(AIRFLOW_VENV)/.installed-stamp

# The project zip for spark-submit --py-files: dist/txn_recon.zip.
package: setup
	$(BIN)/python -m jobs.package

# The documentation site, strictly (a broken link or anchor fails): docs/ and the reference generated from
# the code (docs/hooks.py) into site/, which `txn-recon serve` serves at /docs/.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The suite's set-up, three steps at a time (a fresh clone here, 5 December 2026: 2 min 0 s, against 2 min 36 s one
# after another), then two workers, one test file each at a time, the longest files first (tests/conftest.py).
TEST_WORKERS ?= 2
test:
	$(MAKE) -j3 --output-sync=target lint browser promtool airflow rocketmq docs
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

# apt-get holds one lock: the two installs take turns.
promtool: | browser

# Longer fuzz campaigns than the suite's: FUZZ_EXAMPLES mutated inputs for each decoder of outside bytes
# (tests/fuzz.py), minutes per decoder. An input that fails is saved under tests/data/fuzz/<decoder>/, and
# the suite replays every saved input from then on.
FUZZ_EXAMPLES ?= 100000
fuzz: setup
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_SAVE=1 $(BIN)/pytest tests/test_fuzz.py -q --durations=0

# The main job: simulate the default profile (100,000 transactions) into landing/demo, ingest,
# reconcile, check data quality, write the dashboard, and score the anomalies against the model's truth.
run: setup
	$(BIN)/txn-recon demo --out landing/demo --transactions 100000 --profile default

# Ingest and reconcile at 1M and 2M transactions, then 1% more events reconciled incrementally: per-stage
# wall time, throughput, peak memory and Spark's own counts, and DuckDB running the same rules on the same
# landing beside them (the ratio, and every finding compared: exit 1 if they differ); also in
# artifacts/bench.json. Landings are kept in landing/bench-N. BENCH_TRANSACTIONS="1000000" for 1M only.
bench: setup
	$(BIN)/python -m tests.bench.bench_pipeline

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

# export-store decoding a commit log of 256 MiB and of 1 GiB (BENCH_EXPORT_MIB) written from the broker
# model through the store encoding: records per second on one core and peak memory.
bench-export: setup
	mkdir -p landing
	$(BIN)/python -m tests.bench.bench_export

# Collect throughput and memory from a real broker on loopback (the RocketMQ jars of `make rocketmq`).
bench-collect: setup rocketmq
	$(BIN)/python -m tests.bench.bench_collect

# A serve cycle bringing about 1,000 new transactions to 10,000 and 1M reconciled ones (BENCH_TRANSACTIONS).
bench-serve: setup
	$(BIN)/python -m tests.bench.bench_serve

clean:
	rm -rf warehouse landing .pytest_cache .mypy_cache .ruff_cache
