"""The service's snapshot endpoints against a real JupyterHub (tokens, scopes) and the real
service process: who may record, list, ask for and restore snapshots; hostile bodies are
refused naming the field and change nothing; a requeue and a resume; a loss is recorded and
shown; the core is told a session's snapshot cost and reliability."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger import snapshots as snapledger
from jupyter_gpubudget.service.state import build_state, snapshot_estimate
from tests.fixtures.hub import BUDGETS, INVENTORY, ServiceProc, http, start_hub


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    hub = start_hub(tmp_path_factory.mktemp("hub"))
    d = tmp_path_factory.mktemp("svc")
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}")
    svc.start()
    tokens = {u: hub.token(u) for u in ("root", "bob", "dave")}
    tokens["bob-read"] = hub.token("bob", scopes=["custom:gpubudget:read",
                                                  "access:services!service=gpubudget"])
    yield hub, svc, tokens
    svc.stop()
    hub.stop()


def running(svc: ServiceProc, root: str, user: str = "bob", project: str = "lattice") -> dict:
    st, s = http("POST", f"{svc.api}/sessions", root,
                 {"user": user, "project": project, "slice": "gpu:1", "min_runtime": "1h",
                  "name": f"{user}/"})
    assert st == 201, s
    deadline = time.monotonic() + 30
    while s["state"] != "running":
        assert time.monotonic() < deadline, s
        s = http("GET", f"{svc.api}/sessions/{s['id']}?wait=2", root)[1]
    return s


def a_set(sid: str, n: int = 0, **over) -> tuple[str, dict]:  # noqa: ANN003
    set_id = f"{sid}--{0x18f00000000 + n:x}-abc{n:03x}"
    body = {"session": sid, "project": "lattice", "reason": "preempt",
            "created_at": time.time() + n, "stored_bytes": 1000, "raw_bytes": 4000,
            "seconds": 2.5, "members": [{
                "kernel_id": "k1", "kernel_name": "python3",
                "sessions": [{"path": "a.ipynb", "name": "a.ipynb", "type": "notebook"}],
                "snapshot": f"{sid}--{0x18f00000000 + n:x}-def{n:03x}", "method": "namespace",
                "error": None, "variables": ["x"], "unsaved": {"h": "cannot pickle"},
                "raw_bytes": 4000, "stored_bytes": 1000}], **over}
    return set_id, body


def test_recording_listing_and_who_may(env):
    hub, svc, t = env
    s = running(svc, t["root"])
    sid = s["id"]
    set_id, body = a_set(sid)
    # another user, or a token without the submit scope, may not record it
    assert http("PUT", f"{svc.api}/snapshots/{set_id}", t["dave"], body)[0] == 403
    assert http("PUT", f"{svc.api}/snapshots/{set_id}", t["bob-read"], body)[0] == 403
    # hostile bodies: refused naming the field, nothing recorded
    for bad, field in [({**body, "session": "nope"}, "session"),
                       ({**body, "project": "astro"}, "project"),
                       ({**body, "reason": "whim"}, "reason"),
                       ({**body, "created_at": "soon"}, "created_at"),
                       ({**body, "stored_bytes": -1}, "stored_bytes"),
                       ({**body, "members": "all"}, "members"),
                       ({**body, "members": [{"sessions": "x"}]}, "members[0]"),
                       ({**body, "pruned": ["../../x"]}, "pruned")]:
        st, out = http("PUT", f"{svc.api}/snapshots/{set_id}", t["bob"], bad)
        assert st in (400, 404) and out.get("field", "session") == field, (field, out)
    assert http("GET", f"{svc.api}/snapshots/{set_id}", t["bob"])[0] == 404
    st, row = http("PUT", f"{svc.api}/snapshots/{set_id}", t["bob"], body)
    assert st == 200 and row["method"] == "namespace" and row["saved"] == 1, row
    assert http("PUT", f"{svc.api}/snapshots/{set_id}", t["bob"], body)[0] == 200  # idempotent
    # listing: mine; another user's only by an admin
    st, mine = http("GET", f"{svc.api}/snapshots", t["bob"])
    assert [x["id"] for x in mine["snapshots"]] == [set_id]
    assert mine["snapshots"][0]["kernels"][0]["unsaved"] == {"h": "cannot pickle"}
    assert http("GET", f"{svc.api}/snapshots", t["dave"])[1]["snapshots"] == []
    assert http("GET", f"{svc.api}/snapshots?user=bob", t["dave"])[0] == 403
    assert http("GET", f"{svc.api}/snapshots/{set_id}", t["dave"])[0] == 403
    st, one = http("GET", f"{svc.api}/sessions/{sid}/snapshots", t["bob"])
    assert st == 200 and one["keep_last"] == 3 and one["snapshots"][0]["id"] == set_id
    st, sj = http("GET", f"{svc.api}/sessions/{sid}", t["bob"])
    assert sj["snapshot"]["id"] == set_id and sj["snapshot_count"] == 1
    # a bad one stays listed, with its problem
    st, bad = http("POST", f"{svc.api}/snapshots/{set_id}/bad", t["bob"],
                   {"problem": "chunk 1a2b is missing"})
    assert st == 200 and bad["status"] == "bad" and bad["problem"] == "chunk 1a2b is missing"
    http("DELETE", f"{svc.api}/sessions/{sid}", t["root"])


def test_requests_reach_the_running_session_and_are_answered(env):
    hub, svc, t = env
    s = running(svc, t["root"])
    sid = s["id"]
    assert http("POST", f"{svc.api}/sessions/{sid}/snapshots", t["dave"], {})[0] == 403
    st, req = http("POST", f"{svc.api}/sessions/{sid}/snapshots", t["bob"], {})
    assert st == 202, req
    rid = req["request"]
    st, hb = http("POST", f"{svc.api}/sessions/{sid}/heartbeat", t["root"])
    assert [r["request"] for r in hb["snapshot_requests"]] == [rid]
    assert hb["snapshot_requests"][0]["action"] == "snapshot"
    assert http("GET", f"{svc.api}/sessions/{sid}/requests/{rid}", t["bob"])[1]["state"] == "open"
    set_id, body = a_set(sid, 1, request=rid, reason="user")
    assert http("PUT", f"{svc.api}/snapshots/{set_id}", t["bob"], body)[0] == 200
    st, out = http("GET", f"{svc.api}/sessions/{sid}/requests/{rid}", t["bob"])
    assert out["state"] == "done" and out["detail"]["snapshot"] == set_id, out
    assert http("POST", f"{svc.api}/sessions/{sid}/heartbeat", t["root"])[1][
        "snapshot_requests"] == []
    # a restore request of a running server's snapshot goes to that server
    st, rr = http("POST", f"{svc.api}/snapshots/{set_id}/restore", t["bob"], {})
    assert st == 202 and rr["session"] == sid and rr["request"], rr
    st, out = http("POST", f"{svc.api}/sessions/{sid}/requests/{rr['request']}", t["bob"],
                   {"error": "the kernel is gone"})
    assert st == 200
    assert http("GET", f"{svc.api}/sessions/{sid}/requests/{rr['request']}", t["bob"])[1][
        "state"] == "failed"
    http("DELETE", f"{svc.api}/sessions/{sid}", t["root"])
    assert http("POST", f"{svc.api}/sessions/{sid}/snapshots", t["bob"], {})[0] == 409


def test_requeue_resume_and_loss(env):
    hub, svc, t = env
    s = running(svc, t["root"])
    sid = s["id"]
    # a requeue naming no snapshot of this session is refused, and the session runs on
    st, out = http("DELETE", f"{svc.api}/sessions/{sid}?reason=preempt&requeue=x--18f00000000-abc000",
                   t["root"])
    assert st == 400 and out["field"] == "requeue", out
    assert http("GET", f"{svc.api}/sessions/{sid}", t["root"])[1]["state"] == "running"
    st, out = http("DELETE", f"{svc.api}/sessions/{sid}?reason=stop&requeue=x", t["root"])
    assert st == 400 and out["field"] == "requeue"
    set_id, body = a_set(sid, 2)
    assert http("PUT", f"{svc.api}/snapshots/{set_id}", t["bob"], body)[0] == 200
    # resuming a session that still runs is refused
    st, out = http("POST", f"{svc.api}/sessions", t["root"],
                   {"user": "bob", "project": "lattice", "resumes": sid})
    assert st == 409 and out["field"] == "resumes", out
    st, out = http("DELETE", f"{svc.api}/sessions/{sid}?reason=preempt&requeue={set_id}",
                   t["root"])
    assert st == 200 and out["state"] == "preempted" and out["requeued_as"], out
    new = http("GET", f"{svc.api}/sessions/{out['requeued_as']}", t["root"])[1]
    assert new["resumes"]["session"] == sid and new["resumes"]["snapshot"] == set_id
    assert new["resumable"] and new["request"] == s["request"]
    st, n = http("GET", f"{svc.api}/notices", t["bob"])
    assert any(x["kind"] == "requeue" and x["requeued"] for x in n["notices"]), n
    # its snapshots are listed with it (the session it resumed)
    one = http("GET", f"{svc.api}/sessions/{new['id']}/snapshots", t["bob"])[1]
    assert one["sessions"] == [new["id"], sid] and one["snapshots"][0]["id"] == set_id
    http("DELETE", f"{svc.api}/sessions/{new['id']}", t["root"])
    # resuming someone else's session is refused; one's own ended one works
    st, out = http("POST", f"{svc.api}/sessions", t["root"],
                   {"user": "dave", "project": "astro", "resumes": sid})
    assert st == 400 and out["field"] == "resumes"
    st, out = http("POST", f"{svc.api}/sessions", t["root"],
                   {"user": "bob", "project": "lattice", "resumes": sid, "restore": set_id})
    assert st == 201 and out["resumes"]["snapshot"] == set_id, out
    http("DELETE", f"{svc.api}/sessions/{out['id']}", t["root"])
    # a loss is recorded and shown
    s2 = running(svc, t["root"])
    st, out = http("POST", f"{svc.api}/sessions/{s2['id']}/lost", t["root"],
                   {"reason": "not saved before the grace period ended: busy",
                    "kernels": [{"kernel": "python3", "notebooks": ["a.ipynb"]}]})
    assert st == 200
    sj = http("GET", f"{svc.api}/sessions/{s2['id']}", t["bob"])[1]
    assert "grace period" in sj["snapshot_lost"]["reason"]
    assert http("POST", f"{svc.api}/sessions/{s2['id']}/lost", t["root"], {})[1]["field"] == \
        "reason"
    http("DELETE", f"{svc.api}/sessions/{s2['id']}", t["root"])


def test_the_core_is_told_snapshot_cost_and_reliability(tmp_path):
    # pure: measured history, else the simulator's measured defaults; failures cost the run
    from jupyter_gpubudget.sim.costs import RESTORE_COST_S, SNAPSHOT_COST_S

    assert snapshot_estimate(None, 600) == (SNAPSHOT_COST_S + RESTORE_COST_S, 1.0)
    cost, rel = snapshot_estimate({"dump_s": 3.0, "restore_s": 2.0, "tries": 3, "ok": 1}, 600)
    assert rel == 0.5 and cost == pytest.approx(5.0 + 0.5 * 600)
    # from the ledger, into the Workload the core sees
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    upgrade(url)
    led = Ledger(connect(url))
    budgets = load_budgets(BUDGETS)
    led.sync_budgets(budgets, 0.0)
    now = time.time()
    w = led.submit(project="lattice", user="bob", kind="interactive", now=now - 100,
                   request={"kind": "gpu", "gpus": 1}, backend="hub")
    led.start(w.id, placement=[{"node": "n1", "gpu": 0}], milli=1000, backed=True,
              protected_until=now - 50, now=now - 100)
    for i, saved in enumerate((1, 0)):
        set_id, body = a_set(w.id, i + 10, reason="preempt", seconds=4.0)
        body["members"][0]["snapshot"] = body["members"][0]["snapshot"] if saved else None
        snapledger.record_set(led, {**body, "id": set_id}, now - 80 + i, "bob")
    state, _ = build_state(led, budgets.accounts, load_inventory(INVENTORY), budgets.policy, now,
                           sync_backends=frozenset())
    wl = next(x for x in state.running if x.id == w.id)
    assert wl.snapshot_reliability == pytest.approx(2 / 3)
    assert wl.snapshot_cost == pytest.approx(4.0 + RESTORE_COST_S + (1 / 3) * 100, rel=0.02)
