"""Two clusters under one budget tree, as a researcher meets them in real Chromium (the goal:
"the spawn form, quotes, the queue page, the sidebar ... know the cluster"): the demo hub
(hub_config/jupyterhub_config.py) with ``GPUBUDGET_CLUSTERS`` — a workstation ``ws`` (one
H100) and a ``lab`` node (two A100s), each a declared inventory run by the local backend — and
``BudgetSpawner.cluster_spawners`` giving ``lab`` its own spawner (``GPUBUDGET_HUB_EXTRA_CONFIG``).

- the spawn form offers "Wherever it starts soonest" and each cluster with its GPUs; the live
  quote names the cluster the session would start on, and follows the choice;
- a session started on ``lab`` from the form runs there, by ``lab``'s own spawner (its
  environment says so), and the granted progress message names the cluster;
- the JupyterLab sidebar shows the session's cluster, and a batch job's in "My other work".

Screenshots go to ``$GPUBUDGET_ARTIFACTS`` (default ``out/screenshots``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.hub.hubproc import CHROMIUM, CHROMIUM_FLAGS, http, require_browser, start_demo_hub

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("GPUBUDGET_ARTIFACTS", ROOT / "out" / "screenshots"))
BUDGETS = """\
window: 7d
admins: [admin]
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 60, members: [alice]}
"""
WS = "nodes:\n  - {name: ws0, model: H100-80GB, gpus: 1}\n"
LAB = "nodes:\n  - {name: lab0, model: A100-80GB, gpus: 2}\n"
#: the extra hub config: lab's sessions are started by a spawner of their own, which marks
#: the server's environment (the same class as the demo's, other settings)
EXTRA = """\
c.BudgetSpawner.cluster_spawners = {
    "lab": {"class": c.BudgetSpawner.backend_spawner_class,
            "config": {"environment": {**c.Spawner.environment,
                                       "GPUBUDGET_TEST_SPAWNER": "lab's own"}}},
}
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    require_browser()
    d = tmp_path_factory.mktemp("twoclusters")
    (d / "budgets.yaml").write_text(BUDGETS)
    (d / "ws.yaml").write_text(WS)
    (d / "lab.yaml").write_text(LAB)
    (d / "extra_config.py").write_text(EXTRA)
    h = start_demo_hub(d, d / "budgets.yaml", d / "ws.yaml", env={
        "GPUBUDGET_SLOW_SPAWN": "1",
        "GPUBUDGET_CLUSTERS": f"ws={d / 'ws.yaml'},lab={d / 'lab.yaml'}",
        "GPUBUDGET_HUB_EXTRA_CONFIG": str(d / "extra_config.py")})
    yield h
    st, body = http("GET", h.svc + "/jobs?state=pending,running", h.token)
    for j in body.get("jobs", []) if st == 200 else []:
        http("DELETE", f"{h.svc}/jobs/{j['id']}", h.token)
    h.stop()


def test_offer_lists_the_clusters_and_a_bad_cluster_is_refused(hub):
    st, offer = http("GET", hub.svc + "/sessions/offer?user=alice&quotes=0", hub.token)
    assert st == 200, offer
    assert offer["clusters"] == [
        {"name": "ws", "gpus": 1, "nodes": 1, "models": ["H100-80GB"]},
        {"name": "lab", "gpus": 2, "nodes": 1, "models": ["A100-80GB"]}]
    # a spawn naming no such cluster: refused before anything is queued, listing the clusters
    st, body = http("POST", f"{hub.api}/users/alice/server", hub.token,
                    {"project": "lattice", "slice": "gpu:1", "cluster": "gpu-farm"})
    if st == 202:  # the refusal came after the slow-spawn timeout
        st2, u = http("GET", f"{hub.api}/users/alice", hub.token)
        deadline = time.monotonic() + 30
        while u["servers"] and time.monotonic() < deadline:
            time.sleep(0.5)
            st2, u = http("GET", f"{hub.api}/users/alice", hub.token)
        assert not u["servers"], u
    else:
        assert st == 400, body
        assert "gpu-farm" in body["message"] and "ws" in body["message"], body
    st, sessions = http("GET", hub.svc + "/sessions?user=alice", hub.token)
    assert st == 200 and sessions["sessions"] == []


def test_the_form_offers_the_clusters_and_the_session_runs_on_the_chosen_one(hub):
    from playwright.sync_api import sync_playwright

    # alice's batch job on the workstation (the sidebar's "my other work" names its cluster)
    st, tok = http("POST", f"{hub.api}/users/alice/tokens", hub.token,
                   {"scopes": ["custom:gpubudget:submit", "access:services!service=gpubudget"],
                    "note": "test: alice's batch job"})
    assert st == 201, tok
    st, job = http("POST", hub.svc + "/jobs", tok["token"],
                   {"project": "lattice", "command": "sleep 300", "gpus": 1, "cluster": "ws",
                    "name": "prep", "time_limit": "10m"})
    assert st == 201, job
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(60_000)
            page.goto(hub.url + "/hub/login")
            page.fill("#username_input", "alice")
            page.fill("#password_input", "gpubudget-demo")
            page.click("#login_submit")
            page.wait_for_selector("#gpubudget-clusters")
            box = page.locator("#gpubudget-clusters").inner_text()
            assert "Wherever it starts soonest" in box, box
            assert "ws\n1 GPU (H100-80GB) on 1 node" in box, box
            assert "lab\n2 GPUs (A100-80GB) on 1 node" in box, box
            assert page.is_checked("input[name=cluster][value='']")

            # two whole GPUs: only lab has them, so "soonest" quotes lab
            page.check("input[name=slice][value='gpu:2']")
            page.wait_for_function("() => document.querySelector('#gpubudget-q-cluster')"
                                   ".innerText.startsWith('lab (where it would start')")
            # one GPU on lab, chosen: the quote follows the choice
            page.check("input[name=cluster][value='lab']")
            page.check("input[name=slice][value='gpu:1']")
            page.wait_for_function("() => document.querySelector('#gpubudget-q-cluster')"
                                   ".innerText === 'lab'")
            page.wait_for_function("() => document.querySelector('#gpubudget-q-start')"
                                   ".innerText === 'now'")
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "spawn-form-clusters.png"), full_page=True)
            page.click("#gpubudget-launch")
            page.wait_for_url("**/user/alice/lab**", timeout=150_000)
            page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)

            st, sessions = http("GET", hub.svc + "/sessions?user=alice&state=running",
                                hub.token)
            assert st == 200 and len(sessions["sessions"]) == 1, sessions
            s = sessions["sessions"][0]
            assert s["cluster"] == "lab" and s["request"]["cluster"] == "lab", s
            assert {sl["node"] for sl in s["placement"]} == {"lab0"}, s
            env = hub.server_env("alice")
            assert env["GPUBUDGET_TEST_SPAWNER"] == "lab's own"  # lab's own spawner
            assert env["CUDA_VISIBLE_DEVICES"].startswith("GPU-lab0-"), env
            assert f"session {s['id']} granted" in hub.logtail(200_000)
            assert "on cluster lab" in hub.logtail(200_000)

            # the sidebar: this session's cluster, and the job's in "my other work"
            status = page.locator(".jp-GpuBudget-statusButton")
            status.wait_for()
            status.click()
            panel = page.locator("#jp-gpubudget-panel")
            section = panel.locator("section[aria-labelledby=jp-GpuBudget-session]")
            section.locator(".jp-GpuBudget-row").first.wait_for()
            page.wait_for_selector("#jp-gpubudget-panel .jp-GpuBudget-work")
            session_box = section.inner_text()
            assert "Cluster\nlab" in session_box, session_box
            assert "lab0 GPU" in session_box, session_box
            work = panel.locator(".jp-GpuBudget-work").first.inner_text()
            assert "prep" in work and "cluster ws" in work and "ws0 GPU 0" in work, work
            page.screenshot(path=str(SHOTS / "lab-sidebar-clusters.png"))
        finally:
            browser.close()
    st, _ = http("DELETE", f"{hub.api}/users/alice/server", hub.token)
    assert st in (202, 204)
