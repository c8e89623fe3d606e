"""Busy time from the engine's own GPU accounting for finished work (``SchedulingLoop.
_engine_busy``; Slurm: sacct's ``gres/gpuutil``, ``backends/slurm_gpu.py``): the figures go
into the ledger's busy figures for intervals nothing sampled while they ran; a sampled
interval keeps its samples (never counted twice); an engine with no figure leaves busy time
unknown, never 0.

The backend here is a stand-in for a Slurm cluster that records GPU accounting: the real
Slurm on this machine has no GPUs, so it cannot produce a ``gres/gpuutil`` figure (the real
cluster's side — no GPU accounting reads as unknown — is ``tests/slurm/test_gpu_busy.py``)."""

from __future__ import annotations

import time
from zoneinfo import ZoneInfo

import pytest

from jupyter_gpubudget.backends.base import Backend
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger.reports import Scope, report
from jupyter_gpubudget.service.loop import SchedulingLoop

BUDGETS = """\
accounts:
  lab:
    grant: 100
    children:
      optics: {grant: 50, members: [ann]}
      vision: {grant: 50, members: [ben]}
"""
INVENTORY = "nodes:\n  - {name: n1, model: H100-80GB, gpus: 2}\n"


class AccountingEngine(Backend):
    """Answers ``gpu_busy`` as a cluster with GPU accounting would: a fixed busy fraction per
    workload (None: that job's steps recorded none); remembers what it was asked."""

    name = "slurm"

    def __init__(self, busy: dict[str, float | None]) -> None:
        super().__init__()
        self.busy = busy
        self.asked: list[str] = []

    def gpu_busy(self, intervals):  # noqa: ANN001, ANN201
        self.asked += [w for w, *_ in intervals]
        return [(w, a, b, self.busy[w], "slurm") for w, _seq, a, b, _be in intervals
                if self.busy.get(w) is not None]


@pytest.fixture
def ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade(url)
    led = Ledger(connect(url))
    led.sync_budgets(load_budgets(BUDGETS), time.time())
    yield led
    led.dispose()


def job(led: Ledger, user: str, project: str, gpu: int, t0: float, hours: float,
        busy: float | None = None) -> str:
    """A finished job of ``hours`` on one GPU (``busy``: sampled so while it ran)."""
    w = led.submit(project=project, user=user, kind="batch", request={"kind": "gpu", "gpus": 1},
                   now=t0 - 10, backend="slurm")
    led.start(w.id, placement=[{"node": "n1", "gpu": gpu, "milli": 1000}], milli=1000,
              backed=True, protected_until=None, now=t0)
    if busy is not None:
        led.record_busy([(w.id, t0, t0 + hours * 3600, busy, "device")])
    led.stop(w.id, now=t0 + hours * 3600, state="done", closed_by="exit")
    return w.id


def test_engine_figures_fill_unsampled_intervals_and_unknown_stays_unknown(ledger):
    t0 = time.time() - 6 * 3600
    a = job(ledger, "ann", "optics", 0, t0, 2)  # the engine says 75 % busy
    b = job(ledger, "ben", "vision", 1, t0, 2)  # the engine recorded nothing
    c = job(ledger, "ann", "optics", 0, t0 + 3 * 3600, 1, busy=0.2)  # sampled while it ran
    eng = AccountingEngine({a: 0.75, b: None, c: 0.9})
    budgets = load_budgets(BUDGETS)
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, load_inventory(INVENTORY),
                          lambda: budgets.policy, eng)
    ivs = [(x.workload, x.seq, x.start, x.end, "slurm") for x in ledger.charges(since=0)
           if x.end is not None]
    loop._engine_busy(ivs)
    assert sorted(eng.asked) == sorted([a, b])  # the sampled one is not asked again
    with ledger.ro() as s:
        r = report(s, account="lab", scope=Scope(["optics", "vision"]), start=t0 - 3600,
                   end=t0 + 5 * 3600, tz=ZoneInfo("UTC"), by="user", now=time.time(),
                   grants={}, window=7 * 86400.0)
    users = {u["user"]: u for p in r["projects"] for u in p["users"]}
    # ann: 2 h at 75 % (the engine's) + 1 h at 20 % (sampled; not the engine's 90 %)
    assert users["ann"]["charged_gpu_h"] == pytest.approx(3.0)
    assert users["ann"]["busy_gpu_h"] == pytest.approx(1.5 + 0.2)
    # ben: the engine recorded no GPU figure: unknown, never 0
    assert users["ben"]["charged_gpu_h"] == pytest.approx(2.0)
    assert users["ben"]["busy_gpu_h"] is None
