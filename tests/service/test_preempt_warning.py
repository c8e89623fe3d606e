"""Warning ahead of a likely preemption, through the service's scheduling loop (ledger on
SQLite, the pure core deciding, the real local launcher running the jobs as their users):
bob's job is protected for 10 minutes; alice's backed job is queued behind it and bob's
project stands above hers. The job's JSON forecasts its preemption at the end of its
protection, for alice's job; bob is told once (a ``preempt-warning`` notice in words), and
his job, which asked for ``warn_signal: USR1``, gets SIGUSR1 — while it keeps running."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.backends.local import LocalBackend
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.delivery import notice_of
from jupyter_gpubudget.service.loop import SchedulingLoop
from jupyter_gpubudget.service.preempt_warning import WARNING_KIND, Outlooks, PreemptionWarner
from jupyter_gpubudget.service.reaper import SESSION_BACKEND
from jupyter_gpubudget.service.validate import Invalid, parse_job
from jupyter_gpubudget.service.views import workload_json
from tests.fixtures.smallcluster import ONE_GPU_NODE as INVENTORY
from tests.fixtures.unixusers import TEMPLATE, ensure_accounts

BUDGETS = """\
window: 7d
admins: [root]
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 50, members: [alice]}
      scratch: {grant: 50, members: [bob]}
"""

GPU = {"kind": "gpu", "gpus": 1}


@pytest.fixture
def setup(tmp_path):  # noqa: ANN201
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade(url)
    ledger = Ledger(connect(url))
    budgets = load_budgets(BUDGETS, "budgets.yaml")
    now = time.time()
    ledger.sync_budgets(budgets, now, "budgets.yaml")
    # bob's project used 20 GPU-hours earlier this week: it stands above alice's
    old = ledger.submit(project="scratch", user="bob", kind="batch", request=GPU,
                        now=now - 30 * 3600, command=["true"])
    ledger.start(old.id, placement=[{"node": "n1", "gpu": 0, "kind": "gpu", "milli": 1000}],
                 milli=1000, backed=True, protected_until=None, now=now - 30 * 3600)
    ledger.stop(old.id, now=now - 10 * 3600, state="done", closed_by="exit", exit_code=0)
    as_user = {"unix_user_template": TEMPLATE} if ensure_accounts(["alice", "bob"]) else {}
    backend = LocalBackend(state_dir=str(tmp_path / "jobs"), stop_grace=2, **as_user)
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, load_inventory(INVENTORY),
                          lambda: budgets.policy, backend)
    told: list[tuple[str, str]] = []

    def notify(row, sig):  # noqa: ANN001, ANN202 - what the app wires: the engine's notify
        told.append((row.id, sig))
        iv = ledger.open_interval(row.id)
        return backend.notify(row.id, iv.seq, sig)

    loop.warner = PreemptionWarner(ledger, 600.0, notify=notify)
    loop.outlooks = Outlooks(min_interval=0.0)  # recomputed on every change (the tests' pace)
    try:
        yield ledger, loop, backend, told
    finally:
        for wid, attempt in backend.orphans(set()):
            backend.stop(wid, attempt)
        ledger.dispose()


def test_a_protected_job_with_backed_work_queued_is_warned_once_ahead(setup):
    ledger, loop, backend, told = setup
    body = parse_job({"command": "trap 'echo saving-now' USR1; while :; do sleep 0.1; done",
                      "project": "scratch", "resumable": True, "checkpoint": "self",
                      "min_runtime": 600, "warn_signal": "SIGUSR1"})
    assert body["env"]["GPUBUDGET_WARN_SIGNAL"] == "USR1"
    bob = ledger.submit(project="scratch", user="bob", kind="batch", request=GPU,
                        now=time.time(), command=body["command"], env=body["env"],
                        min_runtime=600, resumable=True).id
    loop.cycle()
    row = ledger.get(bob)
    assert row.state == "running" and row.protected_until is not None
    js = workload_json(row, loop.view, time.time())
    assert js["preemption_forecast"]["likely"] is False  # nothing queued yet

    alice = ledger.submit(project="lattice", user="alice", kind="batch", request=GPU,
                          now=time.time(), command=["/bin/sh", "-c", "exec sleep 60"]).id
    loop.cycle()
    assert ledger.get(alice).state == "pending" and ledger.get(bob).state == "running"
    row = ledger.get(bob)
    now = time.time()
    fc = workload_json(row, loop.view, now)["preemption_forecast"]
    assert fc["likely"] is True
    assert fc["at"] == pytest.approx(row.protected_until, abs=1.0)
    assert (fc["for_workload"], fc["for_project"]) == (alice, "lattice")
    assert fc["reason"] == ("project lattice's backed work is waiting for its GPUs, and "
                            "project scratch has used more of its grant")
    assert fc["at_text"] and fc["at_local"]

    # told once: one decision, one signal; the job saw SIGUSR1 and runs on
    (d,) = ledger.decisions(kind=WARNING_KIND)
    assert d.workload == bob and d.detail["signal"] == "USR1"
    assert "signal_error" not in d.detail
    assert told == [(bob, "USR1")]
    iv = ledger.open_interval(bob)
    deadline = time.time() + 10
    while b"saving-now" not in backend.read_log(bob, iv.seq, 0, 10_000).data:
        assert time.time() < deadline, "the job never saw its warn signal"
        time.sleep(0.1)
    assert backend.status(bob, iv.seq).alive
    n = notice_of(ledger, d, ledger.get(bob))
    assert (n.kind, n.cause) == ("preempt-warning", "likely")
    clock = d.detail["at_clock"]
    assert n.title == f"Your job (project scratch) may be stopped at {clock} for project lattice's backed work"
    assert "It was sent SIGUSR1 now, as it asked, to save its work." in n.body
    assert bob not in n.body and alice not in n.body  # ids only in the details
    assert n.details["for_workload"] == alice

    loop.cycle()
    assert len(ledger.decisions(kind=WARNING_KIND)) == 1 and len(told) == 1
    # a restarted service (a new warner) finds the warning in the ledger: not again
    fresh = PreemptionWarner(ledger, 600.0, notify=lambda r, s: told.append((r.id, s)))
    assert fresh(loop.view.preemption_forecast, time.time()) == []
    assert len(ledger.decisions(kind=WARNING_KIND)) == 1 and len(told) == 1
    # and its notice is among bob's
    assert [dd.kind for dd, _ in ledger.notices_for("bob")] == [WARNING_KIND]


def test_nothing_is_told_beyond_the_lead_time(setup):
    ledger, loop, _backend, told = setup
    loop.warner = PreemptionWarner(ledger, 60.0)  # a minute ahead; the preemption is ~10 away
    bob = ledger.submit(project="scratch", user="bob", kind="batch", request=GPU,
                        now=time.time(), command=["/bin/sh", "-c", "exec sleep 60"],
                        min_runtime=600, resumable=True).id
    loop.cycle()
    ledger.submit(project="lattice", user="alice", kind="batch", request=GPU,
                  now=time.time(), command=["/bin/sh", "-c", "exec sleep 60"])
    loop.cycle()
    assert workload_json(ledger.get(bob), loop.view, time.time())[
        "preemption_forecast"]["likely"] is True
    assert ledger.decisions(kind=WARNING_KIND) == [] and told == []


def test_a_protected_session_with_backed_work_queued_is_forecast_and_warned(setup):
    """A notebook session (started by the loop for the hub's spawner) protected for 10
    minutes, and alice's backed job queued behind it: its JSON forecasts the preemption at
    the end of its protection, and bob is told ahead that its kernels will be saved."""
    ledger, loop, _backend, told = setup
    bob = ledger.submit(project="scratch", user="bob", kind="interactive", request=GPU,
                        now=time.time(), min_runtime=600, resumable=True,
                        backend=SESSION_BACKEND, name="analysis").id
    loop.cycle()
    assert ledger.get(bob).state == "running"
    alice = ledger.submit(project="lattice", user="alice", kind="batch", request=GPU,
                          now=time.time(), command=["/bin/sh", "-c", "exec sleep 60"]).id
    loop.cycle()
    assert ledger.get(alice).state == "pending" and ledger.get(bob).state == "running"
    row = ledger.get(bob)
    fc = workload_json(row, loop.view, time.time())["preemption_forecast"]
    assert fc["likely"] is True and fc["at"] == pytest.approx(row.protected_until, abs=1.0)
    assert (fc["for_workload"], fc["for_project"]) == (alice, "lattice")
    (d,) = ledger.decisions(kind=WARNING_KIND)
    assert d.workload == bob and "signal" not in d.detail and told == []
    n = notice_of(ledger, d, row)
    clock = d.detail["at_clock"]
    assert n.title == (f"Your server “analysis” (project scratch) may be stopped at {clock} "
                       "for project lattice's backed work")
    assert n.body == (
        f"Your server “analysis” (project scratch) may be stopped at about {clock} for "
        "project lattice's backed work: project lattice's backed work is waiting for its "
        "GPUs, and project scratch has used more of its grant. Nothing has happened yet, and "
        "the queue may still change. If it is stopped, its kernels are saved in a snapshot "
        "first and restored when it starts again. Save your notebooks now, or release the "
        "GPU (stop the server) if you are done.")
    assert bob not in n.body and alice not in n.body


@pytest.mark.parametrize("bad", ["KILL", "SIGSTOP", 9, "", "USR3"])
def test_a_warn_signal_that_is_not_offered_is_refused(bad):
    with pytest.raises(Invalid) as e:
        parse_job({"command": "true", "project": "scratch", "warn_signal": bad})
    assert e.value.field == "warn_signal"


def test_gpubudget_jobs_shows_the_forecast_of_a_running_job():
    from jupyter_gpubudget.cli.jobs import _row

    w = {"id": "b1", "state": "running", "project": "scratch", "name": "train",
         "placement": [{"node": "n1", "gpu": 0}], "protected_left_s": 540.0,
         "preemption_forecast": {"likely": True, "at": 1.0, "at_text": "14:05 (in 9 min)",
                                 "reason": "project lattice's backed work is waiting for its "
                                           "GPUs"}}
    assert _row(w).endswith("protected 9 min; may be preempted at 14:05 (in 9 min): project "
                            "lattice's backed work is waiting for its GPUs")
    w["preemption_forecast"] = {"likely": False}
    assert _row(w).endswith("protected 9 min")
