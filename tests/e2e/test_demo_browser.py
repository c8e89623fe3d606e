"""The embedded demo hub as a new user meets it, in real Chromium: `gpubudget hub` (what
`make run` starts: demo budgets and inventory, DEMO login) -> log in -> the spawn form (projects,
slices with quotes, the inventory in use) -> spawn with a MIG slice -> JupyterLab loads.

Needs Chromium (`apt-get install -y chromium`) and the playwright Python package (browsers are
not downloaded: the system Chromium is used). With CI=true a missing part fails the test."""

from __future__ import annotations

import pytest

from tests.hub.hubproc import (
    CHROMIUM,
    CHROMIUM_FLAGS,
    http,
    require_browser,
    start_demo_hub,
)

FLAGS = CHROMIUM_FLAGS


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    require_browser()
    h = start_demo_hub(tmp_path_factory.mktemp("demo"), via_cli=True,
                       env={"GPUBUDGET_SLOW_SPAWN": "1"})
    yield h
    h.stop()


def test_new_user_logs_in_spawns_a_mig_slice_and_sees_jupyterlab(demo):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(60_000)
            page.goto(demo.url + "/hub/login")
            assert "gpubudget DEMO" in page.content()  # the demo login says it is one
            page.fill("#username_input", "alice")
            page.fill("#password_input", "gpubudget-demo")
            page.click("#login_submit")
            page.wait_for_selector("select[name=project]")  # the spawn form
            form = page.content()
            assert "Hardware: a declared inventory" in form
            options = page.locator("select[name=project] option")
            values = [options.nth(i).get_attribute("value") for i in range(options.count())]
            assert values == ["lattice-qcd", "astro"]  # only alice's projects
            assert "GPU-h left" in options.nth(0).inner_text()  # with their budgets
            page.wait_for_function("() => document.querySelector('#gpubudget-q-backed')"
                                   ".innerText.startsWith('yes')")  # the quote
            page.select_option("select[name=project]", "lattice-qcd")
            page.check("input[name=slice][value='mig:1g.10gb']")
            page.click("form button[type=submit], form input[type=submit]")
            page.wait_for_url("**/user/alice/lab**", timeout=150_000)
            page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
            assert "JupyterLab" in page.title()
        finally:
            browser.close()
    st, sessions = http("GET", demo.svc + "/sessions?user=alice&state=running", demo.token)
    assert st == 200 and len(sessions["sessions"]) == 1, sessions
    s = sessions["sessions"][0]
    assert s["project"] == "lattice-qcd"
    assert s["placement"][0]["kind"] == "mig" and s["placement"][0]["profile"] == "1g.10gb"
    env = demo.server_env("alice")
    assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-h100-a-")


def test_queued_spawn_shows_its_place_in_the_queue_then_starts(demo):
    """The whole-GPU capacity is taken (protected sessions queued through the service for
    other users); bob's spawn page shows his queue position and predicted start instead of a
    blank page, and JupyterLab opens once capacity frees."""
    from playwright.sync_api import sync_playwright

    fillers = []
    for user, project, gpus in [("dana", "genomics", 8), ("erin", "genomics", 4),
                                ("erin", "genomics", 2)]:
        st, s = http("POST", demo.svc + "/sessions", demo.token,
                     {"user": user, "project": project, "gpus": gpus, "min_runtime": "1h"})
        assert st == 201, s
        fillers.append(s["id"])
    for wid in fillers:
        _wait_state(demo, wid, "running")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(60_000)
            page.goto(demo.url + "/hub/login")
            page.fill("#username_input", "bob")
            page.fill("#password_input", "gpubudget-demo")
            page.click("#login_submit")
            page.wait_for_selector("select[name=project]")
            page.check("input[name=slice][value='gpu:1']")
            page.click("form button[type=submit], form input[type=submit]")
            page.wait_for_selector("#gb-position:has-text('1 — first in line')",
                                   timeout=60_000)  # the queue page
            assert page.locator("#gb-start").inner_text()  # a predicted start
            for wid in fillers:  # capacity frees
                http("DELETE", f"{demo.svc}/sessions/{wid}", demo.token)
            page.wait_for_url("**/user/bob/lab**", timeout=150_000)
            page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
        finally:
            browser.close()
    assert demo.server_env("bob")["CUDA_VISIBLE_DEVICES"].startswith("GPU-h100-")


def _wait_state(demo, wid: str, state: str, timeout: float = 30) -> dict:  # noqa: ANN001
    import time

    deadline = time.monotonic() + timeout
    while True:
        st, s = http("GET", f"{demo.svc}/sessions/{wid}", demo.token)
        if s["state"] == state:
            return s
        assert time.monotonic() < deadline, s
        time.sleep(0.2)
