# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install lint typecheck bench demo clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,postgres]'
	touch $(STAMP)

install: $(STAMP)

## run: install and run the main job (scheduling demo on a declared inventory until the hub lands)
run: install
	$(BIN)/gpubudget demo

## test: install everything the tests need and run every suite
test: install
	$(BIN)/ruff check jupyter_gpubudget tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check jupyter_gpubudget tests bench

bench: install
	$(BIN)/python bench/cycle.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
