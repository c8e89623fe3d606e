"""Dynamic resource allocation, judged by the real API server, the real ResourceClaim controller
and the real scheduler's DRA plugin (tests/fixtures/k8s.py says which parts are real). No DRA
driver runs: the test publishes what the NVIDIA driver would (DeviceClasses and nodes'
ResourceSlices: 8 GPUs with their UUIDs on gpu-c, MIG instances with their profiles on gpu-d),
which is all the scheduler reads.

- A batch job in ``dra`` mode with the GPUs' UUIDs gets a ResourceClaimTemplate whose CEL
  selector the real scheduler evaluates: the claim made for the pod is allocated exactly the
  core's GPUs, on the core's node.
- A notebook in ``dra`` mode, started by the real KubeSpawner: the pod refers to a
  ResourceClaim that the configurer's hook creates once the pod exists, owned by the pod; the
  real scheduler binds the pod only once that claim is allocated a MIG instance of the
  session's profile on the core's node; stopping the server deletes the pod and the real
  garbage collector deletes the claim with it."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_gpubudget.backends import k8s_objects as ko
from tests.fixtures.k8s import NAMESPACE, KubeError, wait_for
from tests.kubernetes.conftest import need
from tests.kubernetes.test_real_rbac import job, whole

NODE = "gpu-c"
MIG_NODE = "gpu-d"


def _publish(k8s) -> None:  # noqa: ANN001
    def create(path: str, body: dict) -> None:
        try:
            k8s.admin.create(path, body)
        except KubeError as e:
            if e.status != 409:
                raise
    create("/apis/resource.k8s.io/v1/deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression":
                                        "device.driver == 'gpu.nvidia.com' && "
                                        "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}})
    create("/apis/resource.k8s.io/v1/resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-gpu.nvidia.com"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {
                     "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{NODE}-{i}"},
                     "index": {"int": i}}} for i in range(8)]}})


def test_dra_job_claims_exactly_the_core_gpus_through_the_real_scheduler(k8s, real_backend):
    _publish(k8s)
    b = real_backend()
    b.placement_cfg.mode = "dra"
    b.placement_cfg.gpu_uuids = {f"{NODE}/{i}": f"GPU-{NODE}-{i}" for i in range(8)}
    b.discover_inventory()  # the access check includes the DRA verbs now
    wid = "dra000000000001"
    b.launch(job(wid, whole(NODE, 5, 6)))  # runs until stopped (its claim stays allocated)
    pods = wait_for(lambda: (ps := k8s.admin.items(f"/api/v1/namespaces/{NAMESPACE}/pods",
                                                   f"{ko.L_WORKLOAD}={wid}"))
                    and ps[0]["spec"].get("nodeName") and ps, "the pod to be bound", 90)
    assert pods[0]["spec"]["nodeName"] == NODE
    claim_name = pods[0]["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = k8s.admin.get(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/"
                          f"{claim_name}")
    got = {(r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]}
    assert got == {(NODE, "gpu-5"), (NODE, "gpu-6")}  # the core's GPUs, by UUID
    assert b.status(wid, 1).alive
    b.stop(wid, 1)  # deletes the ResourceClaimTemplate too
    assert k8s.admin.items(f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/"
                           "resourceclaimtemplates", f"{ko.L_WORKLOAD}={wid}") == []


def _publish_mig(k8s) -> None:  # noqa: ANN001
    """What the NVIDIA DRA driver publishes for gpu-d's MIG instances (1g.10gb, two on each
    of GPUs 4 and 5)."""
    for path, body in (
        ("/apis/resource.k8s.io/v1/deviceclasses", {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "mig.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression":
                                            "device.driver == 'gpu.nvidia.com' && "
                                            "device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}}),
        ("/apis/resource.k8s.io/v1/resourceslices", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{MIG_NODE}-gpu.nvidia.com"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": MIG_NODE,
                     "pool": {"name": MIG_NODE, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{g}-mig-1g10gb-{i}", "attributes": {
                         "type": {"string": "mig"}, "profile": {"string": "1g.10gb"},
                         "parentUUID": {"string": f"GPU-{MIG_NODE}-{g}"},
                         "uuid": {"string": f"MIG-{MIG_NODE}-{g}-{i}"}}}
                         for g in (4, 5) for i in (0, 1)]}})):
        try:
            k8s.admin.create(path, body)
        except KubeError as e:
            if e.status != 409:
                raise


async def test_dra_notebook_claim_made_for_the_pod_allocated_and_collected(k8s, monkeypatch):
    need("kubespawner")
    import kubernetes_asyncio.config.kube_config as kc
    from kubespawner import KubeSpawner
    from traitlets.config import Config

    from jupyter_gpubudget.backends.kubernetes import configure_kubespawner

    _publish_mig(k8s)
    monkeypatch.setattr(kc, "KUBE_CONFIG_DEFAULT_LOCATION", str(k8s.admin_kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    c = Config()
    c.KubePlacement.mode = "dra"
    c.KubePlacement.stop_grace = 2
    c.KubeSpawner.namespace = "default"
    c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
    # a client configuration of its own for this API server (KubeSpawner caches one per host)
    c.KubeSpawner.k8s_api_host = k8s.url
    c.KubeSpawner.k8s_api_ssl_ca_cert = str(k8s.ca_file)
    c.KubeSpawner.tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists",
                                  "effect": "NoSchedule"}]
    c.KubeSpawner.events_enabled = False
    c.KubeSpawner.start_timeout = 60
    KubeSpawner.reflectors.clear()
    sp = KubeSpawner(config=c, _mock=True)
    sp.api_token = "t"
    placement = [{"node": MIG_NODE, "gpu": 5, "kind": "mig", "profile": "1g.10gb",
                  "mig_start": 6, "milli": 143}]
    configure_kubespawner(sp, placement, {"env": {}, "session": "dra-1", "project": "astro",
                                          "user": "mock@name", "kind": "interactive"})
    pods = "/api/v1/namespaces/default/pods"
    claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    try:
        await asyncio.wait_for(sp.start(), 90)
        pod = k8s.admin.get(f"{pods}/{sp.pod_name}")
        assert pod["spec"]["nodeName"] == MIG_NODE and pod["status"]["phase"] == "Running"
        assert pod["spec"]["resourceClaims"] == [{"name": "gpu",
                                                  "resourceClaimName": f"{sp.pod_name}-gpu"}]
        claim = k8s.admin.get(f"{claims}/{sp.pod_name}-gpu")
        assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        assert claim["status"]["reservedFor"][0]["name"] == sp.pod_name
        (got,) = claim["status"]["allocation"]["devices"]["results"]
        assert got["pool"] == MIG_NODE and "-mig-1g10gb-" in got["device"]
        await asyncio.wait_for(sp.stop(), 30)
        with pytest.raises(KubeError):
            k8s.admin.get(f"{pods}/{sp.pod_name}")
        # the real garbage collector deletes the claim with its owner
        wait_for(lambda: not [x for x in k8s.admin.items(claims)
                              if x["metadata"]["name"] == f"{sp.pod_name}-gpu"],
                 "the claim to be collected with its pod", 60)
    finally:
        k8s.admin.delete(f"{pods}/{sp.pod_name}", {"gracePeriodSeconds": 0})
        for r in list(KubeSpawner.reflectors.values()):
            await r.stop()
        KubeSpawner.reflectors.clear()
