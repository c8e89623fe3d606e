"""Dynamic resource allocation, judged by the real API server, the real ResourceClaim controller
and the real scheduler's DRA plugin (tests/fixtures/k8s.py says which parts are real). No DRA
driver runs: the test publishes what the NVIDIA driver would (a DeviceClass and a node's
ResourceSlice of 8 GPUs with their UUIDs), which is all the scheduler reads. A batch job in
``dra`` mode with the GPUs' UUIDs gets a ResourceClaimTemplate whose CEL selector the real
scheduler evaluates: the claim made for the pod is allocated exactly the core's GPUs, on the
core's node."""

from __future__ import annotations

from jupyter_gpubudget.backends import k8s_objects as ko
from tests.fixtures.k8s import NAMESPACE, KubeError, wait_for
from tests.kubernetes.test_real_rbac import job, whole

NODE = "gpu-c"


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
