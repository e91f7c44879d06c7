# Quick start: `make demo` (the main job) and `make test` (ruff + mypy + pytest).
# Each target installs what it needs into .venv first, so either works on a fresh clone.

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed-test
BENCH_INSTALLED := $(VENV)/.installed-bench
DEMO_OUT ?= demo-out

.PHONY: install demo test lint typecheck pytest bench clean

install: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

$(BENCH_INSTALLED): $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

demo: $(INSTALLED)
	$(BIN)/fedper demo --out $(DEMO_OUT)

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(INSTALLED)
	$(BIN)/mypy

pytest: $(INSTALLED)
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

bench: $(BENCH_INSTALLED)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache $(DEMO_OUT)
