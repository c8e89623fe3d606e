"""Advance reservations in real Chromium against the demo hub (hub_config/jupyterhub_config.py:
real JupyterHub, configurable-http-proxy, the gpubudget service managed by the hub, the local
backend on a declared inventory of one node with four GPUs; no GPU here).

- the admin, in a browser set to Europe/Berlin, books 2 GPUs for ``course`` for tomorrow
  10:00–12:00 on the Reservations page; the booking is tomorrow 10:00 in Berlin, the table
  shows it in local time and the zone is said once;
- alice, a member of ``course``, sees it on the spawn form, not yet open. The service has no
  test clock, so to be inside a window the admin books a second one that starts now (REST);
- alice chooses "In reservation …" on the form (its project and its two whole GPUs are
  chosen with it) and starts her session: it runs on the booked GPUs, charged to ``course``.

Screenshots: docs/img/reservations-page.png and docs/img/spawn-form-reservation.png (shown in
docs/admin.md), and under ``$GPUBUDGET_ARTIFACTS`` (default ``out/screenshots``)."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from tests.hub.hubproc import CHROMIUM, CHROMIUM_FLAGS, http, require_browser, start_demo_hub

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("GPUBUDGET_ARTIFACTS", ROOT / "out" / "screenshots"))
DOCS = ROOT / "docs" / "img"
BERLIN = ZoneInfo("Europe/Berlin")
BUDGETS = """\
window: 7d
admins: [admin]
accounts:
  teaching:
    grant: 100
    children:
      thesis: {grant: 20, members: [alice]}
      course: {grant: 60, members: [alice, bob]}
"""
INVENTORY = "nodes:\n  - {name: node0, model: H100-80GB, gpus: 4}\n"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    require_browser()
    d = tmp_path_factory.mktemp("reservations")
    (d / "budgets.yaml").write_text(BUDGETS)
    (d / "inventory.yaml").write_text(INVENTORY)
    h = start_demo_hub(d, d / "budgets.yaml", d / "inventory.yaml")
    yield h
    st, body = http("GET", h.svc + "/reservations", h.token)
    for r in body.get("reservations", []) if st == 200 else []:
        http("DELETE", f"{h.svc}/reservations/{r['id']}", h.token)
    http("DELETE", f"{h.api}/users/alice/server", h.token)
    h.stop()


def login(browser, url: str, user: str):  # noqa: ANN001, ANN201
    ctx = browser.new_context(viewport={"width": 1280, "height": 900},
                              timezone_id="Europe/Berlin")
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    page.goto(url + "/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "gpubudget-demo")
    page.click("#login_submit")
    page.wait_for_load_state()
    return page


def test_an_admin_books_tomorrow_and_a_member_starts_a_session_in_a_booking(hub):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    tomorrow = (datetime.now(BERLIN) + timedelta(days=1)).date()
    at10 = datetime(tomorrow.year, tomorrow.month, tomorrow.day, 10, tzinfo=BERLIN).timestamp()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = login(browser, hub.url, "admin")
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(hub.url + "/services/gpubudget/")
            page.click("#gb-tabs >> text=Reservations")
            page.wait_for_selector("#gb-book")
            page.select_option("#gb-book-project", "course")
            page.fill("#gb-book-gpus", "2")
            assert page.input_value("#gb-book-day") == tomorrow.isoformat()  # the default
            page.fill("#gb-book-from", "10:00")
            page.fill("#gb-book-to", "12:00")
            page.fill("#gb-book-note", "GPU course, lab session 3")
            page.click("#gb-book-submit")
            page.wait_for_selector("#gb-res-table tr[data-reservation]")
            st, out = http("GET", hub.svc + "/reservations", hub.token)
            assert st == 200 and len(out["reservations"]) == 1, out
            course = out["reservations"][0]
            assert course["project"] == "course" and course["gpus"] == 2
            assert course["start"] == at10 and course["end"] == at10 + 2 * 3600, course
            row = page.inner_text(f"tr[data-reservation='{course['id']}']")
            assert "10:00" in row and "12:00" in row and "node0:" in row, row
            assert page.inner_text("#gb-zone").startswith("Times are local: Europe/Berlin")
            assert not errors, errors
            page.screenshot(path=str(SHOTS / "reservations-page.png"), full_page=True)
            page.screenshot(path=str(DOCS / "reservations-page.png"), full_page=True)

            # a booking whose window is open now (the service keeps real time)
            now = time.time()
            st, live = http("POST", hub.svc + "/reservations", hub.token, {
                "project": "course", "gpus": 2, "start": now, "end": now + 2 * 3600,
                "note": "booked on the day"})
            assert st == 201, live

            member = login(browser, hub.url, "alice")
            member.wait_for_selector("#gpubudget-bookings")
            box = member.inner_text("#gpubudget-bookings")
            assert f"In reservation {course['id']}" in box and "opens at its start" in box, box
            assert f"In reservation {live['id']}" in box and "open now" in box, box
            assert member.is_disabled(f"input[name=reservation][value='{course['id']}']")
            assert member.input_value("#gpubudget-project") == "thesis"  # her first project
            member.check(f"input[name=reservation][value='{live['id']}']")
            assert member.input_value("#gpubudget-project") == "course"
            assert member.is_checked("input[name=slice][value='gpu:2']")
            member.wait_for_function("() => document.getElementById('gpubudget-quote-for')"
                                     ".innerText.includes('course, 2 whole GPUs')")
            member.screenshot(path=str(SHOTS / "spawn-form-reservation.png"), full_page=True)
            member.screenshot(path=str(DOCS / "spawn-form-reservation.png"), full_page=True)
            member.click("#gpubudget-launch")
            member.wait_for_url("**/user/alice/lab**", timeout=150_000)
            st, sessions = http("GET", hub.svc + "/sessions?user=alice&state=running",
                                hub.token)
            assert st == 200 and len(sessions["sessions"]) == 1, sessions
            s = sessions["sessions"][0]
            assert s["project"] == "course", s
            assert s["started_at"] >= live["start"]
            placed = {f"{sl['node']}:{sl['gpu']}" for sl in s["placement"]}
            assert placed == set(live["devices"]), (placed, live)
        finally:
            browser.close()
