"""REST behaviour against the real service process: jobs run through the core and the local
backend, preemption and requeue, grants, usage, validation (400 naming the field)."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.fixtures.hub import ServiceProc, http
from tests.service.conftest import cleanup


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def service(request, hub, tokens, tmp_path_factory):
    """This module runs against both ledgers."""
    d = tmp_path_factory.mktemp("svc")
    if request.param == "sqlite":
        url = f"sqlite:///{d / 'ledger.sqlite'}"
    else:
        url = request.getfixturevalue("postgres_server").new_database()
    svc = ServiceProc(hub, d, url)
    svc.start()
    yield svc
    cleanup(svc, tokens["root"])


def wait_for(fn, what: str, timeout: float = 30.0):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def get_w(svc, token, wid):  # noqa: ANN001, ANN201
    return http("GET", f"{svc.api}/workloads/{wid}", token)[1]


def test_job_runs_with_placement_env_and_is_charged(service, tokens):
    bob = tokens["bob"]
    status, job = http("POST", service.api + "/jobs", bob, {
        "command": ["/bin/sh", "-c", "echo $CUDA_VISIBLE_DEVICES $GPUBUDGET_PROJECT"],
        "project": "lattice", "gpus": 1, "name": "env-check"})
    assert status == 201 and job["state"] == "pending" and job["name"] == "env-check"
    done = wait_for(lambda: (w := get_w(service, bob, job["id"]))["state"] == "done" and w,
                    "the job to finish")
    assert done["exit_code"] == 0 and done["placement"][0]["node"] == "n1"
    out = (service.dir / "jobs" / job["id"] / "1" / "output.log").read_text().split()
    # a declared inventory: the derived id, not an index (CUDA would take that for a GPU)
    assert out == [f"GPU-n1-{done['placement'][0]['gpu']}", "lattice"]
    usage = http("GET", service.api + "/accounts/lattice/usage", bob)[1]
    assert usage["account"] == "lattice" and usage["grant_hours"] == 60
    jobs = http("GET", service.api + "/jobs?state=done", bob)[1]["jobs"]
    assert job["id"] in [j["id"] for j in jobs]


def test_unbacked_job_is_preempted_requeued_and_noticed(service, tokens):
    bob, dave = tokens["bob"], tokens["dave"]
    spec = {"command": "sleep 120", "project": "lattice", "gpus": 1, "min_runtime": "48h",
            "resumable": True}
    j1 = http("POST", service.api + "/jobs", bob, {**spec, "name": "backed"})[1]
    wait_for(lambda: get_w(service, bob, j1["id"])["state"] == "running", "j1 running")
    j2 = http("POST", service.api + "/jobs", bob, {**spec, "name": "unbacked"})[1]
    w2 = wait_for(lambda: (w := get_w(service, bob, j2["id"]))["state"] == "running" and w,
                  "j2 running")
    w1 = get_w(service, bob, j1["id"])
    assert w1["backed"] and w1["protected_left_s"] > 40 * 3600
    assert not w2["backed"] and w2["protected_left_s"] is None
    j3 = http("POST", service.api + "/jobs", dave,
              {"command": "sleep 120", "project": "astro", "gpus": 1, "min_runtime": "1h"})[1]
    w3 = wait_for(lambda: (w := get_w(service, dave, j3["id"]))["state"] == "running" and w,
                  "j3 running")
    assert w3["backed"]
    # the queue position comes from the cycle's view, computed right after the preemption
    w2 = wait_for(lambda: (w := get_w(service, bob, j2["id"]))["preemptions"] == 1
                  and w["queue_position"] is not None and w, "j2 preempted")
    assert w2["state"] == "pending" and w2["queue_position"] == 1
    assert w2["submitted_at"] == j2["submitted_at"]  # requeued keeps its place in time
    assert get_w(service, bob, j1["id"])["state"] == "running"  # protected, untouched
    # what it threw away is logged with the preemption: the drain budget reads it back
    # (it had run for seconds, so the scheduler priced its 120 s reload: 1/30 GPU-h)
    ledger = Ledger(connect(service.db_url))
    try:
        (intent,) = [d for d in ledger.decisions(kind="preempting") if d.workload == j2["id"]]
        assert intent.detail["lost_gpu_hours"] == pytest.approx(120 / 3600, rel=0.2)
        assert ledger.recent_losses(intent.at - 1) == [(intent.at, intent.detail[
            "lost_gpu_hours"])]
    finally:
        ledger.dispose()
    notices = http("GET", service.api + "/notices", bob)[1]["notices"]
    assert [n["workload"] for n in notices] == [j2["id"]] and notices[0]["requeued"]
    assert http("GET", service.api + "/notices", dave)[1]["notices"] == []
    queue = http("GET", service.api + "/queue", dave)[1]["queue"]
    assert queue[0]["id"] is None and queue[0]["user"] is None  # bob's entry, redacted
    metrics = http("GET", service.base + "/metrics", tokens["root"])[1]
    assert 'gpubudget_preemptions_total{project="lattice"} 1.0' in metrics
    # the day's loss against the drain budget (0.9 % of the service's 2 GPUs x 24 h)
    gauges = {x.split()[0]: float(x.split()[1]) for x in metrics.splitlines()
              if x.startswith(("gpubudget_preemption_lost_day", "gpubudget_drain_loss"))}
    assert gauges["gpubudget_preemption_lost_day_gpu_seconds"] == pytest.approx(120, rel=0.2)
    assert gauges["gpubudget_drain_loss_budget_gpu_seconds"] == pytest.approx(
        0.009 * 2 * 86400)
    assert 'gpubudget_workloads_running{kind="batch",project="astro"} 1.0' in metrics
    for j, t in ((j1, bob), (j2, bob), (j3, dave)):
        status, out = http("DELETE", f"{service.api}/jobs/{j['id']}", t)
        assert status == 200 and out["state"] == "cancelled"
    status, out = http("DELETE", f"{service.api}/jobs/{j1['id']}", bob)
    assert status == 409


def test_grant_change_is_versioned_and_audited(service, tokens):
    status, out = http("PUT", service.api + "/accounts/astro/grant", tokens["alice"],
                       {"grant_hours": 35.5, "note": "conference"})
    assert status == 200 and out["grant"]["changed_by"] == "alice"
    versions = http("GET", service.api + "/accounts/astro/grants", tokens["dave"])[1]["versions"]
    assert [(v["grant_hours"], v["changed_by"], v["note"]) for v in versions][-1] == (
        35.5, "alice", "conference")
    acct = http("GET", service.api + "/accounts/astro", tokens["dave"])[1]
    assert acct["grant"]["grant_hours"] == 35.5


def test_idempotent_submit(service, tokens):
    body = {"command": "true", "project": "lattice", "gpus": 0}
    a = http("POST", service.api + "/jobs", tokens["bob"], body, headers={"Idempotency-Key": "x1"})
    b = http("POST", service.api + "/jobs", tokens["bob"], body, headers={"Idempotency-Key": "x1"})
    assert a[0] == b[0] == 201 and a[1]["id"] == b[1]["id"]


BAD_JOBS = [
    ({"project": "lattice"}, "command"),
    ({"command": "x"}, "project"),
    ({"command": 3, "project": "lattice"}, "command"),
    ({"command": "x", "project": "lattice", "gpus": -1}, "gpus"),
    ({"command": "x", "project": "lattice", "gpus": True}, "gpus"),
    ({"command": "x", "project": "lattice", "gpus": 1, "slice": "1g.18gb"}, "slice"),
    ({"command": "x", "project": "lattice", "slice": "banana"}, "slice"),
    ({"command": "x", "project": "lattice", "min_runtime": "forever"}, "min_runtime"),
    ({"command": "x", "project": "lattice", "resumable": "yes"}, "resumable"),
    ({"command": "x", "project": "lattice", "colour": "red"}, "colour"),
    ({"command": "x", "project": "physics"}, "project"),
    ({"command": "x", "project": "nope"}, "project"),
    ({"command": "x", "project": "lattice", "env": {"A": 1}}, "env"),
    ({"command": "x", "project": "lattice", "kind": "interactive"}, "kind"),
    ([1, 2], "body"),
]


@pytest.mark.parametrize("body,field", BAD_JOBS, ids=[f for _, f in BAD_JOBS])
def test_malformed_job_is_400_naming_the_field(service, tokens, body, field):
    before = len(http("GET", service.api + "/jobs", tokens["bob"])[1]["jobs"])
    status, out = http("POST", service.api + "/jobs", tokens["bob"], body)
    assert status == 400 and out["field"] == field, out
    assert field in out["message"]
    assert len(http("GET", service.api + "/jobs", tokens["bob"])[1]["jobs"]) == before


def test_malformed_bodies_and_queries(service, tokens):
    root = tokens["root"]
    status, out = http("POST", service.api + "/jobs", root, b"{not json")
    assert status == 400 and out["field"] == "body"
    for body, field in (({"grant_hours": -1}, "grant_hours"), ({}, "grant_hours"),
                        ({"grant_hours": 1, "share_pct": 5}, "share_pct"),
                        ({"share_pct": 101}, "share_pct"), ({"note": 5, "grant_hours": 1}, "note")):
        status, out = http("PUT", service.api + "/accounts/lattice/grant", root, body)
        assert status == 400 and out["field"] == field, (body, out)
    status, out = http("GET", service.api + "/workloads/me?state=sleeping", root)
    assert status == 400 and out["field"] == "state"
    status, out = http("POST", service.api + "/usage/events", root,
                       {"workload": "e1", "event": "start", "at": 5, "project": "lattice",
                        "user": "bob", "milli": 1000, "placement": [{"node": "zz", "gpu": 0}]})
    assert status == 400 and out["field"] == "placement[0].node"
    status, out = http("GET", service.api + "/nothing/here", root)
    assert status == 404


def test_openapi_document_lists_every_route(service):
    doc = http("GET", service.api + "/openapi.json")[1]
    assert doc["openapi"].startswith("3.") and doc["servers"][0]["url"].endswith("/api/v1")
    assert {"/healthz", "/accounts", "/accounts/{name}/grant", "/workloads/me", "/queue",
            "/jobs", "/jobs/{name}", "/notices", "/usage/events"} <= set(doc["paths"])


def test_queued_job_has_a_predicted_start(service, tokens):
    """The core replays the queue: a job waiting behind a full node is predicted to start when
    the running work's declared limit runs out."""
    bob = tokens["bob"]
    status, first = http("POST", service.api + "/jobs", bob, {
        "command": ["/bin/sleep", "30"], "project": "lattice", "gpus": 2,
        "time_limit": "2h", "name": "fills-the-node"})
    assert status == 201
    running = wait_for(lambda: (w := get_w(service, bob, first["id"]))["state"] == "running"
                       and w, "the first job to start")
    status, second = http("POST", service.api + "/jobs", bob, {
        "command": ["/bin/true"], "project": "lattice", "gpus": 2, "name": "waits"})
    assert status == 201
    waiting = wait_for(lambda: (w := get_w(service, bob, second["id"]))["predicted_start"]
                       and w, "a predicted start")
    assert waiting["state"] == "pending"
    assert abs(waiting["predicted_start"] - (running["started_at"] + 7200)) < 5
    for wid in (second["id"], first["id"]):
        http("DELETE", f"{service.api}/jobs/{wid}", bob)
