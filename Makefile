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

.PHONY: run test install sysdeps criu k8s lint typecheck bench bench-snapshot mutation demo clean lab labtest clean-demo

# the JupyterLab extension is built here (`make lab`), so the editable install skips
# hatch-jupyter-builder's build hook (SKIP_JUPYTER_BUILDER)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	SKIP_JUPYTER_BUILDER=1 $(BIN)/pip install -q -e '.[test,postgres,hub,snapshot,kubernetes,slurm]'
	touch $(STAMP)

install: $(STAMP) lab

## lab: the JupyterLab extension (labextension/ -> jupyter_gpubudget/labextension, prebuilt),
## rebuilt only when its sources change (hash in labextension/.build-stamp), linked into the
## venv's JupyterLab (`jupyter-builder develop`, formerly `jupyter labextension develop`);
## node modules from the lockfile (npm ci)
LAB := labextension
LABOUT := jupyter_gpubudget/labextension
LABSRC = $(sort $(wildcard $(LAB)/src/*.ts $(LAB)/src/*.tsx $(LAB)/style/* $(LAB)/schema/*)) \
	$(LAB)/package.json $(LAB)/package-lock.json $(LAB)/tsconfig.json
NODEMODS := $(LAB)/node_modules/.package-lock.json
LABLINK := $(VENV)/share/jupyter/labextensions/jupyter-gpubudget

$(NODEMODS): $(LAB)/package.json $(LAB)/package-lock.json
	@command -v npm >/dev/null || { echo "npm (Node.js >= 20.19) is needed to build $(LAB)/" >&2; exit 1; }
	cd $(LAB) && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODEMODS)

lab: $(STAMP) $(NODEMODS)
	@h=$$(sha256sum $(LABSRC) | sha256sum | cut -c1-16); \
	if [ "$$(cat $(LAB)/.build-stamp 2>/dev/null)" = "$$h" ] && [ -f $(LABOUT)/package.json ]; then \
	  echo "lab extension unchanged ($$h): reusing $(LABOUT)"; \
	else \
	  (cd $(LAB) && npm run --silent build:prod) && echo $$h > $(LAB)/.build-stamp; \
	fi
	@[ "$$(readlink $(LABLINK))" = "$(CURDIR)/$(LABOUT)" ] || \
	  { $(BIN)/jupyter-builder develop --overwrite . || \
	    $(BIN)/jupyter labextension develop --overwrite . ; } >/dev/null

## labtest: unit tests of the extension's TypeScript (vitest)
labtest: $(NODEMODS)
	cd $(LAB) && npm test --silent

APT := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900
SLURM_PARTS := /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmdbd /usr/sbin/munged \
	/usr/sbin/mariadbd /usr/bin/sudo /usr/bin/python3

## system parts the suites use: PostgreSQL server binaries, Chromium, configurable-http-proxy,
## a Slurm cluster on localhost (slurmctld, slurmd, slurmdbd, munge, MariaDB, sudo; the
## tests start and stop every daemon themselves), Prometheus and promtool (the Grafana
## dashboard's test)
$(SYSSTAMP): Makefile | $(STAMP)
	@command -v initdb >/dev/null || { apt-get update -qq && apt-get install -y -qq postgresql; }
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; }
	@command -v zsh >/dev/null || { apt-get update -qq && apt-get install -y -qq zsh; }  # terminals
	@for f in $(SLURM_PARTS); do test -e $$f || missing=1; done; \
	  if [ -n "$$missing" ]; then $(APT) update -qq && $(APT) install -y -qq slurm-wlm \
	    slurmdbd munge mariadb-server sudo python3-venv; fi
	@{ command -v prometheus && command -v promtool; } >/dev/null || \
	  { $(APT) update -qq && $(APT) install -y -qq --no-install-recommends prometheus; }
	@command -v configurable-http-proxy >/dev/null || npm install -g --silent configurable-http-proxy
	touch $(SYSSTAMP)

sysdeps: $(SYSSTAMP)

## CRIU >= 4.1 for the snapshot suites: found, or built once from Debian trixie's source into
## ~/.cache/jupyter-gpubudget (reused while .ci/build-criu.sh and its patches are unchanged)
criu:
	@bash .ci/build-criu.sh >/dev/null

## k8s: the Kubernetes control plane of the Kubernetes tests (kube-apiserver, kube-scheduler,
## kube-controller-manager, etcd, kwok) built from Go modules once into
## ~/.cache/jupyter-gpubudget/k8s-<hash>/bin (reused while .ci/k8s-versions.env, .ci/k8s/ and
## .ci/build-k8s.sh are unchanged; a cold build took 20 min on the loaded 2-core machine)
k8s:
	@bash .ci/build-k8s.sh >/dev/null

## run: install and run the main job: the embedded demo hub (local processes, SQLite,
## declared demo inventory, the gpubudget service managed by the hub)
run: install sysdeps
	$(BIN)/gpubudget hub

## clean-demo: remove what `make run` made on this machine as root: the demo users' accounts
## (demo-<user>) and this checkout's homes of them (/home/gpubudget-demo-<hash of the
## checkout's path>), the service's account (gpubudget), the users' group (gpubudget-users)
## and a sudoers drop-in (/etc/sudoers.d/gpubudget-*) a killed hub left; stop the hub first
clean-demo:
	$(BIN)/python -m jupyter_gpubudget.hub.demo_setup clean --dir .gpubudget-hub

## test: install everything the tests need and run every suite, in two lanes side by side
## (each lane starts its own hub, PostgreSQL and other daemons on free ports, each lane from
## its half of the ports below the ephemeral range: tests/fixtures/ports.py): the browser
## and hub suites with the security attacks (LANE_A), and every other suite (tests/ less
## LANE_A, so a new suite lands there); balanced by the seconds per suite each run prints
## (.ci/suite_times.py: fresh clone 2026-12-03, A 789 s and B 1424 s before tests/security,
## 297 s, moved to A). A lane's output is printed whole once both have ended; `make test` fails
## when either does. PYTEST_ARGS passes arguments to both.
LANE_A := tests/e2e tests/serverext tests/hub tests/binder tests/security
LANELOG := $(VENV)/lanes
test: install sysdeps criu k8s labtest
	$(BIN)/ruff check jupyter_gpubudget tests bench
	$(BIN)/mypy
	@mkdir -p $(LANELOG); criu="$$(bash .ci/build-criu.sh)"; t0=$$(date +%s); \
	export GPUBUDGET_K8S="$$(bash .ci/build-k8s.sh 2>/dev/null)"; \
	GPUBUDGET_CRIU="$$criu" GPUBUDGET_TEST_LANE=a $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) \
	  --junitxml=$(LANELOG)/a.xml $(LANE_A) > $(LANELOG)/a.log 2>&1 & a=$$!; \
	GPUBUDGET_CRIU="$$criu" GPUBUDGET_TEST_LANE=b $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) \
	  --junitxml=$(LANELOG)/b.xml tests $(addprefix --ignore=,$(LANE_A)) > $(LANELOG)/b.log 2>&1; \
	  rb=$$?; \
	wait $$a; ra=$$?; \
	echo "== lane A ($(LANE_A)): exit $$ra"; cat $(LANELOG)/a.log; \
	echo "== lane B (every other suite): exit $$rb"; cat $(LANELOG)/b.log; \
	echo "== both lanes: $$(( $$(date +%s) - t0 )) s"; \
	$(BIN)/python .ci/suite_times.py $(LANELOG)/a.xml $(LANELOG)/b.xml; \
	n() { tail -n 3 $(LANELOG)/[ab].log | grep -oE "[0-9]+ $$1" | awk '{s+=$$1} END {print s+0}'; }; \
	echo "pytest: $$(n passed) passed, $$(( $$(n failed) + $$(n error) )) failed, $$(n skipped) skipped"; \
	[ $$ra = 0 ] && [ $$rb = 0 ]

lint: install
	$(BIN)/ruff check jupyter_gpubudget tests bench

bench: install
	$(BIN)/python bench/cycle.py

## bench-snapshot: CRIU and namespace snapshots of 1 GiB and 4 GiB kernels against dill
bench-snapshot: install criu
	GPUBUDGET_CRIU="$$(bash .ci/build-criu.sh)" $(BIN)/python bench/snapshot.py

## mutation: the scheduling core's mutation score (docs/core.md, "Testing the core"): mutmut
## over jupyter_gpubudget/core/ with tests/core as the runner; not part of `make test` (a full
## run takes tens of minutes on 2 cores). Results are kept in mutants/ while tests/core and the
## configuration stay the same: `bench/mutation.py --reuse` reports them again.
mutation: $(STAMP)
	SKIP_JUPYTER_BUILDER=1 $(BIN)/pip install -q -e '.[mutation]'
	$(BIN)/python bench/mutation.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache mutants
	rm -rf $(LAB)/node_modules $(LAB)/lib $(LAB)/tsconfig.tsbuildinfo $(LAB)/.build-stamp $(LABOUT)
