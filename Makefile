# One command runner for fairq. `make run` and `make test` work on a fresh machine
# that has only Python 3.11 and the package registries.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: install run test lint bench bench-vllm-setup clean browser

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev,bench]'
	touch $@

run: install
	$(BIN)/fairq up

test: install browser
	$(BIN)/pytest

# tests/integration/test_dashboard.py drives Debian's chromium (no browser download of its own). As
# root on a machine with apt-get it is installed when missing; elsewhere the test skips.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	       && apt-get update -q >/dev/null \
	       && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } \
	  || echo "chromium not installed: tests/integration/test_dashboard.py will be skipped"

# The formatter wins; mypy --strict over every package (pyproject.toml, [tool.mypy]).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The throughput-and-scale suite (one table: every figure next to its target), then the
# fairness scenario. `python -m benchmarks.suite --quick` checks the suite runs, fast.
bench: install
	$(BIN)/python -m benchmarks.suite
	$(BIN)/fairq bench fairness

# A real vLLM (CPU build, ~2.5 GB) and a tiny model in .vllm/, for benchmarks against a
# real engine; not part of `make test`. Then: python -m benchmarks.vllm_engine serve ...
bench-vllm-setup: install
	$(BIN)/python -m benchmarks.vllm_engine setup

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
