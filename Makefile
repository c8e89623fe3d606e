# Two commands do all set-up on a fresh machine: `make run` and `make test`.
# a Python other Unix accounts can run too (as root, the demo runs the service and each user's
# server as their own accounts, from this venv): the system's python3 when it is 3.11+ with
# venv, else the first python3 on PATH
PY ?= $(shell for p in /usr/bin/python3 /usr/local/bin/python3; do "$$p" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo "$$p"; exit 0; }; done; echo python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSSTAMP := $(VENV)/.sysdeps
export PATH := $(CURDIR)/$(BIN):/usr/lib/postgresql/15/bin:$(PATH)

.PHONY: run test install sysdeps lint typecheck bench demo clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,postgres,hub]'
	touch $(STAMP)

install: $(STAMP)

## system parts the suites use: PostgreSQL server binaries, Chromium, configurable-http-proxy,
## sudo (the demo's service runs the job launcher through it)
$(SYSSTAMP): | $(STAMP)
	@command -v sudo >/dev/null || { apt-get update -qq && apt-get install -y -qq sudo; }
	@command -v initdb >/dev/null || { apt-get update -qq && apt-get install -y -qq postgresql; }
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
	@command -v configurable-http-proxy >/dev/null || npm install -g --silent configurable-http-proxy
	touch $(SYSSTAMP)

sysdeps: $(SYSSTAMP)

## run: install and run the main job: the embedded demo hub (local processes, SQLite,
## declared demo inventory, the gpubudget service managed by the hub)
run: install sysdeps
	$(BIN)/gpubudget hub

## test: install everything the tests need and run every suite
test: install sysdeps
	$(BIN)/ruff check jupyter_gpubudget tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check jupyter_gpubudget tests bench

bench: install
	$(BIN)/python bench/cycle.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
