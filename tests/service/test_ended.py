"""`GET /workloads/me/ended`: what my ended work cost and to which project — so a session
that was just stopped is never shown as free (a new user's view). Real service, real hub tokens,
real ledger."""

from __future__ import annotations

import time

from tests.fixtures.hub import http


def _wait(fn, what: str, timeout: float = 30.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_stopped_session_reports_its_cost(service, tokens):
    root, bob = tokens["root"], tokens["bob"]
    st, s = http("POST", service.api + "/sessions", root,
                 {"user": "bob", "project": "lattice", "gpus": 1, "min_runtime": "1h",
                  "name": "short"})
    assert st == 201, s
    _wait(lambda: http("GET", f"{service.api}/sessions/{s['id']}", root)[1]["state"]
          == "running", "the session to start")
    _wait(lambda: time.time() - http("GET", f"{service.api}/sessions/{s['id']}", root)[1]
          ["started_at"] > 1.0, "a second of running")
    st, out = http("DELETE", f"{service.api}/sessions/{s['id']}?reason=stop", root)
    assert st == 200, out
    st, body = http("GET", service.api + "/workloads/me/ended", bob)
    assert st == 200 and body["user"] == "bob", body
    w = body["workloads"][0]  # newest first
    assert (w["id"], w["project"], w["state"]) == (s["id"], "lattice", "done")
    ran = w["ended_at"] - w["started_at"]
    assert w["ran_s"] == ran > 1.0
    assert abs(w["charged_gpu_hours"] - ran / 3600) < 1e-6, w  # one whole GPU
    assert w["ended_at_local"] and "charged_gpu_hours" in w
    assert len(http("GET", service.api + "/workloads/me/ended?limit=1", bob)[1]
               ["workloads"]) == 1
    # someone else's: admins only; a bad limit names the field; nothing for a stranger
    assert http("GET", service.api + "/workloads/me/ended?user=bob", tokens["dave"])[0] == 403
    st, other = http("GET", service.api + "/workloads/me/ended?user=bob", root)
    assert st == 200 and other["workloads"][0]["id"] == s["id"]
    for bad in ("0", "51", "x", "-1"):
        st, err = http("GET", service.api + f"/workloads/me/ended?limit={bad}", bob)
        assert st == 400 and err["field"] == "limit", (bad, err)
    assert http("GET", service.api + "/workloads/me/ended", tokens["dave"])[1]["workloads"] == []
