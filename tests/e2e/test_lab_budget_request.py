"""The sidebar's own week and asking for more budget, in real Chromium: bob's real JupyterLab
(its server extension talks to the real gpubudget service, registered with a real
JupyterHub) shows his GPU-hours this week — charged, busy unknown (the GPUs of the demo's
declared inventory report no utilisation) — per project, his session's live GPU utilisation
as unknown, and the memory its GPU uses (the service reads node h100-a's GPUs through the
test NVML fake, which reports memory but no utilisation: this machine has no GPU); he asks for more GPU-hours for lattice-qcd from the sidebar; alice, the manager of
physics, logs in to the hub, finds the request on the Budget requests page (after a refusal
that names physics' own grant, until the admin raises it) and grants it; the project's grant
changes, and bob's sidebar shows the notice. Screenshots: ``lab-my-week.png``,
``budget-requests-page.png`` and ``lab-request-granted.png`` in ``$GPUBUDGET_ARTIFACTS``."""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest

from jupyter_gpubudget.backends.local import LocalBackend
from jupyter_gpubudget.service.auth import CUSTOM_SCOPES
from tests.e2e.test_lab_sidebar import (  # noqa: F401
    ROOT,
    SERVER_SCOPES,
    Browser,
    _lab,
    _session,
    parts,
)
from tests.fixtures.hub import ServiceProc, http, start_hub
from tests.hub.hubproc import CHROMIUM, CHROMIUM_FLAGS

# the service's pages act with the scopes of their login, as in hub_config/ (the pages'
# OAuth token may carry gpubudget's own scopes, within the user's roles)
OAUTH_SCOPES = f"""
for _s in c.JupyterHub.services:
    if _s["name"] == "gpubudget":
        _s["oauth_client_allowed_scopes"] = {sorted(CUSTOM_SCOPES)!r}
"""


@pytest.fixture(scope="module")
def cluster(parts, tmp_path_factory):  # noqa: F811
    """Hub + service on the demo budgets and inventory (physics: 1,200 GPU-hours, all of it
    granted to lattice-qcd and astro; alice manages physics; bob is lattice-qcd's member)."""
    hub = start_hub(tmp_path_factory.mktemp("hub"), extra_config=OAUTH_SCOPES)
    d = tmp_path_factory.mktemp("svc")
    # alice manages physics without being a member of lattice-qcd (a manager who is one
    # needs another's approval to fund it: the grant change's own rule)
    demo = (ROOT / "examples" / "budgets-demo.yaml").read_text()
    assert "members: [alice, bob]" in demo
    (d / "budgets.yaml").write_text(demo.replace("members: [alice, bob]", "members: [bob]"))
    shutil.copy(ROOT / "examples" / "inventory-demo.yaml", d / "inventory.yaml")
    # node h100-a's GPUs as the NVML fake describes them: 80 GiB each, 12.1 GiB in use, no
    # utilisation (NVML: "Not Supported"), so busy time stays unknown
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "memory_gib": 80, "memory_used_gib": 12.1,
             "uuid": f"GPU-fake-{i:02d}", "mig": False} for i in range(8)]
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}", extra_args=[
        "--GpuBudgetService.busy_nvml_module=tests.inventory.fake_nvml_module",
        "--GpuBudgetService.busy_node=h100-a", "--GpuBudgetService.busy_interval=1"],
        extra_env={"PYTHONPATH": str(ROOT), "GPUBUDGET_FAKE_NVML": json.dumps(gpus)})
    svc.start()
    yield hub, svc, hub.token("root")
    svc.stop()
    hub.stop()
    jobs = LocalBackend(state_dir=str(svc.dir / "jobs"), stop_grace=2)
    for wid, attempt in jobs.orphans(set()):  # nothing outlives the test
        jobs.stop(wid, attempt)


def _grant(svc, root, account):  # noqa: ANN001, ANN202
    st, out = http("GET", f"{svc.api}/accounts/{account}/grants", root)
    assert st == 200, out
    return out["versions"][-1]["grant_hours"]


def test_my_week_live_utilisation_and_a_request_granted_by_the_manager(cluster, tmp_path):
    from playwright.sync_api import sync_playwright

    hub, svc, root = cluster
    s = _session(svc, root, user="bob", project="lattice-qcd", slice="gpu:1", min_runtime="1h")
    token = hub.token("bob", scopes=SERVER_SCOPES)
    # the sampler's first reading of the session's GPU (every second)
    assert [sl["node"] for sl in s["placement"]] == ["h100-a"], s["placement"]
    deadline = time.monotonic() + 60
    while True:
        st, util = http("GET", f"{svc.api}/sessions/{s['id']}/utilisation", token)
        assert st == 200, util
        if util["memory"] is not None or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert util["memory"] == [{"gpu": str(s["placement"][0]["gpu"]), "shared": False,
                               "used_bytes": int(12.1 * 2**30), "total_bytes": 80 * 2**30}]
    assert util["status"] == "unknown"  # memory is read, utilisation is not
    st, week = http("GET", f"{svc.api}/me/week?tz=UTC", token)
    assert st == 200, week
    before = _grant(svc, root, "lattice-qcd")
    lab = _lab(tmp_path / "lab", svc, token, s)
    try:
        with sync_playwright() as p:
            b = Browser(p, lab.url + f"lab?token={lab.token}")
            try:
                page = b.page
                page.locator(".jp-GpuBudget-statusButton").click()
                panel = page.locator("#jp-gpubudget-panel")
                mine = panel.locator(".jp-GpuBudget-myWeek")
                total = mine.locator(".jp-GpuBudget-weekTotal dd")
                total.wait_for()
                text = total.inner_text()
                m = re.fullmatch(r"([\d.]+) GPU-h charged, busy unknown", text)
                assert m, text  # nothing measures the demo's GPUs: unknown, not 0
                # the week's figure as the API has it (the session runs on: it only grows)
                assert float(m.group(1)) >= round(week["totals"]["charged_gpu_h"], 1) - 0.05
                assert "lattice-qcd" in mine.locator(".jp-GpuBudget-weekProject dt").first.inner_text()
                live = mine.locator(".jp-GpuBudget-liveUtil dd").inner_text()
                assert live.startswith("unknown"), live
                memory = mine.locator(".jp-GpuBudget-gpuMemory")
                assert memory.locator("dt").inner_text() == "GPU memory"
                assert memory.locator("dd").inner_text() == "12.1 of 80 GiB"
                b.shot("lab-my-week.png")

                # ask for more GPU-hours from the sidebar: a bad amount is refused first
                mine.locator(".jp-GpuBudget-askMore").click()
                mine.locator(".jp-GpuBudget-askHours").fill("-5")
                mine.locator(".jp-GpuBudget-askReason").fill("lattice sweep for the paper")
                mine.locator("button[type=submit]").click()
                assert "above 0" in mine.locator(".jp-GpuBudget-error").inner_text()
                mine.locator(".jp-GpuBudget-askHours").fill("50")
                mine.locator("button[type=submit]").click()
                sent = mine.locator(".jp-GpuBudget-askSent")
                sent.wait_for()
                assert "50 more GPU-hours for lattice-qcd" in sent.inner_text()
                assert "alice" in sent.inner_text()

                # alice, the manager, sees it on the Budget requests page and grants it
                mb = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                       args=CHROMIUM_FLAGS)
                try:
                    mp = mb.new_page(viewport={"width": 1300, "height": 800})
                    mp.set_default_timeout(60_000)
                    errors: list[str] = []
                    mp.on("pageerror", lambda e: errors.append(str(e)))
                    mp.goto(hub.url + "/hub/login")
                    mp.fill("#username_input", "alice")
                    mp.fill("#password_input", "x")
                    mp.click("#login_submit")
                    mp.wait_for_url(re.compile(r".*/hub/.*"))
                    mp.goto(hub.url + "/services/gpubudget/requests")
                    row = mp.locator("#gb-pending tr[data-request]").first
                    row.wait_for()
                    assert "bob" in row.inner_text() and "lattice sweep" in row.inner_text()
                    # lattice-qcd 800 + astro 400 already use physics' 1,200: refused, why
                    row.locator("button[data-verb=grant]").click()
                    err = mp.locator("#gb-req-error")
                    err.wait_for()
                    assert "physics" in err.inner_text(), err.inner_text()
                    assert _grant(svc, root, "lattice-qcd") == before
                    st, _ = http("PUT", f"{svc.api}/accounts/physics/grant", root,
                                 {"grant_hours": 1300})
                    assert st == 200
                    mp.screenshot(path=str(_shots() / "budget-requests-page.png"))
                    row.locator("button[data-verb=grant]").click()
                    mp.wait_for_load_state()
                    mp.wait_for_function("() => document.querySelector('#gb-answered') || "
                                         "!document.querySelector('#gb-req-error')"
                                         ".classList.contains('d-none')")
                    assert mp.locator("#gb-req-error").is_hidden(), \
                        mp.locator("#gb-req-error").inner_text()
                    assert "granted by alice" in mp.locator("#gb-answered").inner_text()
                    assert mp.locator("#gb-no-requests").is_visible()
                    assert not errors, errors
                finally:
                    mb.close()
                assert _grant(svc, root, "lattice-qcd") == before + 50

                # bob's sidebar: the answer as a notice, and his request's state
                panel.get_by_role("button", name="Refresh").click()
                notice = panel.locator(".jp-GpuBudget-notices li",
                                       has_text="was granted").first
                notice.wait_for()
                assert "Your request for 50 more GPU-hours for lattice-qcd was granted" in \
                    notice.inner_text()
                mine.locator(".jp-GpuBudget-request-granted").wait_for()
                notice.scroll_into_view_if_needed()
                b.shot("lab-request-granted.png")
                assert not b.errors, b.errors
            finally:
                b.close()
    finally:
        lab.stop()
        http("DELETE", f"{svc.api}/sessions/{s['id']}", root)


def _shots():  # noqa: ANN202
    from tests.e2e.test_lab_sidebar import SHOTS

    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS
