"""Every endpoint x (user, the same user with a read-only token, project manager, admin, another
project's user, no token, expired token): the status, a reason on every 403, and no state
change on a refusal. A session's changes (end, idle, heartbeat, snapshot, restore reports)
need the submit scope of the session's own user (or an admin); its reads need only read."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.hub import http

CALLERS = ["user", "reader", "manager", "admin", "other", "none", "expired"]
WHO = {"user": "bob", "manager": "alice", "admin": "root", "other": "dave"}
JOB = {"command": "sleep 3", "project": "lattice", "gpus": 0}


@pytest.fixture(scope="module")
def creds(hub, tokens):
    expired = hub.token("bob", expires_in=1)
    time.sleep(2.5)  # let it expire (no timing is asserted)
    t = {k: tokens[u] for k, u in WHO.items()}
    t["none"] = None
    t["expired"] = expired
    t["reader"] = hub.token("bob", scopes=["custom:gpubudget:read"])  # a dashboard's token
    return t


@pytest.fixture(scope="module")
def bobs_job(service, creds):
    status, body = http("POST", service.api + "/jobs", creds["user"], JOB)
    assert status == 201, body
    return body["id"]


def running_session(svc, creds) -> str:
    """A running interactive session of bob's (started for him by the admin, as the spawner
    does), once the scheduler has granted its GPU."""
    st, s = http("POST", svc.api + "/sessions", creds["admin"],
                 {"user": "bob", "project": "lattice", "slice": "gpu:1", "min_runtime": "1h",
                  "name": "bob/"})
    assert st == 201, s
    deadline = time.monotonic() + 60
    while s["state"] != "running":
        assert time.monotonic() < deadline, s
        s = http("GET", f"{svc.api}/sessions/{s['id']}?wait=2", creds["admin"])[1]
    return s["id"]


@pytest.fixture(scope="module")
def bobs_session(service, creds):
    return running_session(service, creds)


def expect(**kw: int) -> dict[str, int]:
    """Statuses by caller; the read-only token ("reader") gets what bob's full token gets
    unless it is named (every change is named: the read scope changes nothing)."""
    base = {"none": 403, "expired": 403}
    base.update(kw)
    base.setdefault("reader", base.get("user", 403))
    return base


ALL_READERS = expect(user=200, manager=200, admin=200, other=200)
LATTICE_READERS = expect(user=200, manager=200, admin=200, other=403)
ADMIN_ONLY = expect(user=403, manager=403, admin=200, other=403)

# (name, method, path, body, expected) -- {job} is bob's job
MATRIX = [
    ("healthz", "GET", "/healthz", None, {c: 200 for c in CALLERS}),
    ("openapi", "GET", "/openapi.json", None, {c: 200 for c in CALLERS}),
    ("accounts", "GET", "/accounts", None, ALL_READERS),
    ("account", "GET", "/accounts/lattice", None, LATTICE_READERS),
    ("grants", "GET", "/accounts/lattice/grants", None, LATTICE_READERS),
    ("usage", "GET", "/accounts/lattice/usage", None, LATTICE_READERS),
    ("own program usage", "GET", "/accounts/physics/usage", None, ALL_READERS),
    ("foreign program", "GET", "/accounts/biology/usage", None, ADMIN_ONLY),
    ("unknown account", "GET", "/accounts/nope", None, expect(user=404, manager=404, admin=404,
                                                              other=404)),
    ("set grant", "PUT", "/accounts/lattice/grant", {"grant_hours": 55},
     expect(user=403, reader=403, manager=200, admin=200, other=403)),
    ("my workloads", "GET", "/workloads/me", None, ALL_READERS),
    ("a workload", "GET", "/workloads/{job}", None,
     expect(user=200, manager=403, admin=200, other=403)),
    ("queue", "GET", "/queue", None, ALL_READERS),
    ("my jobs", "GET", "/jobs", None, ALL_READERS),
    ("submit", "POST", "/jobs", JOB,
     expect(user=201, reader=403, manager=201, admin=201, other=403)),
    ("notices", "GET", "/notices", None, ALL_READERS),
    ("usage events", "POST", "/usage/events",
     {"workload": "ext-{caller}", "event": "start", "at": 1000.0, "project": "astro",
      "user": "dave", "milli": 1000}, ADMIN_ONLY),
    # the audit trail: admins, and managers (alice manages physics); the users of projects
    # (bob, dave) nothing, even with a valid token
    ("audit", "GET", "/audit", None, expect(user=403, manager=200, admin=200, other=403)),
    ("audit csv", "GET", "/audit?format=csv", None,
     expect(user=403, manager=200, admin=200, other=403)),
    ("audit of a foreign account", "GET", "/audit?account=biology", None,
     expect(user=403, manager=400, admin=200, other=403)),
    # bob's running session: read with the read scope, changed only with submit (or admin)
    ("a session", "GET", "/sessions/{session}", None,
     expect(user=200, manager=403, admin=200, other=403)),
    ("session snapshots", "GET", "/sessions/{session}/snapshots", None,
     expect(user=200, manager=403, admin=200, other=403)),
    ("heartbeat", "POST", "/sessions/{session}/heartbeat", {"gpu_utilisation": 5},
     expect(user=200, reader=403, manager=403, admin=200, other=403)),
    ("snapshot now", "POST", "/sessions/{session}/snapshots", {},
     expect(user=202, reader=403, manager=403, admin=202, other=403)),
    ("request failed", "POST", "/sessions/{session}/requests/0123456789ab", {"error": "x"},
     expect(user=200, reader=403, manager=403, admin=200, other=403)),
    ("restore report", "POST", "/sessions/{session}/restored", {"summary": "nothing"},
     expect(user=200, reader=403, manager=403, admin=200, other=403)),
    ("snapshot lost", "POST", "/sessions/{session}/lost", {"reason": "a test"},
     expect(user=200, reader=403, manager=403, admin=200, other=403)),
    # last of the session's: it ends its protection
    ("idle", "POST", "/sessions/{session}/idle", {"idle_s": 60},
     expect(user=200, reader=403, manager=403, admin=200, other=403)),
]

#: the scope a refusal names, by entry, where the caller's token lacks it
NAMES_SCOPE = {"set grant": "custom:gpubudget:manage", "submit": "custom:gpubudget:submit",
               "heartbeat": "custom:gpubudget:submit", "snapshot now": "custom:gpubudget:submit",
               "request failed": "custom:gpubudget:submit",
               "restore report": "custom:gpubudget:submit",
               "snapshot lost": "custom:gpubudget:submit", "idle": "custom:gpubudget:submit"}


def snapshot(svc, creds) -> tuple:
    """Observable state a refusal must not change: grant versions, everyone's workloads (ids
    and whether cancelled; the scheduler moves the others on by itself), bob's sessions (state,
    protection, idle report, snapshot requests and what is recorded of them)."""
    g = http("GET", svc.api + "/accounts/lattice/grants", creds["admin"])[1]["versions"]
    ws = []
    for c in ("user", "manager", "admin", "other"):
        ws += [(w["id"], w["state"] == "cancelled")
               for w in http("GET", svc.api + "/workloads/me", creds[c])[1]["workloads"]]
    ss = []
    for s in http("GET", svc.api + "/sessions?user=bob", creds["admin"])[1]["sessions"]:
        snaps = http("GET", f"{svc.api}/sessions/{s['id']}/snapshots", creds["admin"])[1]
        ss.append((s["id"], s["state"], s["protected_until"], s["idle_reported"],
                   s.get("snapshot_lost"), len(snaps["requests"])))
    return g, sorted(ws), sorted(ss, key=repr)


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("name,method,path,body,expected", MATRIX, ids=[m[0] for m in MATRIX])
def test_matrix(service, creds, bobs_job, bobs_session, caller, name, method, path, body,
                expected):
    url = service.api + path.format(job=bobs_job, session=bobs_session)
    if isinstance(body, dict):
        body = {k: (v.format(caller=caller) if isinstance(v, str) else v) for k, v in body.items()}
    before = snapshot(service, creds)
    status, out = http(method, url, creds[caller], body)
    assert status == expected[caller], (caller, name, status, out)
    if status == 403:
        assert isinstance(out, dict) and out.get("message"), out  # a reason
        if caller == "reader" and name in NAMES_SCOPE:
            assert NAMES_SCOPE[name] in out["message"], out
    if status >= 400:
        assert snapshot(service, creds) == before


@pytest.mark.parametrize("caller,expected", [("user", 200), ("reader", 403), ("manager", 403),
                                             ("admin", 200), ("other", 403), ("none", 403),
                                             ("expired", 403)])
def test_end_session_matrix(service, creds, caller, expected):
    """Ending a running session (what stops its server) needs submit for its own user."""
    sid = running_session(service, creds)
    try:
        for reason in ("stop", "preempt", "hibernate", "cull"):
            status, out = http("DELETE", f"{service.api}/sessions/{sid}?reason={reason}",
                               creds[caller])
            if expected == 200:
                assert status == 200 and out["state"] in ("done", "preempted"), out
                break
            assert status == 403 and out.get("message"), out
            if caller == "reader":
                assert "custom:gpubudget:submit" in out["message"], out
            s = http("GET", f"{service.api}/sessions/{sid}", creds["admin"])[1]
            assert s["state"] == "running" and s["ended_at"] is None, s
    finally:
        http("DELETE", f"{service.api}/sessions/{sid}", creds["admin"])


def test_a_read_only_token_changes_nothing_of_a_running_session(service, creds):
    """A dashboard's token (custom:gpubudget:read) tries every change to its own user's
    running session: each is a 403 naming the submit scope, and the session is as it was
    (still running, still protected, no idle report, no snapshot request, no loss)."""
    sid = running_session(service, creds)
    ro = creds["reader"]
    try:
        before = http("GET", f"{service.api}/sessions/{sid}", creds["admin"])[1]
        calls = [("DELETE", f"/sessions/{sid}", None),
                 ("DELETE", f"/sessions/{sid}?reason=preempt", None),
                 ("POST", f"/sessions/{sid}/idle", {"idle_s": 3600}),
                 ("POST", f"/sessions/{sid}/heartbeat", {}),
                 ("POST", f"/sessions/{sid}/snapshots", {}),
                 ("POST", f"/sessions/{sid}/requests/0123456789ab", {"error": "x"}),
                 ("POST", f"/sessions/{sid}/restored", {"summary": "x"}),
                 ("POST", f"/sessions/{sid}/lost", {"reason": "x"})]
        for method, path, body in calls:
            status, out = http(method, service.api + path, ro, body)
            assert status == 403 and "custom:gpubudget:submit" in out["message"], \
                (method, path, status, out)
        after = http("GET", f"{service.api}/sessions/{sid}", creds["admin"])[1]
        keep = ("state", "ended_at", "protected_until", "idle_reported", "preempt_requested")
        assert {k: after[k] for k in keep} == {k: before[k] for k in keep}
        assert after["state"] == "running" and after["idle_reported"] is None
        snaps = http("GET", f"{service.api}/sessions/{sid}/snapshots", ro)
        assert snaps[0] == 200 and snaps[1]["requests"] == [], snaps  # reads stay allowed
        assert http("GET", f"{service.api}/sessions/{sid}", ro)[0] == 200
    finally:
        http("DELETE", f"{service.api}/sessions/{sid}", creds["admin"])


@pytest.mark.parametrize("path", ["/sessions/%zz", "/sessions/%E0%A4%A", "/sessions/%zz/idle",
                                  "/sessions/%E0%A4%A/heartbeat", "/accounts/%zz",
                                  "/sessions/%C0%AF"])
@pytest.mark.parametrize("method", ["GET", "DELETE", "POST"])
def test_malformed_percent_encoding_is_a_400_from_the_service(hub, service, creds, path, method):
    """What configurable-http-proxy answers 500 for (a bad %-escape in the path) reaches the
    service straight: a 400 naming the path, whoever asks, and nothing changes."""
    before = snapshot(service, creds)
    for who in ("admin", "none"):
        status, out = http(method, service.api + path, creds[who],
                           {} if method == "POST" else None)
        assert status == 400, (who, status, out)
        assert isinstance(out, dict) and "path" in out["message"], out
    # through the public proxy (configurable-http-proxy, third-party): its own error, which
    # reaches nothing behind it
    status, _ = http(method, hub.url + "/services/gpubudget/api/v1" + path, creds["admin"],
                     {} if method == "POST" else None)
    assert status in (400, 500), status
    assert snapshot(service, creds) == before


@pytest.mark.parametrize("caller,expected", [("user", 200), ("manager", 403), ("admin", 200),
                                             ("other", 403), ("none", 403), ("expired", 403)])
def test_cancel_matrix(service, creds, caller, expected):
    status, job = http("POST", service.api + "/jobs", creds["user"], JOB)
    assert status == 201
    status, out = http("DELETE", f"{service.api}/jobs/{job['id']}", creds[caller])
    assert status == expected, out
    state = http("GET", f"{service.api}/workloads/{job['id']}", creds["user"])[1]["state"]
    assert state == ("cancelled" if expected == 200 else job["state"] if state == "pending"
                     else state)
    if expected != 200:
        assert state in ("pending", "running", "done")
        http("DELETE", f"{service.api}/jobs/{job['id']}", creds["admin"])


@pytest.mark.parametrize("caller,expected", [("admin", 200), ("user", 403), ("manager", 403),
                                             ("other", 403), ("none", 403), ("expired", 403)])
def test_metrics_matrix(service, creds, caller, expected):
    status, out = http("GET", service.base + "/metrics", creds[caller])
    assert status == expected
    if expected == 200:
        assert "gpubudget_grant_gpu_seconds" in out and "gpubudget_cycle_seconds" in out


def test_visibility_is_limited_to_own_projects(service, creds):
    names = {a["name"] for a in http("GET", service.api + "/accounts", creds["user"])[1]["accounts"]}
    assert names == {"physics", "lattice"}
    names = {a["name"] for a in http("GET", service.api + "/accounts", creds["manager"])[1]["accounts"]}
    assert names == {"physics", "lattice", "astro"}
    names = {a["name"] for a in http("GET", service.api + "/accounts", creds["admin"])[1]["accounts"]}
    assert names == {"physics", "lattice", "astro", "biology", "genomics"}
    mine = http("GET", service.api + "/workloads/me", creds["other"])[1]["workloads"]
    assert all(w["user"] == "dave" for w in mine)


def test_scope_limited_token_is_refused_with_reason(hub, service):
    read_only = hub.token("bob", scopes=["custom:gpubudget:read"])
    status, out = http("POST", service.api + "/jobs", read_only, JOB)
    assert status == 403 and "custom:gpubudget:submit" in out["message"]
    assert http("GET", service.api + "/workloads/me", read_only)[0] == 200
    no_scope = hub.token("bob", scopes=["read:users:name!user=bob"])
    status, out = http("GET", service.api + "/workloads/me", no_scope)
    assert status == 403 and "scope" in out["message"]
    # a user with no gpubudget role at all
    mallory = hub.token("mallory")
    assert http("GET", service.api + "/accounts", mallory)[0] == 403


def test_every_change_to_a_users_work_declares_the_submit_scope():
    """Each non-GET verb on a session, a snapshot or a job declares ``needs_scope(submit)``
    (a handler added later without it fails here, before any token reaches it)."""
    from jupyter_gpubudget.service.auth import SCOPE_SUBMIT
    from jupyter_gpubudget.service.handlers import jobs, sessions, snapshots

    seen = []
    for module in (sessions, snapshots, jobs):
        for path, handler in module.API_ROUTES:
            for verb in ("post", "put", "patch", "delete"):
                method = handler.__dict__.get(verb)
                if method is None:
                    continue
                seen.append(f"{verb.upper()} {path}")
                assert getattr(method, "__needs_scope__", None) == SCOPE_SUBMIT, seen[-1]
    assert len(seen) >= 13, seen
