"""The sidebar's snapshot section in real Chromium, in a real JupyterLab whose server extension
talks to the real service: "Snapshot now" saves the notebook's kernel (a notification says
what was saved, the list shows it in local time with its size), "Restore" asks first, then
brings the kernel back (a notification and the section say what came back and how: the
variables restored, recomputed and lost). Screenshots go to ``$GPUBUDGET_ARTIFACTS``."""

from __future__ import annotations

import re
import time

from tests.e2e import test_lab_sidebar as _ls
from tests.fixtures.hub import http
from tests.fixtures.jupyter import start_jupyter
from tests.serverext import conftest as _sx

from .test_server_snapshots import Server

hub, service, root, server_token, session = (_sx.hub, _sx.service, _sx.root, _sx.server_token,
                                             _sx.session)
parts = _ls.parts


def test_snapshot_now_and_restore_from_the_sidebar(parts, service, session, server_token,
                                                   root, tmp_path):
    lab = start_jupyter(tmp_path / "lab", {
        "GPUBUDGET_URL": service.base, "JUPYTERHUB_API_TOKEN": server_token,
        "GPUBUDGET_SESSION": session["id"], "GPUBUDGET_PROJECT": session["project"],
        "GPUBUDGET_SNAPSHOT_DIR": str(tmp_path / "store"),
        "GPUBUDGET_SNAPSHOT_METHODS": "namespace"}, lab=True)
    s = Server(lab)
    try:
        s.open("analysis.ipynb")
        s.run("analysis.ipynb", "import numpy as np\nweights = np.ones(50_000)\nstep = 1\n"
                                "log = open('run.log', 'w')")
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            b = _ls.Browser(p, lab.url + f"lab?token={lab.token}")
            try:
                page = b.page
                page.locator(".jp-GpuBudget-statusButton").click()
                panel = page.locator("#jp-gpubudget-panel")
                section = panel.locator("section[aria-labelledby='jp-GpuBudget-snapshots']")
                section.wait_for()
                assert "No snapshot of this session yet" in section.inner_text()
                assert "Your kernels are saved (namespace)" in section.inner_text()
                section.get_by_role("button", name="Snapshot now").click()
                page.locator(".Toastify__toast", has_text="Snapshot taken: 1 of 1 kernel saved"
                             ).wait_for()
                item = section.locator(".jp-GpuBudget-snapshot").first
                item.wait_for()
                text = item.inner_text()
                # local time, size, method, why; and what could not be saved
                assert re.search(r"\d\d:\d\d · [\d.]+ (kB|MB|B) · namespace · 1 of 1 kernel · "
                                 r"on request", text), text
                assert "not saveable: log (" in text, text
                st, listed = http("GET", f"{service.api}/sessions/{session['id']}/snapshots",
                                  root)
                assert listed["snapshots"][0]["reason"] == "user"
                s.run("analysis.ipynb", "weights[:] = 0\nstep = 2")
                b.shot("snapshots-taken.png")

                item.get_by_role("button", name=re.compile("^Restore")).click()
                dialog = page.locator(".jp-Dialog")
                assert "analysis.ipynb" in dialog.inner_text()
                dialog.get_by_role("button", name="Restore").click()
                toast = page.locator(".Toastify__toast",
                                     has_text="Your kernels were restored from the snapshot")
                toast.wait_for()
                assert "analysis.ipynb: 2 variables restored; lost log" in toast.inner_text()
                assert s.run("analysis.ipynb", "print(step, int(weights.sum()))").split() == \
                    ["1", "50000"]
                restored = section.locator(".jp-GpuBudget-restored")
                deadline = time.monotonic() + 60
                while not restored.count():
                    assert time.monotonic() < deadline, section.inner_text()
                    panel.get_by_role("button", name="Refresh").click()
                    time.sleep(1)
                text = restored.inner_text()
                assert "analysis.ipynb: 2 variables restored; lost log" in text, text
                assert "log — " in text and "opens a file for writing" in text, text
                b.shot("snapshots-restored.png")
                assert not b.errors, b.errors
            finally:
                b.close()
    finally:
        lab.stop()
