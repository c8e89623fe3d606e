"""Ended workloads are settled a few to a ledger transaction, not one each: the service's
scheduling loop (ledger on SQLite, the pure core deciding, the real local launcher running the
jobs) starts eight short jobs, they end, and one reap settles them all in one write
transaction (counted with SQLAlchemy's session events), each charged exactly to the end the
launcher recorded, with its state from its exit code. Each settlement has a savepoint of its
own: one the ledger refuses (a workload already settled elsewhere) leaves the others."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import event

from jupyter_gpubudget.backends.local import LocalBackend
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service import loop as loop_module
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.fixtures.smallcluster import TWO_PROJECTS as BUDGETS
from tests.fixtures.unixusers import TEMPLATE, ensure_accounts

INVENTORY = """\
nodes:
  - name: n1
    model: H100-80GB
    gpus: 8
"""
N = 8


@pytest.fixture
def setup(tmp_path):  # noqa: ANN201
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade(url)
    ledger = Ledger(connect(url))
    budgets = load_budgets(BUDGETS, "budgets.yaml")
    ledger.sync_budgets(budgets, time.time(), "budgets.yaml")
    as_user = {"unix_user_template": TEMPLATE} if ensure_accounts(["alice"]) else {}
    backend = LocalBackend(state_dir=str(tmp_path / "jobs"), stop_grace=2, **as_user)
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, load_inventory(INVENTORY),
                          lambda: budgets.policy, backend)
    try:
        yield ledger, loop, backend
    finally:
        for wid, attempt in backend.orphans(set()):
            backend.stop(wid, attempt)
        ledger.dispose()


def count_write_transactions(ledger: Ledger) -> list[int]:
    """One entry per write transaction the ledger commits (savepoints released not counted)."""
    commits: list[int] = []

    def committed(s) -> None:  # noqa: ANN001
        if not s.in_nested_transaction():
            commits.append(1)

    event.listen(ledger._sessions, "after_commit", committed)
    return commits


def start_and_end(ledger: Ledger, loop: SchedulingLoop, backend: LocalBackend) -> list[str]:
    """Eight one-GPU jobs (half exit 0, half exit 3) started in one cycle, left to end."""
    ids = [ledger.submit(project="lattice", user="alice", kind="batch", now=time.time(),
                         request={"kind": "gpu", "gpus": 1},
                         command=["/bin/sh", "-c", f"exit {3 * (i % 2)}"],
                         backend="local").id for i in range(N)]
    loop.cycle()
    assert all(ledger.get(w).state == "running" for w in ids)
    seq = {w: ledger.open_interval(w).seq for w in ids}
    deadline = time.time() + 120  # generous: the machine may be loaded
    while any(backend.status(w, seq[w]).alive for w in ids):
        assert time.time() < deadline, "the jobs did not end"
        time.sleep(0.1)
    return ids


def test_one_reap_settles_its_ended_workloads_in_one_transaction_charged_exactly(setup):
    ledger, loop, backend = setup
    ids = start_and_end(ledger, loop, backend)
    ends = {w: backend.status(w, ledger.open_interval(w).seq).ended_at for w in ids}
    commits = count_write_transactions(ledger)
    assert loop._reap(time.time()) == []
    assert len(commits) == 1, f"{N} ended workloads settled in {len(commits)} transactions"
    for i, w in enumerate(ids):
        row = ledger.get(w)
        assert (row.state, row.exit_code) == (("done", 0) if i % 2 == 0 else ("failed", 3))
        (c,) = ledger.charges(workload=w)
        assert c.end == max(ends[w], c.start) and c.closed_by == "exit"
        assert row.ended_at == ends[w]


def test_batches_are_split_and_one_refused_settlement_leaves_the_others(setup, monkeypatch):
    ledger, loop, backend = setup
    monkeypatch.setattr(loop_module, "SETTLE_BATCH", 3)
    ids = start_and_end(ledger, loop, backend)
    # settled elsewhere meanwhile (an admin's cancel): the ledger refuses settling it again
    rows = {r.id: r for r in ledger.workloads(states=("running",))}
    ended = [(rows[w], backend.status(w, ledger.open_interval(w).seq)) for w in ids]
    ledger.stop(ids[0], now=time.time(), state="cancelled", closed_by="cancel")
    commits = count_write_transactions(ledger)
    loop._settle_many(ended)
    assert len(commits) == -(-N // 3)  # three to a transaction
    assert ledger.get(ids[0]).state == "cancelled"
    assert [ledger.get(w).state for w in ids[1:]] == \
        ["failed" if i % 2 else "done" for i in range(1, N)]
    assert all(c.end is not None for w in ids for c in ledger.charges(workload=w))
