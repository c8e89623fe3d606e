"""This server's history and its notices in words, in the GPU budget sidebar in real Chromium,
in a real JupyterLab whose server extension talks to the real gpubudget service (registered
with a real JupyterHub).

Bob's session runs, is stopped because the admins drain its node (their note: fan failure),
and comes back on another node as the resume of the first. The sessions are real (REST); the
scheduler's decisions around them — the drain's preemption request, the requeue and the
resume, which the loop writes only after a verified snapshot that needs a real kernel and
hub spawner — are written into the service's own ledger by the test, as the loop writes
them. The sidebar must say: started, preempted (node drained: fan failure), restored on the
other node, each segment's cost and the total; and the notice as its title, its body, and
the ids folded behind "details". Screenshots: ``lab-history.png`` and ``lab-notice-details.png`` in
``$GPUBUDGET_ARTIFACTS`` (default ``out/screenshots``)."""

from __future__ import annotations

import time

from jupyter_gpubudget.ledger import Ledger, connect
from jupyter_gpubudget.ledger import nodes as N
from tests.e2e.test_lab_sidebar import (  # noqa: F401
    SERVER_SCOPES,
    Browser,
    _lab,
    _session,
    cluster,
    parts,
)
from tests.fixtures.hub import http


def test_history_across_a_drain_and_the_notice_in_words(cluster, tmp_path):  # noqa: F811
    from playwright.sync_api import sync_playwright

    hub, svc, root = cluster
    s1 = _session(svc, root, user="bob", project="lattice-qcd", slice="gpu:1",
                  min_runtime="0s")
    node = s1["placement"][0]["node"]
    led = Ledger(connect(f"sqlite:///{svc.dir / 'ledger.sqlite'}"))
    try:
        led.record_decision(now=time.time(), kind="preempt-requested", workload=s1["id"],
                            reason=f"node {node} is draining (loses 0.00 GPU-h)",
                            detail={"for": None, "lost_gpu_hours": 0.0})
        st, out = http("DELETE", f"{svc.api}/sessions/{s1['id']}?reason=preempt", root)
        assert st in (200, 204), out
        N.mark_unhealthy(led, node, "fan failure", "admin", "root", time.time())
        s2 = _session(svc, root, user="bob", project="lattice-qcd", slice="gpu:1",
                      min_runtime="1h")
        snap = "snap-" + s1["id"]
        now = time.time()
        led.record_decision(now=now, kind="requeue", workload=s1["id"], actor="root",
                            reason=f"preempted after snapshot {snap}; requeued as {s2['id']}",
                            detail={"as": s2["id"], "snapshot": snap})
        led.record_decision(now=now, kind="resume", workload=s2["id"], actor="root",
                            reason=f"resumes preempted session {s1['id']}",
                            detail={"resumes": s1["id"], "snapshot": snap,
                                    "reason": "preempted"})
    finally:
        led.dispose()
    new_node = s2["placement"][0]["node"]
    assert new_node != node

    token = hub.token("bob", scopes=SERVER_SCOPES)
    lab = _lab(tmp_path / "lab", svc, token, s2)
    try:
        with sync_playwright() as p:
            b = Browser(p, lab.url + f"lab?token={lab.token}")
            try:
                page = b.page
                page.locator(".jp-GpuBudget-statusButton").click()
                panel = page.locator("#jp-gpubudget-panel")
                summary = panel.locator(".jp-GpuBudget-history-summary")
                summary.wait_for()
                text = summary.inner_text()
                assert text.startswith("started "), text
                assert "preempted " in text and "(node drained: fan failure)" in text, text
                assert text.endswith(f"on {new_node}") and ", restored " in text, text
                assert panel.locator(".jp-GpuBudget-history dt").count() == 3  # 2 + total
                assert "GPU-h" in panel.locator(".jp-GpuBudget-history").inner_text()

                notice = panel.locator(".jp-GpuBudget-notices li").first
                notice.wait_for()
                title = notice.locator(".jp-GpuBudget-notice-title").inner_text()
                assert title == ("Your server (project lattice-qcd) was stopped: its node is "
                                 "being drained"), title
                body = notice.locator(".jp-GpuBudget-notice-body").inner_text()
                assert "“fan failure”" in body and s1["id"] not in body, body
                assert not notice.inner_text().startswith(("requeue:", "preempted:"))
                details = notice.locator("details")
                assert details.get_attribute("open") is None  # folded
                assert not details.locator("dd", has_text=s1["id"]).first.is_visible()
                details.locator("summary").click()
                assert details.locator("dd", has_text=s1["id"]).first.is_visible()
                panel.locator("#jp-GpuBudget-history").scroll_into_view_if_needed()
                b.shot("lab-history.png")
                notice.scroll_into_view_if_needed()
                b.shot("lab-notice-details.png")
                assert not b.errors, b.errors
            finally:
                b.close()
    finally:
        lab.stop()
        http("DELETE", f"{svc.api}/sessions/{s2['id']}", root)
