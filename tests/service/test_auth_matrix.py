"""Every endpoint x (user, project manager, admin, another project's user, no token,
expired token): the status, a reason on every 403, and no state change on a refusal."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.hub import http

CALLERS = ["user", "manager", "admin", "other", "none", "expired"]
WHO = {"user": "bob", "manager": "alice", "admin": "root", "other": "dave"}
JOB = {"command": "sleep 3", "project": "lattice", "gpus": 0}


@pytest.fixture(scope="module")
def creds(hub, tokens):
    expired = hub.token("bob", expires_in=1)
    time.sleep(2.5)  # let it expire (no timing is asserted)
    t = {k: tokens[u] for k, u in WHO.items()}
    t["none"] = None
    t["expired"] = expired
    return t


@pytest.fixture(scope="module")
def bobs_job(service, creds):
    status, body = http("POST", service.api + "/jobs", creds["user"], JOB)
    assert status == 201, body
    return body["id"]


def expect(**kw: int) -> dict[str, int]:
    base = {"none": 403, "expired": 403}
    base.update(kw)
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
     expect(user=403, manager=200, admin=200, other=403)),
    ("my workloads", "GET", "/workloads/me", None, ALL_READERS),
    ("a workload", "GET", "/workloads/{job}", None,
     expect(user=200, manager=403, admin=200, other=403)),
    ("queue", "GET", "/queue", None, ALL_READERS),
    ("my jobs", "GET", "/jobs", None, ALL_READERS),
    ("submit", "POST", "/jobs", JOB, expect(user=201, manager=201, admin=201, other=403)),
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
]


def snapshot(svc, creds) -> tuple:
    """Observable state a refusal must not change: grant versions, everyone's workloads (ids
    and whether cancelled; the scheduler moves the others on by itself)."""
    g = http("GET", svc.api + "/accounts/lattice/grants", creds["admin"])[1]["versions"]
    ws = []
    for c in ("user", "manager", "admin", "other"):
        ws += [(w["id"], w["state"] == "cancelled")
               for w in http("GET", svc.api + "/workloads/me", creds[c])[1]["workloads"]]
    return g, sorted(ws)


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("name,method,path,body,expected", MATRIX, ids=[m[0] for m in MATRIX])
def test_matrix(service, creds, bobs_job, caller, name, method, path, body, expected):
    url = service.api + path.format(job=bobs_job)
    if isinstance(body, dict):
        body = {k: (v.format(caller=caller) if isinstance(v, str) else v) for k, v in body.items()}
    before = snapshot(service, creds)
    status, out = http(method, url, creds[caller], body)
    assert status == expected[caller], (caller, name, status, out)
    if status == 403:
        assert isinstance(out, dict) and out.get("message"), out  # a reason
    if status >= 400:
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
