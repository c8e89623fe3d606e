"""The service's own scheduling loop (ledger on SQLite, the pure core deciding) applying its
decisions through KubernetesBackend against the fake API server (not a Kubernetes cluster),
on an inventory discovered from the fake cluster's Node objects: a backed gang starts as
Indexed Jobs where the core placed it and ends done; an unbacked job is preempted for backed
work (Job deleted, pods gone before the next start) and requeued; the core's placement and
contract are what the Job carries."""

from __future__ import annotations

import json
import sys
import time

from jupyter_gpubudget.backends import k8s_objects as ko
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.kubernetes.conftest import gpu_node

BUDGETS = """\
window: 7d
admins: [root]
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 100, members: [alice]}
      scratch: {grant: 0, members: [bob]}
"""

PY = sys.executable


def make_loop(tmp_path, backend):  # noqa: ANN001, ANN201
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade(url)
    ledger = Ledger(connect(url))
    budgets = load_budgets(BUDGETS, "budgets.yaml")
    ledger.sync_budgets(budgets, time.time(), "budgets.yaml")
    inventory = backend.discover_inventory()  # from the Node objects
    return ledger, SchedulingLoop(ledger, lambda: budgets.accounts, inventory, lambda: budgets.policy,
                                  backend)


def submit(ledger: Ledger, project: str, user: str, gpus: int, code: str) -> str:
    row = ledger.submit(project=project, user=user, kind="batch", now=time.time(),
                        request={"kind": "gpu", "gpus": gpus}, command=[PY, "-c", code],
                        backend="kubernetes", min_runtime=0.0, resumable=True)
    return row.id


def run_until(loop: SchedulingLoop, pred, what: str, timeout: float = 40):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        loop.cycle()
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_loop_runs_a_gang_and_preempts_unbacked_work_on_discovered_nodes(api, backend,
                                                                        tmp_path):
    gpu_node(api, "k1", 2)
    gpu_node(api, "k2", 2)
    b = backend()
    ledger, loop = make_loop(tmp_path, b)
    assert loop.inventory.gpu_count == 4 and loop.inventory.source == "kubernetes"

    # bob's project has no grant: his job runs unbacked on the idle cluster, 4 GPUs
    slow = submit(ledger, "scratch", "bob", 4, "import time; time.sleep(60)")
    run_until(loop, lambda: ledger.get(slow).state == "running", "unbacked job starts")
    row = ledger.get(slow)
    assert not row.backed
    jobs = api.list("jobs", f"{ko.L_WORKLOAD}={slow}")
    assert {j["metadata"]["annotations"][ko.A_CONTRACT] for j in jobs} == {
        json.dumps({"backed": False, "kind": "batch", "min_runtime_s": 0.0, "resumable": True},
                   sort_keys=True)}
    run_until(loop, lambda: len([p for p in api.list("pods", f"{ko.L_WORKLOAD}={slow}")
                                 if p["status"]["phase"] == "Running"]) == 2, "2 pods run")

    # alice's backed gang of 4 needs the whole cluster: the core preempts bob's job
    gang = submit(ledger, "lattice", "alice", 4,
                  "import os; print(os.environ['GPUBUDGET_POD_NODE'], "
                  "os.environ['GPUBUDGET_RANK_OFFSET'], os.environ['JOB_COMPLETION_INDEX'])")
    run_until(loop, lambda: ledger.get(gang).state in ("running", "done"), "gang starts")
    slow_row = ledger.get(slow)
    assert slow_row.state == "pending" and slow_row.preemptions == 1  # requeued (resumable)
    # bob's pods had exited before alice's Job was created (the slice was really free)
    bob_gone = max(t for t, p, w in api.kubelet_log if p.startswith(f"gb-{slow}") and
                   w.startswith("exited"))
    posts = [t for t, m, p in api.timeline if m == "POST" and p.endswith("/jobs")]
    assert len(posts) == 2  # bob's Indexed Job (2 nodes x 2 GPUs), then alice's
    assert posts[0] < bob_gone < posts[1]

    run_until(loop, lambda: ledger.get(gang).state == "done", "gang done")
    placed = {s["node"] for s in ledger.get(gang).placement}
    pods = api.list("pods", f"{ko.L_WORKLOAD}={gang}")
    assert {p["spec"]["nodeName"] for p in pods} == placed == {"k1", "k2"}
    assert all(p["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
               for p in pods)
    assert ledger.get(gang).exit_code == 0
    # and bob's requeued job starts again once the GPUs are free
    run_until(loop, lambda: ledger.get(slow).state == "running", "requeued job restarts")
    loop.cancel(slow, by="test")
    assert not [p for p in api.list("pods", f"{ko.L_WORKLOAD}={slow}")
                if p["status"]["phase"] == "Running"]
