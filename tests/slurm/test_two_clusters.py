"""Two clusters under one budgets file (acceptance of the two-cluster work): one gpubudget service
schedules a local workstation (the local backend, one declared GPU) and the real test Slurm
cluster (SlurmBackend, two nodes of two GPUs) with one account tree:

- a job naming a cluster runs there, by that cluster's backend (a Slurm job on gpu1/gpu2, a
  local process on ws0);
- a job naming none starts on the cluster where it fits now (the workstation is full);
- a project's usage on both clusters is one usage and one standing;
- the operator's queue and nodes views — what the admin pages render, rendered here with the
  pages' own templates — and each workload's JSON name its cluster, and so does the
  researcher's JupyterLab sidebar (real JupyterLab in Chromium, "My other work");
- an unknown cluster is a 400 naming the field and listing the clusters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.hub import free_port, http, wait_http
from tests.slurm.test_backend import SUDO_KEEP_CONF

ADMIN, ANA = "tok-root-" + "x" * 20, "tok-ana-" + "y" * 20
LOCAL_INVENTORY = "nodes:\n  - {name: ws0, model: H100-80GB, gpus: 1}\n"


def wait(pred, timeout: float, what: str, svc=None):  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    tail = (svc["dir"] / "service.log").read_text()[-3000:] if svc else ""
    raise AssertionError(f"timed out: {what}\n{tail}")


@pytest.fixture(scope="module")
def service(slurm_accounts):
    d = Path(slurm_accounts.dir) / "two-clusters"
    d.mkdir(exist_ok=True)
    d.chmod(0o755)
    (d / "budgets.yaml").write_text(slurm_accounts.budgets.read_text())
    (d / "local.yaml").write_text(LOCAL_INVENTORY)
    (d / "tokens.json").write_text(json.dumps({
        ADMIN: {"name": "root", "scopes": ["custom:gpubudget:admin"]},
        ANA: {"name": "gpb-ana", "scopes": ["custom:gpubudget:submit"]}}))
    os.chmod(d / "tokens.json", 0o600)
    clusters = {
        "local": {"backend": "local", "inventory": str(d / "local.yaml"),
                  "config": {"state_dir": str(d / "jobs"), "stop_grace": 2.0}},
        "slurm": {"backend": "slurm",
                  "config": {"user_command_prefix": SUDO_KEEP_CONF,
                             "gpu_models": {"h100": "H100-80GB"}, "watch_interval": 0.5,
                             "stop_grace": 30}},
    }
    (d / "config.py").write_text(f"c.GpuBudgetService.clusters = {clusters!r}\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    env.update(slurm_accounts.env)
    env["JUPYTERHUB_SERVICE_PREFIX"] = "/services/gpubudget/"
    log = d / "service.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_gpubudget.service", f"--config={d / 'config.py'}",
         f"--budgets={d / 'budgets.yaml'}", f"--db=sqlite:///{d / 'ledger.sqlite'}",
         f"--GpuBudgetService.tokens_file={d / 'tokens.json'}", "--ip=127.0.0.1",
         f"--port={port}", "--cycle-interval=0.5", "--GpuBudgetService.event_delay=0.01"],
        cwd=d, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/services/gpubudget/api/v1"
    try:
        wait_http(api + "/healthz", proc=proc, log=log)
        yield {"api": api, "dir": d, "proc": proc}
    finally:
        status, body = http("GET", api + "/jobs?state=pending,running", ANA)
        for j in (body or {}).get("jobs", []) if status == 200 else []:
            http("DELETE", f"{api}/jobs/{j['id']}", ANA)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def submit(svc, **body) -> dict:  # noqa: ANN001
    status, out = http("POST", svc["api"] + "/jobs", ANA,
                       {"project": "lattice", "command": "sleep 600", "time_limit": "1h",
                        **body})
    assert status == 201, (status, out)
    return out


def job(svc, wid: str) -> dict:  # noqa: ANN001
    status, out = http("GET", f"{svc['api']}/workloads/{wid}", ANA)
    assert status == 200, (status, out)
    return out


def running(svc, wid: str) -> dict | None:  # noqa: ANN001
    j = job(svc, wid)
    return j if j["state"] == "running" and j.get("placement") else None


def sidebar_work(svc, d: Path, n: int) -> list[str]:  # noqa: ANN001
    """The "My other work" items of gpb-ana's JupyterLab sidebar (the lab's server extension
    talks to the service with gpb-ana's token), once ``n`` are shown; a screenshot is kept."""
    from playwright.sync_api import sync_playwright

    from tests.e2e.test_lab_sidebar import SHOTS
    from tests.fixtures.jupyter import start_jupyter
    from tests.hub.hubproc import CHROMIUM, CHROMIUM_FLAGS, require_browser

    require_browser()
    lab = start_jupyter(d, {"GPUBUDGET_URL": svc["api"].removesuffix("/api/v1"),
                            "JUPYTERHUB_API_TOKEN": ANA}, lab=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(60_000)
                page.goto(lab.url + f"lab?token={lab.token}")
                page.wait_for_selector("#jp-main-dock-panel")
                page.click('li[data-id="jp-gpubudget-panel"]')
                page.wait_for_function(
                    "n => document.querySelectorAll('#jp-gpubudget-panel .jp-GpuBudget-work')"
                    ".length >= n", arg=n)
                SHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SHOTS / "lab-sidebar-two-clusters-slurm.png"))
                work = page.locator("#jp-gpubudget-panel .jp-GpuBudget-work")
                return [" ".join(work.nth(i).inner_text().split()) for i in range(work.count())]
            finally:
                browser.close()
    finally:
        lab.stop()


def test_two_clusters_one_budget_tree(service, slurm_accounts, tmp_path):
    svc = service
    # an unknown cluster: a 400 naming the field and listing the clusters, nothing queued
    status, out = http("POST", svc["api"] + "/jobs", ANA,
                       {"project": "lattice", "command": "true", "cluster": "gpu-farm"})
    assert status == 400, (status, out)
    text = json.dumps(out)
    assert "cluster" in text and "gpu-farm" in text and "local" in text and "slurm" in text

    # named: each runs on its own cluster, by its own backend
    on_slurm = submit(svc, gpus=2, cluster="slurm", name="slurm-job")
    on_local = submit(svc, gpus=1, cluster="local", name="local-job")
    a = wait(lambda: running(svc, on_slurm["id"]), 60, "the Slurm job starts", svc)
    b = wait(lambda: running(svc, on_local["id"]), 60, "the local job starts", svc)
    assert a["cluster"] == "slurm" and {s["node"] for s in a["placement"]} <= {"gpu1", "gpu2"}
    assert b["cluster"] == "local" and [s["node"] for s in b["placement"]] == ["ws0"]
    # really there: a Slurm job by that name, and a local process (not a Slurm job)
    names = slurm_accounts.run("squeue", "-h", "-o", "%j")
    assert f"gpubudget.{on_slurm['id']}.1" in names
    assert f"gpubudget.{on_local['id']}.1" not in names
    assert (svc["dir"] / "jobs").is_dir() and any(
        p.name.startswith(on_local["id"]) for p in (svc["dir"] / "jobs").iterdir())

    # unnamed: the workstation is full, Slurm has two GPUs free: it starts on Slurm now
    anywhere = submit(svc, gpus=1, name="anywhere")
    c = wait(lambda: running(svc, anywhere["id"]), 60, "the unnamed job starts", svc)
    assert c["cluster"] == "slurm" and c["request"].get("cluster") is None

    # the admin's views name each workload's cluster (and render them in the pages)
    status, q = http("GET", svc["api"] + "/queue/detail", ADMIN)
    assert status == 200, q
    assert q["clusters"] == ["local", "slurm"]
    where = {w["id"]: w["cluster"] for w in q["running"]}
    assert where == {on_slurm["id"]: "slurm", on_local["id"]: "local", anywhere["id"]: "slurm"}
    status, nodes = http("GET", svc["api"] + "/nodes", ADMIN)
    assert status == 200, nodes
    assert {n["name"]: n["cluster"] for n in nodes["nodes"]} == {
        "ws0": "local", "gpu1": "slurm", "gpu2": "slurm"}
    from jupyter_gpubudget.service.handlers.pages import ENV

    frame = {"hub": "/hub/", "hub_static": "/hub/static/", "prefix": "/", "static": "/s/",
             "pages": [], "page": "queue", "title": "Queue", "user": "root", "is_admin": True,
             "repair": [], "boot": {}}
    html = ENV.get_template("queue.html").render(**frame, data=q)
    for wid, cl in where.items():
        row = html.split(f'data-workload="{wid}"', 1)[1].split("</tr>", 1)[0]
        assert f'<td class="gb-cluster">{cl}</td>' in row, row
    html = ENV.get_template("nodes.html").render(**{**frame, "page": "nodes"}, data=nodes)
    assert "cluster local" in html and "cluster slurm" in html

    # the researcher's JupyterLab sidebar, in real Chromium, names each job's cluster
    items = sidebar_work(svc, tmp_path / "lab", 3)
    for name, cl in (("slurm-job", "slurm"), ("local-job", "local"), ("anywhere", "slurm")):
        item = next(i for i in items if f" {name} " in f" {i} ")
        assert f"cluster {cl}" in item, items

    # one standing: stop everything; lattice's usage is the GPU-hours on both clusters
    for w in (on_slurm, on_local, anywhere):
        status, out = http("DELETE", f"{svc['api']}/jobs/{w['id']}", ANA)
        assert status in (200, 202), (status, out)
    done = wait(lambda: (js := [job(svc, w["id"]) for w in (on_slurm, on_local, anywhere)])
                and all(j["state"] not in ("pending", "running") and j["ended_at"] for j in js)
                and js, 120, "the jobs end", svc)
    hours = {j["cluster"]: 0.0 for j in done}
    for j in done:
        gpus = sum(s["milli"] for s in j["placement"]) / 1000
        hours[j["cluster"]] += gpus * (j["ended_at"] - j["started_at"]) / 3600
    assert set(hours) == {"local", "slurm"} and all(h > 0 for h in hours.values())

    def settled():  # noqa: ANN202
        status, acc = http("GET", f"{svc['api']}/accounts/lattice", ANA)
        assert status == 200, acc
        used = acc["usage_hours"] or 0.0
        return acc if abs(used - sum(hours.values())) <= 1e-6 * max(1.0, used) else None

    acc = wait(settled, 30, f"lattice's usage is both clusters' {hours}", svc)
    assert acc["standing"] == pytest.approx(acc["usage_hours"] / acc["effective_grant_hours"])
