"""The server extension against the real gpubudget service (registered with a real JupyterHub)
and a real Jupyter server: what the browser may ask, what reaches the service, and that the
server's token never reaches the browser."""

from __future__ import annotations

import json
import re

import pytest

from jupyter_gpubudget.serverext.budget import allowed
from jupyter_gpubudget.serverext.config import service_url_from_env
from tests.fixtures.hub import free_port, http
from tests.fixtures.jupyter import start_jupyter

from .conftest import wait_state

#: figures that grow while the session runs: equal up to what a few seconds add
GROWING = {"usage_hours": 0.01, "standing": 1e-4, "gpu_hours": 0.01, "total_gpu_hours": 0.01}
#: the relative part of a ``<field>_text`` ("(21 s ago)", "(in 3 min)")
RELATIVE = re.compile(r"\s*\((?:in )?[^()]*(?:ago)?\)$")
CHANGING = ("protected_left_s", "computed_at", "predicted_start", "charged_gpu_hours")


def same_answer(a: object, b: object, at: str = "") -> None:
    """Two answers are the same but for the figures that change from one second to the next
    (left out) and those that grow while the session runs (equal within ``GROWING``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) - set(CHANGING), set(b) - set(CHANGING)
        assert keys[0] == keys[1], (at, keys)
        for k in keys[0]:
            if k in GROWING and isinstance(a[k], float) and isinstance(b[k], float):
                assert abs(a[k] - b[k]) <= GROWING[k], (f"{at}.{k}", a[k], b[k])
            elif k.endswith("_text") and isinstance(a[k], str) and isinstance(b[k], str):
                # "07:21 (21 s ago)": the clock time is the same; the part relative to
                # the moment of each answer may have moved on by a second
                assert RELATIVE.sub("", a[k]) == RELATIVE.sub("", b[k]), (f"{at}.{k}", a[k], b[k])
            else:
                same_answer(a[k], b[k], f"{at}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), (at, a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same_answer(x, y, f"{at}[{i}]")
    else:
        assert a == b, (at, a, b)


def test_info_names_the_session_the_service_and_what_it_offers(lab, service, session,
                                                                server_token):
    st, info, headers = lab.call("GET", "gpubudget/api/info")
    assert st == 200, info
    assert info["session"] == session["id"] and info["project"] == "lattice"
    assert info["service"] == {"configured": True, "reachable": True, "url": service.base,
                               "message": None}
    # optional sections follow the service's own API document, whatever it has today
    _, doc = http("GET", service.api + "/openapi.json")
    paths = set(doc["paths"])
    assert info["features"]["usage_daily"] == ("/accounts/{name}/usage/daily" in paths)
    assert info["features"]["job_log"] == any(p.startswith("/jobs/{") and p.endswith("/log")
                                              for p in paths)
    assert info["features"]["session_history"] == ("/sessions/{id}/history" in paths)
    assert server_token not in json.dumps(info) + json.dumps(headers)


def test_forwarded_answers_are_the_services_answers_for_the_servers_user(lab, service, session,
                                                                          server_token):
    for path in (f"sessions/{session['id']}", f"sessions/{session['id']}/history",
                 "workloads/me?state=running", "accounts",
                 "accounts/lattice/usage", "notices", "queue", "jobs"):
        st, via_lab, headers = lab.call("GET", f"gpubudget/api/v1/{path}")
        st2, direct = http("GET", f"{service.api}/{path}", server_token)
        assert (st, st2) == (200, 200), (path, via_lab, direct)
        same_answer(via_lab, direct, path)
        assert server_token not in json.dumps(via_lab) + json.dumps(headers)
    _, mine, _ = lab.call("GET", "gpubudget/api/v1/workloads/me")
    assert mine["user"] == "bob"  # the service saw bob's server token
    assert [w["id"] for w in mine["workloads"]] == [session["id"]]


def test_only_the_allow_list_reaches_the_service(lab, service, server_token):
    before = http("GET", f"{service.api}/jobs", server_token)[1]
    job = json.dumps({"command": "true", "project": "lattice", "gpus": 1}).encode()
    for method, path, body in [
        ("POST", "jobs", job),                              # submitting is not the sidebar's
        ("PUT", "accounts/lattice/grant", b'{"grant_hours": 1e6}'),
        ("POST", "usage/events", b"{}"),
        ("GET", "sessions/offer", None),
        ("GET", "../../metrics", None),
        ("GET", "accounts/..%2F..%2Fmetrics", None),
        ("DELETE", "accounts/lattice", None),
    ]:
        st, out, _ = lab.call(method, f"gpubudget/api/v1/{path}", body=body)
        assert st in (403, 404, 405), (method, path, st, out)
    assert http("GET", f"{service.api}/jobs", server_token)[1] == before
    assert http("GET", f"{service.api}/accounts/lattice", server_token)[1]["grant"][
        "grant_hours"] == 60


def test_the_allow_list_and_its_query_parameters():
    assert allowed("GET", "accounts/astro/usage") == frozenset()
    assert allowed("GET", "accounts/astro/usage/daily") == {"tz"}
    assert allowed("GET", "jobs/j-1/log") == {"offset", "limit"}
    assert allowed("GET", "workloads/me") == {"state"}
    assert allowed("DELETE", "jobs/j-1") == frozenset()
    for method, path in [("GET", "sessions/offer"), ("POST", "jobs"), ("GET", "metrics"),
                         ("GET", "accounts/a/b"), ("GET", "accounts/../x"),
                         ("DELETE", "workloads/me"), ("GET", "jobs/.hidden/log")]:
        assert allowed(method, path) is None, (method, path)


def test_unauthenticated_browser_requests_are_refused(lab):
    for method in ("GET", "DELETE"):
        st, _, _ = lab.call(method, "gpubudget/api/v1/jobs/x", auth="none")
        assert st == 403
    assert lab.call("GET", "gpubudget/api/info", auth="none")[0] == 403


def test_cancel_with_the_login_cookie_needs_xsrf(lab, service, server_token):
    st, job = http("POST", f"{service.api}/jobs", server_token,
                   {"command": "sleep 600", "project": "lattice", "gpus": 2, "name": "big"})
    assert st == 201 and job["state"] == "pending", job  # bob's session holds one of two GPUs
    xsrf = lab.login_cookie()
    st, out, _ = lab.call("DELETE", f"gpubudget/api/v1/jobs/{job['id']}", auth="cookie")
    assert st == 403, out
    assert http("GET", f"{service.api}/workloads/{job['id']}", server_token)[1]["state"] == \
        "pending"
    st, out, _ = lab.call("DELETE", f"gpubudget/api/v1/jobs/{job['id']}", auth="cookie",
                          headers={"X-XSRFToken": xsrf})
    assert st == 200 and out["state"] == "cancelled", out
    assert http("GET", f"{service.api}/workloads/{job['id']}", server_token)[1]["state"] == \
        "cancelled"


def test_leave_the_queue_but_never_end_a_running_session_from_the_lab(lab, service, session,
                                                                      root, server_token):
    st, out, _ = lab.call("DELETE", f"gpubudget/api/v1/sessions/{session['id']}")
    assert st == 409 and "JupyterHub control panel" in out["message"], out
    assert wait_state(service, root, session["id"], "running")["state"] == "running"
    st, queued = http("POST", f"{service.api}/sessions", root,
                      {"user": "bob", "project": "lattice", "slice": "gpu:2", "name": "second"})
    assert st == 201 and queued["state"] == "pending", queued
    st, out, _ = lab.call("DELETE", f"gpubudget/api/v1/sessions/{queued['id']}")
    assert st == 200 and out["state"] == "cancelled", out
    # someone else's session: the service refuses (the server's token is bob's)
    st, other = http("POST", f"{service.api}/sessions", root,
                     {"user": "dave", "project": "astro", "slice": "gpu:2"})
    assert st == 201
    st, out, _ = lab.call("DELETE", f"gpubudget/api/v1/sessions/{other['id']}")
    assert st == 403, out
    assert http("GET", f"{service.api}/sessions/{other['id']}", root)[1]["state"] == "pending"
    http("DELETE", f"{service.api}/sessions/{other['id']}", root)


@pytest.fixture(scope="module")
def broken(tmp_path_factory, service):
    """Servers with no service URL, nothing listening, and a token the hub does not know."""
    servers = {
        "no-token": start_jupyter(tmp_path_factory.mktemp("j1"), {"GPUBUDGET_URL": service.base}),
        "down": start_jupyter(tmp_path_factory.mktemp("j2"), {
            "GPUBUDGET_URL": f"http://127.0.0.1:{free_port()}/services/gpubudget",
            "JUPYTERHUB_API_TOKEN": "x" * 32}),
        "bad-token": start_jupyter(tmp_path_factory.mktemp("j3"), {
            "GPUBUDGET_URL": service.base, "JUPYTERHUB_API_TOKEN": "not-a-token"}),
    }
    yield servers
    for s in servers.values():
        s.stop()


def test_misconfigured_or_unreachable_service_says_what_is_wrong(broken):
    st, info, _ = broken["no-token"].call("GET", "gpubudget/api/info")
    assert st == 200 and info["service"]["configured"] is False
    assert "JUPYTERHUB_API_TOKEN" in info["service"]["message"]
    st, out, _ = broken["no-token"].call("GET", "gpubudget/api/v1/accounts")
    assert st == 503 and "JUPYTERHUB_API_TOKEN" in out["message"]

    st, info, _ = broken["down"].call("GET", "gpubudget/api/info")
    assert info["service"]["configured"] is True and info["service"]["reachable"] is False
    assert "cannot be reached" in info["service"]["message"]
    st, out, _ = broken["down"].call("GET", "gpubudget/api/v1/accounts")
    assert st == 502 and "cannot be reached" in out["message"], out
    assert "x" * 32 not in json.dumps(out)

    st, out, _ = broken["bad-token"].call("GET", "gpubudget/api/v1/accounts")
    assert st == 403 and "token" in out["message"], out


def test_service_url_from_the_servers_environment():
    assert service_url_from_env({"GPUBUDGET_URL": "http://svc:10101/services/gpubudget/",
                                 "JUPYTERHUB_API_URL": "http://hub:8081/hub/api"}) == \
        "http://svc:10101/services/gpubudget"
    assert service_url_from_env({"JUPYTERHUB_PUBLIC_HUB_URL": "https://hub.example.org/jh/hub/",
                                 "JUPYTERHUB_BASE_URL": "/jh/",
                                 "JUPYTERHUB_API_URL": "http://hub:8081/jh/hub/api"}) == \
        "https://hub.example.org/jh/services/gpubudget"
    assert service_url_from_env({"JUPYTERHUB_PUBLIC_HUB_URL": "",
                                 "JUPYTERHUB_API_URL": "http://proxy:8000/hub/api"}) == \
        "http://proxy:8000/services/gpubudget"
    assert service_url_from_env({}) == ""


def test_save_and_release_now_reaches_the_service(lab, service, session):
    """The warning's button: forwarded (the service answers that nothing is being
    preempted)."""
    assert allowed("POST", f"sessions/{session['id']}/release") == frozenset()
    st, out, _ = lab.call("POST", f"gpubudget/api/v1/sessions/{session['id']}/release",
                          body=b"{}")
    assert st == 409 and "not being preempted" in out["message"], out
