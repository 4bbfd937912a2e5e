# pytest-mla — two commands on a fresh machine:
#   make matrix   run the built-in matrix on the built-in engine, write reports/
#   make test     run the project's test suite
# Both create .venv (Python 3.11+) on first use and install the project into it.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pytest-mla-installed
JOBS   ?= 2
# make test: a third worker. Its engine tests spend about a third of their time waiting on engine
# subprocesses (and those on their platform children); with -n 2 a 2-core machine kept 1.3 cores
# busy (21.3 min), with -n 3 and work stealing 1.97 (14.2 min, the same CPU time).
TEST_JOBS ?= 3

# torch==2.13.0 is the CPU wheel on this machine's disk: an unpinned torch
# would pull a multi-GB CUDA build.
PINS := torch==2.13.0 triton==3.9.0 numpy pytest==9.2.0 pytest-xdist==3.8.0 tabulate packaging setuptools wheel

.PHONY: matrix test conformance bench clean help

help:
	@echo "make matrix       run matrix/reference.toml on the built-in engine, write reports/"
	@echo "make test         run the test suite (pytest -n $(TEST_JOBS) --dist worksteal)"
	@echo "make conformance  run the SGLang and vLLM matrices in their own venvs"
	@echo "                  (ENGINES=\"sglang==0.5.21 vllm==0.33.0\": any releases, in .venv-NAME-VERSION)"
	@echo "make bench        print benchmark numbers (plugin overhead, kernel, report)"

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check $(PINS)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps -e .
	@touch $(STAMP)

matrix: $(STAMP)
	$(BIN)/pytest --mla-matrix -p no:cacheprovider -n $(JOBS) -q

test: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider -n $(TEST_JOBS) --dist worksteal

conformance: $(STAMP)
	bash tools/conformance.sh $(foreach e,$(ENGINES),--engine $(e))

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/kernel.py
	$(BIN)/python benchmarks/report.py

clean:
	rm -rf $(VENV) build *.egg-info
