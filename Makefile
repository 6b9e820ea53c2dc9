# Two entry points on a fresh machine: `make demo` and `make test`.
# The venv gets the pinned CPU torch first so pip never resolves an unpinned (CUDA) torch.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint bench-cpu bench-hook clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/jit_demo.py

test: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m pytest -q

# Every test, the `heavy` real workloads included (about 2 minutes more than `make test` on 2 cores).
test-all: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples
	AITUNE_TEST_HEAVY=1 $(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples

# Benchmarks write their results to benchmarks/results/local/ (ignored by git); pass --out to choose a file.
bench-cpu: $(STAMP)
	$(PY) -m benchmarks.suite.cpu_suite

bench-hook: $(STAMP)
	$(PY) -m benchmarks.probes.hook_overhead

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
