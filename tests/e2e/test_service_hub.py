"""The gpubudget service as a JupyterHub-*managed* service under a real JupyterHub and
configurable-http-proxy: the hub starts it, passes its token and OAuth client, routes
/services/gpubudget/ to it; users reach it through the proxy with tokens and with the
browser OAuth login."""

from __future__ import annotations

import re
import sys
import time

import pytest
import requests

from tests.fixtures.hub import BUDGETS, INVENTORY, USERS, free_port, http, start_hub
from tests.fixtures.unixusers import ensure_accounts


@pytest.fixture(scope="module")
def managed_hub(tmp_path_factory):
    d = tmp_path_factory.mktemp("e2e")
    (d / "budgets.yaml").write_text(BUDGETS)
    (d / "inventory.yaml").write_text(INVENTORY)
    port = free_port()
    service = {
        "name": "gpubudget", "url": f"http://127.0.0.1:{port}", "oauth_no_confirm": True,
        "command": [sys.executable, "-m", "jupyter_gpubudget.service",
                    f"--budgets={d / 'budgets.yaml'}", f"--inventory={d / 'inventory.yaml'}",
                    f"--db=sqlite:///{d / 'ledger.sqlite'}", f"--jobs-dir={d / 'jobs'}",
                    "--cycle-interval=0.5", *ensure_accounts(USERS)],
        "cwd": str(d),
    }
    hub = start_hub(d / "hub", services=[service])
    yield hub
    hub.stop()


def test_service_is_managed_and_routed_through_the_proxy(managed_hub):
    hub = managed_hub
    status, svc = http("GET", hub.api + "/services/gpubudget", hub.admin_token)
    assert status == 200 and svc["kind"] == "service", svc
    assert svc.get("command") or svc.get("pid"), svc  # managed: the hub runs it
    base = hub.url + "/services/gpubudget/api/v1"
    status, health = http("GET", base + "/healthz")
    assert status == 200 and health["status"] == "ok"
    bob = hub.token("bob")
    status, out = http("POST", base + "/jobs", bob,
                       {"command": "echo done", "project": "lattice", "gpus": 1})
    assert status == 201, out
    deadline = time.monotonic() + 60
    while True:
        w = http("GET", f"{base}/workloads/{out['id']}", bob)[1]
        if w["state"] == "done":
            break
        assert time.monotonic() < deadline, w
        time.sleep(0.1)
    assert w["exit_code"] == 0 and w["placement"]
    assert http("GET", f"{base}/workloads/{out['id']}", hub.token("dave"))[0] == 403
    assert http("GET", base + "/accounts")[0] == 403


def test_browser_oauth_login_reaches_the_service(managed_hub):
    hub = managed_hub
    s = requests.Session()
    r = s.get(hub.url + "/hub/login")
    xsrf = s.cookies.get("_xsrf") or re.search(r'name="_xsrf" value="([^"]+)"', r.text).group(1)
    r = s.post(hub.url + "/hub/login", data={"username": "bob", "password": "x", "_xsrf": xsrf},
               allow_redirects=False)
    assert r.status_code in (302, 303), r.text[:300]
    r = s.get(hub.url + "/services/gpubudget/")  # -> hub OAuth authorize -> callback -> here
    assert r.status_code == 200, r.text[:500]
    assert r.json()["user"] == "bob"
    r = s.get(hub.url + "/services/gpubudget/api/v1/workloads/me")  # the OAuth cookie
    assert r.status_code == 200 and r.json()["user"] == "bob"
