"""Attacking the demo hub: a spawn asking for ``choice: gpu:99`` started a CPU session instead of
being refused (an option the spawner does not know was dropped, and "no slice" meant CPU),
and a quote for an absurd ``gpus`` answered with a CPU slice's quote. A request for what this
cluster cannot hold is refused, saying the most it offers; an unknown option is refused,
naming it; nothing is queued.

Against the real demo hub (``hub_config/jupyterhub_config.py``: real JupyterHub, the real
BudgetSpawner, the service managed by the hub; the demo inventory: 16 H100s, 14 of them whole,
at most 8 on a node), through its REST API and through the spawn page as a logged-in user."""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar

import pytest

from jupyter_gpubudget.hub.demo_auth import DEMO_PASSWORD
from tests.hub.hubproc import DemoHub, ProgressReader, http, start_demo_hub

USER, PROJECT = "alice", "lattice-qcd"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    hub = start_demo_hub(tmp_path_factory.mktemp("slices"),
                         env={"GPUBUDGET_SLOW_SPAWN": "5"})
    try:
        yield hub
    finally:
        hub.stop()


def queued(hub: DemoHub) -> list:
    st, out = http("GET", f"{hub.svc}/sessions?user={USER}", hub.token)
    assert st == 200, out
    return out["sessions"]


def spawn_refusal(hub: DemoHub, options: dict) -> tuple[int, str]:
    """The hub's answer to a spawn through its REST API: (status, message) — a refusal that
    came after the slow-spawn timeout ends the spawn, and its progress says why."""
    st, body = http("POST", f"{hub.api}/users/{USER}/server", hub.token, options)
    if st == 201:
        http("DELETE", f"{hub.api}/users/{USER}/server", hub.token)
        return 201, "the server STARTED"
    if st == 202:
        reader = ProgressReader(f"{hub.api}/users/{USER}/server/progress", hub.token)
        reader.start()
        ev = reader.wait_for(lambda e: e.get("failed") or e.get("ready"), timeout=60)
        if ev.get("ready"):
            http("DELETE", f"{hub.api}/users/{USER}/server", hub.token)
            return 202, f"the server STARTED: {ev}"
        m = re.search(r"HTTP (\d{3})", ev["message"])
        return int(m.group(1)) if m else 0, ev["message"]
    return st, body["message"] if isinstance(body, dict) else str(body)


def test_spawn_and_quote_refuse_what_the_cluster_cannot_hold(demo):
    # an option the spawner does not know is refused, naming it (it started a CPU session)
    st, msg = spawn_refusal(demo, {"project": PROJECT, "choice": "gpu:99"})
    assert st == 400 and "'choice'" in msg, (st, msg)
    # more GPUs than the cluster has: refused, saying the most it offers
    for options in ({"project": PROJECT, "slice": "gpu:99"}, {"project": PROJECT, "gpus": 99},
                    {"project": PROJECT, "slice": "gpu:99999999"}):
        st, msg = spawn_refusal(demo, options)
        assert st == 400 and "14 whole GPUs" in msg, (options, st, msg)
    assert queued(demo) == []

    # the spawn form's live quote (the hub's endpoint) and the service's own
    hub_quote = f"{demo.api}/gpubudget/users/{USER}/quote?project={PROJECT}&min_runtime=1h"
    svc_quote = f"{demo.svc}/sessions/quote?user={USER}&project={PROJECT}&min_runtime=1h"
    for base in (hub_quote, svc_quote):
        for extra, field in (("&gpus=99", "gpus"), ("&gpus=99999999999", "gpus"),
                             ("&slice=gpu:99", "gpus"), ("&choice=gpu:99", "choice")):
            st, out = http("GET", base + extra, demo.token)
            assert st == 400 and isinstance(out, dict), (base, extra, st, out)
            assert field in out["message"], (base, extra, out)
            if field == "gpus":
                assert "14 whole GPUs" in out["message"], (base, extra, out)
        st, out = http("GET", base + "&gpus=2", demo.token)  # what the cluster has still quotes
        assert st == 200 and out["slice"] == "gpu:2", out
    assert queued(demo) == []


class Browser:
    """A logged-in user's cookies and the hub's XSRF token, as the spawn page has them."""

    def __init__(self, hub: DemoHub) -> None:
        self.hub = hub
        self.jar = CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def xsrf(self) -> str:
        return next(c.value for c in self.jar if c.name == "_xsrf")

    def request(self, method: str, path: str, form: dict | None = None) -> tuple[int, str]:
        data = None if form is None else urllib.parse.urlencode(form, doseq=True).encode()
        req = urllib.request.Request(self.hub.url + path, data=data, method=method)
        try:
            with self.opener.open(req, timeout=60) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def login(self, user: str) -> None:
        st, _ = self.request("GET", "/hub/login")
        assert st == 200
        st, page = self.request("POST", "/hub/login", {"username": user,
                                                       "password": DEMO_PASSWORD,
                                                       "_xsrf": self.xsrf()})
        assert st == 200 and "gpubudget-form" in page, (st, page[-2000:])


def test_the_spawn_page_shows_why_a_slice_is_refused(demo):
    b = Browser(demo)
    b.login(USER)  # lands on the spawn form
    st, page = b.request("GET", "/hub/spawn")
    assert st == 200 and "gpubudget-form" in page
    for form, words in (
        ({"project": PROJECT, "choice": "gpu:99", "min_runtime": "1h"}, "no slice chosen"),
        ({"project": PROJECT, "slice": "gpu:99", "min_runtime": "1h"}, "is not offered here"),
    ):
        st, page = b.request("POST", "/hub/spawn", {**form, "_xsrf": b.xsrf()})
        assert st == 400, (form, st, page[-3000:])
        assert words in page and "gpubudget-form" in page, (form, page[-3000:])
        if "slice" in form:
            assert "8 whole GPUs" in page, page[-3000:]  # the largest slice the form offers
    assert queued(demo) == []
