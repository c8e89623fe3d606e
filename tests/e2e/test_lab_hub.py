"""The researcher's view end to end, in real Chromium against the `make run` hub (the project's
own hub_config/jupyterhub_config.py: demo budgets and inventory, the gpubudget service managed
by the hub, BudgetSpawner, the lab extension):

1. alice logs in; the spawn form shows her projects' budgets and a live quote for exactly what
   she selects (checked against the service); she starts a MIG slice with a short minimum
   runtime; in JupyterLab the status bar and the sidebar show the countdown, the cost so far
   and her project's budget, each checked against the service's API; protection runs out and
   JupyterLab notifies her.
2. The whole GPUs are taken; bob's spawn queues: the queue page shows his position and
   predicted start (the browser's local time zone) as the service has them, says a MIG slice
   is free now, and "Leave queue" withdraws the request: cancelled, nothing charged, no server.

Screenshots of the form, the status bar, the sidebar and the queue page go to
``$GPUBUDGET_ARTIFACTS`` (default ``out/screenshots``). With CI=true a missing part (Chromium,
playwright, the built extension) fails the test."""

from __future__ import annotations

import os
import re
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from tests.hub.hubproc import (
    CHROMIUM,
    CHROMIUM_FLAGS,
    http,
    require,
    require_browser,
    start_demo_hub,
)

ROOT = Path(__file__).resolve().parents[2]
FLAGS = CHROMIUM_FLAGS
SHOTS = Path(os.environ.get("GPUBUDGET_ARTIFACTS", ROOT / "out" / "screenshots"))
TZ = "Europe/Berlin"  # the browser's zone (not the machine's): times must be shown in it
HOUR, DAY = 3600, 86400


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    require_browser()
    require((ROOT / "jupyter_gpubudget" / "labextension" / "package.json").exists(),
            "the built JupyterLab extension (make lab)")
    h = start_demo_hub(tmp_path_factory.mktemp("labhub"), env={"GPUBUDGET_SLOW_SPAWN": "1"})
    now = time.time()
    # some usage in the window, reported as external workloads
    for i, (user, project, milli, ago, hours) in enumerate([
            ("alice", "lattice-qcd", 4000, 3 * DAY, 6), ("bob", "lattice-qcd", 8000, 2 * DAY, 3),
            ("carol", "astro", 8000, 1 * DAY, 10)]):
        for ev, at in (("start", now - ago), ("stop", now - ago + hours * HOUR)):
            body = {"workload": f"past-{i}", "event": ev, "at": at}
            if ev == "start":
                body.update(project=project, user=user, milli=milli, kind="batch")
            st, out = http("POST", f"{h.svc}/usage/events", h.token, body)
            assert st == 200, out
    yield h
    h.stop()


class Browser:
    def __init__(self, p, url: str) -> None:  # noqa: ANN001
        self.browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        self.page = self.browser.new_page(viewport={"width": 1280, "height": 900},
                                          timezone_id=TZ)
        self.page.set_default_timeout(60_000)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                     else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.url = url

    def login(self, user: str) -> None:
        self.page.goto(self.url + "/hub/login")
        self.page.fill("#username_input", user)
        self.page.fill("#password_input", "gpubudget-demo")
        self.page.click("#login_submit")

    def shot(self, name: str, **kw) -> None:  # noqa: ANN003
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / name), **kw)

    def close(self) -> None:
        self.browser.close()


def berlin(ts: float) -> str:
    return datetime.fromtimestamp(ts, ZoneInfo(TZ)).strftime("%H:%M")


def near_clock(text: str, ts: float) -> bool:
    """``text`` shows ``ts`` (or the minute next to it) as HH:MM in the browser's zone."""
    return any(berlin(ts + d) in text for d in (-60, 0, 60))


def gpu_h(text: str, label: str) -> float:
    return float(re.search(rf"{label}\s+(-?[\d.]+) GPU-h", text).group(1))


def _preempted(demo) -> tuple[str, str]:  # noqa: ANN001
    """An earlier session of alice's that a drain preempted: a real session (REST) stopped as
    preempted after the drain's request, written into the service's ledger as the loop writes
    it. Returns (that session, its node); :func:`_resumed_as` makes a later one its restore."""
    from jupyter_gpubudget.ledger import Ledger, connect

    st, s = http("POST", f"{demo.svc}/sessions", demo.token,
                 {"user": "alice", "project": "lattice-qcd", "slice": "gpu:1",
                  "min_runtime": "0s"})
    assert st == 201, s
    deadline = time.monotonic() + 60
    while s["state"] != "running":
        assert time.monotonic() < deadline, s
        s = http("GET", f"{demo.svc}/sessions/{s['id']}?wait=2", demo.token)[1]
    node = s["placement"][0]["node"]
    led = Ledger(connect(demo.ledger_url))
    try:
        led.record_decision(now=time.time(), kind="preempt-requested", workload=s["id"],
                            reason=f"node {node} is draining (loses 0.00 GPU-h)",
                            detail={"for": None, "lost_gpu_hours": 0.0})
        st, out = http("DELETE", f"{demo.svc}/sessions/{s['id']}?reason=preempt", demo.token)
        assert st in (200, 204), out
    finally:
        led.dispose()
    return s["id"], node


def _resumed_as(demo, first: str, sid: str) -> None:  # noqa: ANN001
    """Make ``sid`` the restore of ``first``: the decisions the hub spawner and the loop write
    after a verified snapshot (which needs a kernel CRIU can dump: tested elsewhere)."""
    from jupyter_gpubudget.ledger import Ledger, connect

    led = Ledger(connect(demo.ledger_url))
    try:
        snap, now = "snap-" + first, time.time()
        led.record_decision(now=now, kind="requeue", workload=first, actor="root",
                            reason=f"preempted after snapshot {snap}; requeued as {sid}",
                            detail={"as": sid, "snapshot": snap})
        led.record_decision(now=now, kind="resume", workload=sid, actor="root",
                            reason=f"resumes preempted session {first}",
                            detail={"resumes": first, "snapshot": snap, "reason": "preempted"})
    finally:
        led.dispose()


def test_form_lab_countdown_cost_budget_and_protection_running_out(demo):
    from playwright.sync_api import sync_playwright

    first, node = _preempted(demo)  # alice's earlier session, preempted by a drain
    with sync_playwright() as p:
        b = Browser(p, demo.url)
        page = b.page
        try:
            b.login("alice")
            page.wait_for_selector("select[name=project]")
            # the projects with their budgets, as the service has them
            for name in ("lattice-qcd", "astro"):
                a = http("GET", f"{demo.svc}/accounts/{name}", demo.token)[1]
                opt = page.locator(f"select[name=project] option[value='{name}']").inner_text()
                left = a["effective_grant_hours"] - a["usage_hours"]
                assert f"{left:.0f} of {a['effective_grant_hours']:.0f} GPU-h left" in opt, opt
                assert "under its share: starts first" in opt
            # a live quote for exactly the selection, as the service quotes it
            page.check("input[name=slice][value='mig:7g.80gb']")
            page.check("#gpubudget-runtime-custom")
            page.fill("#gpubudget-runtime-custom-value", "90s")  # ample for the lab to load
            page.wait_for_function("() => document.querySelector('#gpubudget-quote-for')"
                                   ".innerText.includes('MIG 7g.80gb, minimum runtime 1 min 30 s')")
            q = http("GET", f"{demo.svc}/sessions/quote?user=alice&project=lattice-qcd"
                            "&slice=mig:7g.80gb&min_runtime=90s", demo.token)[1]["quote"]
            assert q["starts_now"] and q["backed"]
            quote = page.locator("#gpubudget-quote").inner_text()
            assert re.search(r"Start\s+now", quote), quote
            assert near_clock(quote, time.time() + 90), quote  # "until HH:MM", Berlin time
            assert "1.00 GPU-h for each hour it runs, charged to lattice-qcd" in quote
            assert "yes: lattice-qcd's grant covers the protected time" in quote
            b.shot("hub-spawn-form.png", full_page=True)
            page.click("#spawn_form button[type=submit]")
            page.wait_for_url("**/user/alice/lab**", timeout=150_000)
            page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)

            sess = http("GET", f"{demo.svc}/sessions?user=alice&state=running",
                        demo.token)[1]["sessions"]
            assert len(sess) == 1 and sess[0]["placement"][0]["profile"] == "7g.80gb"
            sid = sess[0]["id"]
            status = page.locator(".jp-GpuBudget-statusButton")
            status.wait_for()
            assert re.fullmatch(r"protected (1m|\d+s) · (0|0\.0\d*) GPU-h", status.inner_text()), \
                status.inner_text()
            b.shot("hub-lab-statusbar.png",
                   clip={"x": 0, "y": 900 - 60, "width": 1280, "height": 60})
            status.click()
            panel = page.locator("#jp-gpubudget-panel")
            panel.locator(".jp-GpuBudget-big").wait_for()
            page.wait_for_selector("#jp-gpubudget-panel .jp-GpuBudget-account")
            # the countdown and the cost so far, against GET /sessions/{id}
            countdown = panel.locator(".jp-GpuBudget-big").inner_text()
            s = http("GET", f"{demo.svc}/sessions/{sid}", demo.token)[1]
            m = re.fullmatch(r"(?:(\d+)m)?(\d+)s", countdown)
            assert m, countdown
            left = int(m.group(1) or 0) * 60 + int(m.group(2))
            assert abs(left - s["protected_left_s"]) <= 3, (countdown, s["protected_left_s"])
            body = panel.inner_text()
            s = http("GET", f"{demo.svc}/sessions/{sid}", demo.token)[1]
            assert gpu_h(body, "Cost so far") == pytest.approx(s["charged_gpu_hours"], abs=0.006)
            assert "MIG 7g.80gb" in body and "lattice-qcd" in body
            # the project and its program, against GET /accounts/{name}
            cards = panel.locator(".jp-GpuBudget-account")
            for i, name in enumerate(("lattice-qcd", "physics")):
                a = http("GET", f"{demo.svc}/accounts/{name}", demo.token)[1]
                card = cards.nth(i).inner_text()
                assert gpu_h(card, "Grant") == pytest.approx(a["effective_grant_hours"], rel=0.01)
                assert gpu_h(card, "Used") == pytest.approx(a["usage_hours"], abs=0.06), card
                assert gpu_h(card, "Left") == pytest.approx(
                    a["effective_grant_hours"] - a["usage_hours"], abs=0.6), card
            # the daily chart: the 6 h on 4 GPUs three days ago are there
            chart = panel.locator(".jp-GpuBudget-chart")
            chart.wait_for()
            daily = http("GET", f"{demo.svc}/accounts/lattice-qcd/usage/daily?tz={TZ}",
                         demo.token)[1]
            assert sum(d["gpu_hours"] for d in daily["days"]) == pytest.approx(48, abs=0.5)
            label = chart.locator("svg").get_attribute("aria-label")
            for d in daily["days"]:
                if d["gpu_hours"] > 1:
                    assert d["date"] in label, (d, label)
            time.sleep(0.6)  # let the notification slide in
            b.shot("hub-lab-sidebar.png")

            # protection runs out: JupyterLab says so, the status bar turns red
            page.locator(".Toastify__toast", has_text="Protected time of this GPU session is over"
                         ).wait_for(timeout=90_000)
            assert status.inner_text().startswith("unprotected · ")
            assert "jp-GpuBudget-danger" in status.get_attribute("class")
            time.sleep(0.6)
            b.shot("hub-lab-protection-over.png")
            assert http("GET", f"{demo.svc}/sessions/{sid}", demo.token)[1][
                "protected_left_s"] == 0

            # the hub's home page: this server's history across a preemption, in words
            _resumed_as(demo, first, sid)
            page.goto(demo.url + "/hub/home")
            card = page.locator(f"#gpubudget-history .gb-history[data-session='{sid}']")
            card.wait_for(timeout=60_000)
            h = http("GET", f"{demo.svc}/sessions/{sid}/history", demo.token)[1]
            old, new = h["segments"]
            assert old["workload"] == first and new["workload"] == sid, h
            text = card.locator(".gb-history-summary").inner_text()
            assert text == (f"started {berlin(old['start'])}, preempted {berlin(old['end'])} "
                            f"(node drained), restored {berlin(new['start'])} on "
                            f"{new['nodes'][0]}"), (text, h)
            rows = card.locator("tbody tr")
            assert rows.count() == 3  # two segments and the total
            assert f"on {node}" in rows.nth(0).inner_text()
            total = rows.nth(2).inner_text()
            assert total.startswith("Total") and "GPU-h" in total, total
            assert card.locator("h2").inner_text().startswith("Your server")
            # the preempted session is this server's past, not a "last session" of its own
            assert page.locator(f"#gpubudget-history .gb-history[data-session='{first}']"
                                ).count() == 0
            page.wait_for_function(
                f"document.getElementById('gpubudget-last').dataset.workload === '{first}'")
            assert page.locator("#gpubudget-last").is_hidden()
            zone = page.locator("#gpubudget-zone").inner_text()
            assert zone == "Times are local: Europe/Berlin (UTC+01:00)" or TZ in zone, zone
            card.scroll_into_view_if_needed()
            b.shot("hub-home-history.png")
            assert not b.errors, b.errors
        finally:
            b.close()
    st, _ = http("DELETE", f"{demo.api}/users/alice/server", demo.token)
    assert st in (202, 204)


def test_second_user_queues_sees_position_and_predicted_start_and_leaves(demo):
    from playwright.sync_api import sync_playwright

    fillers = []
    for user, project, gpus in [("dana", "genomics", 8), ("erin", "genomics", 4),
                                ("erin", "genomics", 2)]:
        st, s = http("POST", f"{demo.svc}/sessions", demo.token,
                     {"user": user, "project": project, "gpus": gpus, "min_runtime": "1h"})
        assert st == 201, s
        fillers.append(s["id"])
    deadline = time.monotonic() + 30
    while any(http("GET", f"{demo.svc}/sessions/{f}", demo.token)[1]["state"] != "running"
              for f in fillers):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with sync_playwright() as p:
        b = Browser(p, demo.url)
        page = b.page
        try:
            b.login("bob")
            page.wait_for_selector("select[name=project]")
            # the quote handler: bob's cookie counts only with the hub's XSRF token, and only
            # for his own server
            xsrf = page.evaluate("window.jhdata.xsrf_token")
            q = "quote?project=lattice-qcd&slice=gpu:1&min_runtime=1h"
            mine = f"{demo.url}/hub/api/gpubudget/users/bob/{q}"
            assert page.request.get(mine).status == 403
            assert page.request.get(mine, headers={"X-XSRFToken": "forged"}).status == 403
            r = page.request.get(mine, headers={"X-XSRFToken": xsrf})
            assert r.status == 200 and r.json()["user"] == "bob", r.text()
            assert page.request.get(f"{demo.url}/hub/api/gpubudget/users/alice/{q}",
                                    headers={"X-XSRFToken": xsrf}).status in (403, 404)
            # the history handler the same way: his own, with the token, never alice's
            hist = f"{demo.url}/hub/api/gpubudget/users/%s/history"
            assert page.request.get(hist % "bob").status == 403
            r = page.request.get(hist % "bob", headers={"X-XSRFToken": xsrf})
            assert r.status == 200 and set(r.json()) == {"servers", "last"}, r.text()
            assert page.request.get(hist % "alice", headers={"X-XSRFToken": xsrf}).status in (
                403, 404)
            page.check("input[name=slice][value='gpu:1']")
            page.wait_for_function("() => document.querySelector('#gpubudget-quote-for')"
                                   ".innerText.includes('1 whole GPU')")
            assert "now" != page.locator("#gpubudget-q-start").inner_text()
            page.click("#spawn_form button[type=submit]")
            page.wait_for_selector("#gb-queue:not([hidden])", timeout=60_000)
            page.wait_for_function("() => /ahead|first in line/.test("
                                   "document.querySelector('#gb-position').innerText)")
            page.wait_for_selector("#gb-hint:not([hidden])")

            def shown_matches_service() -> tuple[bool, tuple]:
                """The page shows the service's position and predicted start: a clock time,
                or 'any moment now' within the minute."""
                mine = http("GET", f"{demo.svc}/sessions?user=bob&state=pending",
                            demo.token)[1]["sessions"]
                assert len(mine) == 1, mine
                s = mine[0]
                position = page.locator("#gb-position").inner_text()
                start = page.locator("#gb-start").inner_text()
                ok = bool(position.startswith(f"{s['queue_position']} ") and s["predicted_start"]
                          and (near_clock(start, s["predicted_start"]) if start != "any moment now"
                               else s["predicted_start"] - time.time() < 90))
                return ok, (position, start, s, time.time())

            # the prediction moves as the service re-plans (the fillers of the tests before end
            # early); the page follows within the spawner's poll, so compare until they agree
            deadline = time.monotonic() + 30
            while not (seen := shown_matches_service())[0]:
                assert time.monotonic() < deadline, seen[1]
                time.sleep(0.5)
            s = seen[1][2]
            hint = page.locator("#gb-hint").inner_text()
            assert hint.startswith("A MIG 7g.80gb slice is free now"), hint
            assert [f["key"] for f in s["free_now"]][0] == "mig:7g.80gb"
            assert page.locator("#gb-leave").inner_text() == "Leave queue"
            # the bar: 5 % for joining, and no line of the event log twice
            assert page.locator("#progress-bar-wrap").get_attribute("aria-valuenow") == "5"
            log = page.locator("#progress-log .progress-log-event").all_text_contents()
            assert log and len(log) == len(set(log)), log
            assert not any("position ?" in x for x in log), log
            b.shot("hub-queue-page.png", full_page=True)

            page.click("#gb-leave")
            page.get_by_text("Your request was withdrawn and nothing was charged.").wait_for()
            b.shot("hub-queue-left.png", full_page=True)
            deadline = time.monotonic() + 30
            while (s := http("GET", f"{demo.svc}/sessions/{s['id']}", demo.token)[1]
                   )["state"] == "pending":
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert s["state"] == "cancelled" and s["started_at"] is None
            assert s["charged_gpu_hours"] == 0
            while http("GET", f"{demo.api}/users/bob", demo.token)[1]["servers"]:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            # back to the form with his choices
            page.get_by_role("link", name="Choose another slice").click()
            page.wait_for_selector("input[name=slice][value='gpu:1']:checked")
            assert not b.errors, b.errors
        finally:
            b.close()
            for f in fillers:
                http("DELETE", f"{demo.svc}/sessions/{f}", demo.token)


def test_a_user_in_no_project_gets_a_clear_page_and_no_start_button(demo):
    from playwright.sync_api import sync_playwright

    st, offer = http("GET", f"{demo.svc}/sessions/offer?user=admin&quotes=0", demo.token)
    assert st == 200 and offer["projects"] == []  # the demo's admin charges no project
    with sync_playwright() as p:
        b = Browser(p, demo.url)
        page = b.page
        try:
            b.login("admin")
            page.goto(demo.url + "/hub/spawn")
            page.get_by_text("You are not in any GPU project yet").wait_for()
            assert not page.locator("#spawn_form button[type=submit]").is_visible()
            assert page.locator("select[name=project]").count() == 0
            b.shot("hub-spawn-no-project.png", full_page=True)
            assert not b.errors, b.errors
        finally:
            b.close()
