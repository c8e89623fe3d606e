"""Random faults against three service replicas on one real PostgreSQL ledger that drive the
real test Slurm cluster (sbatch, squeue, sacct, scancel): the charges stay exact against
Slurm's own accounting (tests/fixtures/faults.py says which faults, which checks, and the one
fake — the pause between a start's commit and its launch)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.faults import FaultRun, install_hook, seed_of_run, slurm_engine, started
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.fixtures.replicas import INVENTORY, Cluster, Proxy, Replica
from tests.slurm.conftest import BUDGETS

TOKEN = "ben-faults-0123456789abcdef"  # gpb-ben: astro (backed) and scratch (no grant)
CONFIG = """\
c.GpuBudgetService.backend_class = "jupyter_gpubudget.backends.slurm.SlurmBackend"
c.SlurmBackend.user_command_prefix = ["sudo", "-n", "-u", "{user}",
                                      "--preserve-env=SLURM_CONF", "--"]
c.SlurmBackend.gpu_models = {"h100": "H100-80GB"}
c.SlurmBackend.watch_interval = 0.5
c.SlurmBackend.stop_grace = 5
c.SlurmBackend.start_grace = 8
c.SlurmBackend.usage_check_interval = 0
"""


class SlurmFaultCluster(Cluster):
    """Three replicas whose backend is the test Slurm cluster (SLURM_CONF)."""

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "budgets.yaml").write_text(BUDGETS)
        (self.dir / "inventory.yaml").write_text(INVENTORY)
        (self.dir / "slurm_config.py").write_text(CONFIG)
        tok = self.dir / "tokens.json"
        tok.write_text(json.dumps({TOKEN: {"name": "gpb-ben",
                                           "scopes": ["custom:gpubudget:submit"]}}))
        tok.chmod(0o600)
        for i in range(self.n):
            proxy = Proxy(self.pg_port)
            url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{self.db_name}"
            r = Replica(chr(ord("a") + i), self.dir, url, proxy, lease_seconds=self.lease_seconds,
                        extra_args=[f"--config={self.dir / 'slurm_config.py'}"])
            self.replicas.append(r)
            r.start()


@pytest.fixture
def faults(slurm_accounts, postgres_server, tmp_path_factory, monkeypatch):  # noqa: F811
    base = tmp_path_factory.mktemp("faults")
    base.chmod(0o755)  # (the jobs' users reach their working directories below)
    install_hook(base / "hook", monkeypatch)
    url = postgres_server.new_database()
    cluster = SlurmFaultCluster(base / "replicas", postgres_server.port, url.rsplit("/", 1)[1],
                                n=3, lease_seconds=3.0)
    run = FaultRun(cluster, url, slurm_engine(slurm_accounts.env), base / "hook", seed_of_run(),
                   backed=(TOKEN, "astro"), unbacked=(TOKEN, "scratch"), gpus=4, gang_max=2)
    print(f"random faults on Slurm: seed {run.seed}", flush=True)
    with started(cluster, run):
        yield run


def test_random_faults_keep_charges_exact_on_slurm(faults):
    faults.go()
    faults.settle()
    print(json.dumps(faults.audit()))
