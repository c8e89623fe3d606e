"""The Reports page in real Chromium against the `make run` hub (the project's own
hub_config/jupyterhub_config.py: real JupyterHub, configurable-http-proxy, the gpubudget
service managed by the hub, DEMO login) on the demo budgets, with a week of usage reported
through the service's usage API (external workloads: bob's batch runs and alice's notebook
in lattice-qcd, measured; carol's runs in astro, never measured). This machine has no GPU, so
the busy fractions a sampler would have measured are written beside those charge intervals
with the ledger's own ``record_busy`` (what the busy sampler calls).

The admin, in a browser set to Europe/Berlin, chooses physics and a from–to period: the page
draws charged against busy per project over time, a bar per user, the idlest session; astro's
busy time is drawn and said as unknown (never 0); the zone is said once; the CSV download reads
back with csv and its sums equal the API's JSON. Screenshots go to
``$GPUBUDGET_ARTIFACTS/reports-page`` (default ``out/screenshots``)."""

from __future__ import annotations

import csv
import io
import os
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.hub.hubproc import CHROMIUM, CHROMIUM_FLAGS, http, require_browser, start_demo_hub

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("GPUBUDGET_ARTIFACTS", ROOT / "out" / "screenshots")) / "reports-page"
HOUR = 3600
BERLIN = ZoneInfo("Europe/Berlin")
DAYS = 6
#: (workload prefix, user, project, kind, GPUs, start hour (local), hours, busy or None)
RUNS = [("train", "bob", "lattice-qcd", "batch", 8, 9, 3, 0.8),
        ("notebook", "alice", "lattice-qcd", "interactive", 1, 10, 5, 0.1),
        ("sky", "carol", "astro", "batch", 4, 13, 4, None)]


def _ledger_url(h) -> str:  # noqa: ANN001
    return f"sqlite:///{h.dir / 'state' / 'service' / 'ledger.sqlite'}"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    require_browser()
    SHOTS.mkdir(parents=True, exist_ok=True)
    h = start_demo_hub(tmp_path_factory.mktemp("reports-page"))
    today = datetime.now(BERLIN).replace(hour=0, minute=0, second=0, microsecond=0)
    measured = []
    for d in range(DAYS, 0, -1):
        day = today - timedelta(days=d)
        for name, user, project, kind, gpus, at, hours, busy in RUNS:
            wid = f"{name}-{d}"
            start = (day + timedelta(hours=at)).timestamp()
            for ev, t in (("start", start), ("stop", start + hours * HOUR)):
                body = {"workload": wid, "event": ev, "at": t}
                if ev == "start":
                    body.update(project=project, user=user, milli=gpus * 1000, kind=kind)
                st, out = http("POST", f"{h.svc}/usage/events", h.token, body)
                assert st == 200, out
            if busy is not None:
                measured.append((wid, start, start + hours * HOUR, busy, "device"))
    # what the busy sampler would have written, had these GPUs been on this machine
    led = Ledger(connect(_ledger_url(h)))
    try:
        assert led.record_busy(measured) == len(measured)
    finally:
        led.dispose()
    h.range = ((today - timedelta(days=DAYS)).date().isoformat(), today.date().isoformat())
    yield h
    h.stop()


def test_the_reports_page_draws_the_period_and_its_csv_matches_the_api(demo):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            ctx = browser.new_context(viewport={"width": 1280, "height": 900},
                                      timezone_id="Europe/Berlin", accept_downloads=True)
            page = ctx.new_page()
            page.set_default_timeout(30_000)
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(demo.url + "/hub/login")
            page.fill("#username_input", "admin")
            page.fill("#password_input", "gpubudget-demo")
            page.click("#login_submit")
            page.wait_for_load_state()
            page.goto(demo.url + "/services/gpubudget/")
            # the Reports tab among the admin pages
            page.click("#gb-tabs >> text=Reports")
            page.wait_for_selector("#gb-report-form")
            page.select_option("#r-account", "physics")
            page.select_option("#r-period", "range")
            frm, to = demo.range
            page.fill("#r-from", frm)
            page.fill("#r-to", to)
            page.click("#gb-report-form button[type=submit]")
            try:
                page.wait_for_function(
                    "() => (document.getElementById('gb-report').dataset.loaded || '')"
                    f".includes('from={frm}') && document.querySelector('#gb-chart-idle')")
            except Exception:
                page.screenshot(path=str(SHOTS / "reports-page-failed.png"), full_page=True)
                raise AssertionError(f"no report drawn: {page.inner_text('#gb-main')!r} "
                                     f"{errors}") from None
            # the API's figures for the same report (the page's own login)
            q = {"account": "physics", "from": frm, "to": to, "tz": "Europe/Berlin",
                 "by": "day"}
            api = "/services/gpubudget/api/v1/reports?" + urlencode(q)
            rep = page.evaluate(
                "async (u) => (await fetch(u, {headers: {'X-XSRFToken': decodeURIComponent("
                "(document.cookie.split('; ').find(c => c.startsWith('_xsrf=')) || '_xsrf=')"
                ".slice(6))}})).json()", api)
            assert rep["totals"]["charged_gpu_h"] == pytest.approx(DAYS * (8 * 3 + 5 + 4 * 4))
            proj = {p["project"]: p for p in rep["projects"]}
            assert proj["astro"]["busy_gpu_h"] is None

            # charged vs busy over time: a row per project, a column per day that had usage
            rows = page.locator("#gb-chart-time .gb-project-row")
            assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.project)")) == [
                "astro", "lattice-qcd"]
            lattice = page.locator("#gb-chart-time [data-project='lattice-qcd'] .gb-bar")
            astro = page.locator("#gb-chart-time [data-project='astro'] .gb-bar")
            assert lattice.count() == DAYS and astro.count() == DAYS
            assert page.locator("#gb-chart-time [data-project='lattice-qcd'] .gb-busy"
                                ).count() == DAYS
            # astro was never measured: its busy time is unknown — hatched, never a 0 bar
            assert set(astro.evaluate_all("bs => bs.map(b => b.dataset.busy)")) == {"unknown"}
            assert page.locator("#gb-chart-time [data-project='astro'] .gb-busy").count() == 0
            assert page.locator("#gb-chart-time [data-project='astro'] .gb-unknown"
                                ).count() == DAYS
            days = sorted(lattice.evaluate_all("bs => bs.map(b => b.dataset.start)"))
            assert days[-1] == (datetime.fromisoformat(to) - timedelta(days=1)).date().isoformat()
            # per user: bars with the figures of the API; carol's busy time says unknown
            users = page.locator("#gb-chart-users .gb-bar")
            by_label = {b["label"]: b for b in users.evaluate_all(
                "bs => bs.map(b => ({label: b.dataset.label, charged: +b.dataset.charged,"
                " busy: b.dataset.busy, text: b.textContent}))")}
            assert set(by_label) == {"bob · lattice-qcd", "alice · lattice-qcd", "carol · astro"}
            line = {(p["project"], u["user"]): u for p in rep["projects"] for u in p["users"]}
            assert by_label["bob · lattice-qcd"]["charged"] == pytest.approx(
                line[("lattice-qcd", "bob")]["charged_gpu_h"])
            assert by_label["carol · astro"]["busy"] == "unknown"
            assert "busy unknown" in by_label["carol · astro"]["text"]
            # the idlest sessions: alice's notebooks (batch work is not a session)
            idle = page.locator("#gb-chart-idle .gb-bar").evaluate_all(
                "bs => bs.map(b => b.dataset.label)")
            assert idle and all("alice, lattice-qcd" in x for x in idle), idle
            # the totals say what the API says, in words
            body = page.inner_text("#gb-main")
            assert "unknown" in body and "1970" not in body and "null" not in body
            busy_tile = page.inner_text("[data-figure=busy] .gb-value")
            shown = float(busy_tile.split()[0].replace(",", ""))  # '118 GPU-h' (rounded)
            assert abs(shown - rep["totals"]["busy_gpu_h"]) <= 0.5, busy_tile
            # the zone is said once on the page
            assert body.count("Europe/Berlin") == 1, body
            page.screenshot(path=str(SHOTS / "reports-page.png"), full_page=True)

            # the CSV download: the API's CSV of the same report, its sums equal the JSON
            with page.expect_download() as dl:
                page.click("#gb-report-csv")
            text = Path(dl.value.path()).read_text(encoding="utf-8")
            table = list(csv.DictReader(io.StringIO(text)))
            kinds = {r["row"] for r in table}
            assert {"period", "user", "project", "total"} <= kinds, kinds

            def total(kind: str, col: str) -> float:
                return sum(float(r[col] or 0) for r in table if r["row"] == kind)

            t = rep["totals"]
            for kind in ("period", "user", "project", "total"):
                assert total(kind, "charged_gpu_h") == pytest.approx(t["charged_gpu_h"]), kind
                assert total(kind, "busy_gpu_h") == pytest.approx(t["busy_gpu_h"]), kind
            assert next(r for r in table if r["row"] == "project" and r["project"] == "astro"
                        )["busy_gpu_h"] == ""  # unknown: an empty cell, not 0
            assert not errors, errors
        finally:
            browser.close()


def test_a_bad_period_is_said_on_the_page_and_a_plain_user_sees_their_own_line(demo):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            ctx = browser.new_context(viewport={"width": 1280, "height": 900},
                                      timezone_id="Europe/Berlin")
            page = ctx.new_page()
            page.set_default_timeout(30_000)
            page.goto(demo.url + "/hub/login")
            page.fill("#username_input", "bob")
            page.fill("#password_input", "gpubudget-demo")
            page.click("#login_submit")
            page.wait_for_load_state()
            frm, to = demo.range
            page.goto(demo.url + "/services/gpubudget/reports?"
                      + urlencode({"account": "lattice-qcd", "from": frm, "to": to}))
            page.wait_for_selector("#gb-chart-users .gb-bar")
            labels = page.locator("#gb-chart-users .gb-bar").evaluate_all(
                "bs => bs.map(b => b.dataset.label)")
            assert labels == ["bob · lattice-qcd"]  # not alice's line
            # the end before the start: the API's reason, shown on the page
            page.fill("#r-from", to)
            page.fill("#r-to", frm)
            page.click("#gb-report-form button[type=submit]")
            page.wait_for_selector("#gb-report-error:not(.d-none)")
            assert "ends before it starts" in page.inner_text("#gb-report-error")
        finally:
            browser.close()

