"""The service under attack and under trouble, each case as it was found (issue "Safe to
deploy", part B), against the real service process and a real JupyterHub:

- one preempted session must not wedge every cycle (its slice stays held until it is gone);
- an admin's usage event cannot start work on an occupied GPU;
- a session that never sends a heartbeat is charged for the time it held its slice;
- a manager cannot raise the grant of the account they manage, nor overspend it below;
- only gpubudget's own scopes count, and they bound admins too;
- a locked ledger blocks neither the event loop nor /healthz, and is reported;
- an Idempotency-Key reused with another body is refused;
- a long-poll never spins: a finished session is answered at once, waiters sleep;
- the ledger URL can stay out of the command line;
- a policy edit in the budgets file applies to scheduling, not only to quotes.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.fixtures.hub import BUDGETS, ServiceProc, http, start_hub

STALE_S = 4


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("sechub"))
    yield h
    h.stop()


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: hub.token(u) for u in ("root", "alice", "bob", "dave", "erin", "mallory")}


@pytest.fixture(scope="module")
def svc(hub, tokens, tmp_path_factory):
    from tests.service.conftest import cleanup

    d = tmp_path_factory.mktemp("secsvc")
    s = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}", db_via_env=True,
                    extra_env={"GPUBUDGET_SESSION_STALE_S": str(STALE_S)})
    s.start()
    yield s
    cleanup(s, tokens["root"])


def get(svc, tok, path):  # noqa: ANN001, ANN201
    return http("GET", svc.api + path, tok)


def wait_for(pred, what: str, timeout: float = 30):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def session(svc, root, user, project, sl="gpu:2", **kw) -> str:  # noqa: ANN001
    st, s = http("POST", svc.api + "/sessions", root,
                 {"user": user, "project": project, "slice": sl, **kw})
    assert st == 201, s
    return s["id"]


def state_of(svc, root, wid) -> dict:  # noqa: ANN001
    st, s = get(svc, root, f"/sessions/{wid}")
    assert st == 200, s
    return s


def end(svc, root, wid, reason="stop") -> None:  # noqa: ANN001
    http("DELETE", f"{svc.api}/sessions/{wid}?reason={reason}", root)


# ---------------------------------------------------------------------------- item 4
def test_a_preempted_session_holds_its_slice_and_scheduling_goes_on(svc, tokens):
    root = tokens["root"]
    bob = session(svc, root, "bob", "lattice", min_runtime="1h")
    wait_for(lambda: state_of(svc, root, bob)["state"] == "running", "bob not running")
    http("POST", f"{svc.api}/sessions/{bob}/heartbeat", root)
    st, _ = http("POST", f"{svc.api}/sessions/{bob}/idle", root, {"idle_s": 7200})
    assert st == 200  # idle: unprotected, yields to any backed work
    dave = session(svc, root, "dave", "astro", min_runtime="1h")
    wait_for(lambda: state_of(svc, root, bob)["preempt_requested"], "bob not asked to stop")
    # bob's server has not stopped yet: dave waits, with a predicted start, for several cycles
    for _ in range(6):
        time.sleep(0.5)
        d = state_of(svc, root, dave)
        assert d["state"] == "pending", d
        assert state_of(svc, root, bob)["state"] == "running"
    assert d["predicted_start"] is not None
    # scheduling goes on for everyone else, and the service is healthy
    erin = session(svc, root, "erin", "genomics", sl="cpu")
    wait_for(lambda: state_of(svc, root, erin)["state"] == "running", "cycles are wedged")
    st, health = get(svc, None, "/healthz")
    assert st == 200 and health["status"] == "ok", health
    # bob's server stops: only now does dave get the GPUs
    end(svc, root, bob, "preempt")
    wait_for(lambda: state_of(svc, root, dave)["state"] == "running", "dave never started")
    assert state_of(svc, root, bob)["state"] == "preempted"
    assert get(svc, None, "/healthz")[0] == 200
    # a usage event cannot put work on a GPU dave holds
    st, out = http("POST", svc.api + "/usage/events", root,
                   {"workload": "ext-on-dave", "event": "start", "at": time.time(),
                    "project": "astro", "user": "dave", "milli": 1000,
                    "placement": [{"node": "n1", "gpu": 0}]})
    assert st == 409 and out["field"] == "placement" and "held" in out["message"], out
    assert get(svc, root, "/workloads/ext-on-dave")[0] == 404
    for wid in (dave, erin):
        end(svc, root, wid)


# ---------------------------------------------------------------------------- item 5
def test_a_session_without_heartbeats_is_charged_for_the_time_it_held_its_slice(svc, tokens):
    root = tokens["root"]
    wid = session(svc, root, "bob", "lattice", min_runtime="1h")

    def workload() -> dict:  # (not a session endpoint: reading it vouches for nothing)
        return get(svc, root, f"/workloads/{wid}")[1]

    wait_for(lambda: workload()["state"] == "running", "not running")
    # no heartbeat, no long-poll: the service ends it after STALE_S (checked every STALE_S/2)
    s = wait_for(lambda: (x := workload())["state"] == "failed" and x, "never reaped",
                 timeout=STALE_S * 4)
    led = Ledger(connect(svc.db_url, read_only=True))
    (ch,) = led.charges(workload=wid)
    held = ch.end - ch.start
    assert held >= STALE_S - 0.5, held  # not 0 GPU-hours: the slice was held all along
    assert ch.milli == 2000 and ch.end == pytest.approx(s["ended_at"])


# ---------------------------------------------------------------------------- item 7
def test_a_manager_redistributes_below_and_within_what_they_manage(svc, tokens):
    alice, root = tokens["alice"], tokens["root"]  # alice manages physics (100 GPU-h)
    before = get(svc, root, "/accounts/physics/grants")[1]["versions"]
    st, out = http("PUT", svc.api + "/accounts/physics/grant", alice, {"grant_hours": 1e9})
    assert st == 403 and "only an admin" in out["message"], out
    st, out = http("PUT", svc.api + "/accounts/lattice/grant", alice, {"grant_hours": 1e9})
    assert st == 403 and "physics" in out["message"], out
    assert get(svc, root, "/accounts/physics/grants")[1]["versions"] == before
    st, out = http("PUT", svc.api + "/accounts/lattice/grant", alice,
                   {"grant_hours": 55, "note": "within physics"})
    assert st == 200, out
    # an admin may change physics itself
    st, out = http("PUT", svc.api + "/accounts/physics/grant", root, {"grant_hours": 120})
    assert st == 200, out
    http("PUT", svc.api + "/accounts/physics/grant", root, {"grant_hours": 100})
    http("PUT", svc.api + "/accounts/lattice/grant", root, {"grant_hours": 60})


# ---------------------------------------------------------------------------- item 8
def test_only_gpubudget_scopes_count_and_they_bound_admins(svc, hub, tokens):
    # another service's access scope: nothing here
    st, out = http("POST", f"{hub.api}/users/mallory/tokens", hub.admin_token,
                   {"scopes": ["access:services!service=harness"]})
    assert st == 201, out
    st, out = get(svc, out["token"], "/accounts")
    assert st == 403, out
    # root is a gpubudget admin, but this token of theirs may only read
    read_only = hub.token("root", scopes=["custom:gpubudget:read"])
    st, out = get(svc, read_only, "/accounts")
    assert st == 200 and out["accounts"] == [], out  # root charges no project itself
    before = get(svc, tokens["root"], "/accounts/lattice/grants")[1]["versions"]
    st, out = http("PUT", svc.api + "/accounts/lattice/grant", read_only, {"grant_hours": 1e6})
    assert st == 403, out
    st, out = http("POST", svc.api + "/usage/events", read_only,
                   {"workload": "x-scope", "event": "start", "at": 1.0, "project": "astro",
                    "user": "dave", "milli": 0})
    assert st == 403, out
    assert get(svc, tokens["root"], "/accounts/lattice/grants")[1]["versions"] == before


# ---------------------------------------------------------------------------- item 10
def test_a_locked_ledger_blocks_nothing_and_is_reported(svc, tokens):
    path = svc.db_url.removeprefix("sqlite:///")
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(30)
        conn.execute("ROLLBACK")
        conn.close()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert locked.wait(10)
    try:
        st, out = http("POST", svc.api + "/jobs", tokens["bob"],
                       {"command": "true", "project": "lattice", "gpus": 0}, timeout=30)
        assert st == 503 and out["message"].startswith("ledger unavailable"), out
        # while the lock is held the event loop answers (health is not behind the ledger)
        st, health = http("GET", svc.api + "/healthz", timeout=3)
        assert st == 503 and "ledger unavailable" in health["message"], health
        assert get(svc, tokens["bob"], "/jobs")[0] == 200  # reads go on (WAL)
    finally:
        release.set()
        t.join()
    st, out = http("POST", svc.api + "/jobs", tokens["bob"],
                   {"command": "true", "project": "lattice", "gpus": 0})
    assert st == 201, out
    wait_for(lambda: get(svc, None, "/healthz")[0] == 200, "health did not recover")


def test_retry_after_is_sent_with_503(svc, tokens):
    import urllib.error
    import urllib.request

    path = svc.db_url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        req = urllib.request.Request(svc.api + "/jobs", method="POST",
                                     data=b'{"command": "true", "project": "lattice"}',
                                     headers={"Authorization": f"token {tokens['bob']}"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 503 and int(e.value.headers["Retry-After"]) > 0
    finally:
        conn.execute("ROLLBACK")
        conn.close()


# ---------------------------------------------------------------------------- low items
def test_an_idempotency_key_reused_with_another_body_is_refused(svc, tokens):
    bob = tokens["bob"]
    a = {"command": "true", "project": "lattice", "gpus": 0, "name": "idem-a"}
    b = {**a, "name": "idem-b"}
    h = {"Idempotency-Key": "reused-key"}
    st1, r1 = http("POST", svc.api + "/jobs", bob, a, headers=h)
    st2, r2 = http("POST", svc.api + "/jobs", bob, b, headers=h)
    st3, r3 = http("POST", svc.api + "/jobs", bob, a, headers=h)
    assert st1 == 201 and st3 == 201 and r3["id"] == r1["id"]
    assert st2 == 422 and r2["field"] == "Idempotency-Key", r2
    names = [j["name"] for j in get(svc, bob, "/jobs")[1]["jobs"]]
    assert names.count("idem-a") == 1 and "idem-b" not in names


def cpu_seconds(pid: int) -> float:
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_long_polls_answer_finished_sessions_at_once_and_never_spin(svc, tokens):
    root = tokens["root"]
    done = session(svc, root, "erin", "genomics", sl="cpu")
    wait_for(lambda: state_of(svc, root, done)["state"] == "running", "not running")
    end(svc, root, done)
    t0 = time.monotonic()
    st, s = get(svc, root, f"/sessions/{done}?wait=30")
    assert st == 200 and s["state"] == "done"
    assert time.monotonic() - t0 < 15  # not held for the full 30 s

    # 20 waiters on a queued session (more GPUs than the cluster has free: it stays queued)
    hog = session(svc, root, "bob", "lattice", min_runtime="1h")
    wait_for(lambda: state_of(svc, root, hog)["state"] == "running", "hog not running")
    queued = session(svc, root, "dave", "astro", min_runtime="1h")
    assert state_of(svc, root, queued)["state"] == "pending"
    assert svc.proc is not None
    cpu0 = cpu_seconds(svc.proc.pid)
    threads = [threading.Thread(target=get, args=(svc, root, f"/sessions/{queued}?wait=5"))
               for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    used = cpu_seconds(svc.proc.pid) - cpu0
    # polling the ledger every 10 ms for 5 s in 20 requests burnt ~4.6 CPU-seconds
    assert used < 1.5, used
    for wid in (queued, hog):
        end(svc, root, wid)


def test_the_ledger_url_stays_out_of_the_command_line(svc):
    assert svc.proc is not None
    cmdline = Path(f"/proc/{svc.proc.pid}/cmdline").read_bytes().decode()
    assert "ledger.sqlite" not in cmdline and "--db" not in cmdline
    # it found its ledger through the environment: that file holds what the API was told
    led = Ledger(connect(svc.db_url, read_only=True))
    assert any(w.name == "idem-a" for w in led.workloads(user="bob"))


def test_a_policy_edit_applies_to_scheduling(svc, tokens):
    bob = tokens["bob"]
    budgets = svc.dir / "budgets.yaml"

    def protected_for(name: str) -> float:
        st, j = http("POST", svc.api + "/jobs", bob,
                     {"command": "sleep 60", "project": "lattice", "gpus": 0,
                      "min_runtime": "1d", "name": name})
        assert st == 201, j
        j = wait_for(lambda: (x := get(svc, bob, f"/workloads/{j['id']}")[1])["state"]
                     == "running" and x, "job not started")
        http("DELETE", f"{svc.api}/jobs/{j['id']}", bob)
        return j["protected_until"] - j["started_at"]

    assert protected_for("cap-2d") == pytest.approx(86400)  # 1 d asked, batch cap 2 d
    budgets.write_text(BUDGETS.replace("batch: 2d", "batch: 4h"))
    time.sleep(1.1)  # a new mtime
    try:
        st, offer = get(svc, bob, "/sessions/offer?quotes=0")
        assert st == 200
        assert protected_for("cap-4h") == pytest.approx(4 * 3600)
    finally:
        budgets.write_text(BUDGETS)
