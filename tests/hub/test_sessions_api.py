"""The service's session endpoints (jupyter_gpubudget/service/sessions.py), which BudgetSpawner
uses, against a real JupyterHub (tokens, scopes) and the real service process."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.hub.hubproc import require_hub_parts


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    require_hub_parts()
    from tests.fixtures.hub import ServiceProc, start_hub

    hub = start_hub(tmp_path_factory.mktemp("shub"))
    d = tmp_path_factory.mktemp("ssvc")
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}")
    svc.start()
    tokens = {u: hub.token(u) for u in ("root", "bob", "dave", "mallory")}
    yield hub, svc, tokens
    svc.stop()
    hub.stop()


def call(method, url, token, body=None):  # noqa: ANN001, ANN201
    from tests.fixtures.hub import http

    return http(method, url, token, body)


def wait_state(svc, tok, wid, state, timeout=30):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        st, s = call("GET", f"{svc.api}/sessions/{wid}", tok)
        assert st == 200, s
        if s["state"] == state:
            return s
        assert time.monotonic() < deadline, s
        time.sleep(0.1)


def test_offer_is_per_user(env):
    hub, svc, t = env
    st, offer = call("GET", svc.api + "/sessions/offer", t["bob"])
    assert st == 200 and offer["user"] == "bob" and offer["projects"] == ["lattice"]
    assert offer["inventory"] == "declared"
    assert set(offer["quotes"]["lattice"]) == {c["key"] for c in offer["choices"]}
    st, out = call("GET", svc.api + "/sessions/offer?user=dave", t["bob"])
    assert st == 403 and "act for another user" in out["message"]
    st, offer = call("GET", svc.api + "/sessions/offer?user=dave", t["root"])
    assert st == 200 and offer["projects"] == ["astro"]


def test_refusals_name_the_reason_and_change_nothing(env):
    hub, svc, t = env
    cases = [
        ("bob", {"user": "bob", "project": "astro", "gpus": 1}, 403, "not a member of project"),
        ("bob", {"user": "dave", "project": "astro", "gpus": 1}, 403, "for another user"),
        ("bob", {"user": "bob", "project": "physics", "gpus": 1}, 400, "is a program"),
        ("bob", {"user": "bob", "project": "nope", "gpus": 1}, 400, "no project"),
        ("bob", {"user": "bob", "project": "lattice", "slice": "1g.10gb"}, 400, "MIG"),
        ("bob", {"user": "bob", "project": "lattice", "gpus": 3}, 400, "2 whole GPUs"),
        ("bob", {"user": "bob", "project": "lattice", "colour": "red"}, 400, "unknown field"),
        ("mallory", {"user": "mallory", "project": "lattice", "gpus": 1}, 403, "scope"),
    ]
    for who, body, status, words in cases:
        st, out = call("POST", svc.api + "/sessions", t[who], body)
        assert st == status and words in out["message"], (body, st, out)
    st, out = call("GET", svc.api + "/sessions", t["root"])
    assert out["sessions"] == []


def test_session_lifecycle_launches_nothing_locally_and_charges(env):
    hub, svc, t = env
    st, s = call("POST", svc.api + "/sessions", t["root"],
                 {"user": "bob", "project": "lattice", "slice": "gpu:1", "min_runtime": "30m"})
    assert st == 201, s
    wid = s["id"]
    s = wait_state(svc, t["bob"], wid, "running")
    assert s["backend"] == "hub" and s["placement"][0]["node"] == "n1"
    assert s["protected_left_s"] > 0 and s["preempt_requested"] is None
    assert not (svc.dir / "jobs" / wid).exists()  # the spawner starts the server, not the service
    assert call("GET", f"{svc.api}/sessions/{wid}", t["dave"])[0] == 403
    assert call("GET", f"{svc.api}/sessions/nope", t["bob"])[0] == 404
    st, beat = call("POST", f"{svc.api}/sessions/{wid}/heartbeat", t["root"])
    assert st == 200 and beat["state"] == "running"

    st, idle = call("POST", f"{svc.api}/sessions/{wid}/idle", t["root"],
                    {"idle_s": 4000, "source": "kernel activity"})
    assert st == 200 and idle["idle_reported"] and idle["protected_left_s"] in (0, 0.0, None)
    st, done = call("DELETE", f"{svc.api}/sessions/{wid}?reason=cull", t["root"])
    assert st == 200 and done["state"] == "done"
    st, again = call("DELETE", f"{svc.api}/sessions/{wid}?reason=stop", t["root"])
    assert st == 200 and again["state"] == "done"  # idempotent: charges nothing more
    led = Ledger(connect(svc.db_url, read_only=True))
    (ch,) = led.charges(workload=wid)
    assert ch.end is not None and ch.closed_by == "cull" and ch.milli == 1000


def test_pending_session_can_be_withdrawn(env):
    hub, svc, t = env
    ids = []
    for _ in range(3):  # two GPUs: the third waits
        st, s = call("POST", svc.api + "/sessions", t["root"],
                     {"user": "dave", "project": "astro", "gpus": 1})
        assert st == 201
        ids.append(s["id"])
    wait_state(svc, t["dave"], ids[0], "running")
    wait_state(svc, t["dave"], ids[1], "running")
    s = wait_state(svc, t["dave"], ids[2], "pending")
    deadline = time.monotonic() + 10
    while s["queue_position"] is None and time.monotonic() < deadline:
        time.sleep(0.2)
        s = call("GET", f"{svc.api}/sessions/{ids[2]}", t["dave"])[1]
    assert s["queue_position"] == 1 and s["predicted_start"] is not None
    assert call("POST", f"{svc.api}/sessions/{ids[2]}/idle", t["root"], {"idle_s": 1})[0] == 409
    st, out = call("DELETE", f"{svc.api}/sessions/{ids[2]}?reason=timeout", t["root"])
    assert st == 200 and out["state"] == "cancelled"
    for wid in ids[:2]:
        assert call("DELETE", f"{svc.api}/sessions/{wid}", t["dave"])[1]["state"] == "done"
    led = Ledger(connect(svc.db_url, read_only=True))
    assert led.charges(workload=ids[2]) == []  # withdrawn while queued: never charged



def test_a_restarted_service_settles_sessions_the_hub_has_no_server_for(env):
    """The hub stops its services before the users' servers: a server stopped meanwhile could
    not end its session. On start, the service reads the hub's servers and closes every
    session with no server behind it at its last heartbeat (here: no hub server at all)."""
    hub, svc, t = env
    st, s = call("POST", svc.api + "/sessions", t["root"],
                 {"user": "bob", "project": "lattice", "slice": "gpu:1", "name": "bob/"})
    assert st == 201, s
    wid = s["id"]
    wait_state(svc, t["bob"], wid, "running")
    st, beat = call("POST", f"{svc.api}/sessions/{wid}/heartbeat", t["root"])
    assert st == 200
    led = Ledger(connect(svc.db_url, read_only=True))
    (open_charge,) = led.charges(workload=wid)
    last_beat = open_charge.checkpoint
    svc.kill9()
    time.sleep(1.5)  # the phantom would be charged for this time, and more
    svc.start()
    s = wait_state(svc, t["bob"], wid, "done")
    assert "reconciled with the hub" in s["reason"]
    (ch,) = led.charges(workload=wid)
    assert ch.end == last_beat  # charged until the last heartbeat, not until the restart
