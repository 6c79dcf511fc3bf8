# One command runner for fairq. `make run` and `make test` work on a fresh machine
# that has only Python 3.11 and the package registries.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: install run test lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev,bench]'
	touch $@

run: install
	$(BIN)/fairq up

test: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python -m benchmarks.latency
	$(BIN)/python -m benchmarks.dispatch
	$(BIN)/fairq bench fairness

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
