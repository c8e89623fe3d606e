"""A refused spawn-form choice is one line in the hub's log, not a traceback: JupyterHub logs
whatever ``options_from_form`` raises as "Failed to spawn single-user server with form" with
the whole traceback, so a user posting bad choices in a loop could flood the hub's log.

Against the real demo hub (``hub_config/jupyterhub_config.py``: real JupyterHub, the real
BudgetSpawner, configurable-http-proxy), through the spawn page as a logged-in user; the
hub's own log file is read before and after each refused post."""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar

import pytest

from jupyter_gpubudget.hub.demo_auth import DEMO_PASSWORD
from tests.hub.hubproc import DemoHub, http, start_demo_hub

USER, PROJECT = "alice", "lattice-qcd"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    hub = start_demo_hub(tmp_path_factory.mktemp("formlog"))
    try:
        yield hub
    finally:
        hub.stop()


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
        assert self.request("GET", "/hub/login")[0] == 200
        st, page = self.request("POST", "/hub/login", {"username": user,
                                                       "password": DEMO_PASSWORD,
                                                       "_xsrf": self.xsrf()})
        assert st == 200 and "gpubudget-form" in page, (st, page[-2000:])


def _log_size(hub: DemoHub) -> int:
    return hub.log.stat().st_size


def _new_lines(hub: DemoHub, since: int) -> list[str]:
    with open(hub.log, "rb") as f:
        f.seek(since)
        return f.read().decode(errors="replace").splitlines()


@pytest.mark.parametrize("form, words", [
    ({"project": PROJECT, "slice": "gpu:99", "min_runtime": "1h"}, "is not offered here"),
    ({"project": PROJECT, "slice": "", "min_runtime": "1h"}, "no slice chosen"),
    ({"project": PROJECT, "slice": "cpu", "min_runtime": "forever"}, "Minimum runtime"),
    ({"project": "biology", "slice": "cpu", "min_runtime": "1h"}, "not a member of project"),
    # a choice built to break the log line: a newline and a %-format in it
    ({"project": PROJECT, "slice": "gpu:%s\nTraceback (most recent call last):",
      "min_runtime": "1h"}, "is not offered here"),
], ids=["slice", "no slice", "runtime", "project", "newline"])
def test_a_refused_choice_is_one_log_line(demo, form, words):
    b = Browser(demo)
    b.login(USER)
    start = _log_size(demo)
    st, page = b.request("POST", "/hub/spawn", {**form, "_xsrf": b.xsrf()})
    assert st in (400, 403), (st, page[-3000:])
    assert words in page and "gpubudget-form" in page, page[-3000:]  # the user is told why
    # the access-log line of the request is written when it finishes: wait for it, then read
    lines: list[str] = []
    for _ in range(100):
        lines = _new_lines(demo, start)
        if any(re.search(r"\b(400|403) POST /hub/spawn", ln) for ln in lines):
            break
        urllib.request.urlopen(demo.url + "/hub/health", timeout=5).read()  # noqa: S310
    refusal = [ln for ln in lines if "Failed to spawn" in ln or words in ln]
    assert len(refusal) == 1, "\n".join(lines)
    assert not any(ln.startswith(("Traceback", "  File ", "tornado.web.HTTPError", "    "))
                   for ln in lines), "\n".join(lines)
    assert words in refusal[0] and USER in refusal[0], refusal
    # nothing was queued
    st, out = http("GET", f"{demo.svc}/sessions?user={USER}", demo.token)
    assert st == 200 and out["sessions"] == [], out
