"""Nodes through a real kube-apiserver and scheduler (tests/fixtures/k8s.py says which parts
are real; kwok plays the kubelets): the core's drain cordons the node with its reason, the
real scheduler then binds nothing new there, and the backend sees the cordon through its watch;
a cordon someone else made is not lifted by the backend; a node kwok marks NotReady is
unhealthy for the backend, and healthy again once it is Ready; so is a node whose MIG layout is
being changed."""

from __future__ import annotations

from jupyter_gpubudget.backends import k8s_objects as ko
from tests.fixtures.k8s import NAMESPACE, NOT_READY_LABEL, NOT_READY_REASON, node_ready, wait_for
from tests.kubernetes.test_real_rbac import job, whole


def _pods(k8s, wid: str) -> list[dict]:  # noqa: ANN001
    return k8s.admin.items(f"/api/v1/namespaces/{NAMESPACE}/pods", f"{ko.L_WORKLOAD}={wid}")


def test_a_drain_cordons_the_node_with_its_reason_and_the_scheduler_obeys(k8s, real_backend):
    b = real_backend()
    b.discover_inventory()
    reason = "drain: NVLink errors on GPU 3 (admin alice)"
    try:
        b.drain_node("gpu-b", reason)
        node = k8s.admin.get("/api/v1/nodes/gpu-b")
        assert node["spec"]["unschedulable"] is True
        assert node["metadata"]["annotations"][ko.A_DRAIN_REASON] == reason
        assert node["metadata"]["labels"][ko.L_DRAINED] == "true"
        # the real node lifecycle controller adds the unschedulable taint
        assert wait_for(lambda: any(t["key"] == "node.kubernetes.io/unschedulable" for t in
                                    k8s.admin.get("/api/v1/nodes/gpu-b")["spec"].get("taints")
                                    or []), "the unschedulable taint", 30)
        assert wait_for(lambda: b.node_health().get("gpu-b"), "the watch to show the cordon",
                        30) == f"cordoned ({reason})"

        # a Job pinned to the cordoned node stays Pending: the real scheduler obeys the cordon
        b.launch(job("drain0000000001", whole("gpu-b", 0)))
        pods = wait_for(lambda: _pods(k8s, "drain0000000001"), "the job's pod", 60)
        wait_for(lambda: any(c.get("reason") == "Unschedulable" for c in
                             _pods(k8s, "drain0000000001")[0]["status"].get("conditions")
                             or []), "the scheduler to find the pod unschedulable", 60)
        assert not pods[0]["spec"].get("nodeName")

        b.undrain_node("gpu-b")
        node = k8s.admin.get("/api/v1/nodes/gpu-b")
        assert not node["spec"].get("unschedulable")
        assert ko.A_DRAIN_REASON not in (node["metadata"].get("annotations") or {})
        # ... and the pending pod is bound now
        assert wait_for(lambda: _pods(k8s, "drain0000000001")[0]["spec"].get("nodeName"),
                        "the pod to be bound after the uncordon", 60) == "gpu-b"
        b.stop("drain0000000001", 1)
    finally:
        k8s.admin.merge_patch("/api/v1/nodes/gpu-b", ko.uncordon_patch())


def test_an_undrain_straight_after_the_drain_lifts_the_cordon(k8s, real_backend):
    """The undrain comes before the node watch shows the drain's cordon (an admin's undo, or
    a drain the core takes back in its next cycle): the cordon is lifted all the same, each
    of ten times (before: the backend read "not ours" from its watch and left the node
    cordoned, and the next test's pod on it never ran)."""
    b = real_backend()
    b.discover_inventory()
    try:
        for i in range(10):
            b.drain_node("gpu-b", f"undo {i}")
            b.undrain_node("gpu-b")
            node = k8s.admin.get("/api/v1/nodes/gpu-b")
            assert not node["spec"].get("unschedulable"), f"still cordoned after undo {i}"
            assert ko.L_DRAINED not in (node["metadata"].get("labels") or {})
    finally:
        k8s.admin.merge_patch("/api/v1/nodes/gpu-b", ko.uncordon_patch())


def test_a_cordon_made_by_someone_else_stays(k8s, real_backend):
    b = real_backend()
    b.discover_inventory()
    try:
        k8s.admin.merge_patch("/api/v1/nodes/gpu-c", {"spec": {"unschedulable": True}})
        wait_for(lambda: b.node_health().get("gpu-c"), "the watch to show the cordon", 30)
        b.drain_node("gpu-c", "ours")  # already cordoned by someone else: not taken over
        b.undrain_node("gpu-c")
        node = k8s.admin.get("/api/v1/nodes/gpu-c")
        assert node["spec"]["unschedulable"] is True
        assert ko.A_DRAIN_REASON not in (node["metadata"].get("annotations") or {})
    finally:
        k8s.admin.merge_patch("/api/v1/nodes/gpu-c", {"spec": {"unschedulable": None}})


def test_a_node_kwok_marks_not_ready_is_unhealthy_for_the_backend(k8s, real_backend):
    b = real_backend()
    b.discover_inventory()
    assert "gpu-a" not in b.node_health()
    try:
        k8s.admin.merge_patch("/api/v1/nodes/gpu-a",
                              {"metadata": {"labels": {NOT_READY_LABEL: "true"}}})
        wait_for(lambda: node_ready(k8s.admin.get("/api/v1/nodes/gpu-a")) == "False",
                 "kwok to mark gpu-a NotReady", 60)
        assert wait_for(lambda: b.node_health().get("gpu-a"), "the backend to see it",
                        30) == f"NotReady ({NOT_READY_REASON})"
        assert set(b.node_health()) == {"gpu-a"}
    finally:
        k8s.admin.merge_patch("/api/v1/nodes/gpu-a",
                              {"metadata": {"labels": {NOT_READY_LABEL: None}}})
    wait_for(lambda: node_ready(k8s.admin.get("/api/v1/nodes/gpu-a")) == "True",
             "kwok to make gpu-a Ready again", 60)
    wait_for(lambda: "gpu-a" not in b.node_health(), "the backend to see it healthy", 30)


def test_a_node_whose_mig_layout_is_being_changed_is_unhealthy_for_the_backend(k8s,
                                                                              real_backend):
    """The GPU operator's MIG manager labels a node ``nvidia.com/mig.config.state=pending``
    while it repartitions it (the label is set here by the test: no MIG manager runs)."""
    b = real_backend()
    b.discover_inventory()
    assert "gpu-d" not in b.node_health()
    label = "nvidia.com/mig.config.state"
    try:
        k8s.admin.merge_patch("/api/v1/nodes/gpu-d", {"metadata": {"labels": {label: "pending"}}})
        assert wait_for(lambda: b.node_health().get("gpu-d"), "the backend to see it",
                        30) == "MIG reconfiguration pending"
    finally:
        k8s.admin.merge_patch("/api/v1/nodes/gpu-d", {"metadata": {"labels": {label: "success"}}})
    wait_for(lambda: "gpu-d" not in b.node_health(), "the backend to see it healthy", 30)
