"""A checkpointed batch job through the service's scheduling loop (ledger on SQLite, the pure
core deciding, the real privileged launcher and the real CRIU, as root, jobs running as test
accounts): bob's resumable job (``checkpoint: auto``) holds the only GPU unbacked; alice's
backed job needs it. The loop preempts bob's job — its process tree is dumped — runs alice's,
and when hers ends restores bob's, which counts on from where it stopped.

The charges are exact across the preemption: one interval per run, none overlapping on the
GPU, and nothing charged for the time bob's job waited in the queue. A job that cannot be
dumped (a process that left its tree) falls back to the signal and a fresh start, and the
preemption's decision record — and the notice in words — say why."""

from __future__ import annotations

import json
import os
import time

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.delivery import notice_of
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.fixtures.smallcluster import ONE_GPU_NODE as INVENTORY
from tests.fixtures.smallcluster import TWO_PROJECTS as BUDGETS
from tests.fixtures.unixusers import ensure_accounts, shared_tmp

from .test_job_checkpoint import COUNTER, _backend, counts, nodes, wait_for  # noqa: F401

GPU = {"kind": "gpu", "gpus": 1}


@pytest.fixture
def loop(nodes):  # noqa: F811
    ensure_accounts(["alice", "bob"])
    base = shared_tmp("gpubudget-ckpt-charges-")
    url = f"sqlite:///{base / 'ledger.sqlite'}"
    upgrade(url)
    ledger = Ledger(connect(url))
    budgets = load_budgets(BUDGETS, "budgets.yaml")
    ledger.sync_budgets(budgets, time.time(), "budgets.yaml")
    backend = _backend(base / "jobs", base / "store")
    lp = SchedulingLoop(ledger, lambda: budgets.accounts, load_inventory(INVENTORY),
                        lambda: budgets.policy, backend)
    try:
        yield ledger, lp, backend, base
    finally:
        for wid, attempt in backend.orphans(set()):
            backend.stop(wid, attempt)
        ledger.dispose()


def cycle_until(lp, cond, what: str, timeout: float = 60.0):  # noqa: ANN001, ANN201
    end = time.monotonic() + timeout
    while True:
        lp.cycle()
        v = cond()
        if v:
            return v
        assert time.monotonic() < end, f"timed out: {what}"
        time.sleep(0.2)


def test_a_checkpointed_jobs_charges_are_exact_across_its_preemption(loop):
    ledger, lp, backend, base = loop
    bob = ledger.submit(project="scratch", user="bob", kind="batch", request=GPU,
                        now=time.time(), command=["/usr/bin/python3", "-c", COUNTER],
                        resumable=True).id
    lp.cycle()
    assert ledger.get(bob).state == "running" and not ledger.get(bob).backed
    log1 = base / "jobs" / bob / "1" / "output.log"
    wait_for(lambda: len(counts(log1)) > 10)
    alice = ledger.submit(project="lattice", user="alice", kind="batch", request=GPU,
                          now=time.time(), command=["/bin/sh", "-c", "sleep 2"]).id
    lp.cycle()  # preempts bob's job (its tree dumped), starts alice's
    assert ledger.get(bob).state == "pending" and ledger.get(alice).state == "running"
    (pre,) = ledger.decisions(kind="preempt", workloads=[bob])
    assert "checkpoint_fallback" not in pre.detail
    # the record names the checkpoint, and the notice says the job resumes where it stopped
    (snap,) = backend._checkpoints.store.list(session=f"job-{bob}")
    assert pre.detail["checkpoint"] == snap.id
    n = notice_of(ledger, pre, ledger.get(bob))
    assert ("Its processes were checkpointed just before it stopped (everything they held "
            "in memory was saved): it resumes where it stopped, not from its command.") \
        in n.body, n.body
    assert "Nothing of a batch job's memory is saved" not in n.body
    assert n.details["checkpoint"] == snap.id and snap.id not in n.body + n.title
    last = counts(log1)[-1]
    # alice's job ends; bob's is restored and counts on
    cycle_until(lp, lambda: ledger.get(bob).state == "running", "bob's job back")
    log2 = base / "jobs" / bob / "2" / "output.log"
    wait_for(lambda: len(counts(log2)) > 5)
    assert counts(log2)[0] == last + 1  # not from 0
    time.sleep(1)
    lp.cycle()
    b1, b2 = ledger.charges(workload=bob)
    (a1,) = ledger.charges(workload=alice)
    assert ledger.get(alice).state == "done"
    # one interval per run, in order on the one GPU, none overlapping
    assert b1.end is not None and a1.end is not None and b2.end is None
    assert b1.start < b1.end <= a1.start < a1.end <= b2.start
    # each run charged from its own start to its own end: the first to when its tree was
    # ended after the dump, the second from the restored job's start — the wait between
    # them is in no interval
    exit1 = json.loads((base / "jobs" / bob / "1" / "exit").read_text())
    assert exit1["checkpointed"] is True and b1.end == pytest.approx(exit1["ended_at"])
    started = backend.started(bob, 2)
    assert started is not None and b2.start == pytest.approx(started[1], abs=0.01)
    assert len(ledger.charges(workload=bob)) == 2

def test_a_job_that_cannot_be_dumped_falls_back_and_the_record_says_why(loop):
    ledger, lp, backend, base = loop
    bob = ledger.submit(project="scratch", user="bob", kind="batch", request=GPU,
                        now=time.time(), resumable=True,
                        command=["/bin/sh", "-c", "(setsid sleep 300 &); echo started; "
                                 "sleep 300"]).id
    lp.cycle()
    log1 = base / "jobs" / bob / "1" / "output.log"
    wait_for(lambda: "started" in log1.read_text())
    time.sleep(0.3)
    ledger.submit(project="lattice", user="alice", kind="batch", request=GPU,
                  now=time.time(), command=["/bin/sh", "-c", "sleep 30"])
    lp.cycle()
    (pre,) = ledger.decisions(kind="preempt", workloads=[bob])
    why = pre.detail["checkpoint_fallback"]
    assert "left the job's process tree" in why, why
    n = notice_of(ledger, pre, ledger.get(bob))
    assert "could not be checkpointed" in n.body and "left the job's process tree" in n.body
    assert "starts again from its command" in n.body
    assert os.path.exists(log1) and "could not be checkpointed" in log1.read_text()
