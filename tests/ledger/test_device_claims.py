"""No GPU is charged twice: a charge interval claims its placement's GPUs, and the ledger
refuses (409, nothing written) an interval on a GPU another interval holds at its start —
open, or closed after that start (a victim stopped after the cycle that preempted it).
A successor opened with ``after_release`` starts when its victims' intervals closed. SQLite
and a real PostgreSQL server."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, LedgerError, connect, upgrade
from tests.fixtures.postgres import db_url, postgres_server  # noqa: F401

BUDGETS = """
admins: [root]
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 60, members: [bob]}
      astro: {grant: 40, members: [dave]}
"""

WHOLE = [{"node": "n1", "gpu": 0, "kind": "gpu", "milli": 1000}]


@pytest.fixture
def ledger(db_url):  # noqa: F811
    upgrade(db_url)
    engine = connect(db_url)
    led = Ledger(engine)
    led.sync_budgets(load_budgets(BUDGETS), now=1.0)
    yield led
    engine.dispose()


def submit(ledger: Ledger, project: str = "lattice") -> str:
    return ledger.submit(project=project, user="bob", kind="batch",
                         request={"kind": "gpu", "gpus": 1}, now=1.0).id


def start(ledger: Ledger, wid: str, placement: list[dict], now: float, **kw: object):  # noqa: ANN201
    milli = sum(s["milli"] for s in placement)
    return ledger.start(wid, placement=placement, milli=milli, backed=True,
                        protected_until=now + 60, now=now, **kw)


def test_a_second_open_interval_on_a_held_gpu_is_refused_and_writes_nothing(ledger):
    a, b = submit(ledger), submit(ledger, "astro")
    start(ledger, a, WHOLE, 10.0)
    for kw in ({}, {"after_release": True}):  # an open interval: refused either way
        with pytest.raises(LedgerError) as e:
            start(ledger, b, WHOLE, 20.0, **kw)
        assert e.value.status == 409 and e.value.field == "placement"
        assert "GPU 0 of node n1" in e.value.message and a in e.value.message
        assert ledger.get(b).state == "pending" and ledger.charges(workload=b) == []
    # another GPU of the node is free
    start(ledger, b, [{"node": "n1", "gpu": 1, "kind": "gpu", "milli": 1000}], 20.0)
    assert ledger.get(b).state == "running"


def test_an_interval_closed_after_the_successors_start_is_never_overlapped(ledger):
    """The preemption: the victim's interval closes when it really ended (after SIGTERM and
    the stop grace), later than the cycle's ``now`` at which its successor was decided."""
    victim, successor = submit(ledger), submit(ledger, "astro")
    start(ledger, victim, WHOLE, 10.0)
    ledger.stop(victim, now=31.5, state="pending", closed_by="preempt")  # stopped at 31.5
    with pytest.raises(LedgerError, match="until 31.500"):  # written as decided: refused
        start(ledger, successor, WHOLE, 30.0)
    charge = start(ledger, successor, WHOLE, 30.0, after_release=True)
    assert charge.start == 31.5  # when the GPU was really freed
    row = ledger.get(successor)
    assert row.started_at == 31.5 and row.protected_until == 31.5 + 60
    (v,) = [c for c in ledger.charges(workload=victim)]
    assert v.end <= charge.start
    # the victim's claim closed with its interval, the successor's is open
    from jupyter_gpubudget.ledger.models import DeviceClaimRow

    with ledger.ro() as s:
        claims = {c.workload: (c.start, c.end) for c in s.scalars(select(DeviceClaimRow))}
    assert claims == {victim: (10.0, 31.5), successor: (31.5, None)}


def test_mps_shares_and_mig_instances_fit_up_to_the_gpus_size(ledger):
    ws = [submit(ledger) for _ in range(4)]
    share = [{"node": "n1", "gpu": 0, "kind": "mps", "milli": 500}]
    start(ledger, ws[0], share, 10.0)
    start(ledger, ws[1], share, 10.0)  # two halves: the GPU is full
    with pytest.raises(LedgerError, match="GPU 0 of node n1"):
        start(ledger, ws[2], share, 10.0)
    mig = [{"node": "n1", "gpu": 1, "kind": "mig", "milli": 142, "mig_start": 0}]
    start(ledger, ws[2], mig, 10.0)
    with pytest.raises(LedgerError, match="GPU 1 of node n1"):  # the same instance
        start(ledger, ws[3], mig, 10.0)
    start(ledger, ws[3], [dict(mig[0], mig_start=1)], 10.0)  # the next one is free
    assert all(ledger.get(w).state == "running" for w in ws)
