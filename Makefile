# One command runner for fairq. `make run` and `make test` work on a fresh machine
# that has only Python 3.11 and the package registries.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: install install-run install-dev run test lint docs bench bench-vllm-setup clean browser \
        image image-test

# Two installs, each with its own stamp: `make run` installs only what running needs;
# `make test`, `make lint` and `make bench` add the test, dev and bench extras (the tests
# run the benchmarks too, plots included).
PIP_INSTALL := $(BIN)/pip install --quiet

install: install-dev
install-run: $(VENV)/.installed-run
install-dev: $(VENV)/.installed-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	@echo "make: installing fairq and what it needs to run into $(VENV) (pyproject.toml, dependencies)"
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	@echo "make: installing fairq with its test, dev and bench extras into $(VENV) (pytest, openai, ruff, mypy, matplotlib, ...)"
	$(PIP_INSTALL) -e '.[test,dev,bench]'
	touch $@ $(VENV)/.installed-run

run: install-run
	$(BIN)/fairq up

# The suite in TEST_PROCESSES processes (pytest-xdist), each with its own Redis and its own
# range of ports (tests/conftest.py); most of a test's time is waiting on other processes,
# so more processes than cores. TEST_PROCESSES=0 runs it in this one process.
TEST_PROCESSES ?= 3
test: install-dev browser
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist worksteal

# tests/integration/test_dashboard.py drives Debian's chromium (no browser download of its own).
# As root on a machine with apt-get it is installed when missing (and said so first);
# elsewhere, or with BROWSER=no, that one test skips.
BROWSER ?= yes
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	  || { [ "$(BROWSER)" = yes ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	       && echo "make: installing Debian's chromium (apt-get, as root) for tests/integration/test_dashboard.py, which drives the dashboard in a headless browser; BROWSER=no skips it" \
	       && apt-get update -q >/dev/null \
	       && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } \
	  || echo "make: chromium not installed: tests/integration/test_dashboard.py will be skipped"

# The image of every Kubernetes manifest (fairq:0.1.0), built from the Dockerfile with
# buildah: no Docker daemon. deploy/image/build.sh installs Debian's buildah when missing
# (apt-get, as root; said first); where python:3.11-slim cannot be pulled it builds on a
# Debian base made with debootstrap (installed likewise), kept for the next build.
# image-test then runs the image's gateway, dispatcher, worker and simulator and asks them
# for a chat completion through the openai client (tests/integration/test_image.py).
IMAGE ?= fairq:0.1.0
image:
	IMAGE=$(IMAGE) PYTHON=$(PYTHON) deploy/image/build.sh

image-test: image install-dev
	FAIRQ_IMAGE=$(IMAGE) $(BIN)/pytest tests/integration/test_image.py

# The formatter wins; mypy --strict over every package (pyproject.toml, [tool.mypy]).
lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# fairq.example.yaml and README.md's settings table, generated from the descriptions of the
# settings (broker/settings); tests/fairq/test_config_docs.py fails while they are stale.
docs: install-run
	$(BIN)/fairq config example --write fairq.example.yaml
	$(BIN)/fairq config settings --write README.md

# The throughput-and-scale suite (one table: every figure next to its target), then the
# fairness scenario. `python -m benchmarks.suite --quick` checks the suite runs, fast.
bench: install-dev
	$(BIN)/python -m benchmarks.suite
	$(BIN)/fairq bench fairness

# A real vLLM (CPU build, ~2.5 GB) and a tiny model in .vllm/, for benchmarks against a
# real engine; not part of `make test`. Then: python -m benchmarks.lib.vllm_engine serve ...
bench-vllm-setup: install-dev
	$(BIN)/python -m benchmarks.lib.vllm_engine setup

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
