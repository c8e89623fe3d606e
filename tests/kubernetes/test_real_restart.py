"""The service restarted with pods running adopts them. The real service process (a real
JupyterHub as its hub, the ledger on SQLite) runs its jobs through KubernetesBackend against
the real control plane (tests/fixtures/k8s.py says which parts are real; kwok plays the
kubelets, and a pod runs until its Job is deleted). Two jobs run; the service is stopped
(SIGTERM), started again on the same ledger, then killed (-9) and started again: each time
the pods are neither recreated nor deleted (same Jobs, same pods, same uids), the workloads
stay running, and each keeps the one charge interval it opened at its start, whose checkpoint
moves on past the restart (charged on, with no second interval and no gap)."""

from __future__ import annotations

import time

from jupyter_gpubudget.backends import k8s_objects as ko
from jupyter_gpubudget.ledger import Ledger, connect
from tests.fixtures.hub import ServiceProc, http, start_hub
from tests.fixtures.k8s import NAMESPACE, FakeNode, wait_for

LABEL = "gpubudget.test/restart"
NODE = "restart-a"  # 8 GPUs, only this test's work on it
BACKEND = "jupyter_gpubudget.backends.kubernetes.KubernetesBackend"


def test_a_restarted_service_adopts_running_pods_and_their_charges(k8s, tmp_path):
    m = FakeNode(NODE, 8).manifest()
    m["metadata"]["labels"][LABEL] = "true"
    k8s.admin.create("/api/v1/nodes", m)
    hub = start_hub(tmp_path / "hub")
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    svc = ServiceProc(hub, tmp_path / "svc", url, cycle_interval=0.5, extra_args=[
        f"--GpuBudgetService.backend_class={BACKEND}",
        f"--KubernetesBackend.kubeconfig={k8s.service_kubeconfig}",
        "--KubernetesBackend.config_source=kubeconfig",
        f"--KubernetesBackend.namespace={NAMESPACE}",
        f"--KubernetesBackend.node_selector={LABEL}=true",
        "--KubernetesBackend.stop_grace=2",
        # an attempt the backend did not find would count as lost after 2 s, not 30 s
        "--KubernetesBackend.start_grace=2",
        "--GpuBudgetService.checkpoint_interval=1"])
    ids: list[str] = []
    try:
        wait_for(lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in
                             k8s.admin.get(f"/api/v1/nodes/{NODE}")["status"]
                             .get("conditions") or []), "the test's kwok node Ready", 60)
        svc.start()
        bob = hub.token("bob")
        for i in range(2):
            status, job = http("POST", svc.api + "/jobs", bob, {
                "command": ["python", "-c", "pass"], "project": "lattice", "gpus": 1,
                "name": f"adopt-{i}"})
            assert status == 201, job
            ids.append(job["id"])

        def workload(w: str) -> dict:
            return http("GET", f"{svc.api}/workloads/{w}", bob)[1]

        def pods() -> dict[str, dict]:
            return {w: p for w in ids for p in k8s.admin.items(
                f"/api/v1/namespaces/{NAMESPACE}/pods", f"{ko.L_WORKLOAD}={ko.label_value(w)}")}

        def jobs() -> dict[str, dict]:
            return {j["metadata"]["name"]: j for w in ids for j in k8s.admin.items(
                f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                f"{ko.L_WORKLOAD}={ko.label_value(w)}")}

        def running() -> bool:
            ps = pods()
            return all(workload(w)["state"] == "running" for w in ids) and len(ps) == 2 and \
                all(p["status"].get("phase") == "Running" for p in ps.values())
        wait_for(running, "2 jobs running, their pods Running", 90, every=0.5)
        pods0 = {w: p["metadata"]["uid"] for w, p in pods().items()}
        jobs0 = {n: j["metadata"]["uid"] for n, j in jobs().items()}
        assert sorted(jobs0) == sorted(ko.job_name(w, 1) for w in ids)
        ledger = Ledger(connect(url))
        charges0 = {w: ledger.charges(workload=w) for w in ids}
        assert all(len(c) == 1 and c[0].end is None for c in charges0.values())

        for how in ("stop", "kill9"):
            getattr(svc, how)()
            down = time.time()
            time.sleep(1)
            svc.start()

            def charged_on(down: float = down) -> bool:
                ivs = [ledger.open_interval(w) for w in ids]
                return all(iv is not None and iv.checkpoint > down for iv in ivs)
            wait_for(charged_on, f"the charges checkpointed after the restart ({how})", 60)
            time.sleep(2)  # a few more of the new service's cycles
            assert svc.proc.poll() is None
            assert all(workload(w)["state"] == "running" for w in ids)
            now = pods()
            assert {w: p["metadata"]["uid"] for w, p in now.items()} == pods0, how
            assert all(p["status"].get("phase") == "Running" and
                       not p["metadata"].get("deletionTimestamp") for p in now.values()), how
            assert {n: j["metadata"]["uid"] for n, j in jobs().items()} == jobs0, how
            for w in ids:
                cs = ledger.charges(workload=w)
                # the same single interval: not closed, not reopened (no gap, no double charge)
                assert [(c.id, c.seq, c.start, c.end) for c in cs] == \
                    [(charges0[w][0].id, 1, charges0[w][0].start, None)], how
            told = ledger.decisions(workloads=ids, limit=100)
            assert not [d.kind for d in told if d.kind not in ("start",)], how
    finally:
        svc.stop()
        hub.stop()
        for w in ids:
            k8s.admin.delete(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{ko.job_name(w, 1)}",
                             {"propagationPolicy": "Background"})
        k8s.admin.delete(f"/api/v1/nodes/{NODE}")
