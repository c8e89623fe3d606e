"""Security review: ``time_limit`` was not enforced, so backfill on it was a lie: a job with
``time_limit: 10`` backfilled into a reservation ran 90 s and delayed the reserved gang.

Now the job gets SIGTERM at its limit, SIGKILL after the grace, and ends in state
``timeout``; the reserved gang starts when the core said it would."""

from __future__ import annotations

import dataclasses
import time

from jupyter_gpubudget.backends.base import Launch
from jupyter_gpubudget.backends.local import LocalBackend
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.loop import SchedulingLoop
from jupyter_gpubudget.service.openapi import openapi_document
from tests.fixtures.hub import http
from tests.fixtures.unixusers import TEMPLATE, ensure_accounts

from .conftest import require_root, wait_state


def test_a_job_is_stopped_at_its_time_limit_and_recorded_as_timeout(service_factory, tokens):
    require_root()
    svc = service_factory("--LocalBackend.stop_grace=1")
    bob = tokens["bob"]
    # ignores SIGTERM: only the SIGKILL after the grace ends it
    script = "trap 'echo got TERM' TERM; echo started; sleep 60 & wait; sleep 60"
    status, job = http("POST", svc.api + "/jobs", bob, {
        "command": script, "project": "lattice", "gpus": 1, "time_limit": 2})
    assert status == 201, job
    w = wait_state(svc, bob, job["id"], ("timeout", "done", "failed"), timeout=30)
    assert w["state"] == "timeout", w
    assert "time limit" in w["reason"]
    out = (svc.dir / "jobs" / job["id"] / "1" / "output.log").read_text()
    assert "started" in out and "got TERM" in out  # SIGTERM first, then SIGKILL
    assert http("GET", svc.api + "/jobs?state=timeout", bob)[1]["jobs"][0]["id"] == job["id"]
    led = Ledger(connect(svc.db_url, read_only=True))
    try:
        (iv,) = led.charges(workload=job["id"])
        assert iv.closed_by == "timeout"
        assert iv.end - iv.start < 2 + 1 + 10  # the limit, the grace, some slack; never 60 s
    finally:
        led.dispose()
    enum = openapi_document("/x")["components"]["schemas"]["Workload"]["properties"]["state"]
    assert "timeout" in enum["enum"]


BUDGETS = """\
admins: [root]
policy:
  min_runtime_cap: {interactive: 8h, batch: 2d, debug: 1h}
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 60, members: [bob]}
      astro: {grant: 40, members: [dave]}
  biology:
    grant: 50
    children:
      genomics: {grant: 50, members: [erin]}
"""


def test_a_backfilled_job_cannot_delay_the_reservation_past_its_time_limit(service_factory,
                                                                           tokens):
    """Two GPUs. A 1-GPU job runs 5 s; a 2-GPU gang is reserved for its end; a protected job
    that declares ``time_limit: 2`` but would run 120 s is backfilled onto the idle GPU. The gang
    must start about when the first job ends, not after the backfilled job's 120 s."""
    require_root()
    svc = service_factory("--LocalBackend.stop_grace=1", budgets=BUDGETS)
    dave, bob, erin = tokens["dave"], tokens["bob"], tokens["erin"]
    t0 = time.time()
    st, first = http("POST", svc.api + "/jobs", dave, {
        "command": "sleep 5", "project": "astro", "gpus": 1, "time_limit": 5})
    assert st == 201, first
    wait_state(svc, dave, first["id"], ("running",))
    st, gang = http("POST", svc.api + "/jobs", bob, {
        "command": "sleep 1", "project": "lattice", "gpus": 2})
    assert st == 201, gang
    time.sleep(0.5)  # the gang is reserved for the first job's end
    st, liar = http("POST", svc.api + "/jobs", erin, {
        "command": "sleep 120", "project": "genomics", "gpus": 1, "time_limit": 2,
        "min_runtime": "2m"})
    assert st == 201, liar
    w = wait_state(svc, erin, liar["id"], ("running", "timeout"))
    assert w["started_at"] is not None  # backfilled in front of the gang
    w = wait_state(svc, erin, liar["id"], ("timeout", "done", "failed"), timeout=30)
    assert w["state"] == "timeout", w
    g = wait_state(svc, bob, gang["id"], ("running", "done"), timeout=45)
    assert g["started_at"] - t0 < 40, g  # not held back for the liar's 120 s


class NoLimitBackend(LocalBackend):
    """The real local backend, except that it leaves ``time_limit`` to the scheduling loop (as
    a backend without its own enforcement would)."""

    def launch(self, launch: Launch) -> str:
        return super().launch(dataclasses.replace(launch, time_limit=None))


def test_the_loop_stops_a_job_its_backend_lets_run_past_the_limit(tmp_path):
    require_root()
    from tests.fixtures.hub import BUDGETS as TEST_BUDGETS
    from tests.fixtures.hub import INVENTORY

    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade(url)
    ledger = Ledger(connect(url))
    budgets = load_budgets(TEST_BUDGETS)
    now = [time.time()]
    ledger.sync_budgets(budgets, now[0])
    backend = NoLimitBackend(state_dir=str(tmp_path / "jobs"), stop_grace=1,
                             unix_user_template=TEMPLATE)
    ensure_accounts(["bob"])
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, load_inventory(INVENTORY),
                          lambda: budgets.policy, backend, clock=lambda: now[0])
    row = ledger.submit(project="lattice", user="bob", kind="batch", now=now[0],
                        request={"kind": "gpu", "gpus": 1}, command=["/bin/sleep", "60"],
                        time_limit=5, backend="local")
    try:
        loop.cycle()
        assert ledger.get(row.id).state == "running"
        now[0] += 5 + loop.time_limit_slack - 1
        loop.cycle()
        assert ledger.get(row.id).state == "running"  # within the slack: the backend's turn
        now[0] += 2
        loop.cycle()
        w = ledger.get(row.id)
        assert w.state == "timeout" and "time limit" in w.reason
        assert not backend.status(row.id, 1).alive
        assert "timeout" in [d.kind for d in ledger.decisions(workloads=[row.id])]
    finally:
        for wid, attempt in backend.orphans(set()):
            backend.stop(wid, attempt)
        ledger.dispose()
