# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSSTAMP := $(VENV)/.sysdeps
export PATH := $(CURDIR)/$(BIN):/usr/lib/postgresql/15/bin:$(PATH)

.PHONY: run test install sysdeps lint typecheck bench demo clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,postgres,hub,slurm]'
	touch $(STAMP)

install: $(STAMP)

APT := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900
SLURM_PARTS := /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmdbd /usr/sbin/munged \
	/usr/sbin/mariadbd /usr/bin/sudo /usr/bin/python3

## system parts the suites use: PostgreSQL server binaries, Chromium, configurable-http-proxy,
## a Slurm cluster on localhost (slurmctld, slurmd, slurmdbd, munge, MariaDB, sudo; the
## tests start and stop every daemon themselves)
$(SYSSTAMP): Makefile | $(STAMP)
	@command -v initdb >/dev/null || { apt-get update -qq && apt-get install -y -qq postgresql; }
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
	@for f in $(SLURM_PARTS); do test -e $$f || missing=1; done; \
	  if [ -n "$$missing" ]; then $(APT) update -qq && $(APT) install -y -qq slurm-wlm \
	    slurmdbd munge mariadb-server sudo python3-venv; fi
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
