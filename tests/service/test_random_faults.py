"""Random faults against three service replicas on one real PostgreSQL ledger, the real local
launcher running the jobs: the charges stay exact (tests/fixtures/faults.py says which faults,
which checks, and the one fake — the pause between a start's commit and its launch)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.faults import FaultRun, install_hook, local_engine, seed_of_run
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.fixtures.replicas import INVENTORY, TOKENS, Cluster, Proxy, Replica

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


class FaultCluster(Cluster):
    """Three replicas with the budgets above (one unbacked project)."""

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "budgets.yaml").write_text(BUDGETS)
        (self.dir / "inventory.yaml").write_text(INVENTORY)
        tok = self.dir / "tokens.json"
        tok.write_text(json.dumps({t: {"name": u, "scopes": s} for u, (t, s) in TOKENS.items()}))
        tok.chmod(0o600)
        for i in range(self.n):
            proxy = Proxy(self.pg_port)
            url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{self.db_name}"
            r = Replica(chr(ord("a") + i), self.dir, url, proxy, lease_seconds=self.lease_seconds)
            self.replicas.append(r)
            r.start()


@pytest.fixture
def faults(postgres_server, tmp_path, monkeypatch):  # noqa: F811
    install_hook(tmp_path / "hook", monkeypatch)
    url = postgres_server.new_database()
    cluster = FaultCluster(tmp_path, postgres_server.port, url.rsplit("/", 1)[1], n=3,
                           lease_seconds=3.0)
    run = FaultRun(cluster, url, local_engine(tmp_path / "jobs"), tmp_path / "hook",
                   seed_of_run(), backed=(TOKENS["bob"][0], "lattice"),
                   unbacked=(TOKENS["dave"][0], "scratch"), gpus=4, gang_max=3)
    print(f"random faults on the local launcher: seed {run.seed}", flush=True)
    try:
        cluster.start()
        yield run
    finally:
        for r in cluster.replicas:
            if r.alive:
                r.resume()
        cluster.stop()
        run.engine.stop_all(run.wids)


def test_random_faults_keep_charges_exact_on_the_local_launcher(faults):
    faults.go()
    faults.settle()
    print(json.dumps(faults.audit()))
