"""What the backend writes, judged by the real kube-apiserver, kube-scheduler and job
controller (tests/fixtures/k8s.py says which parts are real; kwok plays the kubelets):

- a notebook pod built by the real KubeSpawner with :func:`configure_kubespawner` is accepted
  (defaulting, validation, admission) and bound by the real scheduler to the node the core
  chose — on a node the scheduler would otherwise avoid; the same pod without the pin lands
  elsewhere, so the check can tell;
- a two-node gang becomes an Indexed Job whose pods the real job controller makes, one per
  node with its completion index, and the Job's end (or failure, with the exit code) is what
  the backend reports.
"""

from __future__ import annotations

import copy

import pytest

from jupyter_gpubudget.backends import k8s_objects as ko
from tests.fixtures.k8s import EXIT_ENV, NAMESPACE, KubeError, wait_for
from tests.kubernetes.test_objects import kubespawner, notebook_pod  # noqa: F401 - fixture
from tests.kubernetes.test_real_rbac import job, whole

AVOID = {"key": "gpubudget.test/avoid", "value": "yes", "effect": "PreferNoSchedule"}


def _bound(k8s, ns: str, name: str) -> str | None:  # noqa: ANN001
    return k8s.admin.get(f"/api/v1/namespaces/{ns}/pods/{name}")["spec"].get("nodeName")


def _submit(k8s, pod: dict, name: str) -> dict:  # noqa: ANN001
    pod = copy.deepcopy(pod)
    pod["metadata"] = {k: v for k, v in pod["metadata"].items()
                       if k in ("labels", "annotations")}
    pod["metadata"]["name"] = name
    # Zero to JupyterHub's singleuser.extraTolerations (hub_config/z2jh/values.yaml)
    pod["spec"]["tolerations"] = [*(pod["spec"].get("tolerations") or []),
                                  {"key": "nvidia.com/gpu", "operator": "Exists",
                                   "effect": "NoSchedule"}]
    return k8s.admin.create("/api/v1/namespaces/default/pods", pod)


async def test_notebook_pod_is_accepted_and_bound_to_the_core_node(k8s, kubespawner):  # noqa: F811
    node = "gpu-c"
    placement = [{"node": node, "gpu": i, "kind": "gpu", "milli": 1000} for i in (0, 1)]
    pod = await notebook_pod(kubespawner(stop_grace=90), placement)
    # the scheduler prefers every other node: only the pin can put the pod on gpu-c
    taints = k8s.admin.get(f"/api/v1/nodes/{node}")["spec"].get("taints") or []
    k8s.admin.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"taints": [*taints, AVOID]}})
    names = ["nb-pinned", "nb-unpinned"]
    try:
        made = _submit(k8s, pod, names[0])
        # the real API server's defaulting: requests follow the extended resource's limits
        res = made["spec"]["containers"][0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == "2" and res["requests"]["nvidia.com/gpu"] == "2"
        assert made["spec"]["terminationGracePeriodSeconds"] == 90
        assert wait_for(lambda: _bound(k8s, "default", names[0]), "the pod to be bound",
                        60) == node

        # the control: the same pod without the core's node term goes elsewhere
        loose = copy.deepcopy(pod)
        terms = loose["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        for t in terms:
            t.pop("matchFields")
        _submit(k8s, loose, names[1])
        assert wait_for(lambda: _bound(k8s, "default", names[1]), "the control pod to be bound",
                        60) != node
    finally:
        for n in names:
            k8s.admin.delete(f"/api/v1/namespaces/default/pods/{n}",
                             {"gracePeriodSeconds": 0})
        k8s.admin.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"taints": taints}})


async def test_mig_notebook_pod_asks_for_the_profile_the_node_offers(k8s, kubespawner):  # noqa: F811
    placement = [{"node": "gpu-d", "gpu": 5, "kind": "mig", "milli": 1000,
                  "profile": "1g.10gb", "mig_start": 2}]
    pod = await notebook_pod(kubespawner(), placement)
    try:
        made = _submit(k8s, pod, "nb-mig")
        assert made["spec"]["containers"][0]["resources"]["limits"][
            "nvidia.com/mig-1g.10gb"] == "1"
        assert wait_for(lambda: _bound(k8s, "default", "nb-mig"), "the MIG pod to be bound",
                        60) == "gpu-d"
    finally:
        k8s.admin.delete("/api/v1/namespaces/default/pods/nb-mig", {"gracePeriodSeconds": 0})


def _pods(k8s, wid: str) -> list[dict]:  # noqa: ANN001
    return k8s.admin.items(f"/api/v1/namespaces/{NAMESPACE}/pods", f"{ko.L_WORKLOAD}={wid}")


@pytest.mark.parametrize("code", [0, 3])
def test_two_node_gang_is_an_indexed_job_the_job_controller_runs(k8s, real_backend, code):
    wid = f"gang0000000000{code}"
    b = real_backend()
    b.discover_inventory()
    placement = whole("gpu-a", 4, 5, 6, 7) + whole("gpu-b", 4, 5, 6, 7)
    # the scheduler prefers the other nodes (gpu-c, gpu-d fit a pod of 4 GPUs each): only the
    # core's pin can put the pods on gpu-a and gpu-b (a wrong affinity lands them elsewhere)
    chosen = ("gpu-a", "gpu-b")
    taints = {n: k8s.admin.get(f"/api/v1/nodes/{n}")["spec"].get("taints") or []
              for n in chosen}
    for n in chosen:
        k8s.admin.merge_patch(f"/api/v1/nodes/{n}", {"spec": {"taints": [*taints[n], AVOID]}})
    try:
        ref = b.launch(job(wid, placement, {EXIT_ENV: str(code)}))
        assert ref == ko.job_name(wid, 1)
        # the job controller made one pod per index; the scheduler put one on each core's node
        pods = wait_for(lambda: (ps := _pods(k8s, wid)) and len(ps) == 2
                        and all(p["spec"].get("nodeName") for p in ps) and ps,
                        "the gang's two pods to be bound", 90)
    finally:
        for n in chosen:
            k8s.admin.merge_patch(f"/api/v1/nodes/{n}", {"spec": {"taints": taints[n]}})
    got = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]:
           (p["spec"]["nodeName"],
            p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
           for p in pods}
    assert sorted(got.values()) == [("gpu-a", "4"), ("gpu-b", "4")]
    assert set(got) == {"0", "1"}
    st = wait_for(lambda: (s := b.status(wid, 1)).launched and not s.alive and s,
                  "the gang's Job to end", 90)
    assert st.exit_code == code
    jobs = k8s.admin.items(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                           f"{ko.L_WORKLOAD}={wid}")
    conds = {c["type"] for c in jobs[0]["status"].get("conditions") or []
             if c["status"] == "True"}
    assert ("Complete" if code == 0 else "Failed") in conds
    b.stop(wid, 1)


def test_a_job_on_a_node_the_cluster_lacks_is_refused_before_anything_is_created(k8s, real_backend):
    b = real_backend()
    b.discover_inventory()
    with pytest.raises(RuntimeError, match="gpu-z"):
        b.launch(job("nonode000000001", whole("gpu-z", 0)))
    with pytest.raises(KubeError):  # nothing was created
        k8s.admin.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/"
                      f"{ko.job_name('nonode000000001', 1)}")
