"""Random faults against three service replicas on one real PostgreSQL ledger, the real local
launcher running the jobs: the charges stay exact (tests/fixtures/faults.py says which faults,
which checks, and the one fake — the pause between a start's commit and its launch)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.faults import FaultRun, install_hook, local_engine, seed_of_run, started
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.fixtures.replicas import TOKENS, Cluster

#: lattice is backed (bob's); scratch has no grant (dave's): its work is preempted first
BUDGETS = """\
admins: [root]
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 100, members: [bob]}
  scratch: {grant: 0, members: [dave]}
"""


@pytest.fixture
def faults(postgres_server, tmp_path, monkeypatch):  # noqa: F811
    install_hook(tmp_path / "hook", monkeypatch)
    url = postgres_server.new_database()
    cluster = Cluster(tmp_path, postgres_server.port, url.rsplit("/", 1)[1], n=3,
                      lease_seconds=3.0, budgets=BUDGETS)
    run = FaultRun(cluster, url, local_engine(tmp_path / "jobs"), tmp_path / "hook",
                   seed_of_run(), backed=(TOKENS["bob"][0], "lattice"),
                   unbacked=(TOKENS["dave"][0], "scratch"), gpus=4, gang_max=3)
    print(f"random faults on the local launcher: seed {run.seed}", flush=True)
    with started(cluster, run):
        yield run


def test_random_faults_keep_charges_exact_on_the_local_launcher(faults):
    faults.go()
    faults.settle()
    print(json.dumps(faults.audit()))
