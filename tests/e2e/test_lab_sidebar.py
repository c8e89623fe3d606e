"""The GPU budget sidebar and status bar in real Chromium, in a real JupyterLab whose server
extension talks to the real gpubudget service (registered with a real JupyterHub) with the
user's token, on the demo budgets and inventory with some usage in the window.

Checks what a researcher reads against the service's own API, the live countdown, the
notifications when protection runs out, leaving the queue, and that the browser console stays
clean. Screenshots (light and dark theme) go to ``$GPUBUDGET_ARTIFACTS`` (default
``out/screenshots``).

Needs Chromium, the playwright package and the built extension (``make lab``); with CI=true a
missing part fails the test. The full spawn through the hub is tested in the hub e2e tests."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.backends.local import LocalBackend
from tests.fixtures.hub import ServiceProc, http, start_hub
from tests.fixtures.jupyter import start_jupyter
from tests.hub.hubproc import CHROMIUM, CHROMIUM_FLAGS, require, require_browser

ROOT = Path(__file__).resolve().parents[2]
FLAGS = CHROMIUM_FLAGS
SHOTS = Path(os.environ.get("GPUBUDGET_ARTIFACTS", ROOT / "out" / "screenshots"))
SERVER_SCOPES = ["custom:gpubudget:read", "custom:gpubudget:submit",
                 "access:services!service=gpubudget"]
HOUR, DAY = 3600, 86400


@pytest.fixture(scope="module")
def parts():
    require_browser()
    require((ROOT / "jupyter_gpubudget" / "labextension" / "package.json").exists(),
            "the built JupyterLab extension (make lab)")
    import jupyterlab  # noqa: F401


@pytest.fixture(scope="module")
def cluster(parts, tmp_path_factory):
    """Hub + service on the demo budgets and inventory, with a week of usage."""
    hub = start_hub(tmp_path_factory.mktemp("hub"))
    d = tmp_path_factory.mktemp("svc")
    shutil.copy(ROOT / "examples" / "budgets-demo.yaml", d / "budgets.yaml")
    shutil.copy(ROOT / "examples" / "inventory-demo.yaml", d / "inventory.yaml")
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}")
    svc.start()
    root = hub.token("root")
    now = time.time()
    # past usage reported as external workloads: (user, project, milli, start ago, hours)
    for i, (user, project, milli, ago, hours) in enumerate([
            ("alice", "lattice-qcd", 4000, 5 * DAY, 6), ("bob", "lattice-qcd", 8000, 3 * DAY, 10),
            ("alice", "lattice-qcd", 2000, 1 * DAY, 5), ("carol", "astro", 8000, 2 * DAY, 30),
            ("erin", "genomics", 8000, 4 * DAY, 12)]):
        for ev, at in (("start", now - ago), ("stop", now - ago + hours * HOUR)):
            body = {"workload": f"past-{i}", "event": ev, "at": at}
            if ev == "start":
                body.update(project=project, user=user, milli=milli, kind="batch")
            st, out = http("POST", f"{svc.api}/usage/events", root, body)
            assert st == 200, out
    yield hub, svc, root
    for sid in [w["id"] for w in http("GET", f"{svc.api}/sessions?state=pending,running",
                                      root)[1]["sessions"]]:
        http("DELETE", f"{svc.api}/sessions/{sid}", root)
    for e in http("GET", f"{svc.api}/queue", root)[1]["queue"]:
        http("DELETE", f"{svc.api}/jobs/{e['id']}", root)
    svc.stop()
    hub.stop()
    jobs = LocalBackend(state_dir=str(svc.dir / "jobs"), stop_grace=2)
    for wid, attempt in jobs.orphans(set()):  # nothing outlives the test
        jobs.stop(wid, attempt)


def _session(svc: ServiceProc, root: str, **body) -> dict:
    st, s = http("POST", f"{svc.api}/sessions", root, body)
    assert st == 201, s
    deadline = time.monotonic() + 30
    while s["state"] != "running":
        assert time.monotonic() < deadline, s
        s = http("GET", f"{svc.api}/sessions/{s['id']}?wait=2", root)[1]
    return s


def _lab(tmp: Path, svc: ServiceProc, token: str, session: dict, theme: str | None = None):
    settings = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    if theme:
        (settings / "themes.jupyterlab-settings").write_text(f'{{"theme": "{theme}"}}')
    return start_jupyter(tmp, {"GPUBUDGET_URL": svc.base, "JUPYTERHUB_API_TOKEN": token,
                               "GPUBUDGET_SESSION": session["id"],
                               "GPUBUDGET_PROJECT": session["project"]}, lab=True)


class Browser:
    def __init__(self, p, url: str) -> None:
        self.browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        self.page = self.browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.set_default_timeout(60_000)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                     else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(url)
        self.page.wait_for_selector("#jp-main-dock-panel")

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / name))

    def close(self) -> None:
        self.browser.close()


def _hours(text: str) -> float:
    return float(re.search(r"([\d.]+) GPU-h", text).group(1))


def test_sidebar_and_status_bar_show_what_the_service_says(cluster, tmp_path):
    from playwright.sync_api import sync_playwright

    hub, svc, root = cluster
    token = hub.token("alice", scopes=SERVER_SCOPES)
    sess = _session(svc, root, user="alice", project="lattice-qcd", slice="mig:1g.10gb",
                    min_runtime="2h")
    # alice's other work: a running 8-GPU job, a queued one, a queued second session
    jobs = []
    for name in ("train-8", "sweep-8"):
        st, j = http("POST", f"{svc.api}/jobs", token,
                     {"command": "sleep 600", "project": "lattice-qcd", "gpus": 8, "name": name,
                      "min_runtime": "1h"})
        assert st == 201, j
        jobs.append(j)
    st, queued = http("POST", f"{svc.api}/sessions", root,
                      {"user": "alice", "project": "astro", "slice": "gpu:8", "name": "big"})
    assert st == 201, queued
    time.sleep(2)  # a cycle places what fits
    lab = _lab(tmp_path / "lab", svc, token, sess)
    with sync_playwright() as p:
        b = Browser(p, lab.url + f"lab?token={lab.token}")
        try:
            page = b.page
            status = page.locator(".jp-GpuBudget-statusButton")
            status.wait_for()
            text = status.inner_text()
            assert re.fullmatch(r"protected 1h5\dm · (0|0\.0\d*) GPU-h", text), text
            b.shot("lab-statusbar.png")
            status.focus()
            page.keyboard.press("Enter")  # keyboard opens the sidebar
            panel = page.locator("#jp-gpubudget-panel")
            panel.locator(".jp-GpuBudget-big").wait_for()
            page.wait_for_selector("#jp-gpubudget-panel .jp-GpuBudget-account")
            page.wait_for_selector("#jp-gpubudget-panel .jp-GpuBudget-work")
            body = panel.inner_text()

            # this session, against GET /sessions/{id}
            s = http("GET", f"{svc.api}/sessions/{sess['id']}", token)[1]
            countdown = panel.locator(".jp-GpuBudget-big").inner_text()
            h, m, sec = map(int, re.fullmatch(r"(\d+)h(\d+)m(\d+)s", countdown).groups())
            assert abs(h * 3600 + m * 60 + sec - s["protected_left_s"]) < 20, (countdown, s)
            gpu = s["placement"][0]["gpu"]
            assert "lattice-qcd" in body and "MIG 1g.10gb (1/7 of a GPU)" in body
            assert f"h100-a GPU {gpu}" in body and "no real GPU behind it" in body
            time.sleep(1.5)
            assert panel.locator(".jp-GpuBudget-big").inner_text() != countdown  # live

            # the project and its parents, against GET /accounts/{name}
            cards = panel.locator(".jp-GpuBudget-account")
            assert cards.count() == 2
            for i, name in enumerate(("lattice-qcd", "physics")):
                a = http("GET", f"{svc.api}/accounts/{name}", token)[1]
                card = cards.nth(i).inner_text()
                assert card.startswith(name)
                grant = re.search(r"Grant\s+([\d.]+) GPU-h / 7 days", card)
                used = re.search(r"Used\s+([\d.]+) GPU-h", card)
                left = re.search(r"Left\s+([\d.]+) GPU-h", card)
                assert float(grant.group(1)) == pytest.approx(a["effective_grant_hours"],
                                                              rel=0.01), card
                # shown to the precision the sidebar gives (no decimals from 100 GPU-h on),
                # plus what the running session adds between the page and the answer
                shown = used.group(1)
                step = 10.0 ** -len(shown.partition(".")[2])
                assert float(shown) == pytest.approx(a["usage_hours"], abs=step / 2 + 0.06), card
                assert float(left.group(1)) == pytest.approx(
                    a["effective_grant_hours"] - a["usage_hours"], abs=0.6), card
                assert f"{a['standing']:.2f} · under its grant" in card

            # my other work, against GET /workloads/me
            mine = {w["id"]: w for w in http("GET", f"{svc.api}/workloads/me?state=pending,running", token)[1][
                "workloads"]}
            items = panel.locator(".jp-GpuBudget-work")
            assert items.count() == 3
            work = panel.locator(".jp-GpuBudget-workList").inner_text()
            for w in mine.values():
                if w["id"] == sess["id"]:
                    continue
                assert (w["name"] or w["id"]) in work
                if w["state"] == "pending" and w["queue_position"]:
                    assert f"#{w['queue_position']} in the queue" in work
            assert "Leave queue" in work and "Cancel" in work
            b.shot("lab-sidebar.png")

            # leave the queue from the sidebar (keyboard), through a confirmation dialog
            item = items.filter(has_text="big")
            item.get_by_role("button", name=re.compile("Leave the queue")).focus()
            page.keyboard.press("Enter")
            dialog = page.locator(".jp-Dialog")
            dialog.wait_for()
            b.shot("lab-leave-queue-dialog.png")
            dialog.get_by_role("button", name="Leave queue").click()
            page.wait_for_function(
                "() => !document.querySelector('#jp-gpubudget-panel "
                "section[aria-labelledby=jp-GpuBudget-work]').innerText.includes('big ')")
            assert http("GET", f"{svc.api}/sessions/{queued['id']}", root)[1]["state"] == \
                "cancelled"
            assert not b.errors, b.errors
        finally:
            b.close()
            lab.stop()


def test_protection_running_out_turns_red_and_notifies(cluster, tmp_path):
    """A short minimum runtime: amber with a warning at once, red with a second notification
    when it is over; in the dark theme."""
    from playwright.sync_api import sync_playwright

    hub, svc, root = cluster
    token = hub.token("bob", scopes=SERVER_SCOPES)
    sess = _session(svc, root, user="bob", project="lattice-qcd", slice="mig:1g.10gb",
                    min_runtime="25s")
    lab = _lab(tmp_path / "lab", svc, token, sess, theme="JupyterLab Dark")
    with sync_playwright() as p:
        b = Browser(p, lab.url + f"lab?token={lab.token}")
        try:
            page = b.page
            status = page.locator(".jp-GpuBudget-statusButton")
            status.wait_for()
            assert "jp-GpuBudget-warn" in status.get_attribute("class")
            toast = page.locator(".Toastify__toast", has_text="Protection of this GPU session ends")
            toast.wait_for()
            time.sleep(0.6)  # let it slide in
            b.shot("lab-dark-protection-ending.png")
            page.locator(".Toastify__toast", has_text="Protected time of this GPU session is over"
                         ).wait_for(timeout=60_000)
            assert status.inner_text().startswith("unprotected · ")
            assert "jp-GpuBudget-danger" in status.get_attribute("class")
            status.click()
            panel = page.locator("#jp-gpubudget-panel")
            panel.get_by_text("May be preempted when backed work needs this slice").wait_for()
            b.shot("lab-dark-unprotected.png")
            assert http("GET", f"{svc.api}/sessions/{sess['id']}", token)[1][
                "protected_left_s"] == 0
            assert not b.errors, b.errors
        finally:
            b.close()
            lab.stop()


def test_settings_from_the_settings_registry_drive_warnings_and_notifications(cluster, tmp_path):
    """protectionWarningMinutes above the protected time left: amber at once; notifications
    off: no toast, although the warning is due."""
    from playwright.sync_api import sync_playwright

    hub, svc, root = cluster
    token = hub.token("erin", scopes=SERVER_SCOPES)
    sess = _session(svc, root, user="erin", project="genomics", slice="gpu:1", min_runtime="2h")
    mine = tmp_path / "lab" / "settings" / "jupyter-gpubudget"
    mine.mkdir(parents=True)
    (mine / "plugin.jupyterlab-settings").write_text(
        '{"protectionWarningMinutes": 180, "notifications": false}')
    lab = _lab(tmp_path / "lab", svc, token, sess)
    with sync_playwright() as p:
        b = Browser(p, lab.url + f"lab?token={lab.token}")
        try:
            page = b.page
            status = page.locator(".jp-GpuBudget-statusButton.jp-GpuBudget-warn")
            status.wait_for()
            assert re.fullmatch(r"protected 1h5\dm · (0|0\.0\d*) GPU-h", status.inner_text())
            time.sleep(3)  # ticks and a refresh happen; the warning stays silent
            assert page.locator(".Toastify__toast").count() == 0
            assert not b.errors, b.errors
        finally:
            b.close()
            lab.stop()


def test_a_members_limit_shows_in_the_sidebar_and_past_it_the_work_runs_unbacked(cluster,
                                                                                 tmp_path):
    """bob's limit in lattice-qcd, set by alice (a manager of physics) through the API: the
    sidebar's project card reads "Your limit … 8x of 300 GPU-h" (his 80 GPU-h of past work
    in the window); lowered below what he used, the card says his work runs unbacked, as the
    quote does. The limit is cleared afterwards."""
    from playwright.sync_api import sync_playwright

    hub, svc, root = cluster
    alice = hub.token("alice", scopes=["custom:gpubudget:manage", *SERVER_SCOPES])
    url = f"{svc.api}/accounts/lattice-qcd/member_limits/bob"
    st, out = http("PUT", url, alice, {"gpu_hours": 300, "note": "sidebar test"})
    assert st == 200, out
    token = hub.token("bob", scopes=SERVER_SCOPES)
    sess = _session(svc, root, user="bob", project="lattice-qcd", slice="gpu:1",
                    min_runtime="1h")
    mine = tmp_path / "lab" / "settings" / "jupyter-gpubudget"
    mine.mkdir(parents=True)
    (mine / "plugin.jupyterlab-settings").write_text('{"refreshInterval": 2}')
    lab = _lab(tmp_path / "lab", svc, token, sess)
    try:
        with sync_playwright() as p:
            b = Browser(p, lab.url + f"lab?token={lab.token}")
            try:
                page = b.page
                page.locator(".jp-GpuBudget-statusButton").click()
                card = page.locator("#jp-gpubudget-panel .jp-GpuBudget-account").first
                card.get_by_text("Your limit").wait_for()
                text = card.inner_text()
                assert re.search(r"Your limit\s+your member limit in lattice-qcd: 8\d of 300 "
                                 r"GPU-h$", text.strip()), text
                assert "unbacked" not in text, text
                b.shot("lab-sidebar-member-limit.png")
                # lowered below what he used: the card and the quote say it runs unbacked
                st, out = http("PUT", url, alice, {"gpu_hours": 50, "note": "sidebar test"})
                assert st == 200, out
                card.get_by_text(re.compile(r"over your member limit in lattice-qcd: 8\d of 50 "
                                            r"GPU-h — runs unbacked")).wait_for()
                q = http("GET", f"{svc.api}/sessions/quote?project=lattice-qcd&gpus=1"
                         "&min_runtime=1h", token)[1]["quote"]
                assert not q["backed"] and "runs unbacked" in q["note"], q
                assert q["member_limit"]["limit"] == "gpu_hours", q
                assert not b.errors, b.errors
            finally:
                b.close()
    finally:
        lab.stop()
        http("DELETE", url, alice)
        http("DELETE", f"{svc.api}/sessions/{sess['id']}", root)
