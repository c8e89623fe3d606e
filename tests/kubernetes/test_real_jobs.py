"""KubernetesBackend's batch Jobs as the real kube-apiserver, job controller and scheduler take
them (tests/fixtures/k8s.py says which parts are real; kwok plays the kubelets, so no container
runs: what a job is told is read in its pod's environment as the API server stored it):

- a job on lent GPUs (a backfill or a lease) is told when they are due back
  (``GPUBUDGET_DUE_AT``), a job on its own GPUs is not;
- a launch asking for a resource its node does not offer is refused before anything is
  created, naming the resource; one the node offers runs there;
- a launch retried (after a crash) makes no second Job, and a restarted backend finds its
  running attempt again (and tells it from an orphan);
- a gang with MIG instances runs one pod per instance on the MIG node, ranked with the rest,
  its pods made by the real job controller and bound by the real scheduler.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from jupyter_gpubudget.backends import k8s_objects as ko
from tests.fixtures.k8s import EXIT_ENV, NAMESPACE, wait_for
from tests.kubernetes.realpods import env_of
from tests.kubernetes.test_real_rbac import job, whole


def _pods(k8s, wid: str) -> list[dict]:  # noqa: ANN001
    return k8s.admin.items(f"/api/v1/namespaces/{NAMESPACE}/pods", f"{ko.L_WORKLOAD}={wid}")


def _jobs(k8s, wid: str) -> list[dict]:  # noqa: ANN001
    return k8s.admin.items(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                           f"{ko.L_WORKLOAD}={wid}")


def _ended(b, wid: str):  # noqa: ANN001, ANN202
    return wait_for(lambda: (s := b.status(wid, 1)).launched and not s.alive and s,
                    f"{wid}'s Job to end", 90)


def test_a_job_on_lent_gpus_is_told_when_they_are_due(k8s, real_backend):
    b = real_backend()
    b.discover_inventory()
    for wid, due, want in (("due000000000001", 1_800_000_000.0, "2027-01-15T08:00:00Z"),
                           ("due000000000002", None, None)):
        b.launch(replace(job(wid, whole("gpu-b", 0), {EXIT_ENV: "0"}), due_at=due))
        (pod,) = wait_for(lambda wid=wid: _pods(k8s, wid), f"{wid}'s pod", 60)
        assert env_of(pod).get("GPUBUDGET_DUE_AT") == want
        assert _ended(b, wid).exit_code == 0
        b.stop(wid, 1)


def test_a_resource_the_node_does_not_offer_is_refused_before_anything_is_created(
        k8s, real_backend):
    b = real_backend()
    b.discover_inventory()
    # gpu-d offers MIG 1g.10gb and 3g.40gb instances, no 2g.20gb
    bad = [{"node": "gpu-d", "gpu": 5, "kind": "mig", "profile": "2g.20gb", "mig_start": 0,
            "milli": 286}]
    with pytest.raises(RuntimeError, match="offers 0 of nvidia.com/mig-2g.20gb"):
        b.launch(job("nooffer00000001", bad))
    assert _jobs(k8s, "nooffer00000001") == []
    ok = [{**bad[0], "profile": "1g.10gb", "milli": 143}]
    b.launch(job("nooffer00000002", ok, {EXIT_ENV: "0"}))
    assert _ended(b, "nooffer00000002").exit_code == 0
    (pod,) = _pods(k8s, "nooffer00000002")
    assert pod["spec"]["nodeName"] == "gpu-d"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    b.stop("nooffer00000002", 1)


def test_a_retried_launch_makes_no_second_job_and_a_restarted_backend_finds_it(
        k8s, real_backend):
    wid = "retry0000000001"
    b = real_backend()
    b.discover_inventory()
    lz = job(wid, whole("gpu-b", 1))  # runs until stopped
    first = b.launch(lz)
    assert b.launch(lz) == first  # the Job exists (409): no second one
    assert [j["metadata"]["name"] for j in _jobs(k8s, wid)] == [first]
    wait_for(lambda: [p for p in _pods(k8s, wid) if p["status"].get("phase") == "Running"],
             "its pod to run", 60)
    b.close()
    b2 = real_backend()  # a restarted service finds its running attempt again
    b2.discover_inventory()
    assert b2.status(wid, 1).alive
    assert (wid, 1) in b2.orphans(set())
    assert (wid, 1) not in b2.orphans({(wid, 1)})
    b2.stop(wid, 1)
    assert _pods(k8s, wid) == [] and _jobs(k8s, wid) == []


def test_a_gang_on_mig_instances_runs_a_pod_per_instance(k8s, real_backend):
    """Policy ``gang_on_mig``: a CUDA process sees one MIG instance, so a gang's two instances
    on the MIG node run as two pods there, each asking for one, ranked with the rest."""
    wid = "gangmig00000001"
    b = real_backend()
    b.discover_inventory()
    placement = whole("gpu-a", 0, 1) + [
        {"node": "gpu-d", "gpu": i, "kind": "mig", "milli": 1000, "profile": "3g.40gb",
         "mig_start": 0} for i in (4, 5)]
    ref = b.launch(job(wid, placement, {EXIT_ENV: "0"}))
    assert ref.split(",") == [ko.job_name(wid, 1), ko.job_name(wid, 1, 1)]
    assert _ended(b, wid).exit_code == 0
    got = {}
    for p in _pods(k8s, wid):
        env = env_of(p)
        index = p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        assert env["GPUBUDGET_GANG_SIZE"] == "3"
        got[int(env["GPUBUDGET_RANK_OFFSET"]) + int(index)] = (
            p["spec"]["nodeName"], p["spec"]["containers"][0]["resources"]["limits"])
    assert got == {0: ("gpu-a", {"nvidia.com/gpu": "2"}),
                   1: ("gpu-d", {"nvidia.com/mig-3g.40gb": "1"}),
                   2: ("gpu-d", {"nvidia.com/mig-3g.40gb": "1"})}
    b.stop(wid, 1)
