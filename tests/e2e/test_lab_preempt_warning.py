"""Warned ahead, in real Chromium and a real JupyterLab whose server extension talks to the real
gpubudget service (registered with a real JupyterHub).

Bob's session is protected for two minutes when the admins drain its node (their note: fan
failure; through the service's API — the service's own loop decides). Before anything stops,
the sidebar and the status bar show the forecast ("may be preempted at ~…: its node … is
being drained") and a notification says so ahead. When the protection ends, the scheduler
asks for the session, and the lab shows the warning with the time left before the server
stops (the service's notice time) and "Save and release now": clicking it saves the open
document (its file on disk changes) and releases the session through the API. The test then
plays the hub spawner's part — it stops the session as preempted and requeues it as the
resume of the first (the decisions the spawner and the loop write after a verified
snapshot, which needs the real spawner's kernel) — and the restored session's sidebar shows
its history and the total cost. Heartbeats are sent as the hub would.

The same forecast and notification ahead for backed work: a protected session of bob's, and
erin's backed job (a project that stands lower) queued for every whole GPU, bob's too.

Screenshots: ``lab-preempt-forecast.png``, ``lab-preempt-warning.png`` and
``lab-preempt-forecast-backed.png`` in ``$GPUBUDGET_ARTIFACTS``."""

from __future__ import annotations

import re
import threading
import time

from jupyter_gpubudget.ledger import Ledger, connect
from tests.e2e.test_lab_sidebar import (  # noqa: F401
    SERVER_SCOPES,
    Browser,
    _lab,
    _session,
    cluster,
    parts,
)
from tests.fixtures.hub import http

PROTECT_S = 120
LEAD_S = 600  # the service's preemption_notice_lead (its default)


def _heartbeats(svc, root: str, sid: str, stop: threading.Event) -> None:  # noqa: ANN001
    """What the hub spawner sends while the server runs (the service ends silent sessions)."""
    while not stop.wait(10):
        http("POST", f"{svc.api}/sessions/{sid}/heartbeat", root)


def test_forecast_warning_before_the_stop_and_history_after(cluster, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    hub, svc, root = cluster
    s1 = _session(svc, root, user="bob", project="lattice-qcd", slice="gpu:1",
                  min_runtime=f"{PROTECT_S}s")
    node = s1["placement"][0]["node"]
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeats, args=(svc, root, s1["id"], stop), daemon=True)
    beat.start()
    token = hub.token("bob", scopes=SERVER_SCOPES)
    lab = _lab(tmp_path / "lab", svc, token, s1)
    notes = lab.dir / "work" / "notes.txt"
    notes.write_text("results so far\n")
    s2 = None
    try:
        with sync_playwright() as p:
            b = Browser(p, lab.url + f"lab/tree/notes.txt?token={lab.token}")
            try:
                page = b.page
                page.locator(".jp-GpuBudget-statusButton").click()
                panel = page.locator("#jp-gpubudget-panel")
                panel.locator("#jp-GpuBudget-session").wait_for()
                assert panel.locator(".jp-GpuBudget-forecast").count() == 0  # nothing likely
                st, out = http("PUT", f"{svc.api}/nodes/{node}/health", root,
                               {"healthy": False, "reason": "fan failure"})
                assert st == 200, out

                # the forecast, while nothing has happened yet
                forecast = panel.locator(".jp-GpuBudget-forecast")
                forecast.wait_for(timeout=60_000)
                text = forecast.inner_text()
                assert text.startswith("May be preempted at ~"), text
                assert f"its node {node} is being drained for maintenance" in text, text
                status = page.locator(".jp-GpuBudget-statusButton").inner_text()
                assert "may be preempted ~" in status, status
                ahead = page.locator(".Toastify__toast", has_text="may be stopped at")
                ahead.first.wait_for(timeout=60_000)
                said = ahead.first.inner_text()
                assert "Your server (project lattice-qcd) may be stopped at" in said, said
                assert http("GET", f"{svc.api}/sessions/{s1['id']}", root)[1]["state"] == \
                    "running"
                b.shot("lab-preempt-forecast.png")

                # an unsaved change in the open document
                page.locator(".jp-FileEditor .cm-content").click()
                page.keyboard.press("Control+End")
                page.keyboard.type("one more line")

                # protection over: the warning with the time left, before the server stops
                warning = page.locator(".Toastify__toast", has_text="This server stops in")
                warning.first.wait_for(timeout=(PROTECT_S + 60) * 1000)
                msg = warning.first.inner_text()
                left = int(re.search(r"stops in (\d+) s", msg).group(1))
                assert 0 < left <= 60, msg
                assert f"node {node} is draining" in msg, msg
                sess = http("GET", f"{svc.api}/sessions/{s1['id']}", root)[1]
                assert sess["state"] == "running" and sess["preempt_requested"]
                assert sess["preempt_stop_at"] > time.time()
                b.shot("lab-preempt-warning.png")
                assert "one more line" not in notes.read_text()
                warning.first.get_by_role("button", name="Save and release now").click()
                page.locator(".Toastify__toast", has_text="Released").first.wait_for(
                    timeout=30_000)
                assert "one more line" in notes.read_text()  # saved before the release
                rel = http("GET", f"{svc.api}/decisions?kind=release-now&workload={s1['id']}",
                           root)[1]["decisions"]
                assert [d["actor"] for d in rel] == ["bob"]
                sess = http("GET", f"{svc.api}/sessions/{s1['id']}", root)[1]
                assert sess["preempt_stop_at"] <= time.time() + 1
                assert not b.errors, b.errors
            finally:
                b.close()
    finally:
        stop.set()
        lab.stop()

    # the spawner's part: stopped as preempted, requeued as the resume of the first
    st, out = http("DELETE", f"{svc.api}/sessions/{s1['id']}?reason=preempt", root)
    assert st in (200, 204), out
    s2 = _session(svc, root, user="bob", project="lattice-qcd", slice="gpu:1", min_runtime="1h")
    new_node = s2["placement"][0]["node"]
    assert new_node != node
    led = Ledger(connect(f"sqlite:///{svc.dir / 'ledger.sqlite'}"))
    try:
        snap, now = "snap-" + s1["id"], time.time()
        led.record_decision(now=now, kind="requeue", workload=s1["id"], actor="root",
                            reason=f"preempted after snapshot {snap}; requeued as {s2['id']}",
                            detail={"as": s2["id"], "snapshot": snap})
        led.record_decision(now=now, kind="resume", workload=s2["id"], actor="root",
                            reason=f"resumes preempted session {s1['id']}",
                            detail={"resumes": s1["id"], "snapshot": snap,
                                    "reason": "preempted"})
    finally:
        led.dispose()
    lab2 = _lab(tmp_path / "lab2", svc, token, s2)
    try:
        with sync_playwright() as p:
            b = Browser(p, lab2.url + f"lab?token={lab2.token}")
            try:
                page = b.page
                page.locator(".jp-GpuBudget-statusButton").click()
                panel = page.locator("#jp-gpubudget-panel")
                summary = panel.locator(".jp-GpuBudget-history-summary")
                summary.wait_for()
                text = summary.inner_text()
                assert text.startswith("started ") and "(node drained: fan failure)" in text, text
                assert text.endswith(f"on {new_node}") and ", restored " in text, text
                history = panel.locator(".jp-GpuBudget-history").inner_text()
                assert history.count("GPU-h") == 3, history  # two segments and the total
                assert panel.locator(".jp-GpuBudget-history dt").last.inner_text().lower() \
                    .startswith("total"), history
                assert not b.errors, b.errors
            finally:
                b.close()
    finally:
        lab2.stop()
        http("DELETE", f"{svc.api}/sessions/{s2['id']}", root)
        http("PUT", f"{svc.api}/nodes/{node}/health", root, {"healthy": True, "reason": "fixed"})


def test_backed_work_queued_behind_a_protected_session_is_forecast_and_told_ahead(
        cluster, tmp_path):  # noqa: F811
    """Bob's session is protected for a few minutes when erin (project genomics, whose
    program stands lower than bob's) queues backed work that needs every whole GPU, bob's
    too, through the service's REST with her own token. Nothing is drained and nothing has
    happened yet: the sidebar and the status bar forecast the preemption at the end of the
    protection, for genomics' backed work, and a notification says so ahead (the protection
    ends within the service's lead time)."""
    from playwright.sync_api import sync_playwright

    hub, svc, root = cluster
    s1 = _session(svc, root, user="bob", project="lattice-qcd", slice="gpu:1",
                  min_runtime=f"{LEAD_S - 60}s")  # its end is within the lead time at once
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeats, args=(svc, root, s1["id"], stop), daemon=True)
    beat.start()
    token = hub.token("bob", scopes=SERVER_SCOPES)
    erin = hub.token("erin", scopes=SERVER_SCOPES)
    lab = _lab(tmp_path / "lab", svc, token, s1)
    job = None
    try:
        with sync_playwright() as p:
            b = Browser(p, lab.url + f"lab?token={lab.token}")
            try:
                page = b.page
                page.locator(".jp-GpuBudget-statusButton").click()
                panel = page.locator("#jp-gpubudget-panel")
                panel.locator("#jp-GpuBudget-session").wait_for()
                assert panel.locator(".jp-GpuBudget-forecast").count() == 0  # nothing queued
                whole = 14  # the demo inventory's whole GPUs: h100-a's 6 (two are MIG), h100-b's 8
                st, job = http("POST", f"{svc.api}/jobs", erin,
                               {"command": "sleep 600", "project": "genomics", "gpus": whole,
                                "name": "align", "min_runtime": "10m"})
                assert st == 201, job

                forecast = panel.locator(".jp-GpuBudget-forecast")
                forecast.wait_for(timeout=90_000)
                text = forecast.inner_text()
                assert text.startswith("May be preempted at ~"), text
                assert "project genomics's backed work is waiting for its GPUs" in text, text
                assert "drain" not in text, text
                sess = http("GET", f"{svc.api}/sessions/{s1['id']}", root)[1]
                fc = sess["preemption_forecast"]
                assert fc["likely"] and fc["for_workload"] == job["id"], fc
                assert abs(fc["at"] - sess["protected_until"]) < 2, (fc, sess)
                shown = re.search(r"~(\d\d):(\d\d)", text)
                at = time.localtime(fc["at"])
                assert abs((int(shown.group(1)) * 60 + int(shown.group(2)))
                           - (at.tm_hour * 60 + at.tm_min)) % 1440 in (0, 1, 1439), (text, fc)
                status = page.locator(".jp-GpuBudget-statusButton").inner_text()
                assert f"may be preempted ~{shown.group(1)}:{shown.group(2)}" in status, status
                ahead = page.locator(".Toastify__toast", has_text="may be stopped at")
                ahead.first.wait_for(timeout=90_000)
                said = ahead.first.inner_text()
                assert "Your server (project lattice-qcd) may be stopped at" in said, said
                assert "for project genomics's backed work" in said, said
                sess = http("GET", f"{svc.api}/sessions/{s1['id']}", root)[1]
                assert sess["state"] == "running" and not sess["preempt_requested"], sess
                assert http("GET", f"{svc.api}/workloads/{job['id']}", root)[1]["state"] == \
                    "pending"
                b.shot("lab-preempt-forecast-backed.png")
                assert not b.errors, b.errors
            finally:
                b.close()
    finally:
        stop.set()
        lab.stop()
        if isinstance(job, dict) and "id" in job:
            http("DELETE", f"{svc.api}/jobs/{job['id']}", root)
        http("DELETE", f"{svc.api}/sessions/{s1['id']}", root)
