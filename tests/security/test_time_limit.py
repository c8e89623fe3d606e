"""Issue 8, Medium 9: ``time_limit`` was not enforced, so backfill on it was a lie: a job with
``time_limit: 10`` backfilled into a reservation ran 90 s and delayed the reserved gang.

Now the job gets SIGTERM at its limit, SIGKILL after the grace, and ends in state
``timeout``; the reserved gang starts when the core said it would."""

from __future__ import annotations

import time

from jupyter_gpubudget.ledger import Ledger, connect
from jupyter_gpubudget.service.openapi import openapi_document
from tests.fixtures.hub import http

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
