"""A preemption never charges the freed GPU twice: the service's scheduling loop (ledger on
SQLite, the pure core deciding, the real local launcher running the jobs as their users)
preempts an unbacked job that ignores SIGTERM — it ends only at the SIGKILL after the stop
grace — for a backed one on the same GPU. The successor's charge opens when the victim's
closes, not at the cycle's start; and the ledger refuses, through the loop, a Start on a GPU
whose interval is still open."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.backends.local import LocalBackend
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.core.model import Placement, SliceAlloc, Start
from jupyter_gpubudget.ledger import Ledger, LedgerError, connect, upgrade
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.fixtures.smallcluster import ONE_GPU_NODE as INVENTORY
from tests.fixtures.smallcluster import TWO_PROJECTS as BUDGETS
from tests.fixtures.unixusers import TEMPLATE, ensure_accounts


@pytest.fixture
def setup(tmp_path):  # noqa: ANN201
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade(url)
    ledger = Ledger(connect(url))
    budgets = load_budgets(BUDGETS, "budgets.yaml")
    ledger.sync_budgets(budgets, time.time(), "budgets.yaml")
    as_user = {"unix_user_template": TEMPLATE} if ensure_accounts(["alice", "bob"]) else {}
    backend = LocalBackend(state_dir=str(tmp_path / "jobs"), stop_grace=2, **as_user)
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, load_inventory(INVENTORY),
                          lambda: budgets.policy, backend)
    try:
        yield ledger, loop
    finally:
        for wid, attempt in backend.orphans(set()):
            backend.stop(wid, attempt)
        ledger.dispose()


def submit(ledger: Ledger, project: str, user: str, script: str) -> str:
    return ledger.submit(project=project, user=user, kind="batch", now=time.time(),
                         request={"kind": "gpu", "gpus": 1},
                         command=["/bin/sh", "-c", script], backend="local",
                         resumable=True).id


@pytest.mark.parametrize("successor_kind", ["job", "session"])
def test_a_preempted_jobs_successor_is_charged_from_when_the_gpu_was_freed(setup,
                                                                          successor_kind):
    ledger, loop = setup
    # bob's project has no grant: unbacked, preempted first; it ignores SIGTERM
    victim = submit(ledger, "scratch", "bob", "trap '' TERM; sleep 60 & wait; sleep 60")
    loop.cycle()
    assert ledger.get(victim).state == "running"
    if successor_kind == "job":
        successor = submit(ledger, "lattice", "alice", "exec sleep 60")
    else:  # a notebook session: the hub starts its server once the ledger says it runs
        successor = ledger.submit(project="lattice", user="alice", kind="interactive",
                                  now=time.time(), request={"kind": "gpu", "gpus": 1},
                                  backend="hub").id
    decisions = loop.cycle()  # preempts bob (SIGTERM, 2 s grace, SIGKILL), starts alice
    assert {type(d).__name__ for d in decisions} >= {"Preempt", "Start"}
    assert ledger.get(successor).state == "running"
    (v,) = ledger.charges(workload=victim)
    (s,) = ledger.charges(workload=successor)
    assert v.end is not None and v.closed_by == "preempt"
    assert s.start >= v.end, (f"GPU n1/0 charged twice from {s.start:.3f} to {v.end:.3f} "
                              f"({v.end - s.start:.2f} s)")
    assert ledger.get(successor).started_at == s.start


def test_the_loop_cannot_open_a_second_interval_on_a_held_gpu(setup):
    ledger, loop = setup
    holder = submit(ledger, "lattice", "alice", "exec sleep 60")
    loop.cycle()
    assert ledger.get(holder).state == "running"
    other = submit(ledger, "scratch", "bob", "exec sleep 60")
    row = ledger.get(other)
    start = Start(other, Placement((SliceAlloc("n1", 0, "gpu", 1000),)), False, None)
    with pytest.raises(LedgerError, match="GPU 0 of node n1 is held by workload " + holder):
        loop._apply(start, {other: row}, time.time())
    assert ledger.get(other).state == "pending" and ledger.charges(workload=other) == []
