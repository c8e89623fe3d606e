"""A batch job's ``warn_signal`` on the Slurm backend, against the real test cluster (the
service's ledger on SQLite, its scheduling loop and Slurm backend, without HTTP): the warner
(service/preempt_warning.py), wired to the backend as the service wires it, sends the running
job the signal it asked for (``scancel --signal=USR1 --full``, as the job's user); the job's
trap sees it and the job runs on. A job that has ended gets an error string and nothing
changes; a signal a job may not ask for is refused without reaching Slurm. With several
clusters (``ClusterBackends``), the backend of the job's cluster sends it.

The warner is given the outlook that makes the warning due (a likely preemption within the
lead time): when work is likely to be preempted is the core's, tested with the local backend
in tests/service/test_preempt_warning.py; here the way from the warning to Slurm is."""

from __future__ import annotations

import pwd
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from jupyter_gpubudget.backends.multi import ClusterBackends
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.outlook import Outlook
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.app import GpuBudgetService
from jupyter_gpubudget.service.loop import SchedulingLoop
from jupyter_gpubudget.service.preempt_warning import (
    WARN_ENV,
    WARNING_KIND,
    Foreseen,
    PreemptionWarner,
)
from tests.slurm.conftest import BUDGETS
from tests.slurm.test_backend import make_backend, wait


@pytest.fixture
def service(slurm_accounts, tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade(url)
    engine = connect(url)
    ledger = Ledger(engine)
    budgets = load_budgets(BUDGETS, "budgets.yaml")
    ledger.sync_budgets(budgets, time.time())
    backend = make_backend(start_grace=10)
    backend.use_ledger(ledger)
    inv = backend.discover_inventory()
    backend.use_inventory(inv)
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, inv, lambda: budgets.policy,
                          backend)
    try:
        yield ledger, loop, backend
    finally:
        for wid, attempt in backend.orphans(set()):
            backend.stop(wid, attempt)
        engine.dispose()


def output(wid: str, job_id: str) -> str:
    home = Path(pwd.getpwnam("gpb-ben").pw_dir)
    path = home / f"gpubudget-gpubudget.{wid}.1-{job_id}.out"
    return path.read_text() if path.exists() else ""


def test_the_warner_signals_a_running_slurm_job_and_not_an_ended_one(service):
    ledger, loop, backend = service
    wid = "warn" + uuid.uuid4().hex[:8]
    ledger.submit(project="astro", user="gpb-ben", kind="batch",
                  request={"kind": "gpu", "gpus": 1}, now=time.time(),
                  command=["/bin/sh", "-c", "trap 'echo saving-now' USR1; echo ready; "
                                            "while :; do sleep 0.2; done"],
                  env={WARN_ENV: "USR1"}, time_limit=600, backend="slurm",
                  workload_id=wid)

    def running() -> str | None:
        loop.cycle()
        row = ledger.get(wid)
        ref = row.backend_ref if row.state == "running" else None
        return ref if ref and "ready" in output(wid, ref) else None

    job_id = wait(running, 60, "the job runs and has set its trap")

    # the service's own wiring: GpuBudgetService._warn_job (the warner's notify) on a
    # service whose backend is this Slurm backend
    app = SimpleNamespace(backend=backend, ledger=ledger)
    warner = PreemptionWarner(ledger, 600.0,
                              notify=lambda row, sig: GpuBudgetService._warn_job(app, row, sig))
    now = time.time()
    foreseen = {wid: Foreseen(Outlook(now + 300, "other", "unbacked work yields to backed "
                                      "work"), "lattice", "backed work is waiting")}
    assert warner(foreseen, now) == [wid]
    (d,) = ledger.decisions(kind=WARNING_KIND)
    assert d.workload == wid and d.detail["signal"] == "USR1"
    assert "signal_error" not in d.detail, d.detail
    wait(lambda: "saving-now" in output(wid, job_id), 30, "the job's trap saw SIGUSR1")
    assert backend.status(wid, 1).alive  # warned, not stopped
    assert [j.state for j in backend.queue(fresh=True) if j.job_id == job_id] == ["RUNNING"]

    # with several clusters, the backend of the cluster the job runs on sends it
    clusters = ClusterBackends({"hpc": backend}, {"gpu1": "hpc", "gpu2": "hpc"},
                               locate=lambda w: "hpc")
    assert clusters.notify(wid, 1, "USR1") is None
    wait(lambda: output(wid, job_id).count("saving-now") == 2, 30, "the second signal")

    # a signal the job may not ask for never reaches Slurm
    assert "USR1" in (backend.notify(wid, 1, "KILL") or "")
    assert backend.status(wid, 1).alive

    # an ended job: an error string, nothing raised, nothing changed
    assert not backend.stop(wid, 1).alive
    before = [(r.job_id, r.state, r.end) for r in backend.accounting([f"gpubudget.{wid}.1"])]
    assert [s for _, s, _ in before] == ["CANCELLED"]
    err = backend.notify(wid, 1, "USR1")
    assert err and "not running" in err
    after = [(r.job_id, r.state, r.end) for r in backend.accounting([f"gpubudget.{wid}.1"])]
    assert after == before
    assert output(wid, job_id).count("saving-now") == 2
