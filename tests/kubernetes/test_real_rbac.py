"""The service's RBAC against a real kube-apiserver (``--authorization-mode=Node,RBAC``;
tests/fixtures/k8s.py says which parts are real): with exactly the Role and ClusterRole that
hub_config/z2jh/rbac.yaml gives the service account, KubernetesBackend does all it does (list
and watch Jobs, pods and Nodes, create, read and delete Jobs, cordon and uncordon a node); with
one verb taken away it fails at once with an error that names the verb and the resource."""

from __future__ import annotations

import copy

import pytest

from jupyter_gpubudget.backends import k8s_objects as ko
from jupyter_gpubudget.backends.base import Launch
from tests.fixtures.k8s import EXIT_ENV, NAMESPACE, wait_for
from tests.kubernetes.conftest import apply_rbac, rbac_docs


def whole(node: str, *idx: int) -> list[dict]:
    return [{"node": node, "gpu": i, "kind": "gpu", "milli": 1000} for i in idx]


def job(wid: str, placement: list[dict], env: dict | None = None) -> Launch:
    return Launch(workload=wid, attempt=1, user="alice", project="lattice",
                  command=["python", "-c", "pass"], placement=placement, env=env or {},
                  kind="batch", min_runtime=0.0, backed=True, resumable=False)


def test_the_documented_rbac_lets_the_service_do_all_the_backend_does(k8s, real_backend):
    b = real_backend()
    inv = b.discover_inventory()  # list + watch nodes, jobs, pods as the service account
    assert [n.name for n in inv.nodes] == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    assert inv.gpu_count == 32

    # create, watch to the end (the job controller marks the Job Complete)
    b.launch(job("rbac00000000001", whole("gpu-a", 0), {EXIT_ENV: "0"}))
    st = wait_for(lambda: (s := b.status("rbac00000000001", 1)).launched and not s.alive
                  and s, "the Job to complete", 90)
    assert st.exit_code == 0

    # delete: a running Job stops, its pods go
    b.launch(job("rbac00000000002", whole("gpu-a", 1)))
    wait_for(lambda: [p for p in k8s.admin.items(f"/api/v1/namespaces/{NAMESPACE}/pods",
                                                 f"{ko.L_WORKLOAD}=rbac00000000002")
                      if p["status"].get("phase") == "Running"], "the job's pod to run", 60)
    st = b.stop("rbac00000000002", 1)
    assert not st.alive
    assert k8s.admin.items(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                           f"{ko.L_WORKLOAD}=rbac00000000002") == []

    # patch nodes: the drain cordons, the undrain uncordons
    try:
        b.drain_node("gpu-d", "rbac test")
        assert k8s.admin.get("/api/v1/nodes/gpu-d")["spec"].get("unschedulable") is True
    finally:
        b.undrain_node("gpu-d")
        if k8s.admin.get("/api/v1/nodes/gpu-d")["spec"].get("unschedulable"):
            k8s.admin.merge_patch("/api/v1/nodes/gpu-d", ko.uncordon_patch())
            pytest.fail("the backend's undrain left gpu-d cordoned")


def _without(verb: str, resource: str) -> list[dict]:
    docs = copy.deepcopy(rbac_docs())
    hit = False
    for d in docs:
        for r in d.get("rules") or []:
            if resource in r["resources"] and verb in r["verbs"]:
                r["verbs"] = [v for v in r["verbs"] if v != verb]
                hit = True
        if "rules" in d:  # a rule left without verbs goes (the API refuses it)
            d["rules"] = [r for r in d["rules"] if r["verbs"]]
    assert hit, f"rbac.yaml grants no {verb} on {resource}"
    return docs


def _allowed(k8s, verb: str, resource: str, group: str, namespace: str | None) -> bool:  # noqa: ANN001
    attrs = {"verb": verb, "resource": resource, "group": group}
    if namespace:
        attrs["namespace"] = namespace
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": k8s.service_user,
                       "groups": ["system:serviceaccounts",
                                  f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"],
                       "resourceAttributes": attrs}}
    return k8s.admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews",
                            review)["status"].get("allowed", False)


@pytest.mark.parametrize("verb,resource,group,namespaced", [
    ("create", "jobs", "batch", True),
    ("delete", "jobs", "batch", True),
    ("watch", "jobs", "batch", True),
    ("list", "pods", "", True),
    ("watch", "pods", "", True),
    ("watch", "nodes", "", False),
    ("patch", "nodes", "", False),
])
def test_a_missing_verb_fails_at_once_naming_it(k8s, real_backend, verb, resource, group,
                                                namespaced):
    ns = NAMESPACE if namespaced else None
    apply_rbac(k8s, _without(verb, resource))
    try:
        # the authorizer's cache follows the Role within moments
        wait_for(lambda: not _allowed(k8s, verb, resource, group, ns),
                 f"RBAC to drop {verb} {resource}", 30)
        b = real_backend(request_timeout=5)
        with pytest.raises(RuntimeError) as err:
            # what the service does first: discover the inventory, then launch, drain
            b.discover_inventory()
            b.launch(job(f"rbac-{verb}-{resource}", whole("gpu-a", 2)))
            b.drain_node("gpu-b", "rbac test")
        msg = str(err.value)
        assert verb in msg and resource in msg, msg
        assert k8s.service_user in msg, msg
        # nothing was created
        assert k8s.admin.items(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                               f"{ko.L_WORKLOAD}=rbac-{verb}-{resource}") == []
        assert not k8s.admin.get("/api/v1/nodes/gpu-b")["spec"].get("unschedulable")
    finally:
        apply_rbac(k8s)
        wait_for(lambda: _allowed(k8s, verb, resource, group, ns),
                 f"RBAC to grant {verb} {resource} again", 30)


def test_a_wrong_token_is_refused_at_once(k8s, real_backend, tmp_path):
    from tests.fixtures.k8s import kubeconfig

    bad = tmp_path / "kubeconfig"
    bad.write_text(kubeconfig(k8s.url, k8s.ca_file, "not-a-token"))
    b = real_backend(kubeconfig=str(bad))
    with pytest.raises(RuntimeError, match="refused these credentials: 401 Unauthorized"):
        b.discover_inventory()


def test_in_cluster_with_a_real_service_account_token(k8s, tmp_path, monkeypatch):
    """As the service's Deployment runs (hub_config/z2jh/gpubudget-service.yaml): its
    ServiceAccount's token (a real one, from the TokenRequest API, signed by the API server's
    service-account key), the cluster's CA and the namespace file, found through
    KUBERNETES_SERVICE_HOST/PORT."""
    import logging
    import urllib.parse

    from jupyter_gpubudget.backends.kubernetes import KubernetesBackend
    from tests.fixtures.k8s import KubeError

    try:
        k8s.admin.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                         {"metadata": {"name": "gpubudget"}})
    except KubeError as e:
        if e.status != 409:
            raise
    tr = k8s.admin.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/gpubudget/token",
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                           "spec": {"expirationSeconds": 3600}})
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(tr["status"]["token"])
    (sa / "ca.crt").write_bytes(k8s.ca_file.read_bytes())
    (sa / "namespace").write_text(NAMESPACE)
    u = urllib.parse.urlsplit(k8s.url)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", u.hostname)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(u.port))
    b = KubernetesBackend(log=logging.getLogger("test.k8s.real"), config_source="auto",
                          incluster_token_file=str(sa / "token"),
                          incluster_ca_file=str(sa / "ca.crt"), request_timeout=10)
    try:
        assert b.namespace == NAMESPACE  # from the namespace file
        assert b.discover_inventory().gpu_count == 32  # the access check passed, as the SA
        b.launch(job("incluster000001", whole("gpu-c", 7), {EXIT_ENV: "0"}))
        st = wait_for(lambda: (s := b.status("incluster000001", 1)).launched and not s.alive
                      and s, "the Job to complete", 90)
        assert st.exit_code == 0
    finally:
        b.close()
