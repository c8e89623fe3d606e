"""Placement -> Kubernetes objects, without any server: a unit table of pod resources,
affinity and claims (whole GPUs, MIG mixed and single, MPS shares, gangs, DRA), schema
validation of every generated Pod, Job and ResourceClaim(Template) with kubernetes-validate
(strict) for each Kubernetes version from 1.32 to 1.37 where the kind exists, and the project's
own checks for what schema validation misses."""

from __future__ import annotations

import json

import pytest

from jupyter_gpubudget.backends import k8s_objects as ko
from tests.kubernetes.conftest import need

kv = need("kubernetes_validate")

VERSIONS = ["1.32", "1.33", "1.34", "1.35", "1.36", "1.37"]
DRA_VERSIONS = ["1.34", "1.35", "1.36", "1.37"]  # resource.k8s.io/v1 is GA from 1.34


def gpu(node: str, i: int) -> dict:
    return {"node": node, "gpu": i, "kind": "gpu", "milli": 1000}


def mig(node: str, i: int, profile: str, start: int) -> dict:
    return {"node": node, "gpu": i, "kind": "mig", "milli": 143, "profile": profile,
            "mig_start": start}


def mps(node: str, i: int, milli: int, mem: int = 0) -> dict:
    return {"node": node, "gpu": i, "kind": "mps", "milli": milli, "gpu_memory_mib": mem}


META = ko.Meta(workload="0123456789abcdef", project="physics/lattice-qcd", user="alice@example.org",
               kind="batch", attempt=2, min_runtime=3600.0, protected_until=1_750_000_000.0,
               backed=True, resumable=False)
MIXED = ko.Naming()
SINGLE = ko.Naming(mig_strategy="single", node_products={"a100": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"})
DRA = ko.Naming(mode="dra")
DRA_UUIDS = ko.Naming(mode="dra", gpu_uuids={("h1", 0): "GPU-aaaa", ("h1", 1): "GPU-bbbb",
                                            ("h1", 6): "GPU-mig6"})
NODENAME = ko.Naming(pin="nodeName")


def jobs_of(placement, naming=MIXED):  # noqa: ANN001, ANN201
    return ko.batch_jobs(meta=META, command=["python", "-c", "print(1)"], env={"A": "1"},
                         placement=placement, naming=naming, namespace="gpu-jobs",
                         image="python:3.12-slim", pod_security={"runAsNonRoot": True},
                         tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists",
                                       "effect": "NoSchedule"}])


def job_pod(job: dict) -> tuple[dict, dict]:
    spec = job["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


def required_nodes(spec: dict) -> list[str]:
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [v for t in terms["nodeSelectorTerms"] for f in t["matchFields"] for v in f["values"]]


# ---------------------------------------------------------------------------- the table

TABLE = [
    # (case, placement, naming, expected limits, node selector, expected DRA requests)
    ("whole-1", [gpu("h1", 3)], MIXED, {"nvidia.com/gpu": "1"}, {}, None),
    ("whole-4", [gpu("h1", i) for i in range(4)], MIXED, {"nvidia.com/gpu": "4"}, {}, None),
    ("mig-mixed", [mig("h1", 6, "1g.10gb", 6)], MIXED, {"nvidia.com/mig-1g.10gb": "1"}, {},
     None),
    ("mig-single", [mig("a100", 0, "1g.5gb", 2)], SINGLE, {"nvidia.com/gpu": "1"},
     {"nvidia.com/mig.strategy": "single",
      "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"}, None),
    ("mps-250", [mps("h1", 2, 250, 20000)], MIXED, {"nvidia.com/gpu.shared": "1"}, {}, None),
    ("mps-500", [mps("h1", 2, 500)], MIXED, {"nvidia.com/gpu.shared": "2"}, {}, None),
    ("dra-whole-2", [gpu("h2", 0), gpu("h2", 1)], DRA, {}, {},
     [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                   "allocationMode": "ExactCount", "count": 2}}]),
    ("dra-whole-uuids", [gpu("h1", 0), gpu("h1", 1)], DRA_UUIDS, {}, {},
     [{"name": "gpus", "exactly": {
         "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2,
         "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].uuid in "
                                              "['GPU-aaaa', 'GPU-bbbb']"}}]}}]),
    ("dra-mig", [mig("h1", 6, "3g.40gb", 4)], DRA_UUIDS, {}, {},
     [{"name": "mig", "exactly": {
         "deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1,
         "selectors": [{"cel": {"expression":
                                "device.attributes['gpu.nvidia.com'].profile == '3g.40gb' && "
                                "device.attributes['gpu.nvidia.com'].parentUUID == "
                                "'GPU-mig6'"}}]}}]),
    ("dra-mps-falls-back", [mps("h1", 1, 250)], DRA, {"nvidia.com/gpu.shared": "1"}, {}, None),
    ("cpu-only", [{"node": "c1", "gpu": -1, "kind": "cpu", "milli": 0, "cpu_milli": 2000,
                   "memory_mib": 4096}], MIXED, {}, {}, None),
]


@pytest.mark.parametrize("case,placement,naming,limits,selector,claims", TABLE,
                         ids=[t[0] for t in TABLE])
def test_placement_to_pod_resources(case, placement, naming, limits, selector, claims):
    (node, slices), = ko.by_node(placement).items()
    plan = ko.pod_plan(node, slices, naming)
    assert plan.limits == limits
    assert plan.node_selector == selector
    assert (plan.claim_requests or None) == claims
    if case.startswith("mps"):
        milli = placement[0]["milli"]
        assert plan.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(milli // 10)
    if case == "mps-250":
        assert plan.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20000M"
    if case == "cpu-only":
        assert plan.requests == {"cpu": "2000m", "memory": "4096Mi"} and plan.gpus == 0
    # the Job built from it carries exactly these resources and is pinned to the node
    objs = jobs_of(placement, naming)
    (job,) = [o for o in objs if o["kind"] == "Job"]
    spec, c = job_pod(job)
    assert c["resources"].get("limits", {}) == limits
    assert "requests" not in c["resources"] or set(c["resources"]["requests"]) <= {"cpu",
                                                                                  "memory"}
    assert required_nodes(spec) == [node]
    assert spec.get("nodeSelector", {}) == selector
    if claims:
        (tpl,) = [o for o in objs if o["kind"] == "ResourceClaimTemplate"]
        assert tpl["spec"]["spec"]["devices"]["requests"] == claims
        assert spec["resourceClaims"] == [{"name": "gpu",
                                           "resourceClaimTemplateName": tpl["metadata"]["name"]}]
        assert c["resources"]["claims"] == [{"name": "gpu"}]
        assert "nodeName" not in spec


def test_whole_gpus_pinned_with_node_name():
    (job,) = jobs_of([gpu("h1", 0), gpu("h1", 1)], NODENAME)
    spec, c = job_pod(job)
    assert spec["nodeName"] == "h1" and "affinity" not in spec
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "2"}


def test_dra_never_pins_with_node_name():
    dra_nodename = ko.Naming(mode="dra", pin="nodeName")
    objs = jobs_of([gpu("h1", 0)], dra_nodename)
    spec, _ = job_pod(objs[-1])
    assert "nodeName" not in spec and required_nodes(spec) == ["h1"]


def test_gang_on_equally_loaded_nodes_is_one_indexed_job_one_pod_per_node():
    placement = [gpu("h1", i) for i in range(8)] + [gpu("h2", i) for i in range(8)]
    (job,) = jobs_of(placement)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert job["spec"]["backoffLimit"] == 0
    spec, c = job_pod(job)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert required_nodes(spec) == ["h1", "h2"]
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert anti[0]["labelSelector"]["matchLabels"] == {ko.L_GANG: "0123456789abcdef-2"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GPUBUDGET_GANG_SIZE"] == "2" and env["GPUBUDGET_RANK_OFFSET"] == "0"
    assert json.loads(env["GPUBUDGET_PLACEMENT"]) == placement


def test_gang_on_unequally_loaded_nodes_is_one_indexed_job_per_load():
    placement = [gpu("h1", i) for i in range(8)] + [gpu("h2", i) for i in range(8)] + \
        [gpu("h3", i) for i in range(4)]
    jobs = jobs_of(placement)
    assert [j["metadata"]["name"] for j in jobs] == ["gb-0123456789abcdef-2",
                                                      "gb-0123456789abcdef-2-1"]
    shapes = []
    for j in jobs:
        spec, c = job_pod(j)
        env = {e["name"]: e.get("value") for e in c["env"]}
        shapes.append((required_nodes(spec), j["spec"]["completions"],
                       c["resources"]["limits"]["nvidia.com/gpu"], env["GPUBUDGET_RANK_OFFSET"],
                       env["GPUBUDGET_GANG_SIZE"]))
        assert j["metadata"]["labels"][ko.L_GANG] == "0123456789abcdef-2"
    assert shapes == [(["h1", "h2"], 2, "8", "0", "3"), (["h3"], 1, "4", "2", "3")]
    # the single-node part needs no anti-affinity
    assert "podAntiAffinity" not in job_pod(jobs[1])[0]["affinity"]


def test_gang_runs_a_pod_per_full_size_mig_instance():
    """Policy ``gang_on_mig``: a gang's GPUs on a MIG-mode node are full-size instances. A CUDA
    process sees only one MIG instance, so each instance gets a pod of its own, in an Indexed
    Job of that node (no anti-affinity: its pods share the node), while the gang's other
    nodes keep one pod per node."""
    placement = [gpu("h1", 0), gpu("h1", 1), gpu("h2", 0), gpu("h2", 1),
                 {**mig("m1", 0, "7g.80gb", 0), "cpu_milli": 3000, "memory_mib": 1001},
                 mig("m1", 1, "7g.80gb", 0), mig("m1", 3, "7g.80gb", 0)]
    shapes = []
    for j in jobs_of(placement):
        spec, c = job_pod(j)
        env = {e["name"]: e.get("value") for e in c["env"]}
        shapes.append((required_nodes(spec), j["spec"]["completions"],
                       j["spec"]["parallelism"], c["resources"]["limits"],
                       c["resources"].get("requests"), env["GPUBUDGET_RANK_OFFSET"],
                       env["GPUBUDGET_GANG_SIZE"],
                       "podAntiAffinity" in spec.get("affinity", {})))
        assert j["metadata"]["labels"][ko.L_GANG] == "0123456789abcdef-2"
    assert shapes == [
        (["h1", "h2"], 2, 2, {"nvidia.com/gpu": "2"}, None, "0", "5", True),
        # the node's CPU and memory split between its three pods
        # (1001 MiB: 334 + 334 + 333; equal pods share an Indexed Job)
        (["m1"], 2, 2, {"nvidia.com/mig-7g.80gb": "1"}, {"cpu": "1000m", "memory": "334Mi"},
         "2", "5", False),
        (["m1"], 1, 1, {"nvidia.com/mig-7g.80gb": "1"}, {"cpu": "1000m", "memory": "333Mi"},
         "4", "5", False)]


def test_pod_units_split_only_a_gangs_mig_instances():
    one = [mig("m1", 0, "7g.80gb", 0), mig("m1", 1, "7g.80gb", 0)]
    # a workload on one node is one pod, whatever it holds
    assert ko.pod_units({"m1": one}) == [("m1", one, False)]
    # a gang's node with whole GPUs and MIG instances: the GPUs together, an instance each
    both = [{**gpu("m1", 4), "cpu_milli": 5, "memory_mib": 7}, gpu("m1", 5),
            mig("m1", 0, "7g.80gb", 0)]
    units = ko.pod_units({"h1": [gpu("h1", 0)], "m1": both, "m2": [mig("m2", 0, "7g.80gb", 0)]})
    assert [(n, [(s["kind"], s["gpu"]) for s in sl], alone) for n, sl, alone in units] == [
        ("h1", [("gpu", 0)], False),
        ("m1", [("gpu", 4), ("gpu", 5)], True), ("m1", [("mig", 0)], True),
        ("m2", [("mig", 0)], False)]  # one instance alone on its node: its pod already
    assert [[(s.get("cpu_milli", 0), s.get("memory_mib", 0)) for s in sl]
            for _, sl, _ in units[1:3]] == [[(3, 4), (0, 0)], [(2, 3)]]


def test_labels_and_annotations_carry_project_workload_contract_protected_until():
    (job,) = jobs_of([gpu("h1", 0)])
    md = job["metadata"]
    assert md["labels"][ko.L_WORKLOAD] == "0123456789abcdef"
    assert md["labels"][ko.L_PROJECT] != "physics/lattice-qcd"  # '/' is not label-safe...
    assert md["annotations"][ko.A_PROJECT] == "physics/lattice-qcd"  # ...the annotation is exact
    assert md["labels"][ko.L_USER].startswith("alice-example.org")
    assert md["labels"][ko.L_ATTEMPT] == "2"
    assert json.loads(md["annotations"][ko.A_CONTRACT]) == {
        "kind": "batch", "min_runtime_s": 3600.0, "backed": True, "resumable": False}
    assert md["annotations"][ko.A_PROTECTED_UNTIL] == "2025-06-15T15:06:40Z"
    assert job["spec"]["template"]["metadata"]["labels"] == md["labels"]
    spec, c = job_pod(job)
    assert spec["automountServiceAccountToken"] is False  # nothing of the service in the pod
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("bad,field", [
    ([], "placement"),
    ([{"gpu": 0, "kind": "gpu"}], "placement[0].node"),
    ([{"node": "h1", "kind": "tpu"}], "placement[0].kind"),
    ([{"node": "h1", "kind": "mig", "gpu": 0}], "placement[0].profile"),
    ([mps("h1", 0, 1000)], "placement.milli"),
    ([mig("h1", 0, "1g.10gb", 0), mig("h1", 1, "2g.20gb", 2)], "placement"),
    ([mig("a100", 0, "2g.10gb", 0)], "placement.profile"),  # node exposes 1g.5gb only
])
def test_bad_placements_are_refused_naming_the_field(bad, field):
    naming = SINGLE if field == "placement.profile" else MIXED
    with pytest.raises(ko.PlacementError) as e:
        jobs_of(bad, naming)
    assert str(e.value).startswith(field), str(e.value)


def test_bad_naming_is_refused():
    with pytest.raises(ko.PlacementError, match="gpu_resource"):
        ko.Naming(gpu_resource="gpu")
    with pytest.raises(ko.PlacementError, match="mig_strategy"):
        ko.Naming(mig_strategy="none")


def test_label_values_and_names_stay_valid_for_hostile_input():
    for s in ["a" * 200, "héllo wörld", "-x-", "", "a/b/c", "UPPER_case.ok"]:
        v = ko.label_value(s)
        assert len(v) <= 63 and ko._LABEL_VALUE.match(v), (s, v)
        n = ko.dns_label("gb-" + s, 40)
        assert len(n) <= 40 and ko._DNS_LABEL.match(n), (s, n)
    assert ko.label_value("a/b") != ko.label_value("a-b")  # altered values get a hash


# ---------------------------------------------------------------------------- validation


def all_manifests() -> list[tuple[str, dict]]:
    out = []
    for case, placement, naming, *_ in TABLE:
        for o in jobs_of(placement, naming):
            out.append((f"{case}:{o['kind']}", o))
    gang = [gpu("h1", i) for i in range(8)] + [gpu("h2", i) for i in range(8)] + \
        [gpu("h3", i) for i in range(4)]
    out += [(f"gang:{o['metadata']['name']}", o) for o in jobs_of(gang)]
    out.append(("claim", ko.resource_claim(
        "jupyter-alice-gpu", "jhub", ko.pod_plan("h1", [mig("h1", 6, "1g.10gb", 6)],
                                                 DRA).claim_requests, META,
        ko.owner_reference("Pod", "jupyter-alice", "5f0c7bde-64d8-4b53-8c2a-5b3b3f1c0c11"))))
    return out


def versions_for(obj: dict) -> list[str]:
    return DRA_VERSIONS if obj["apiVersion"].startswith("resource.k8s.io") or \
        obj["kind"] == "Job" and _uses_claims(obj) else VERSIONS


def _uses_claims(job: dict) -> bool:
    return bool(job["spec"]["template"]["spec"].get("resourceClaims"))


def test_kubernetes_validate_ships_the_versions_we_test():
    have = {v.rsplit(".", 1)[0] for v in kv.utils.all_versions()}
    assert set(VERSIONS) <= have, sorted(have)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_generated_manifest_validates_strictly(version):
    checked = 0
    for name, obj in all_manifests():
        if version not in versions_for(obj):
            continue
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{name} invalid for Kubernetes {version}: {e.message} at "
                        f"{list(e.absolute_path)}")
        assert ko.check_manifest(obj) == [], name
        checked += 1
    assert checked >= (10 if version in ("1.32", "1.33") else 16)


def test_strict_validation_really_rejects_mistakes():
    (job,) = jobs_of([gpu("h1", 0)])
    job["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # typo: unknown field
    with pytest.raises(kv.ValidationError):
        kv.validate(job, "1.34", strict=True)
    claim = ko.resource_claim("c", "ns", [{"name": "g", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": "2"}}], META)  # count must be an int
    with pytest.raises(kv.ValidationError):
        kv.validate(claim, "1.34", strict=True)
    with pytest.raises(kv.SchemaNotFoundError):  # no resource.k8s.io/v1 before 1.34
        kv.validate(claim, "1.33", strict=True)


def _pod(limits: dict, requests: dict | None = None, **spec) -> dict:  # noqa: ANN003
    res = {"limits": limits} | ({"requests": requests} if requests else {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": res}], **spec}}


@pytest.mark.parametrize("pod,complaint", [
    (_pod({"gpu": "1"}), "domain-prefixed"),
    (_pod({"kubernetes.io/gpu": "1"}), "domain-prefixed"),
    (_pod({"nvidia.com/gpu": "0.5"}), "whole number"),
    (_pod({"nvidia.com/gpu": "500m"}), "whole number"),
    (_pod({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"}), "must equal limits"),
    (_pod({}, {"nvidia.com/gpu": "1"}), "no limit"),
    (_pod({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-2g.20gb": "1"}), "more than one MIG"),
    (_pod({}, nodeName="h1", resourceClaims=[{"name": "gpu", "resourceClaimName": "x"}]),
     "nodeName"),
    # the real API server refuses this (seen in test_real_scheduling.py's gang)
    (_pod({}, affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                "values": ["h1", "h2"]}]}]}}}),
     "exactly one value"),
])
def test_own_checks_catch_what_the_schema_misses(pod, complaint):
    kv.validate(pod, "1.34", strict=True)  # the schema accepts it...
    errs = ko.check_manifest(pod)  # ...the project's checks do not
    assert any(complaint in e for e in errs), errs


def test_own_checks_pass_a_good_pod():
    assert ko.check_manifest(_pod({"nvidia.com/gpu": "2", "cpu": "1"},
                                  {"nvidia.com/gpu": "2", "cpu": "500m"})) == []


# ---------------------------------------------------------------------------- inventory


def node(name: str, labels: dict, alloc: dict, ready: str = "True",
         unschedulable: bool = False, annotations: dict | None = None) -> dict:
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
            "spec": {"unschedulable": True} if unschedulable else {},
            "status": {"allocatable": {"cpu": "96", "memory": "1024Gi", **alloc},
                       "conditions": [{"type": "Ready", "status": ready,
                                       "reason": "KubeletReady" if ready == "True"
                                       else "KubeletNotReady"}]}}


NODES = [
    node("h100-a", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                    "nvidia.com/gpu.memory": "81559", "nvidia.com/mig.strategy": "mixed",
                    "nvidia.com/mig-1g.10gb.count": "7", "nvidia.com/mig-3g.40gb.count": "2",
                    "nvidia.com/mig.config.state": "success",
                    "topology.kubernetes.io/zone": "rack-1"},
         {"nvidia.com/gpu": "6", "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"}),
    node("a100-s", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                    "nvidia.com/gpu.count": "28", "nvidia.com/gpu.memory": "4864",
                    "nvidia.com/mig.strategy": "single"}, {"nvidia.com/gpu": "28"}),
    node("h200-x", {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "4",
                    "nvidia.com/gpu.memory": "143771"}, {"nvidia.com/gpu": "4"},
         ready="False"),
    node("cpu-1", {}, {}),
]


def test_inventory_from_gpu_feature_discovery_labels():
    inv = ko.inventory_from_nodes(NODES)
    by = {n.name: n for n in inv.nodes}
    assert inv.source == "kubernetes"
    h = by["h100-a"]
    assert [g.mig for g in h.gpus] == [False] * 6 + [True] * 2
    assert {g.model for g in h.gpus} == {"H100-80GB"} and h.gpus[0].memory_mib == 81559
    assert h.rack == "rack-1" and h.cpu_milli == 96000 and h.memory_mib == 1024 * 1024
    a = by["a100-s"]  # 28 instances of 1g.5gb at 7 per GPU: 4 MIG GPUs
    assert len(a.gpus) == 4 and all(g.mig and g.model == "A100-40GB" for g in a.gpus)
    assert len(by["h200-x"].gpus) == 4 and by["h200-x"].gpus[0].model == "H200-141GB"
    assert by["cpu-1"].gpus == ()
    assert ko.node_products(NODES)["a100-s"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"


def test_mig_gpus_have_a_fixed_layout_holding_the_instances_the_node_offers():
    """The core places MIG work only on instances that exist: the device plugin's counts per
    node become the MIG GPUs' fixed layouts (no profile the node does not offer)."""
    from collections import Counter

    by = {n.name: n for n in ko.inventory_from_nodes(NODES).nodes}
    h = [g for g in by["h100-a"].gpus if g.mig]
    assert Counter(p for g in h for p, _ in g.mig_layout) == {"1g.10gb": 7, "3g.40gb": 2}
    assert h[0].mig_layout == (("3g.40gb", 0), ("3g.40gb", 4))
    a = by["a100-s"].gpus
    assert all(g.mig_layout == tuple(("1g.5gb", s) for s in range(7)) for g in a)
    assert ko.mig_layouts("H100-80GB", 1, {"7g.80gb": 2}) is None  # more than fits: carvable
    assert ko.mig_layouts("H100-80GB", 2, {}) is None


def test_node_health_cordoned_notready_and_mig_reconfiguration():
    nodes = [n for n in NODES]
    nodes.append(node("h100-b", {"nvidia.com/mig.config.state": "pending"}, {}))
    nodes.append(node("h100-c", {}, {}, unschedulable=True,
                      annotations={ko.A_DRAIN_REASON: "core drain: XID 79"}))
    nodes.append(node("h100-d", {"nvidia.com/mig.config.state": "failed"}, {}, unschedulable=True))
    h = ko.node_health(nodes)
    assert set(h) == {"h200-x", "h100-b", "h100-c", "h100-d"}
    assert h["h200-x"] == "NotReady (KubeletNotReady)"
    assert h["h100-b"] == "MIG reconfiguration pending"
    assert h["h100-c"] == "cordoned (core drain: XID 79)"
    assert h["h100-d"] == "cordoned; MIG reconfiguration failed"


def test_cordon_and_uncordon_patches():
    p = ko.cordon_patch("unhealthy: NotReady", 1_750_000_000.0)
    assert p["spec"] == {"unschedulable": True}
    assert p["metadata"]["annotations"][ko.A_DRAIN_REASON] == "unhealthy: NotReady"
    assert p["metadata"]["labels"][ko.L_DRAINED] == "true"
    u = ko.uncordon_patch()
    assert u["spec"] == {"unschedulable": None}
    assert u["metadata"]["annotations"][ko.A_DRAIN_REASON] is None


# ---------------------------------------------------------------------------- notebook pods


@pytest.fixture
def kubespawner(tmp_path, monkeypatch):
    """A real KubeSpawner (its own test mode: mock user and hub; no API calls are made)."""
    need("kubespawner")
    from traitlets.config import Config

    from tests.kubernetes.fakeapi import kubeconfig

    cfg = tmp_path / "kubeconfig"
    cfg.write_text(kubeconfig("http://127.0.0.1:9", "unused"))
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    import kubernetes_asyncio.config.kube_config as kc

    monkeypatch.setattr(kc, "KUBE_CONFIG_DEFAULT_LOCATION", str(cfg))  # read at import
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def make(**placement_cfg):  # noqa: ANN003, ANN202
        from kubespawner import KubeSpawner

        c = Config()
        for k, v in placement_cfg.items():
            setattr(c.KubePlacement, k, v)
        c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
        c.KubeSpawner.node_affinity_required = [{"matchExpressions": [
            {"key": "hub.jupyter.org/node-purpose", "operator": "In", "values": ["user"]}]}]
        sp = KubeSpawner(config=c, _mock=True)
        sp.api_token = "secret-token"
        return sp
    return make


SESSION_META = {"env": {"CUDA_VISIBLE_DEVICES": "GPU-h1-0", "GPUBUDGET_SESSION": "s-42",
                        "GPUBUDGET_PLACEMENT": json.dumps([gpu("h1", 0)])},
                "session": "s-42", "project": "astro", "user": "mock@name",
                "protected_until": 1_750_000_000.0, "min_runtime": 3600.0,
                "kind": "interactive"}


async def notebook_pod(sp, placement) -> dict:  # noqa: ANN001
    from kubernetes_asyncio.client import ApiClient

    from jupyter_gpubudget.backends.kubernetes import configure_kubespawner

    configure_kubespawner(sp, placement, SESSION_META)
    pod = await sp.get_pod_manifest()
    if sp.modify_pod_hook:
        pod = await sp.modify_pod_hook(sp, pod)
    return ApiClient().sanitize_for_serialization(pod)


async def test_kubespawner_pod_gets_the_placement(kubespawner):
    sp = kubespawner(snapshot_command=["gpubudget-snapshot", "--before-stop"], stop_grace=90)
    pod = await notebook_pod(sp, [gpu("h1", 0), gpu("h1", 1)])
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "nvidia.com/gpu" not in (c["resources"].get("requests") or {})
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # the admin's own term still applies, ANDed with the core's node
    assert terms == [{"matchExpressions": [{"key": "hub.jupyter.org/node-purpose",
                                            "operator": "In", "values": ["user"]}],
                      "matchFields": [{"key": "metadata.name", "operator": "In",
                                       "values": ["h1"]}]}]
    md = pod["metadata"]
    assert md["labels"][ko.L_WORKLOAD] == "s-42" and md["labels"][ko.L_KIND] == "interactive"
    assert md["annotations"][ko.A_PROTECTED_UNTIL] == "2025-06-15T15:06:40Z"
    assert json.loads(md["annotations"][ko.A_CONTRACT])["min_runtime_s"] == 3600.0
    assert json.loads(md["annotations"][ko.A_PLACEMENT]) == [gpu("h1", 0), gpu("h1", 1)]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert json.loads(env["GPUBUDGET_PLACEMENT"]) == [gpu("h1", 0)]  # braces kept literal
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin decides visibility
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["gpubudget-snapshot",
                                                            "--before-stop"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == 90 and sp.delete_grace_period == 90
    for v in VERSIONS:
        kv.validate(pod, v, strict=True)
    assert ko.check_manifest(pod) == []


async def test_kubespawner_pod_mig_mps_and_node_name(kubespawner):
    pod = await notebook_pod(kubespawner(), [mig("h1", 6, "1g.10gb", 6)])
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"
    pod = await notebook_pod(kubespawner(pin="nodeName"), [mps("h1", 2, 250, 8000)])
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    assert pod["spec"]["nodeName"] == "h1"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    for v in VERSIONS:
        kv.validate(pod, v, strict=True)
    assert ko.check_manifest(pod) == []


async def test_kubespawner_pod_with_dra_claim(kubespawner):
    sp = kubespawner(mode="dra")
    pod = await notebook_pod(sp, [mig("h1", 6, "1g.10gb", 6)])
    claim_name = f"{sp.pod_name}-gpu"
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": claim_name}]
    c = pod["spec"]["containers"][0]
    assert c["resources"]["claims"] == [{"name": "gpu"}]
    assert not any(k.startswith("nvidia.com") for k in c["resources"].get("limits") or {})
    assert "nodeName" not in pod["spec"]
    for v in DRA_VERSIONS:  # pod.spec.resourceClaims[].resourceClaimName: 1.34 schema on
        kv.validate(pod, v, strict=True)
    assert ko.check_manifest(pod) == []


async def test_notebook_spanning_nodes_is_refused(kubespawner):
    from jupyter_gpubudget.backends.kubernetes import configure_kubespawner

    with pytest.raises(ko.PlacementError, match="one pod on one node"):
        configure_kubespawner(kubespawner(), [gpu("h1", 0), gpu("h2", 0)], SESSION_META)
