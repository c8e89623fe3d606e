"""A job launched late by a leader that then dies is charged, by the replica that adopts it,
from when the local launcher started it (its ``pid`` record), not from when the old leader
committed its start — two service replicas (their leases, ledgers, local backends and
scheduling loops) on one real PostgreSQL ledger, the real launcher running the job as its
user.

The faults are the one fake, as in tests/slurm/test_fenced_launch: the old leader's commit
(``ledger.start``) is held 2 s before it launches (a pause within its lease), and it dies right
after the launcher started the job, before recording the launch (``_launched`` raises) — a
real process cannot be stopped at those exact moments.
"""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import text

from jupyter_gpubudget.backends.local import LocalBackend
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.leader import Lease
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.fixtures.unixusers import TEMPLATE, ensure_accounts
from tests.service.test_charge_order import BUDGETS, INVENTORY


class Crash(BaseException):
    """The service process dies here (nothing after it runs)."""


class Replica:
    def __init__(self, url: str, name: str, jobs: str) -> None:
        self.engine = connect(url)
        self.lease = Lease(self.engine, f"http://{name}/", ttl=8.0, renew_interval=2.0,
                           holder=name)
        self.ledger = Ledger(self.engine)
        self.ledger.fence = self.lease.check
        self.budgets = load_budgets(BUDGETS, "budgets.yaml")
        as_user = {"unix_user_template": TEMPLATE} if ensure_accounts(["alice", "bob"]) else {}
        self.backend = LocalBackend(state_dir=jobs, stop_grace=2, **as_user)
        self.loop = SchedulingLoop(self.ledger, lambda: self.budgets.accounts,
                                   load_inventory(INVENTORY), lambda: self.budgets.policy,
                                   self.backend)

    def lead(self) -> None:
        assert self.lease.tick() is not None
        self.ledger.others_wrote()
        self.ledger.sync_budgets(self.budgets, time.time())
        self.loop.reconcile()

    def cycle(self) -> None:
        assert self.lease.tick() is not None
        self.loop.cycle()


@pytest.fixture
def replicas(postgres_server, tmp_path):  # noqa: F811
    url = postgres_server.new_database()
    upgrade(url)
    jobs = str(tmp_path / "jobs")
    a, b = Replica(url, "a", jobs), Replica(url, "b", jobs)
    yield a, b
    for wid, attempt in b.backend.orphans(set()):  # (what the test left running)
        b.backend.stop(wid, attempt)
    for r in (a, b):
        r.engine.dispose()


def test_a_late_launch_adopted_by_the_next_leader_is_charged_from_the_launchers_start(
        replicas, tmp_path):
    a, b = replicas
    a.lead()
    wid = a.ledger.submit(project="lattice", user="alice", kind="batch", now=time.time(),
                          request={"kind": "gpu", "gpus": 1},
                          command=["/bin/sh", "-c", "exec sleep 60"], backend="local",
                          resumable=True).id
    real_start = a.ledger.start

    def start_then_pause(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        out = real_start(*args, **kw)
        time.sleep(2.0)  # (within the 8 s lease: it still leads and launches)
        return out

    def died(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        raise Crash

    a.ledger.start = start_then_pause
    a.loop._launched = died
    with pytest.raises(Crash):
        a.loop.cycle()
    committed = a.ledger.open_interval(wid).start
    pid = json.loads((tmp_path / "jobs" / wid / "1" / "pid").read_text())
    assert pid["launched_at"] >= committed + 1.5  # the launcher started it late
    with a.engine.begin() as c:  # a is gone: its lease runs out
        c.execute(text("UPDATE service_leader SET expires_at = extract(epoch from now()) - 1"))
    b.lead()
    b.cycle()
    b.cycle()
    row, iv = b.ledger.get(wid), b.ledger.open_interval(wid)
    assert row.state == "running" and iv.seq == 1  # adopted, still running
    # charged from the launcher's start of the job, not from the commit 2 s before
    assert iv.start == pytest.approx(pid["launched_at"], abs=1e-6), (iv.start, pid, committed)
    assert row.started_at == iv.start and row.backend_ref == str(pid["pid"])
