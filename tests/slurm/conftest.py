"""The Slurm suite's session fixtures: one real Slurm cluster for the whole test session
(munge, MariaDB, slurmdbd, slurmctld, two ``slurmd -N`` fake GPU nodes), and the Unix users
the jobs run as. Missing parts skip the suite, except under CI=true where that fails."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.hub.hubproc import require
from tests.slurm.cluster import missing_parts, start_cluster

#: Unix users the tests' jobs and notebooks run as (created when missing, like the
#: PostgreSQL fixture's server user)
USERS = ("gpb-ana", "gpb-ben")


def ensure_users() -> None:
    for u in USERS:
        try:
            pwd.getpwnam(u)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", u], check=True,
                           capture_output=True)


def require_slurm() -> None:
    missing = missing_parts()
    require(not missing, "Slurm/munge/MariaDB/sudo (" + ", ".join(missing) + "; `make test` "
            "installs them)")
    require(os.geteuid() == 0, "root (the test cluster's daemons and jobs of other users)")


@pytest.fixture(scope="session")
def slurm_cluster():
    require_slurm()
    ensure_users()
    # not under pytest's private (0700) tmp: mysql and the users' jobs must reach it
    base = Path(tempfile.mkdtemp(prefix="gpubudget-slurm-"))
    try:
        cluster = start_cluster(base)
    except Exception as e:  # noqa: BLE001 - a cluster that does not start is a failure
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(f"the test Slurm cluster did not start: {e}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


BUDGETS = """\
admins: [root]
policy:
  min_runtime_cap: {interactive: 8h, batch: 2d, debug: 1h}
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 60, members: [gpb-ana]}
      astro: {grant: 40, members: [gpb-ben]}
  scratch: {grant: 0, members: [gpb-ben]}
"""


@pytest.fixture(scope="session")
def slurm_env(slurm_cluster):
    """This process's Slurm commands (the backend's, the tests') talk to the test cluster."""
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(slurm_cluster.conf)
    yield slurm_cluster
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


@pytest.fixture(scope="session")
def slurm_accounts(slurm_env):
    """The cluster with the suite's budgets tree mirrored into slurmdbd by the real admin
    command, `gpubudget slurm sync-accounts`."""
    d = slurm_env.dir
    (d / "budgets.yaml").write_text(BUDGETS)
    p = subprocess.run([sys.executable, "-m", "jupyter_gpubudget.cli", "slurm", "sync-accounts",
                        f"--budgets={d / 'budgets.yaml'}"], capture_output=True, text=True,
                       env=slurm_env.env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    slurm_env.budgets = d / "budgets.yaml"
    slurm_env.sync_output = p.stdout
    return slurm_env
