"""Drain end to end against the real service (a real process, registered with a real
JupyterHub; real jobs run by the local backend): an admin marks a node unhealthy through the
API while a protected session and an unprotected job run there. Nothing new lands on it; the
job is preempted and requeued elsewhere at once; the session keeps its protected time and is
asked to stop at its protected-until; the node then shows "drained: ready for repair", the
admin is told (notice, metrics), every step is in the audit log; undrain returns it to
service. The test plays the hub's part for the session (heartbeats, ending it when asked)."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.hub import ServiceProc, http

from .conftest import cleanup

INVENTORY = """\
nodes:
  - {name: n1, model: H100-80GB, gpus: 2}
  - {name: n2, model: H100-80GB, gpus: 2}
"""
PROTECT_S = 12


@pytest.fixture(scope="module")
def svc(hub, tokens, tmp_path_factory):
    d = tmp_path_factory.mktemp("drain")
    (d / "inventory.yaml").write_text(INVENTORY)
    s = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}", cycle_interval=0.5,
                    extra_args=["--GpuBudgetService.health_interval=0.5",
                                "--LocalBackend.stop_grace=2"])
    s.start()
    yield s
    cleanup(s, tokens["root"])


def until(pred, what: str, timeout: float = 20, every: float = 0.1):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(every)


def get(svc, path: str, token: str):  # noqa: ANN001, ANN201
    st, body = http("GET", svc.api + path, token)
    assert st == 200, (path, st, body)
    return body


def node(svc, name: str, token: str) -> dict:  # noqa: ANN001
    return get(svc, f"/nodes/{name}", token)


def nodes_of(w: dict) -> set[str]:
    return {s["node"] for s in (w.get("placement") or [])}


def health(svc, name: str, token: str, healthy: bool, reason: str):  # noqa: ANN001, ANN201
    st, body = http("PUT", f"{svc.api}/nodes/{name}/health", token,
                    {"healthy": healthy, "reason": reason})
    assert st == 200, body
    return body


def test_node_health_api_refuses_and_validates(svc, tokens):
    bob, root = tokens["bob"], tokens["root"]
    st, body = http("PUT", f"{svc.api}/nodes/n1/health", bob, {"healthy": False, "reason": "x"})
    assert st == 403 and "admin" in body["message"]
    assert http("PUT", f"{svc.api}/nodes/nope/health", root,
                {"healthy": False, "reason": "x"})[0] == 404
    for bad, field in [({"healthy": "no", "reason": "x"}, "healthy"),
                       ({"healthy": False}, "reason"), ({"healthy": False, "reason": "  "},
                                                        "reason"),
                       ({"healthy": True, "colour": 1}, "colour"), ([], "body")]:
        st, body = http("PUT", f"{svc.api}/nodes/n1/health", root, bad)
        assert st == 400 and body["field"] == field, (bad, body)
    assert http("GET", f"{svc.api}/nodes?tz=Mars/Olympus", root)[1]["field"] == "tz"
    n = get(svc, "/nodes", bob)["nodes"]
    assert [x["name"] for x in n] == ["n1", "n2"] and all(x["state"] == "in_service" for x in n)
    assert not any(x["can_act"] for x in n)  # plain users read only


def test_drain_end_to_end(svc, tokens):
    root, bob = tokens["root"], tokens["bob"]
    # keep n2 free while the session and the job start: both land on n1
    assert health(svc, "n2", root, False, "keep free for the test")["changed"]
    assert until(lambda: node(svc, "n2", root)["state"] == "ready_for_repair", "n2 empty")
    st, sess = http("POST", svc.api + "/sessions", root,
                    {"user": "bob", "project": "lattice", "gpus": 1,
                     "min_runtime": f"{PROTECT_S}s"})
    assert st == 201, sess
    sid = sess["id"]
    st, job = http("POST", svc.api + "/jobs", bob,
                   {"command": "sleep 300", "project": "lattice", "gpus": 1,
                    "resumable": True, "name": "unprotected"})
    assert st == 201, job
    jid = job["id"]
    s = until(lambda: (w := get(svc, f"/sessions/{sid}", root))["state"] == "running" and w,
              "session starts")
    j = until(lambda: (w := get(svc, f"/workloads/{jid}", bob))["state"] == "running" and w,
              "job starts")
    assert nodes_of(s) == nodes_of(j) == {"n1"}
    assert s["backed"] and s["protected_until"] > time.time()
    assert j["protected_left_s"] in (0, None)  # no protected time: unprotected
    health(svc, "n2", root, True, "done")
    assert node(svc, "n2", root)["state"] == "in_service"

    # n1 needs repair
    t0 = time.time()
    out = health(svc, "n1", root, False, "XID 79: GPU fell off the bus (test)")
    assert out["changed"] and not out["healthy"] and out["reason"].startswith("XID 79")
    # the unprotected job is preempted and requeued elsewhere at once
    j = until(lambda: (w := get(svc, f"/workloads/{jid}", bob))["preemptions"] == 1
              and w["state"] == "running" and w, "job requeued and restarted", timeout=15)
    assert nodes_of(j) == {"n2"}
    restarted = time.time() - t0
    assert restarted < 10, restarted
    pre = [d for d in get(svc, f"/decisions?kind=preempt&workload={jid}", root)["decisions"]]
    assert pre and pre[0]["reason"] == "node n1 is draining" and pre[0]["detail"]["requeued"]
    # the session keeps its protected time; n1 is draining until then
    n1 = node(svc, "n1", root)
    assert n1["state"] == "draining" and n1["protected_until"] == s["protected_until"]
    assert "protected work until" in n1["state_text"] and n1["protected_until_text"]
    hb = http("POST", f"{svc.api}/sessions/{sid}/heartbeat", root)[1]
    assert hb["state"] == "running" and not hb["preempt_requested"]
    # nothing new lands on n1: two more 1-GPU jobs — one fits on n2, one must wait
    more = [http("POST", svc.api + "/jobs", bob,
                 {"command": "sleep 300", "project": "lattice", "gpus": 1, "name": f"new{i}"}
                 )[1]["id"] for i in range(2)]
    until(lambda: sum(get(svc, f"/workloads/{w}", bob)["state"] == "running"
                      for w in more) == 1, "one new job starts")
    time.sleep(1.5)  # a few more cycles
    states = {w: get(svc, f"/workloads/{w}", bob) for w in more}
    assert sorted(w["state"] for w in states.values()) == ["pending", "running"]
    for w in states.values():
        assert "n1" not in nodes_of(w)
    waiting = next(w for w in states.values() if w["state"] == "pending")
    q = get(svc, "/queue/detail", root)
    why = {p["id"]: p for p in q["pending"]}[waiting["id"]]
    assert why["why"] == "capacity" and "1 whole GPU" in why["why_text"], why
    ses_row = {r["id"]: r for r in q["running"]}[sid]
    assert ses_row["protected_until"] == s["protected_until"] and ses_row["nodes"] == ["n1"]
    assert ses_row["cost_gpu_hours"] > 0

    # at its protected-until, the session is asked to stop (the hub then stops the server)
    def asked() -> dict | None:
        b = http("POST", f"{svc.api}/sessions/{sid}/heartbeat", root)[1]
        return b if b.get("preempt_requested") else None

    hb = until(asked, "session asked to stop", timeout=PROTECT_S + 15, every=0.2)
    asked_at = time.time()
    assert asked_at >= s["protected_until"] - 0.1, (asked_at, s["protected_until"])
    assert asked_at - s["protected_until"] < 5
    assert "draining" in hb["preempt_requested"]
    assert node(svc, "n1", root)["state"] == "draining"  # it still holds its slice
    st, _ = http("DELETE", f"{svc.api}/sessions/{sid}?reason=preempt", root)
    assert st == 200
    n1 = until(lambda: (n := node(svc, "n1", root))["state"] == "ready_for_repair" and n,
               "n1 ready for repair")
    assert n1["state_text"] == "drained: ready for repair" and n1["running"] == 0
    assert n1["drained_at"] and n1["drained_at_text"]
    # the admin is told: a notice, the audit log, the metrics
    nodes = until(lambda: (b := get(svc, "/nodes", root))["notices"] and b, "notice")
    assert [n["node"] for n in nodes["notices"]] == ["n1"]
    assert "ready for repair" in nodes["notices"][0]["message"]
    assert get(svc, "/nodes", bob)["notices"] == []  # only admins
    audit = get(svc, "/decisions?q=n1", root)["decisions"]
    kinds = [d["kind"] for d in audit]
    # unhealthy, then the core's drain (nothing protected left), then ready for repair
    assert kinds.index("repair") < kinds.index("drain") < kinds.index("health"), kinds
    drain = next(d for d in audit if d["kind"] == "drain")
    assert drain["reason"].startswith("XID 79") and drain["node"] == "n1"
    repair = next(d for d in audit if d["kind"] == "repair")
    assert "ready for repair" in repair["reason"] and repair["node"] == "n1"
    assert repair["at_local"] and repair["at_text"]
    st, metrics = http("GET", svc.base + "/metrics", root)
    assert 'gpubudget_node_state{node="n1",state="ready_for_repair"} 1.0' in metrics
    assert 'gpubudget_nodes{state="ready_for_repair"} 1.0' in metrics
    assert "gpubudget_node_drains_total 2.0" in metrics  # n2 earlier, n1 now
    assert 'gpubudget_gpus{state="drained"} 2.0' in metrics

    # undrain: n1 takes work again (the waiting job starts there)
    out = health(svc, "n1", root, True, "GPU reseated")
    assert out["state"] == "in_service" and out["changed"]
    w = until(lambda: (x := get(svc, f"/workloads/{waiting['id']}", bob))["state"] == "running"
              and x, "waiting job starts on n1")
    assert nodes_of(w) == {"n1"}
    undrain = get(svc, "/decisions?kind=undrain", root)["decisions"]
    assert undrain[0]["node"] == "n1" and "GPU reseated" in undrain[0]["reason"]
    assert undrain[0]["actor"] == "root"
    for wid in [jid, *more]:
        http("DELETE", f"{svc.api}/jobs/{wid}", bob)
