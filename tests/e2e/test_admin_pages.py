"""The operator's pages in real Chromium against the `make run` hub (the project's own
hub_config/jupyterhub_config.py: real JupyterHub, configurable-http-proxy, the gpubudget
service managed by the hub, DEMO login), on the demo budgets and inventory with some usage in
the window, sessions running and work waiting:

- the admin logs in, opens the service from the hub's Services menu, sees the account tree
  with the API's figures, changes a grant with a note (previewing its effect first) and sees
  the history row and the new standing; drains and undrains a node; reads the queue (why work
  waits) and the audit log;
- a manager (alice: physics; dana: biology) can edit only below their account, and a change
  beyond the parent's grant is refused in the preview;
- a plain user (bob) gets a read-only view of their own projects.

Screenshots go to ``$GPUBUDGET_ARTIFACTS/admin-pages`` (default ``out/screenshots``). Needs
Chromium and the playwright package; with CI=true a missing part fails the test."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.hub.hubproc import (
    CHROMIUM,
    CHROMIUM_FLAGS,
    http,
    require_browser,
    start_demo_hub,
)

ROOT = Path(__file__).resolve().parents[2]
FLAGS = CHROMIUM_FLAGS
SHOTS = Path(os.environ.get("GPUBUDGET_ARTIFACTS", ROOT / "out" / "screenshots")) / "admin-pages"
HOUR, DAY = 3600, 86400
GPUS = 16  # the demo inventory: what may be charged per second at most


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    require_browser()
    SHOTS.mkdir(parents=True, exist_ok=True)
    h = start_demo_hub(tmp_path_factory.mktemp("admin-pages"),
                       env={"GPUBUDGET_SESSION_STALE_S": "3600"})
    now = time.time()
    # past usage, reported as external workloads: (user, project, milli, start ago, hours)
    for i, (user, project, milli, ago, hours) in enumerate([
            ("alice", "lattice-qcd", 4000, 5 * DAY, 6), ("bob", "lattice-qcd", 8000, 3 * DAY, 10),
            ("carol", "astro", 8000, 2 * DAY, 30), ("erin", "genomics", 8000, 4 * DAY, 12),
            ("frank", "proteins", 2000, 1 * DAY, 8)]):
        for ev, at in (("start", now - ago), ("stop", now - ago + hours * HOUR)):
            body = {"workload": f"past-{i}", "event": ev, "at": at}
            if ev == "start":
                body.update(project=project, user=user, milli=milli, kind="batch")
            st, out = http("POST", f"{h.svc}/usage/events", h.token, body)
            assert st == 200, out
    # running sessions (protected for an hour) and a batch job; then work that must wait
    sessions = []
    for user, project, gpus in [("dana", "genomics", 8), ("carol", "astro", 2),
                                ("erin", "genomics", 2)]:
        st, s = http("POST", h.svc + "/sessions", h.token,
                     {"user": user, "project": project, "gpus": gpus, "min_runtime": "1h"})
        assert st == 201, s
        sessions.append(s["id"])
    # a batch job of bob's (it runs as his Unix account)
    st, tok = http("POST", f"{h.api}/users/bob/tokens", h.token,
                   {"scopes": ["custom:gpubudget:submit"], "note": "admin pages test"})
    assert st == 201, tok
    st, job = http("POST", h.svc + "/jobs", tok["token"],
                   {"command": "sleep 600", "project": "lattice-qcd", "gpus": 1,
                    "name": "training-run", "resumable": True})
    assert st == 201, job
    for wid in sessions:
        wait_state(h, f"/sessions/{wid}", "running")
    wait_state(h, f"/workloads/{job['id']}", "running")
    st, big = http("POST", h.svc + "/sessions", h.token,
                   {"user": "bob", "project": "lattice-qcd", "gpus": 4, "min_runtime": "2h",
                    "name": "big-session"})
    assert st == 201, big
    h.extra = {"sessions": [*sessions, big["id"]], "job": job["id"]}
    yield h
    for wid in h.extra["sessions"]:
        http("DELETE", f"{h.svc}/sessions/{wid}", h.token)
    http("DELETE", f"{h.svc}/jobs/{job['id']}", h.token)
    h.stop()


def wait_state(h, path: str, state: str, timeout: float = 30) -> dict:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while True:
        st, w = http("GET", h.svc + path, h.token)
        if st == 200 and w["state"] == state:
            return w
        assert time.monotonic() < deadline, w
        time.sleep(0.2)


def proxy_lost(r) -> bool:  # noqa: ANN001
    """A read or PUT that configurable-http-proxy lost on its way to the service (it answers
    502/503/504 with the hub's HTML error page, "socket hang up" in its log, not the
    service's JSON): the page sends it once more (gpubudget.js ``send``), and the test then
    checks the outcome; any other 5xx is an error of the page."""
    return (r.status in (502, 503, 504) and r.request.method in ("GET", "PUT")
            and not (r.headers.get("content-type") or "").startswith("application/json"))


def login(browser, demo, user: str):  # noqa: ANN001, ANN201
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a 5xx is recorded with its method and address (the console's line for it names neither)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not
            re.match(r"Failed to load resource: .* status of 5\d\d", m.text) else None)
    page.on("response", lambda r: errors.append(f"{r.status} {r.request.method} {r.url}")
            if r.status >= 500 and not proxy_lost(r) else None)
    page.goto(demo.url + "/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "gpubudget-demo")
    page.click("#login_submit")
    page.wait_for_load_state()
    # the hub's own nav bar: Services -> gpubudget
    page.click("nav >> text=Services")
    page.click("nav .dropdown-menu >> text=gpubudget")
    page.wait_for_selector("#gb-accounts")
    assert page.url.rstrip("/").endswith("/services/gpubudget"), page.url
    page.errors = errors
    return ctx, page


def shot(page, name: str) -> None:  # noqa: ANN001
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def row(page, account: str):  # noqa: ANN001, ANN201
    return page.locator(f"tr.gb-account[data-account='{account}']")


def page_figures(page) -> dict[str, dict]:  # noqa: ANN001
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
        'tr.gb-account')].map(r => [r.dataset.account, {grant: r.dataset.grant,
        usage: r.dataset.usage, standing: r.dataset.standing, canEdit: r.dataset.canEdit,
        grantText: r.querySelector('.gb-grant-hours').textContent.trim(),
        usageText: r.querySelector('.gb-usage-hours').textContent.trim(),
        pctText: (r.querySelector('.gb-standing-pct') || {}).textContent}]))""")


def page_fetch(page, method: str, path: str, body: dict) -> tuple[int, dict]:  # noqa: ANN001
    """A request from the page itself: its login cookie and JupyterHub's XSRF token."""
    return tuple(page.evaluate("""async ([method, path, body]) => {
        const x = document.cookie.split('; ').find(c => c.startsWith('_xsrf='));
        const r = await fetch(path, {method, body: JSON.stringify(body),
            headers: {'Content-Type': 'application/json',
                      'X-XSRFToken': decodeURIComponent(x.slice(6))}});
        return [r.status, await r.json()]; }""", [method, path, body]))


def stay(page) -> None:  # noqa: ANN001
    """Mark the loaded page: ``stayed(page)`` is false once anything reloads it."""
    page.evaluate("window.gbStay = 'yes'")


def stayed(page) -> bool:  # noqa: ANN001
    return page.evaluate("window.gbStay === 'yes'")


def wait_in_place(page, js: str) -> None:  # noqa: ANN001
    """Wait until ``js`` (an expression) holds on the page as it was loaded: a reload (which
    drops the mark ``stay`` set) never satisfies it."""
    page.wait_for_function(f"() => window.gbStay === 'yes' && ({js})")


def fmt(x: float) -> str:
    return f"{x:,.1f}" if abs(x) < 100 else f"{x:,.0f}"


def test_admin_sees_the_api_figures_and_changes_a_grant_with_a_note(demo):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            ctx, page = login(browser, demo, "admin")
            t_page = time.time()
            figs = page_figures(page)
            st, api = http("GET", demo.svc + "/accounts", demo.token)
            dt = time.time() - t_page + 2.0  # the page's figures may be a cycle older
            assert st == 200
            api = {a["name"]: a for a in api["accounts"]}
            assert list(figs) == ["physics", "lattice-qcd", "astro", "biology", "genomics",
                                  "proteins"]  # the tree, depth first
            for name, a in api.items():
                f = figs[name]
                assert float(f["grant"]) == a["effective_grant_hours"], name
                assert f["grantText"] == fmt(a["effective_grant_hours"]), name
                assert abs(float(f["usage"]) - a["usage_hours"]) <= GPUS * dt / HOUR + 1e-9
                assert abs(float(f["standing"]) - a["standing"]) <= \
                    GPUS * dt / HOUR / a["effective_grant_hours"] + 1e-9
                assert f["canEdit"] == "yes"  # the admin may change every grant
            assert figs["lattice-qcd"]["usageText"] == fmt(float(figs["lattice-qcd"]["usage"]))
            body = page.inner_text("#gb-main")
            assert "GPU budget admin" in page.inner_text("nav")
            assert "1970" not in body and "epoch" not in body
            assert page.locator("time[data-t]").first.inner_text().count(":") == 1
            shot(page, "admin-accounts")

            # change lattice-qcd's grant: preview first, then save with a note
            usage = api["lattice-qcd"]["usage_hours"]
            row(page, "lattice-qcd").locator(".gb-edit").click()
            page.wait_for_selector("#gb-grant-modal.show")
            page.fill("#gb-grant-value", "1000")
            page.click("#gb-grant-preview")
            assert "Write a note" in page.inner_text("#gb-grant-error")  # a note is required
            assert page.is_disabled("#gb-grant-save")
            page.fill("#gb-grant-note", "More for the March deadline (ticket 42)")
            page.click("#gb-grant-preview")
            prev = page.locator("#gb-preview-table tr[data-account='lattice-qcd']")
            prev.wait_for()
            cells = prev.locator("td").all_inner_texts()
            assert cells[1] == "800 GPU-h" and cells[2] == "1,000 GPU-h", cells
            assert cells[3] == "67 % → 71 %", cells  # of physics' grants: 800/1200 -> 1000/1400
            assert page.locator("#gb-preview-table tr[data-account='astro'] td").nth(3
                                                                                  ).inner_text() \
                == "33 % → 29 %"
            after = float(cells[5].split()[0].replace(",", ""))
            assert abs(after - 100 * usage / 1000) < 0.1 + 100 * GPUS * dt / HOUR / 1000, cells
            assert page.is_enabled("#gb-grant-save")
            shot(page, "admin-grant-preview")
            stay(page)
            page.click("#gb-grant-save")  # saved: the dialog closes, the page updates in place
            page.wait_for_selector("#gb-grant-modal", state="hidden")
            page.wait_for_selector("#gb-alert.alert-success")
            assert "1,000 GPU-h" in page.inner_text("#gb-alert")
            # the new standing once the scheduler has run on the new grant
            wait_in_place(page, "parseFloat(document.querySelector(\"tr.gb-account"
                                "[data-account='lattice-qcd']\").dataset.grant) === 1000")
            hist = page.locator("tr.gb-history[data-account='lattice-qcd']")
            assert "show" in (hist.get_attribute("class") or "")  # opened after the save
            first = hist.locator("tbody tr").first
            assert "More for the March deadline (ticket 42)" in first.inner_text()
            assert "admin" in first.inner_text() and "1,000 GPU-h" in first.inner_text()
            figs2 = page_figures(page)
            assert float(figs2["lattice-qcd"]["grant"]) == 1000.0
            st, a = http("GET", demo.svc + "/accounts/lattice-qcd", demo.token)
            assert a["grant"]["grant_hours"] == 1000 and a["grant"]["changed_by"] == "admin"
            assert a["grant"]["note"] == "More for the March deadline (ticket 42)"
            assert abs(float(figs2["lattice-qcd"]["standing"]) - a["standing"]) < 1e-3
            assert abs(a["standing"] - a["usage_hours"] / 1000) < 1e-9
            shown = float(figs2["lattice-qcd"]["pctText"])
            assert abs(shown - 100 * a["standing"]) < 0.15, (shown, a["standing"])
            shot(page, "admin-accounts-after-change")

            # the queue: why work waits, running work with slice, place, protection, cost
            page.click("#gb-tabs >> text=Queue and running")
            page.wait_for_selector("#gb-running")
            waiting = page.locator("#gb-pending tr[data-why]").first
            assert waiting.get_attribute("data-why") in ("capacity", "reserved")
            assert "big-session" in waiting.inner_text()
            run = page.locator(f"#gb-running tr[data-workload='{demo.extra['job']}']")
            txt = run.inner_text()
            assert "training-run" in txt and "GPU" in txt and "GPU-h" in txt
            assert page.locator("#gb-running .gb-protected time").count() >= 3
            assert "in 5" in page.inner_text("#gb-running")  # protected "in 59 min"
            shot(page, "admin-queue")
            # requeue the batch job from the page
            run.locator("button[data-act=requeue]").click()
            stay(page)
            page.click("#gb-confirm-ok")
            page.wait_for_selector("#gb-confirm", state="hidden")
            page.wait_for_selector("#gb-alert.alert-success")
            assert "put back in the queue" in page.inner_text("#gb-alert")
            assert stayed(page)
            dec = http("GET", f"{demo.svc}/decisions?kind=requeue", demo.token)[1]
            assert dec["decisions"][0]["workload"] == demo.extra["job"]
            assert dec["decisions"][0]["actor"] == "admin"

            # nodes: drain h100-b with a reason, see it draining, undrain it
            page.click("#gb-tabs >> text=Nodes")
            card = page.locator("#node-h100-b")
            card.wait_for()
            assert card.get_attribute("data-state") == "in_service"
            card.locator("button[data-act=drain]").click()
            page.click("#gb-confirm-ok")
            assert "Please say why" in page.inner_text("#gb-confirm-error")
            page.fill("#gb-confirm-reason", "fan replacement")
            stay(page)
            page.click("#gb-confirm-ok")
            page.wait_for_selector("#gb-confirm", state="hidden")
            wait_in_place(page, "document.querySelector('#node-h100-b').dataset.state "
                                "!== 'in_service'")
            page.wait_for_selector("#gb-alert.alert-success")
            card = page.locator("#node-h100-b")
            assert card.get_attribute("data-state") in ("draining", "ready_for_repair")
            assert "fan replacement" in card.inner_text()
            shot(page, "admin-nodes-draining")
            st, n = http("GET", demo.svc + "/nodes/h100-b", demo.token)
            assert not n["healthy"] and n["reason"] == "fan replacement" and n["source"] == "admin"
            card.locator("button[data-act=undrain]").click()
            page.fill("#gb-confirm-reason", "fan replaced")
            page.click("#gb-confirm-ok")
            page.wait_for_selector("#gb-confirm", state="hidden")
            wait_in_place(page, "document.querySelector('#node-h100-b').dataset.state "
                                "=== 'in_service'")

            # the audit log, filtered
            page.click("#gb-tabs >> text=Decisions")
            page.select_option("#f-kind", "grant")
            page.click("#gb-filter button[type=submit]")
            page.wait_for_selector("#gb-decisions tr[data-kind]")
            kinds = set(page.locator("#gb-decisions tr[data-kind]").evaluate_all(
                "rs => rs.map(r => r.dataset.kind)"))
            assert kinds == {"grant"}
            assert "More for the March deadline" in page.inner_text("#gb-decisions")
            page.goto(page.url.split("?")[0] + "?q=h100-b")
            assert {"health", "undrain"} <= set(page.locator(
                "#gb-decisions tr[data-kind]").evaluate_all("rs => rs.map(r => r.dataset.kind)"))
            shot(page, "admin-decisions")
            assert page.errors == [], page.errors
        finally:
            browser.close()


def test_a_manager_edits_only_below_their_account(demo):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            _, page = login(browser, demo, "alice")
            figs = page_figures(page)
            assert list(figs) == ["physics", "lattice-qcd", "astro"]  # not biology
            assert {k: v["canEdit"] for k, v in figs.items()} == {
                "physics": "no", "lattice-qcd": "yes", "astro": "yes"}
            assert row(page, "physics").locator(".gb-edit").count() == 0
            # lattice-qcd's and astro's shares (both visible) are shown; physics' is not
            assert row(page, "astro").locator(".gb-shares .progress").count() == 2
            assert "not shown" in row(page, "physics").inner_text()
            assert "GPU budget admin" not in page.inner_text("nav")
            # beyond physics' own grant: the preview says it would be refused
            row(page, "lattice-qcd").locator(".gb-edit").click()
            page.fill("#gb-grant-value", "1200")
            page.fill("#gb-grant-note", "try to take more")
            page.click("#gb-grant-preview")
            page.wait_for_selector("#gb-grant-error:not(.d-none)")
            assert "would be refused" in page.inner_text("#gb-grant-error")
            assert "physics" in page.inner_text("#gb-grant-error")
            assert page.is_disabled("#gb-grant-save")
            shot(page, "manager-refused-preview")
            # within it: astro 400 -> 200, saved with the note
            page.click("#gb-grant-modal .btn-close")
            page.wait_for_selector("#gb-grant-modal", state="hidden")
            row(page, "astro").locator(".gb-edit").click()
            page.fill("#gb-grant-value", "200")
            page.fill("#gb-grant-note", "astro runs less this month")
            page.click("#gb-grant-preview")
            page.wait_for_selector("#gb-preview-table tr[data-account='astro']")
            stay(page)
            page.click("#gb-grant-save")
            page.wait_for_selector("#gb-grant-modal", state="hidden")
            page.wait_for_selector("#gb-alert.alert-success")
            wait_in_place(page, "parseFloat(document.querySelector(\"tr.gb-account"
                                "[data-account='astro']\").dataset.grant) === 200")
            hist = page.locator("tr.gb-history[data-account='astro'] tbody tr").first
            assert "astro runs less this month" in hist.inner_text()
            assert "alice" in hist.inner_text()
            shot(page, "manager-accounts")
            # the API agrees: from alice's login, physics' own grant cannot be changed
            st, out = page_fetch(page, "PUT", "api/v1/accounts/physics/grant",
                                 {"grant_hours": 5000, "note": "x"})
            assert st == 403 and "only an admin" in out["message"], out
            page.errors.clear()  # the console reports that deliberate 403
            # nodes: read only
            page.click("#gb-tabs >> text=Nodes")
            page.wait_for_selector("#gb-nodes")
            assert page.locator("button[data-act]").count() == 0
            assert page.errors == [], page.errors

            _, dpage = login(browser, demo, "dana")
            figs = page_figures(dpage)
            assert {k: v["canEdit"] for k, v in figs.items()} == {
                "biology": "no", "genomics": "yes", "proteins": "yes"}
        finally:
            browser.close()


def test_a_plain_user_gets_a_read_only_view_of_their_own_projects(demo):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            _, page = login(browser, demo, "bob")
            figs = page_figures(page)
            assert list(figs) == ["physics", "lattice-qcd"]
            assert all(v["canEdit"] == "no" for v in figs.values())
            assert page.locator(".gb-edit").count() == 0
            assert "read-only" in page.inner_text(".gb-legend")
            # shares among siblings would tell about accounts he cannot see (biology, astro)
            assert page.locator(".gb-shares .progress").count() == 0
            assert "not shown" in row(page, "lattice-qcd").inner_text()
            # his history is readable
            row(page, "lattice-qcd").locator(".gb-history-toggle").click()
            hist = page.locator("tr.gb-history[data-account='lattice-qcd']")
            hist.wait_for(state="visible")
            assert "More for the March deadline" in hist.inner_text()
            shot(page, "user-accounts")
            page.click("#gb-tabs >> text=Queue and running")
            page.wait_for_selector("#gb-running")
            assert page.locator("button[data-act]").count() == 0
            text = page.inner_text("#gb-main")
            assert "someone else" in text and "dana" not in text and "carol" not in text
            assert "big-session" in text  # his own
            shot(page, "user-queue")
            # a change from this page's login is refused by the API too
            st, out = page_fetch(page, "PUT", "api/v1/accounts/lattice-qcd/grant",
                                 {"grant_hours": 5000, "note": "mine now"})
            assert st == 403, out
            assert page.errors == ["Failed to load resource: the server responded with a status "
                                   "of 403 (Forbidden)"], page.errors
        finally:
            browser.close()


def test_a_drain_closes_its_dialog_updates_the_node_in_place_and_a_failure_stays_in_it(demo):
    """The drain dialog closes once the drain is accepted and the node's badge
    changes without a reload (as do undrain's); a refused change is shown in the dialog."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            ctx, page = login(browser, demo, "admin")
            page.set_viewport_size({"width": 1280, "height": 800})
            page.click("#gb-tabs >> text=Nodes")
            card = page.locator("#node-h100-b")
            card.wait_for()
            assert card.get_attribute("data-state") == "in_service"
            stay(page)
            card.locator("button[data-act=drain]").click()
            page.wait_for_selector("#gb-confirm.show")
            page.fill("#gb-confirm-reason", "PSU swap")
            page.click("#gb-confirm-ok")
            page.wait_for_selector("#gb-confirm", state="hidden")
            wait_in_place(page, "document.querySelector('#node-h100-b').dataset.state "
                                "!== 'in_service'")
            badge = page.locator("#node-h100-b .gb-state").inner_text()
            assert badge.startswith(("draining", "drained")), badge
            assert "PSU swap" in page.inner_text("#node-h100-b")
            assert "h100-b" in page.inner_text("#gb-alert")
            assert page.locator("#node-h100-b button[data-act=undrain]").count() == 1
            shot(page, "admin-nodes-drained-in-place")
            assert stayed(page)

            # a change the service refuses stays in the dialog with the reason
            page.locator("#node-h100-b button[data-act=undrain]").click()
            page.wait_for_selector("#gb-confirm.show")
            page.fill("#gb-confirm-reason", "PSU swapped")
            # the drain's in-place refreshes are done (one after the next scheduling cycle):
            # a refresh after the logout below would fail, rightly, and log its fetch error
            page.wait_for_function("() => !document.body.dataset.gbRefreshing")
            ctx.clear_cookies()  # logged out meanwhile (another tab)
            page.click("#gb-confirm-ok")
            err = page.locator("#gb-confirm-error")
            err.wait_for(state="visible")
            assert "no longer logged in" in err.inner_text(), err.inner_text()
            assert page.locator("#gb-confirm").is_visible()
            assert page.is_enabled("#gb-confirm-ok")
            assert page.locator("#node-h100-b").get_attribute("data-state") != "in_service"
            shot(page, "admin-undrain-refused-in-dialog")
            st, n = http("GET", demo.svc + "/nodes/h100-b", demo.token)
            assert not n["healthy"], n  # nothing changed
            st, n = http("PUT", demo.svc + "/nodes/h100-b/health", demo.token,
                         {"healthy": True, "reason": "PSU swapped"})
            assert st == 200 and n["state"] == "in_service", n
            page.errors[:] = [e for e in page.errors if "403" not in e]
            assert page.errors == [], page.errors
        finally:
            browser.close()


def test_a_change_accepted_while_its_dialog_opens_still_closes_it(demo):
    """Bootstrap ignores a dialog's hide() while it is still fading in: a drain confirmed
    within that fade (a quick click, a fast service) was carried out but left its dialog open
    (the first admin-pages test timed out on it once, after an undrain)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            ctx, page = login(browser, demo, "admin")
            page.click("#gb-tabs >> text=Nodes")
            card = page.locator("#node-h100-b")
            card.wait_for()
            assert card.get_attribute("data-state") == "in_service"
            stay(page)
            # a slow fade (2 s) so that the service's answer surely lands within it
            page.add_style_tag(content=".modal.fade, .modal.fade .modal-dialog, "
                                       ".modal-backdrop.fade { transition-duration: 2s "
                                       "!important; }")
            # open the dialog and confirm it in the same task, long before its fade ends
            page.evaluate("""() => {
                document.querySelector('#node-h100-b button[data-act=drain]').click();
                document.getElementById('gb-confirm-reason').value = 'quick drain';
                document.getElementById('gb-confirm-form').requestSubmit();
            }""")
            wait_in_place(page, "document.querySelector('#node-h100-b').dataset.state "
                                "!== 'in_service'")
            # closed for good: no backdrop left (while the backdrop fades in, the dialog itself
            # is not displayed yet, so "hidden" alone would hold before it ever showed)
            page.wait_for_function("() => !document.querySelector('.modal-backdrop') && "
                                   "!document.body.classList.contains('modal-open')",
                                   timeout=15_000)
            assert not page.locator("#gb-confirm").is_visible()
            assert "h100-b" in page.inner_text("#gb-alert")
            st, n = http("GET", demo.svc + "/nodes/h100-b", demo.token)
            assert not n["healthy"] and n["reason"] == "quick drain", n
            page.wait_for_function("() => !document.body.dataset.gbRefreshing")
            ctx.close()
        finally:
            browser.close()
            st, n = http("PUT", demo.svc + "/nodes/h100-b/health", demo.token,
                         {"healthy": True, "reason": "quick drain test done"})
            assert st == 200, n


def test_change_grant_says_save_waits_for_a_preview(demo):
    """A grant change: Save is off until the change is previewed, and the dialog says so."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            _, page = login(browser, demo, "admin")
            page.set_viewport_size({"width": 1280, "height": 800})
            row(page, "proteins").locator(".gb-edit").click()
            page.wait_for_selector("#gb-grant-modal.show")
            hint = page.locator("#gb-grant-save-hint")
            assert page.is_disabled("#gb-grant-save")
            assert hint.is_visible() and "Preview the effect first" in hint.inner_text()
            assert page.get_attribute("#gb-grant-save", "aria-describedby") == \
                "gb-grant-save-hint"
            shot(page, "admin-grant-save-hint")
            page.fill("#gb-grant-value", "40")
            page.fill("#gb-grant-note", "unchanged: checking the dialog")
            page.click("#gb-grant-preview")
            page.wait_for_selector("#gb-preview-table tr[data-account='proteins']")
            assert page.is_enabled("#gb-grant-save") and not hint.is_visible()
            page.fill("#gb-grant-value", "41")  # another value: preview again
            assert page.is_disabled("#gb-grant-save") and hint.is_visible()
            assert page.errors == [], page.errors
        finally:
            browser.close()


def csv_rows(text: str) -> list[list[str]]:
    import csv
    import io
    return list(csv.reader(io.StringIO(text)))


def test_the_audit_tab_for_admins_and_managers(demo):
    """An Audit tab (admins; managers: their subtree) with grant changes,
    drains, cancellations and preemptions — who, when in local time, why — filtered by
    account and time, and a formula-safe CSV download. Researchers get no tab."""
    from playwright.sync_api import sync_playwright

    # a grant change whose note a spreadsheet would run, and a node drained and returned
    evil = '=HYPERLINK("http://evil.example/","click")'
    st, out = http("PUT", demo.svc + "/accounts/proteins/grant", demo.token,
                   {"share_pct": 40, "note": evil})
    assert st == 200, out
    for healthy, why in ((False, "audit tab check"), (True, "audit tab check done")):
        st, out = http("PUT", demo.svc + "/nodes/h100-b/health", demo.token,
                       {"healthy": healthy, "reason": why})
        assert st == 200, out
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            ctx, page = login(browser, demo, "admin")
            page.set_viewport_size({"width": 1280, "height": 800})
            page.click("#gb-tabs >> text=Audit")
            page.wait_for_selector("#gb-audit")
            kinds = set(page.locator("#gb-audit tr[data-kind]").evaluate_all(
                "rs => rs.map(r => r.dataset.kind)"))
            assert {"grant", "health", "undrain"} <= kinds, kinds
            text = page.inner_text("#gb-audit")
            assert "audit tab check" in text and evil in text
            assert "1970" not in text and "{" not in text  # no epoch, no raw JSON
            first = page.locator("#gb-audit tr[data-kind]").first
            assert first.locator("time").inner_text().count(":") == 1  # '14:05 (…)'
            shot(page, "admin-audit")
            # by account: proteins only (and nothing about nodes)
            page.select_option("#a-account", "proteins")
            page.click("#gb-audit-filter button[type=submit]")
            page.wait_for_selector("#gb-audit")
            accts = set(page.locator("#gb-audit tr[data-kind]").evaluate_all(
                "rs => rs.map(r => r.dataset.account)"))
            assert accts == {"proteins"}, accts
            # by time: from tomorrow, nothing
            page.fill("#a-since", time.strftime("%Y-%m-%dT%H:%M",
                                                time.localtime(time.time() + DAY)))
            page.click("#gb-audit-filter button[type=submit]")
            page.wait_for_selector("#gb-audit")
            assert page.locator("#gb-audit tr[data-kind]").count() == 0
            assert "Nothing matches" in page.inner_text("#gb-audit")
            page.fill("#a-since", time.strftime("%Y-%m-%dT%H:%M",
                                                time.localtime(time.time() - DAY)))
            page.click("#gb-audit-filter button[type=submit]")
            page.wait_for_selector("#gb-audit tr[data-kind='grant']")
            # the CSV of what is shown
            with page.expect_download() as dl:
                page.click("#gb-audit-csv")
            rows = csv_rows(Path(dl.value.path()).read_text())
            assert rows[0] == ["time", "what", "who", "account", "workload", "user", "node",
                               "change", "why"]
            note = [r for r in rows[1:] if "HYPERLINK" in r[8]]
            assert note and note[0][8] == "'" + evil, note  # a spreadsheet shows it as text
            assert all(r[3] == "proteins" for r in rows[1:]), rows
            assert note[0][2] == "gpubudget-test" and note[0][0][:2] == "20", note
            assert page.errors == [], page.errors

            # a manager: their own subtree only
            _, mpage = login(browser, demo, "dana")
            mpage.set_viewport_size({"width": 1280, "height": 800})
            mpage.click("#gb-tabs >> text=Audit")
            mpage.wait_for_selector("#gb-audit")
            accts = set(mpage.locator("#gb-audit tr[data-kind]").evaluate_all(
                "rs => rs.map(r => r.dataset.account)"))
            assert accts <= {"biology", "genomics", "proteins", ""}, accts
            assert "proteins" in accts
            assert "lattice-qcd" not in mpage.inner_text("#gb-main")
            shot(mpage, "manager-audit")
            # a researcher: no tab, and the page itself is refused
            _, upage = login(browser, demo, "bob")
            assert upage.locator("#gb-tabs >> text=Audit").count() == 0
            resp = upage.goto(demo.url + "/services/gpubudget/audit")
            assert resp.status == 403
            assert "admins and account managers" in upage.inner_text("body")
        finally:
            browser.close()


def user_token(demo, user: str, scopes: list[str]) -> str:  # noqa: ANN001
    st, tok = http("POST", f"{demo.api}/users/{user}/tokens", demo.token,
                   {"scopes": scopes, "note": "audit test"})
    assert st == 201, tok
    return tok["token"]


def test_the_audit_api_respects_authorisation_and_validates_its_filters(demo):
    st, out = http("PUT", demo.svc + "/accounts/astro/grant", demo.token,
                   {"grant_hours": 200, "note": "+1 for the audit API test"})
    assert st == 200, out
    st, out = http("PUT", demo.svc + "/accounts/genomics/grant", demo.token,
                   {"share_pct": 60, "note": "@genomics audit API test"})
    assert st == 200, out
    alice = user_token(demo, "alice", ["custom:gpubudget:manage"])
    dana = user_token(demo, "dana", ["custom:gpubudget:manage"])
    bob = user_token(demo, "bob", ["custom:gpubudget:submit"])
    alice_read = user_token(demo, "alice", ["custom:gpubudget:read"])

    st, every = http("GET", demo.svc + "/audit?limit=1000", demo.token)
    assert st == 200, every
    accounts = {e["account"] for e in every["entries"]}
    assert {"astro", "genomics"} <= accounts
    e = every["entries"][0]
    assert e["at_local"] and e["at_text"] and e["who_text"] and e["what"]

    st, mine = http("GET", demo.svc + "/audit?limit=1000", alice)
    assert st == 200, mine
    assert {e["account"] for e in mine["entries"]} - {None} <= {"physics", "lattice-qcd",
                                                                "astro"}
    assert any(e["why"] == "+1 for the audit API test" for e in mine["entries"])
    assert mine["accounts"] == ["astro", "lattice-qcd", "physics"]
    st, theirs = http("GET", demo.svc + "/audit?limit=1000", dana)
    assert st == 200
    assert {e["account"] for e in theirs["entries"]} - {None} <= {"biology", "genomics",
                                                                  "proteins"}
    assert not any("audit API test" in e["why"] and e["account"] == "astro"
                   for e in theirs["entries"])
    # a manager naming someone else's account: refused like one that does not exist
    for acct in ("genomics", "no-such-account"):
        st, out = http("GET", demo.svc + f"/audit?account={acct}", alice)
        assert st == 400 and out["field"] == "account", out
    # a researcher, and a manager's read-only token: nothing
    for tok in (bob, alice_read):
        st, out = http("GET", demo.svc + "/audit", tok)
        assert st == 403 and "admins and account managers" in out["message"], out
        st, out = http("GET", demo.svc + "/audit?format=csv", tok)
        assert st == 403, out
    st, out = http("GET", demo.svc + "/audit?since=yesterday", bob)
    assert st == 403, out  # authority is checked before the filters
    # the filters
    for query, field in (("since=yesterday", "since"), ("until=2025-02-30", "until"),
                         ("since=1700000000", "since"), ("account=nope", "account"),
                         ("since=2025-03-02&until=2025-03-01", "until"),
                         ("what=gossip", "what"), ("format=xlsx", "format"),
                         ("tz=Mars/Olympus", "tz"), ("before=" + "9" * 30, "before"),
                         ("limit=0", "limit")):
        st, out = http("GET", demo.svc + "/audit?" + query, demo.token)
        assert st == 400 and out["field"] == field, (query, out)
        assert out["message"].startswith(field + ":"), out
    st, out = http("GET", demo.svc + "/audit?account=physics&what=grants"
                   "&since=2000-01-01&until=2999-12-31&tz=Europe/Berlin", demo.token)
    assert st == 200, out
    assert {e["account"] for e in out["entries"]} <= {"physics", "lattice-qcd", "astro"}
    assert {e["kind"] for e in out["entries"]} == {"grant"}
    assert out["entries"][0]["at_local"].endswith(("+01:00", "+02:00"))
    st, out = http("GET", demo.svc + "/audit?since=2999-01-01", demo.token)
    assert st == 200 and out["entries"] == []
    # the CSV: every cell that would start a formula is prefixed
    import urllib.request
    req = urllib.request.Request(demo.svc + "/audit?format=csv&account=biology",
                                 headers={"Authorization": f"token {dana}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/csv")
        assert "attachment" in r.headers["Content-Disposition"]
        rows = csv_rows(r.read().decode())
    whys = [r[8] for r in rows[1:]]
    assert "'@genomics audit API test" in whys, whys
    assert all(not c.startswith(("=", "+", "-", "@")) for r in rows for c in r), rows
    # the OpenAPI document describes it
    st, doc = http("GET", demo.svc + "/openapi.json")
    assert "/audit" in doc["paths"], sorted(doc["paths"])


def limits_read(demo, project: str) -> dict:  # noqa: ANN001
    st, out = http("GET", f"{demo.svc}/accounts/{project}/member_limits", demo.token)
    assert st == 200, out
    return out["member_limits"]


def limit_row(page, project: str, user: str):  # noqa: ANN001, ANN201
    return page.locator(f"#gb-limits tr.gb-limit[data-project='{project}'][data-user='{user}']")


def test_a_manager_sets_a_members_limit_on_the_accounts_page_and_a_member_may_not(demo):
    """alice (manager of physics) sees every member of lattice-qcd and astro with their usage,
    sets bob's limit on the page (read back through the API), gets the service's reason for a
    bad one, and removes it; bob sees his own limit against his usage, read-only, and a PUT
    from his page is refused 403. Screenshot: docs/img/accounts-member-limits.png."""
    from playwright.sync_api import sync_playwright

    assert "bob" not in limits_read(demo, "lattice-qcd")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            _, page = login(browser, demo, "alice")
            projects = page.eval_on_selector_all(
                "#gb-limits .gb-limits-project", "xs => xs.map(x => x.dataset.project)")
            assert projects == ["lattice-qcd", "astro"], projects  # not biology's
            bob = limit_row(page, "lattice-qcd", "bob")
            assert limit_row(page, "lattice-qcd", "alice").count() == 1
            # bob's 80 GPU-h of past work in the window and his running GPUs (his job's one,
            # or none once its `sleep 600` ended: the module's earlier tests may take longer
            # under load), no limit
            assert re.search(r"\b8\d\.\d GPU-h · no limit\s+[01] · no limit",
                             bob.inner_text()), bob.inner_text()
            # alice's 24 GPU-h in the project, carol's 240 in astro
            assert "24.0 GPU-h · no limit" in limit_row(page, "lattice-qcd", "alice").inner_text()
            assert re.search(r"\b24\d GPU-h · no limit", limit_row(page, "astro", "carol")
                             .inner_text())
            # a bad limit: the service's reason under the table, nothing saved
            bob.locator(".gb-limit-hours-in").fill("-5")
            bob.locator(".gb-limit-save").click()
            err = page.locator("#gb-limits .gb-limits-project[data-project='lattice-qcd'] "
                               ".gb-limit-error")
            err.wait_for(state="visible")
            assert "gpu_hours: must be a number from 0" in err.inner_text(), err.inner_text()
            assert "bob" not in limits_read(demo, "lattice-qcd")
            # both fields empty: said on the page, nothing sent
            bob.locator(".gb-limit-hours-in").fill("")
            bob.locator(".gb-limit-save").click()
            page.wait_for_function("() => document.querySelector('#gb-limits "
                                   ".gb-limit-error').textContent.includes('Remove lifts')")
            # a good one: saved, the page reloads with it
            bob.locator(".gb-limit-hours-in").fill("300")
            bob.locator(".gb-limit-gpus-in").fill("2")
            bob.locator(".gb-limit-save").click()
            page.wait_for_selector("#gb-limits tr.gb-limit[data-user='bob'][data-gpu-hours='300.0']")
            assert limits_read(demo, "lattice-qcd")["bob"] == {"gpu_hours": 300.0, "gpus": 2.0}
            text = limit_row(page, "lattice-qcd", "bob").inner_text()
            assert re.search(r"\b8\d\.\d of 300 GPU-h\s+[01] of 2\b", text), text
            page.locator("#gb-limits").screenshot(
                path=str(ROOT / "docs" / "img" / "accounts-member-limits.png"))
            assert page.errors == ["Failed to load resource: the server responded with a status "
                                   "of 400 (Bad Request)"], page.errors  # the bad limit's

            _, bpage = login(browser, demo, "bob")
            mine = bpage.locator("#gb-limits tr.gb-limit")
            assert mine.count() == 1 and mine.get_attribute("data-user") == "bob"
            assert re.search(r"of 300 GPU-h", mine.inner_text()), mine.inner_text()
            assert bpage.locator("#gb-limits input, #gb-limits button").count() == 0
            st, out = page_fetch(bpage, "PUT", "api/v1/accounts/lattice-qcd/member_limits/bob",
                                 {"gpu_hours": 5000})
            assert st == 403, out
            assert limits_read(demo, "lattice-qcd")["bob"] == {"gpu_hours": 300.0, "gpus": 2.0}

            # alice lifts it
            page.reload()
            limit_row(page, "lattice-qcd", "bob").locator(".gb-limit-remove").click()
            page.wait_for_selector("#gb-limits tr.gb-limit[data-user='bob'][data-gpu-hours='']")
            assert "bob" not in limits_read(demo, "lattice-qcd") or \
                limits_read(demo, "lattice-qcd")["bob"] is None
        finally:
            browser.close()
            http("DELETE", f"{demo.svc}/accounts/lattice-qcd/member_limits/bob", demo.token)


def test_past_a_members_limit_the_spawn_forms_quote_says_the_session_runs_unbacked(demo):
    """bob's limit in lattice-qcd below the 80 GPU-h he used in the window: the spawn form's
    quote says why the session would be unbacked (his member limit, not the project's grant)."""
    from playwright.sync_api import sync_playwright

    url = f"{demo.svc}/accounts/lattice-qcd/member_limits/bob"
    st, out = http("PUT", url, demo.token, {"gpu_hours": 10, "note": "spawn form test"})
    assert st == 200, out
    bob = user_token(demo, "bob", ["custom:gpubudget:read", "custom:gpubudget:submit"])
    deadline = time.monotonic() + 60
    while True:  # the next cycle has the limit
        st, q = http("GET", f"{demo.svc}/sessions/quote?project=lattice-qcd&gpus=1"
                     "&min_runtime=1h", bob)
        if st == 200 and q["quote"].get("member_limit"):
            break
        assert time.monotonic() < deadline, q
        time.sleep(0.5)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                page.set_default_timeout(60_000)
                page.goto(demo.url + "/hub/login")
                page.fill("#username_input", "bob")
                page.fill("#password_input", "gpubudget-demo")
                page.click("#login_submit")
                page.wait_for_load_state()
                page.goto(demo.url + "/hub/spawn")
                page.wait_for_function("() => (document.getElementById('gpubudget-q-backed') || "
                                       "{}).textContent?.includes('member limit')")
                backed = page.inner_text("#gpubudget-q-backed")
                assert re.match(r"no: over your member limit in lattice-qcd: 8\d of 10 GPU-h — "
                                r"runs unbacked; ", backed), backed
                shot(page, "spawn-form-member-limit")
            finally:
                browser.close()
    finally:
        http("DELETE", url, demo.token)
