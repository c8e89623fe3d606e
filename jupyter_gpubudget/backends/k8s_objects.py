"""Pure builders for the Kubernetes backend: a granted placement -> Kubernetes objects, and
Node objects -> the core's inventory and health. No I/O, no client library: plain dicts in the
shape of the Kubernetes API (camelCase), so they can be validated against the API's schemas
and sent as they are.

How a placement becomes pod resources (NVIDIA device plugin / GPU operator names):

- whole GPUs: ``nvidia.com/gpu: N`` (limits only: the API server copies limits to requests
  for extended resources);
- a MIG instance, ``mixed`` strategy: ``nvidia.com/mig-<profile>: 1``; ``single`` strategy:
  ``nvidia.com/gpu: 1`` on a node whose ``nvidia.com/gpu.product`` ends in ``-MIG-<profile>``;
- an MPS share (time-slicing or MPS sharing with ``renameByDefault``):
  ``nvidia.com/gpu.shared: ceil(milli * replicas / 1000)`` plus the MPS environment;
- with Dynamic Resource Allocation (``resource.k8s.io/v1``, Kubernetes >= 1.34) a
  ResourceClaim(Template) asking device class ``gpu.nvidia.com`` for N GPUs, or
  ``mig.nvidia.com`` with a CEL selector on the profile.

The pod is pinned to the core's node by a required node affinity on ``metadata.name`` (or
``spec.nodeName``, which bypasses the scheduler and so cannot be used with DRA). Labels and
annotations carry project, workload id, contract and protected-until.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from jupyter_gpubudget.backends.devices import mps_env
from jupyter_gpubudget.core import mig as migtab
from jupyter_gpubudget.core.inventory import GpuSpec, Inventory, NodeSpec
from jupyter_gpubudget.inventory.nvml import model_name

DOMAIN = "gpubudget.jupyter.org"
MANAGED_BY = ("app.kubernetes.io/managed-by", "jupyter-gpubudget")
L_WORKLOAD = f"{DOMAIN}/workload"
L_ATTEMPT = f"{DOMAIN}/attempt"
L_PROJECT = f"{DOMAIN}/project"
L_USER = f"{DOMAIN}/user"
L_KIND = f"{DOMAIN}/kind"
L_GANG = f"{DOMAIN}/gang"
L_DRAINED = f"{DOMAIN}/drained"
A_PROJECT = f"{DOMAIN}/project"
A_WORKLOAD = f"{DOMAIN}/workload"
A_USER = f"{DOMAIN}/user"
A_CONTRACT = f"{DOMAIN}/contract"
A_PROTECTED_UNTIL = f"{DOMAIN}/protected-until"
A_PLACEMENT = f"{DOMAIN}/placement"
A_DRAIN_REASON = f"{DOMAIN}/drain-reason"
A_DRAINED_AT = f"{DOMAIN}/drained-at"

NVIDIA = "nvidia.com"
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
L_PRODUCT = "nvidia.com/gpu.product"
L_COUNT = "nvidia.com/gpu.count"
L_MEMORY = "nvidia.com/gpu.memory"
L_STRATEGY = "nvidia.com/mig.strategy"
L_REPLICAS = "nvidia.com/gpu.replicas"
L_MIG_STATE = "nvidia.com/mig.config.state"
DRA_DRIVER = "gpu.nvidia.com"
CLAIM_NAME = "gpu"  # the pod-level name of the GPU claim

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class PlacementError(ValueError):
    """A placement that cannot be expressed as Kubernetes objects (names the field)."""


# ---------------------------------------------------------------------------- naming


def _digest(s: str, n: int = 8) -> str:
    return hashlib.sha256(s.encode()).hexdigest()[:n]


def label_value(s: str) -> str:
    """A valid label value standing for ``s`` (the exact value goes into an annotation):
    invalid characters become '-', and a long or altered value ends in a short hash."""
    if len(s) <= 63 and _LABEL_VALUE.fullmatch(s):
        return s
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", s)
    clean = clean[:54].strip("-_.")
    return f"{clean}-{_digest(s)}" if clean else _digest(s)


def dns_label(s: str, max_len: int = 63) -> str:
    """A DNS-1123 label (object names, ≤ ``max_len``) standing for ``s``."""
    low = s.lower()
    if len(low) <= max_len and _DNS_LABEL.fullmatch(low) and low == s:
        return s
    clean = re.sub(r"[^a-z0-9-]", "-", low).strip("-")
    clean = clean[: max_len - 9].strip("-")
    return f"{clean}-{_digest(s)}" if clean else f"x{_digest(s)}"


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Meta:
    """Who and what a pod or Job belongs to (labels and annotations)."""

    workload: str
    project: str
    user: str
    kind: str = "batch"
    attempt: int | None = None
    min_runtime: float = 0.0
    protected_until: float | None = None
    backed: bool | None = None
    resumable: bool | None = None

    def labels(self) -> dict[str, str]:
        out = {MANAGED_BY[0]: MANAGED_BY[1], L_WORKLOAD: label_value(self.workload),
               L_PROJECT: label_value(self.project), L_USER: label_value(self.user),
               L_KIND: label_value(self.kind)}
        if self.attempt is not None:
            out[L_ATTEMPT] = str(self.attempt)
        return out

    def contract(self) -> dict[str, Any]:
        c: dict[str, Any] = {"kind": self.kind, "min_runtime_s": self.min_runtime}
        if self.backed is not None:
            c["backed"] = self.backed
        if self.resumable is not None:
            c["resumable"] = self.resumable
        return c

    def annotations(self, placement: list[dict] | None = None) -> dict[str, str]:
        out = {A_WORKLOAD: self.workload, A_PROJECT: self.project, A_USER: self.user,
               A_CONTRACT: json.dumps(self.contract(), sort_keys=True)}
        if self.protected_until is not None:
            out[A_PROTECTED_UNTIL] = rfc3339(self.protected_until)
        if placement is not None:
            out[A_PLACEMENT] = json.dumps(placement, sort_keys=True)
        return out


# ---------------------------------------------------------------------------- GPU resources


@dataclass(frozen=True)
class Naming:
    """How the cluster exposes GPUs (the device plugin's or the DRA driver's names)."""

    mode: str = "device-plugin"  # or "dra"
    mig_strategy: str = "mixed"  # or "single"
    gpu_resource: str = GPU_RESOURCE
    shared_resource: str = SHARED_RESOURCE
    shared_replicas: int = 4  # replicas per GPU of the shared resource
    pin: str = "affinity"  # or "nodeName"
    gpu_device_class: str = "gpu.nvidia.com"
    mig_device_class: str = "mig.nvidia.com"
    #: node -> its nvidia.com/gpu.product label (single strategy: ends in -MIG-<profile>)
    node_products: dict[str, str] = field(default_factory=dict)
    #: (node, gpu index) -> GPU UUID: with DRA, claims select exactly the core's GPU
    gpu_uuids: dict[tuple[str, int], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in ("device-plugin", "dra"):
            raise PlacementError(f"mode: expected 'device-plugin' or 'dra', got {self.mode!r}")
        if self.mig_strategy not in ("mixed", "single"):
            raise PlacementError(f"mig_strategy: expected 'mixed' or 'single', got "
                                 f"{self.mig_strategy!r}")
        if self.pin not in ("affinity", "nodeName"):
            raise PlacementError(f"pin: expected 'affinity' or 'nodeName', got {self.pin!r}")
        if self.shared_replicas < 1:
            raise PlacementError("shared_replicas: must be at least 1")
        for f in ("gpu_resource", "shared_resource"):
            v = getattr(self, f)
            if "/" not in v or not _QUALIFIED.fullmatch(v):
                raise PlacementError(f"{f}: {v!r} is not a domain-prefixed resource name")


@dataclass
class PodPlan:
    """What one pod needs for its part of a placement."""

    node: str
    limits: dict[str, str] = field(default_factory=dict)
    requests: dict[str, str] = field(default_factory=dict)  # CPU / memory from the placement
    node_selector: dict[str, str] = field(default_factory=dict)
    claim_requests: list[dict] = field(default_factory=list)  # DRA device requests
    env: dict[str, str] = field(default_factory=dict)
    gpus: int = 0  # GPU devices of the pod (whole GPUs, MIG instances or shares)

    @property
    def uses_dra(self) -> bool:
        return bool(self.claim_requests)


def _int(s: dict, key: str, default: int = 0) -> int:
    v = s.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise PlacementError(f"placement.{key}: expected an integer, got {v!r}")
    return v


def by_node(placement: list[dict]) -> dict[str, list[dict]]:
    """Slices grouped by node, in placement order; refuses malformed slices."""
    if not isinstance(placement, list) or not placement:
        raise PlacementError("placement: expected a non-empty list of slices")
    out: dict[str, list[dict]] = {}
    for i, s in enumerate(placement):
        if not isinstance(s, dict):
            raise PlacementError(f"placement[{i}]: expected an object")
        node = s.get("node")
        if not isinstance(node, str) or not node:
            raise PlacementError(f"placement[{i}].node: expected a node name")
        kind = s.get("kind", "gpu")
        if kind not in ("gpu", "mig", "mps", "cpu"):
            raise PlacementError(f"placement[{i}].kind: unknown slice kind {kind!r}")
        if kind == "mig" and not (isinstance(s.get("profile"), str) and s["profile"]):
            raise PlacementError(f"placement[{i}].profile: a MIG slice needs its profile")
        out.setdefault(node, []).append(s)
    return out


def _cel_str(s: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", s):
        raise PlacementError(f"{s!r} cannot be used in a CEL selector")
    return f"'{s}'"


def pod_plan(node: str, slices: list[dict], naming: Naming) -> PodPlan:
    """The resources one pod on ``node`` needs for ``slices`` (all on that node)."""
    plan = PodPlan(node)
    whole: list[dict] = []
    migs: dict[str, list[dict]] = {}
    shares: list[dict] = []
    cpu_milli = memory_mib = 0
    for s in slices:
        kind = s.get("kind", "gpu")
        cpu_milli += _int(s, "cpu_milli")
        memory_mib += _int(s, "memory_mib")
        if kind == "gpu":
            whole.append(s)
        elif kind == "mig":
            migs.setdefault(s["profile"], []).append(s)
        elif kind == "mps":
            milli = _int(s, "milli")
            if not 0 < milli < 1000:
                raise PlacementError(f"placement.milli: an MPS share is 1..999 milli-GPUs, "
                                     f"got {milli}")
            count = math.ceil(milli * naming.shared_replicas / 1000)
            prev = int(plan.limits.get(naming.shared_resource, "0"))
            plan.limits[naming.shared_resource] = str(prev + count)
            shares.append(s)
            plan.gpus += 1
    # the device plugin picks the devices; the MPS limits come from the one builder
    plan.env.update(mps_env(enumerate(shares)))
    if whole:
        plan.gpus += len(whole)
        if naming.mode == "dra":
            req: dict[str, Any] = {"deviceClassName": naming.gpu_device_class,
                                   "allocationMode": "ExactCount", "count": len(whole)}
            uuids = [naming.gpu_uuids.get((node, _int(s, "gpu", -1))) for s in whole]
            if all(uuids):
                lst = ", ".join(_cel_str(u) for u in uuids if u)
                req["selectors"] = [{"cel": {"expression":
                                             f"device.attributes['{DRA_DRIVER}'].uuid in [{lst}]"}}]
            plan.claim_requests.append({"name": "gpus", "exactly": req})
        else:
            plan.limits[naming.gpu_resource] = str(len(whole))
    if migs:
        if len(migs) > 1:
            raise PlacementError(f"placement: one pod may hold one MIG profile, got "
                                 f"{', '.join(sorted(migs))}")
        (profile, insts), = migs.items()
        plan.gpus += len(insts)
        if naming.mode == "dra":
            expr = f"device.attributes['{DRA_DRIVER}'].profile == {_cel_str(profile)}"
            parent = {naming.gpu_uuids.get((node, _int(s, "gpu", -1))) for s in insts}
            if len(parent) == 1 and None not in parent:
                expr += f" && device.attributes['{DRA_DRIVER}'].parentUUID == " \
                        f"{_cel_str(parent.pop() or '')}"
            plan.claim_requests.append({"name": "mig", "exactly": {
                "deviceClassName": naming.mig_device_class, "allocationMode": "ExactCount",
                "count": len(insts), "selectors": [{"cel": {"expression": expr}}]}})
        elif naming.mig_strategy == "mixed":
            plan.limits[f"{NVIDIA}/mig-{profile}"] = str(len(insts))
        else:
            if naming.gpu_resource in plan.limits:
                raise PlacementError("placement: whole GPUs and a MIG instance cannot share a "
                                     "pod under the single MIG strategy")
            plan.limits[naming.gpu_resource] = str(len(insts))
            plan.node_selector[L_STRATEGY] = "single"
            product = naming.node_products.get(node)
            if product:
                if not product.endswith(f"-MIG-{profile}"):
                    raise PlacementError(
                        f"placement.profile: node {node} exposes {product!r} under the single "
                        f"MIG strategy, not MIG {profile}")
                plan.node_selector[L_PRODUCT] = product
    if cpu_milli:
        plan.requests["cpu"] = f"{cpu_milli}m"
    if memory_mib:
        plan.requests["memory"] = f"{memory_mib}Mi"
    return plan


def node_affinity(nodes: Iterable[str]) -> dict:
    """A required node affinity on the nodes' names (``metadata.name``, not a label that an
    admin might have changed): one term per node, the terms ORed. The API server refuses a
    ``metadata.name`` field selector with more than one value."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [n]}]}
            for n in sorted(set(nodes))]}}}


def pin(spec: dict, nodes: list[str], naming: Naming, uses_dra: bool) -> None:
    """Pin a pod spec to the core's node(s)."""
    if naming.pin == "nodeName" and len(nodes) == 1 and not uses_dra:
        spec["nodeName"] = nodes[0]
    else:
        spec.setdefault("affinity", {}).update(node_affinity(nodes))


def resource_claim_spec(requests: list[dict]) -> dict:
    return {"devices": {"requests": requests}}


def resource_claim(name: str, namespace: str, requests: list[dict], meta: Meta,
                   owner: dict | None = None) -> dict:
    """A ``resource.k8s.io/v1`` ResourceClaim (DRA) for one pod's GPUs; ``owner`` (the pod) makes
    the garbage collector delete it with the pod."""
    md: dict[str, Any] = {"name": name, "namespace": namespace, "labels": meta.labels(),
                          "annotations": meta.annotations()}
    if owner is not None:
        md["ownerReferences"] = [owner]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": md,
            "spec": resource_claim_spec(requests)}


def resource_claim_template(name: str, namespace: str, requests: list[dict], meta: Meta) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace, "labels": meta.labels(),
                         "annotations": meta.annotations()},
            "spec": {"metadata": {"labels": meta.labels()},
                     "spec": resource_claim_spec(requests)}}


def owner_reference(kind: str, name: str, uid: str, api_version: str = "v1") -> dict:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
            "blockOwnerDeletion": True, "controller": False}


# ---------------------------------------------------------------------------- batch Jobs


RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                        "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def job_name(workload: str, attempt: int, part: int = 0) -> str:
    """Job names: short enough for Indexed Job pod hostnames (``<job>-<index>`` ≤ 63)."""
    base = dns_label(f"gb-{workload}", 40)
    return f"{base}-{attempt}" + (f"-{part}" if part else "")


def batch_jobs(*, meta: Meta, command: list[str], env: dict[str, str], placement: list[dict],
               naming: Naming, namespace: str, image: str, grace_seconds: int = 30,
               ttl_seconds: int | None = 3600, service_account: str | None = None,
               pod_security: dict | None = None,
               container_security: dict | None = None,
               tolerations: list[dict] | None = None) -> list[dict]:
    """The objects that run one attempt of a batch job: Indexed Jobs (and, with DRA, the
    ResourceClaimTemplates their pods claim from).

    A gang's slices are grouped by node. Nodes holding the same number of slices share one
    Indexed Job (one pod per node: a required node affinity on exactly those nodes and a pod
    anti-affinity on the hostname); nodes with another count get their own Indexed Job. A
    gang's MIG instances get a pod each (:func:`pod_units`), in an Indexed Job of their node.
    ``GPUBUDGET_RANK`` = ``GPUBUDGET_RANK_OFFSET`` + ``JOB_COMPLETION_INDEX`` numbers the pods
    0..``GPUBUDGET_GANG_SIZE``-1 across all of them.
    """
    if meta.attempt is None:
        raise PlacementError("attempt: a Job needs the attempt number")
    if not command or not all(isinstance(c, str) for c in command):
        raise PlacementError("command: expected a non-empty list of strings")
    units = pod_units(by_node(placement))
    plans = [pod_plan(n, s, naming) for n, s, _ in units]
    shape: dict[tuple, list[int]] = {}
    for u, ((n, _, alone), p) in enumerate(zip(units, plans, strict=True)):
        key = (tuple(sorted(p.limits.items())), tuple(sorted(p.requests.items())),
               json.dumps(p.claim_requests, sort_keys=True), tuple(sorted(p.node_selector.items())),
               tuple(sorted(p.env.items())), n if alone else None)
        shape.setdefault(key, []).append(u)
    gang = len(plans)
    objs: list[dict] = []
    offset = 0
    for part, members in enumerate(shape.values()):
        plan = plans[members[0]]
        nodes = sorted({units[u][0] for u in members})
        name = job_name(meta.workload, meta.attempt, part)
        labels = {**meta.labels(), L_GANG: label_value(f"{meta.workload}-{meta.attempt}")}
        ann = meta.annotations(placement)
        penv = {**env, **plan.env, "GPUBUDGET_WORKLOAD": meta.workload,
                "GPUBUDGET_PROJECT": meta.project, "GPUBUDGET_USER": meta.user,
                "GPUBUDGET_ATTEMPT": str(meta.attempt), "GPUBUDGET_GANG_SIZE": str(gang),
                "GPUBUDGET_RANK_OFFSET": str(offset),
                "GPUBUDGET_PLACEMENT": json.dumps(placement, sort_keys=True)}
        container: dict[str, Any] = {
            "name": "job", "image": image, "command": list(command),
            "env": [{"name": k, "value": v} for k, v in sorted(penv.items())]
            + [{"name": "GPUBUDGET_POD_NODE",
                "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
            "securityContext": dict(container_security if container_security is not None
                                    else RESTRICTED_CONTAINER)}
        resources: dict[str, Any] = {}
        if plan.limits:
            resources["limits"] = dict(plan.limits)
        if plan.requests:
            resources["requests"] = dict(plan.requests)
        spec: dict[str, Any] = {
            "restartPolicy": "Never", "containers": [container],
            "terminationGracePeriodSeconds": int(grace_seconds),
            "automountServiceAccountToken": False, "enableServiceLinks": False}
        if pod_security:
            spec["securityContext"] = dict(pod_security)
        if service_account:
            spec["serviceAccountName"] = service_account
        if tolerations:
            spec["tolerations"] = [dict(t) for t in tolerations]
        if plan.node_selector:
            spec["nodeSelector"] = dict(plan.node_selector)
        pin(spec, nodes, naming, plan.uses_dra)
        if len(nodes) > 1:
            spec["affinity"]["podAntiAffinity"] = {
                "requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": {L_GANG: labels[L_GANG]}},
                    "topologyKey": "kubernetes.io/hostname"}]}
        if plan.uses_dra:
            tname = f"{name}-gpu"
            objs.append(resource_claim_template(tname, namespace, plan.claim_requests, meta))
            spec["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimTemplateName": tname}]
            resources["claims"] = [{"name": CLAIM_NAME}]
        if resources:
            container["resources"] = resources
        job: dict[str, Any] = {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "annotations": ann},
            "spec": {"completionMode": "Indexed", "completions": len(members),
                     "parallelism": len(members), "backoffLimit": 0,
                     "template": {"metadata": {"labels": labels, "annotations": ann},
                                  "spec": spec}}}
        if ttl_seconds is not None:
            job["spec"]["ttlSecondsAfterFinished"] = int(ttl_seconds)
        objs.append(job)
        offset += len(members)
    return objs


def pod_units(groups: dict[str, list[dict]]) -> list[tuple[str, list[dict], bool]]:
    """The pods of one attempt, as ``(node, slices, alone)``: one pod per node, except where
    a gang across nodes holds MIG instances (``Policy.gang_on_mig``). A CUDA process sees one
    MIG instance only, so there each instance gets a pod of its own and the node's other
    slices one more, the node's CPU and memory split evenly between them; ``alone`` keeps
    these pods in Indexed Jobs of their node only."""
    if len(groups) < 2:
        return [(n, s, False) for n, s in groups.items()]
    out: list[tuple[str, list[dict], bool]] = []
    for n, slices in groups.items():
        migs = [s for s in slices if s.get("kind") == "mig"]
        rest = [s for s in slices if s.get("kind") != "mig"]
        if not migs or len(migs) + bool(rest) < 2:
            out.append((n, slices, False))
            continue
        parts = ([rest] if rest else []) + [[s] for s in migs]
        cpu = sum(_int(s, "cpu_milli") for s in slices)
        mem = sum(_int(s, "memory_mib") for s in slices)
        k = len(parts)
        for i, part in enumerate(parts):
            host = {"cpu_milli": cpu // k + (i < cpu % k), "memory_mib": mem // k + (i < mem % k)}
            part = [{**s, **(host if j == 0 else {"cpu_milli": 0, "memory_mib": 0})}
                    for j, s in enumerate(part)]
            out.append((n, part, True))
    return out


# ---------------------------------------------------------------------------- Node objects


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}


def quantity(v: Any) -> float:
    """A Kubernetes quantity ('96', '95500m', '1056Gi') as a number; 0 when unreadable."""
    m = _QUANTITY.fullmatch(str(v).strip()) if v is not None else None
    if not m or m.group(2) not in _SUFFIX:
        return 0.0
    try:
        return float(m.group(1)) * _SUFFIX[m.group(2)]
    except ValueError:
        return 0.0


def _count(v: Any) -> int:
    return int(quantity(v))


def _per_gpu(model: str, profile: str) -> int:
    p = migtab.profiles_for(model).get(profile)
    if p is None:
        return 1
    return max(1, min(migtab.COMPUTE // p.compute, migtab.SLOTS // p.size))


def _model(product: str, memory_mib: int) -> str:
    name = product.replace("-", " ")
    mem = memory_mib * 2**20
    m = re.search(r"(\d+)\s?GB", name)
    if m and not memory_mib:
        mem = int(m.group(1)) * 2**30
    return model_name(name, mem)


@dataclass(frozen=True)
class NodeGpus:
    """What the GPU feature discovery labels and allocatable resources say about one node."""

    name: str
    model: str
    product: str
    strategy: str
    whole: int
    mig: int
    memory_mib: int
    mig_profiles: dict[str, int]
    shared: int


def node_gpus(node: dict) -> NodeGpus:
    md = node.get("metadata") or {}
    labels = md.get("labels") or {}
    alloc = (node.get("status") or {}).get("allocatable") or {}
    name = md.get("name", "")
    product = labels.get(L_PRODUCT, "")
    strategy = labels.get(L_STRATEGY, "none")
    memory = _count(labels.get(L_MEMORY, 0))
    profiles = {k[len(NVIDIA) + 5:]: _count(v) for k, v in alloc.items()
                if k.startswith(f"{NVIDIA}/mig-")}
    shared = _count(alloc.get(SHARED_RESOURCE, 0))
    replicas = max(1, _count(labels.get(L_REPLICAS, 1)))
    if strategy == "single" and "-MIG-" in product:
        base, profile = product.split("-MIG-", 1)
        model = _model(base, 0)
        inst = _count(labels.get(L_COUNT, alloc.get(GPU_RESOURCE, 0)))
        physical = math.ceil(inst / _per_gpu(model, profile)) if inst else 0
        return NodeGpus(name, model, product, strategy, 0, physical, memory, {profile: inst},
                        shared)
    model = _model(product, memory) if product else ""
    physical = _count(labels.get(L_COUNT, 0))
    whole_alloc = _count(alloc.get(GPU_RESOURCE, 0))
    if not physical:
        physical = whole_alloc // replicas if whole_alloc else shared // replicas
    if strategy == "mixed" and profiles:
        whole = min(physical, whole_alloc // replicas if whole_alloc else 0)
        mig = physical - whole
        if not physical:  # no count label: as many GPUs as the instances need
            need = sum(p.compute * profiles.get(n, 0)
                       for n, p in migtab.profiles_for(model).items())
            mig = math.ceil(need / migtab.COMPUTE)
    else:
        whole, mig = physical, 0
    return NodeGpus(name, model, product, strategy, whole, mig, memory, profiles, shared)


def mig_layouts(model: str, gpus: int, profiles: dict[str, int]
                ) -> list[tuple[tuple[str, int], ...]] | None:
    """A fixed layout for each of a node's ``gpus`` MIG GPUs that holds the node's instances
    (``profiles``: how many of each the device plugin offers). The node says how many, not on
    which GPU; any valid assignment serves, since the device plugin hands out any free instance
    of a profile. Larger profiles first, each at the first GPU and start slot where it fits.
    None where they do not fit (or the model has no MIG table): the GPUs stay carvable."""
    table = migtab.profiles_for(model)
    if not table or gpus <= 0 or not profiles or any(p not in table for p in profiles):
        return None
    masks, used = [0] * gpus, [0] * gpus
    out: list[list[tuple[str, int]]] = [[] for _ in range(gpus)]
    for name in sorted(profiles, key=lambda n: (-table[n].size, -table[n].compute, n)):
        p = table[name]
        for _ in range(profiles[name]):
            for i in range(gpus):
                starts = migtab.fits(model, name, masks[i], used[i])
                if starts:
                    masks[i] = migtab.occupy(p, starts[0], masks[i])
                    used[i] += p.compute
                    out[i].append((name, starts[0]))
                    break
            else:
                return None
    return [tuple(x) for x in out]


def inventory_from_nodes(nodes: list[dict]) -> Inventory:
    """The core's inventory from Node objects: GPU feature discovery labels and allocatable
    ``nvidia.com/*`` resources. MIG GPUs are those the mixed strategy leaves out of
    ``nvidia.com/gpu`` (or all of them under the single strategy), with a fixed layout that
    holds the instances the node offers (:func:`mig_layouts`: the core places only on those);
    models are mapped to the core's names (MIG tables key on them)."""
    specs: list[NodeSpec] = []
    for node in sorted(nodes, key=lambda n: (n.get("metadata") or {}).get("name", "")):
        g = node_gpus(node)
        if not g.name:
            continue
        mig_ok = g.model in migtab.MIG_TABLES
        gpus = [GpuSpec(i, g.model, g.memory_mib if g.strategy != "single" else 0, False,
                        f"GPU-{g.name}-{i}") for i in range(g.whole)]
        layouts = mig_layouts(g.model, g.mig, g.mig_profiles) if mig_ok else None
        gpus += [GpuSpec(g.whole + i, g.model, 0, mig_ok, f"GPU-{g.name}-{g.whole + i}",
                         mig_layout=layouts[i] if layouts else None)
                 for i in range(g.mig)]
        alloc = (node.get("status") or {}).get("allocatable") or {}
        labels = (node.get("metadata") or {}).get("labels") or {}
        specs.append(NodeSpec(
            g.name, tuple(gpus), labels.get("topology.kubernetes.io/zone", "default"),
            int(quantity(alloc.get("cpu", 0)) * 1000), int(quantity(alloc.get("memory", 0))
                                                           // 2**20)))
    return Inventory(tuple(specs), "kubernetes")


def node_products(nodes: list[dict]) -> dict[str, str]:
    out = {}
    for n in nodes:
        md = n.get("metadata") or {}
        p = (md.get("labels") or {}).get(L_PRODUCT)
        if p and md.get("name"):
            out[md["name"]] = p
    return out


def node_health(nodes: list[dict]) -> dict[str, str]:
    """Nodes the core must treat as unhealthy: cordoned, not Ready, or with a MIG
    reconfiguration that has not succeeded. node -> reason."""
    out: dict[str, str] = {}
    for n in nodes:
        md = n.get("metadata") or {}
        name = md.get("name")
        if not name:
            continue
        reasons = []
        if (n.get("spec") or {}).get("unschedulable"):
            why = (md.get("annotations") or {}).get(A_DRAIN_REASON)
            reasons.append(f"cordoned ({why})" if why else "cordoned")
        conds = {c.get("type"): c for c in (n.get("status") or {}).get("conditions") or []}
        ready = conds.get("Ready")
        if ready is None or ready.get("status") != "True":
            detail = (ready or {}).get("reason") or "no Ready condition"
            reasons.append(f"NotReady ({detail})")
        state = (md.get("labels") or {}).get(L_MIG_STATE)
        if state is not None and state != "success":
            reasons.append(f"MIG reconfiguration {state}")
        if reasons:
            out[name] = "; ".join(reasons)
    return out


def cordon_patch(reason: str, now: float) -> dict:
    """Merge patch that cordons a node for the core's drain, saying why."""
    return {"spec": {"unschedulable": True},
            "metadata": {"labels": {L_DRAINED: "true"},
                         "annotations": {A_DRAIN_REASON: reason, A_DRAINED_AT: rfc3339(now)}}}


def uncordon_patch() -> dict:
    return {"spec": {"unschedulable": None},
            "metadata": {"labels": {L_DRAINED: None},
                         "annotations": {A_DRAIN_REASON: None, A_DRAINED_AT: None}}}


def drained_by_us(node: dict) -> bool:
    return ((node.get("metadata") or {}).get("labels") or {}).get(L_DRAINED) == "true"


# ---------------------------------------------------------------------------- own checks


def _containers(obj: dict) -> list[tuple[str, dict]]:
    kind = obj.get("kind")
    if kind == "Pod":
        spec = obj.get("spec") or {}
    elif kind == "Job":
        spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    else:
        return []
    out = []
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            out.append((f"{key}[{c.get('name')}]", c))
    return out


def _pod_spec(obj: dict) -> dict:
    if obj.get("kind") == "Pod":
        return obj.get("spec") or {}
    if obj.get("kind") == "Job":
        return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return {}


def check_manifest(obj: dict) -> list[str]:
    """What schema validation misses and a real API server (or the device plugin) refuses:
    extended resources must be domain-prefixed and whole numbers, with requests equal to
    limits; one MIG resource type per container; label values and object names valid;
    a node field selector (``matchFields``) with exactly one value;
    nodeName not combined with resource claims; claims referenced by containers declared in
    the pod. Returns the problems (empty: fine)."""
    errs: list[str] = []
    md = obj.get("metadata") or {}
    name = md.get("name", "")
    if obj.get("kind") in ("Pod", "Job", "ResourceClaim", "ResourceClaimTemplate") and \
            (not _DNS_LABEL.fullmatch(name) or len(name) > 63):
        errs.append(f"metadata.name {name!r} is not a DNS-1123 label")
    label_sets = [("metadata.labels", md.get("labels") or {})]
    if obj.get("kind") == "Job":
        tmd = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
        label_sets.append(("spec.template.metadata.labels", tmd.get("labels") or {}))
    for where, labels in label_sets:
        for k, v in labels.items():
            if not _QUALIFIED.fullmatch(k) or len(k.split("/")[-1]) > 63:
                errs.append(f"{where}: key {k!r} is not a qualified name")
            if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.fullmatch(v):
                errs.append(f"{where}[{k}]: value {v!r} is not a valid label value")
    for where, c in _containers(obj):
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        mig_types = set()
        for r in set(limits) | set(requests):
            if r in ("cpu", "memory", "ephemeral-storage") or r.startswith("hugepages-"):
                continue
            if "/" not in r or not _QUALIFIED.fullmatch(r) or r.startswith("kubernetes.io/"):
                errs.append(f"{where}: extended resource {r!r} must be domain-prefixed "
                            "(outside kubernetes.io)")
                continue
            for kind, vals in (("limits", limits), ("requests", requests)):
                if r in vals and not re.fullmatch(r"[0-9]+", str(vals[r])):
                    errs.append(f"{where}: {kind}[{r}] = {vals[r]!r} is not a whole number")
            if r in requests and r not in limits:
                errs.append(f"{where}: extended resource {r!r} has a request but no limit")
            elif r in requests and str(requests[r]) != str(limits[r]):
                errs.append(f"{where}: extended resource {r!r}: requests "
                            f"({requests[r]}) must equal limits ({limits[r]})")
            if r.startswith(f"{NVIDIA}/mig-"):
                mig_types.add(r)
        if len(mig_types) > 1:
            errs.append(f"{where}: more than one MIG type ({', '.join(sorted(mig_types))})")
        spec = _pod_spec(obj)
        declared = {rc.get("name") for rc in spec.get("resourceClaims") or []}
        for cl in res.get("claims") or []:
            if cl.get("name") not in declared:
                errs.append(f"{where}: claim {cl.get('name')!r} is not in spec.resourceClaims")
    spec = _pod_spec(obj)
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
             .get("nodeSelectorTerms") or [])
    for i, t in enumerate(terms):
        for j, f in enumerate(t.get("matchFields") or []):
            if f.get("operator") in ("In", "NotIn") and len(f.get("values") or []) != 1:
                errs.append(f"nodeSelectorTerms[{i}].matchFields[{j}]: a node field selector "
                            f"takes exactly one value with {f.get('operator')} (one term per "
                            "node instead)")
    if spec.get("nodeName") and spec.get("resourceClaims"):
        errs.append("spec.nodeName bypasses the scheduler, which must allocate the resource "
                    "claims: pin with node affinity instead")
    if obj.get("kind") in ("ResourceClaim", "ResourceClaimTemplate"):
        s = obj.get("spec") or {}
        s = s.get("spec", s) if obj["kind"] == "ResourceClaimTemplate" else s
        for i, r in enumerate((s.get("devices") or {}).get("requests") or []):
            ex = r.get("exactly") or {}
            if not ex.get("deviceClassName"):
                errs.append(f"spec.devices.requests[{i}]: no deviceClassName")
            if ex.get("allocationMode", "ExactCount") == "ExactCount" and \
                    not (isinstance(ex.get("count", 1), int) and ex.get("count", 1) >= 1):
                errs.append(f"spec.devices.requests[{i}].count must be a positive integer")
    return errs
