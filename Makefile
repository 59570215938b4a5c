# Two commands do everything from a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test test-fast lint format bench gpu-check clean

venv: $(STAMP)

# Re-installs when setup.py changes; the package is installed editable, so
# code changes need no reinstall.
$(STAMP): setup.py pyproject.toml constraints-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]" -c constraints-dev.txt
	touch $(STAMP)

demo: venv
	rm -rf demo_data
	$(BIN)/evenshard make-images demo_data/images --num_labels 6 --per_label 50 \
	    --formats jpeg,png,gif,webp --broken
	$(BIN)/evenshard convert --input demo_data/images --output_dir demo_data/out \
	    --max_reject_fraction 0.05 --shard_multiple 2
	$(BIN)/python -m reader demo_data/out

# Test files run in one process more than the cores, at most 4 (pytest-xdist; a file's tests
# stay in one process, so its converted fixtures are made once): a test waiting on a server or a
# subprocess leaves its core to the extra one (2 cores: 10 min 59 s against 13 min 19 s with 2,
# the same CPU seconds).
TEST_PROCESSES := $(or $(shell $(PYTHON) -c "import os; cores = len(os.sched_getaffinity(0)) \
    if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1; print(min(4, cores + 1))" \
    2>/dev/null),auto)
test: venv
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist loadfile

# The unit lane (under a minute): modules tested on their own, no conversion run.
test-fast: venv
	$(BIN)/python -m pytest -q -m fast

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Runs every benchmark and rewrites benchmarks/RESULTS.md (about 20 minutes on 2 cores);
# installs TFDS, the competitor of benchmarks/tfds_bench.py, first.
bench: venv
	$(BIN)/pip install -q -e ".[bench]" -c constraints-dev.txt
	$(BIN)/python benchmarks/run_all.py

# The GPU path checked in under 5 minutes (benchmarks/gpu_check.py): DALI (nvJPEG),
# prefetch_to_device, pinned memory; every image once, the CPU route's pixels, rates
# against the CPU limit. Without a GPU it skips those routes, saying why.
gpu-check: venv
	$(BIN)/python benchmarks/gpu_check.py

clean:
	rm -rf demo_data benchmarks/_work .pytest_cache
