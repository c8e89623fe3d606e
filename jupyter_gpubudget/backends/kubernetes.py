"""Kubernetes backend: the core decides, Kubernetes runs what it decided.

- **Notebooks**: :func:`configure_kubespawner` is BudgetSpawner's ``child_configurer`` for a
  wrapped ``kubespawner.KubeSpawner``: the granted placement becomes the pod's GPU resources
  (see :mod:`.k8s_objects`), a required node affinity on the core's node (or ``nodeName``),
  labels and annotations (project, workload, contract, protected-until), and the preemption
  path: the pod's ``preStop`` hook runs the snapshot command and the pod is deleted with a
  grace period long enough for it.
- **Batch jobs**: :class:`KubernetesBackend` creates ``batch/v1`` Indexed Jobs (one per group
  of equally loaded nodes of a gang, every pod pinned to the core's nodes) with
  kubernetes-asyncio, and knows their state from **watches** (Jobs, their pods, Nodes), not
  polling. The service's loop calls it from its own thread: the backend runs its own asyncio
  event loop in a background thread and the synchronous methods wait on it.
- **Inventory and health** from Node objects; the core's drain cordons the node (with a reason
  annotation); only nodes this backend cordoned are uncordoned by it.

Works inside the cluster (service account: in-cluster configuration) and from outside
(kubeconfig); ``KubernetesBackend.config_source`` chooses, ``auto`` by default.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from traitlets import Bool, Dict, Enum, Float, Integer, List, Unicode, default
from traitlets.config import Configurable

from . import k8s_objects as ko
from .base import Backend, BackendStatus, Launch, due_env

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# ---------------------------------------------------------------------------- configuration


class KubePlacement(Configurable):
    """How granted placements become pod resources on this cluster (read by the notebook
    configurer inside the hub and by :class:`KubernetesBackend` in the service)."""

    mode = Enum(["device-plugin", "dra"], "device-plugin", config=True,
                help="'device-plugin': extended resources of the NVIDIA device plugin / GPU "
                     "operator (nvidia.com/gpu, nvidia.com/mig-<profile>, "
                     "nvidia.com/gpu.shared). 'dra': resource.k8s.io/v1 ResourceClaims "
                     "(Kubernetes >= 1.34 with the NVIDIA DRA driver) for whole GPUs and MIG; "
                     "MPS shares still use the shared extended resource.")
    mig_strategy = Enum(["mixed", "single"], "mixed", config=True,
                        help="The device plugin's MIG strategy: 'mixed' exposes "
                             "nvidia.com/mig-<profile>; 'single' exposes MIG instances as "
                             "nvidia.com/gpu on nodes labelled <product>-MIG-<profile>.")
    gpu_resource = Unicode(ko.GPU_RESOURCE, config=True,
                           help="Extended resource name of a whole GPU.")
    shared_resource = Unicode(ko.SHARED_RESOURCE, config=True,
                              help="Extended resource of a GPU share (time-slicing or MPS "
                                   "sharing with renameByDefault).")
    shared_replicas = Integer(4, config=True,
                              help="Replicas per GPU of the shared resource (the device "
                                   "plugin's sharing config). An MPS share of m milli-GPUs "
                                   "asks for ceil(m * replicas / 1000) of them; with MPS "
                                   "sharing the plugin accepts 1 per container, so set this to "
                                   "1000 / the share size offered (4 for 250).")
    pin = Enum(["affinity", "nodeName"], "affinity", config=True,
               help="How a pod is pinned to the core's node: a required node affinity on "
                    "metadata.name (the scheduler still checks resources), or spec.nodeName "
                    "(bypasses the scheduler; never used with DRA).")
    gpu_device_class = Unicode("gpu.nvidia.com", config=True,
                               help="DRA device class of a whole GPU.")
    mig_device_class = Unicode("mig.nvidia.com", config=True,
                               help="DRA device class of a MIG instance.")
    node_products = Dict({}, config=True,
                         help="Node -> its nvidia.com/gpu.product label. Under the single MIG "
                              "strategy a MIG pod also selects this product (it must end in "
                              "-MIG-<profile>). The service's backend reads it from the Node "
                              "objects itself.")
    gpu_uuids = Dict({}, config=True,
                     help="'node/index' -> GPU UUID. With DRA, claims then select exactly the "
                          "core's GPU (uuid / parentUUID attributes).")
    snapshot_command = List(Unicode(), [], config=True,
                            help="Notebook pods: the preStop exec command that snapshots the "
                                 "session before its pod stops (preemption, stop). Empty: no "
                                 "hook.")
    stop_grace = Integer(60, config=True,
                         help="Seconds a notebook pod gets to stop (preStop snapshot, then "
                              "SIGTERM) before it is killed: its terminationGracePeriodSeconds "
                              "and KubeSpawner's delete_grace_period.")

    def naming(self, products: dict[str, str] | None = None) -> ko.Naming:
        uuids = {}
        for k, v in self.gpu_uuids.items():
            node, _, idx = str(k).rpartition("/")
            if not node or not idx.isdigit():
                raise ko.PlacementError(f"KubePlacement.gpu_uuids: key {k!r} is not "
                                        "'node/index'")
            uuids[(node, int(idx))] = str(v)
        return ko.Naming(mode=self.mode, mig_strategy=self.mig_strategy,
                         gpu_resource=self.gpu_resource, shared_resource=self.shared_resource,
                         shared_replicas=self.shared_replicas, pin=self.pin,
                         gpu_device_class=self.gpu_device_class,
                         mig_device_class=self.mig_device_class,
                         node_products={**(products or {}), **self.node_products},
                         gpu_uuids=uuids)


# ---------------------------------------------------------------------------- notebooks


def _literal(v: str) -> str:
    """KubeSpawner expands {username}-style templates in labels, annotations and env: keep
    our values (JSON) literal."""
    return str(v).replace("{", "{{").replace("}", "}}")


def configure_kubespawner(child: Any, placement: list[dict], meta: dict) -> None:
    """BudgetSpawner ``child_configurer`` for a wrapped KubeSpawner
    (``c.BudgetSpawner.child_configurer =
    'jupyter_gpubudget.backends.kubernetes:configure_kubespawner'``)."""
    cfg = KubePlacement(config=child.config)
    naming = cfg.naming()
    groups = ko.by_node(placement)
    if len(groups) != 1:
        raise ko.PlacementError(f"placement: a notebook runs in one pod on one node; the grant "
                                f"spans {', '.join(groups)}")
    node, slices = next(iter(groups.items()))
    plan = ko.pod_plan(node, slices, naming)
    m = ko.Meta(workload=str(meta.get("session") or ""), project=str(meta.get("project")),
                user=str(meta.get("user")), kind=str(meta.get("kind") or "interactive"),
                min_runtime=float(meta.get("min_runtime") or 0),
                protected_until=meta.get("protected_until"))
    child.extra_labels = {**child.extra_labels, **m.labels()}
    child.extra_annotations = {**child.extra_annotations,
                               **{k: _literal(v) for k, v in m.annotations(placement).items()}}
    env = {k: v for k, v in (meta.get("env") or {}).items()
           # the device plugin / DRA driver decide the devices the container sees
           if k not in ("CUDA_VISIBLE_DEVICES",)}
    env.update(plan.env)
    child.environment = {**child.environment, **{k: _literal(v) for k, v in env.items()}}
    if plan.limits:
        child.extra_resource_limits = {**child.extra_resource_limits, **plan.limits}
    cpu = sum(int(s.get("cpu_milli") or 0) for s in slices)
    mem = sum(int(s.get("memory_mib") or 0) for s in slices)
    if cpu:
        child.cpu_guarantee = cpu / 1000
    if mem:
        child.mem_guarantee = mem * 2**20
    if plan.node_selector:
        child.node_selector = {**child.node_selector, **plan.node_selector}
    pod_extra = dict(child.extra_pod_config)
    if naming.pin == "nodeName" and not plan.uses_dra:
        pod_extra["nodeName"] = node
    else:
        ours = {"key": "metadata.name", "operator": "In", "values": [node]}
        terms = child._sorted_dict_values(child.node_affinity_required) or [{}]
        child.node_affinity_required = [
            {**t, "matchFields": [*(t.get("matchFields") or []), ours]} for t in terms]
    pod_extra["terminationGracePeriodSeconds"] = int(cfg.stop_grace)
    child.delete_grace_period = int(cfg.stop_grace)
    if cfg.snapshot_command:
        child.lifecycle_hooks = {**child.lifecycle_hooks,
                                 "preStop": {"exec": {"command": list(cfg.snapshot_command)}}}
    if plan.uses_dra:
        claim = f"{child.pod_name}-{ko.CLAIM_NAME}"
        pod_extra["resourceClaims"] = [{"name": ko.CLAIM_NAME, "resourceClaimName": claim}]
        _chain_dra_hooks(child, claim, plan.claim_requests, m)
    child.extra_pod_config = pod_extra
    child.log.info("gpubudget: pod for session %s pinned to %s with %s", m.workload, node,
                   plan.limits or plan.claim_requests or "no GPU")


def _chain_dra_hooks(child: Any, claim: str, requests: list[dict], m: ko.Meta) -> None:
    from kubernetes_asyncio.client import CoreV1ResourceClaim
    from kubespawner.clients import shared_client

    prev_modify, prev_created = child.modify_pod_hook, child.after_pod_created_hook

    async def modify(spawner: Any, pod: Any) -> Any:
        if prev_modify is not None:
            pod = prev_modify(spawner, pod)
            if asyncio.iscoroutine(pod):
                pod = await pod
        c = pod.spec.containers[0]
        c.resources.claims = [*(c.resources.claims or []), CoreV1ResourceClaim(name=ko.CLAIM_NAME)]
        return pod

    async def created(spawner: Any, pod: dict) -> None:
        if prev_created is not None:
            r = prev_created(spawner, pod)
            if asyncio.iscoroutine(r):
                await r
        owner = ko.owner_reference("Pod", pod["metadata"]["name"], pod["metadata"]["uid"])
        body = ko.resource_claim(claim, spawner.namespace, requests, m, owner)
        api = shared_client("ResourceV1Api")
        await api.create_namespaced_resource_claim(spawner.namespace, body)
        spawner.log.info("gpubudget: created ResourceClaim %s for pod %s", claim,
                         pod["metadata"]["name"])

    child.modify_pod_hook = modify
    child.after_pod_created_hook = created


# ---------------------------------------------------------------------------- batch jobs


def _ts(s: str | None) -> float | None:
    if not s:
        return None
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class _Cache:
    """Objects of one kind kept current by list + watch (resourceVersion, 410 -> relist)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.items: dict[str, dict] = {}
        #: (workload label, attempt label) -> {name: object}: an attempt's objects without a
        #: scan of all of them (the loop asks for each running workload's status every cycle)
        self.by_attempt: dict[tuple[str, str], dict[str, dict]] = {}
        self.synced = asyncio.Event()
        self.rv = ""
        self.relists = 0

    @staticmethod
    def _key(obj: dict) -> tuple[str, str]:
        labels = obj["metadata"].get("labels") or {}
        return labels.get(ko.L_WORKLOAD, ""), labels.get(ko.L_ATTEMPT, "")

    def replace(self, objs: list[dict]) -> None:
        """A new list: made aside, then swapped in (the loop's thread reads while the
        backend's lists)."""
        items: dict[str, dict] = {}
        index: dict[tuple[str, str], dict[str, dict]] = {}
        for o in objs:
            items[o["metadata"]["name"]] = o
            index.setdefault(self._key(o), {})[o["metadata"]["name"]] = o
        self.items, self.by_attempt = items, index

    def put(self, obj: dict) -> None:
        name = obj["metadata"]["name"]
        old = self.items.get(name)
        if old is not None and self._key(old) != self._key(obj):
            self.by_attempt.get(self._key(old), {}).pop(name, None)
        self.items[name] = obj
        self.by_attempt.setdefault(self._key(obj), {})[name] = obj

    def pop(self, name: str) -> None:
        old = self.items.pop(name, None)
        if old is not None:
            key = self._key(old)
            group = self.by_attempt.get(key, {})
            group.pop(name, None)
            if not group:
                self.by_attempt.pop(key, None)

    def of(self, workload_label: str, attempt: int) -> list[dict]:
        return list(self.by_attempt.get((workload_label, str(attempt)), {}).values())


class KubernetesBackend(Backend):
    """Batch jobs as Kubernetes Jobs; inventory, health and drain from Node objects."""

    name = "kubernetes"

    namespace = Unicode(config=True, help="Namespace of the Jobs (default: the service "
                                          "account's namespace in the cluster, else 'default').")
    config_source = Enum(["auto", "incluster", "kubeconfig"], "auto", config=True,
                         help="'incluster': the pod's service account; 'kubeconfig': "
                              "a kubeconfig file; 'auto': in-cluster when "
                              "KUBERNETES_SERVICE_HOST is set, else kubeconfig.")
    kubeconfig = Unicode("", config=True, help="Kubeconfig file (default: $KUBECONFIG, else "
                                               "~/.kube/config).")
    context = Unicode("", config=True, help="Kubeconfig context (default: the current one).")
    incluster_token_file = Unicode(f"{SA_DIR}/token", config=True,
                                   help="Service account token (in-cluster configuration).")
    incluster_ca_file = Unicode(f"{SA_DIR}/ca.crt", config=True,
                                help="API server CA bundle (in-cluster configuration).")
    image = Unicode("python:3.12-slim", config=True,
                    help="Container image of batch jobs (the command runs in it).")
    service_account = Unicode("", config=True,
                              help="Service account of job pods (its token is not mounted).")
    stop_grace = Integer(30, config=True,
                         help="Seconds a job pod gets between SIGTERM and SIGKILL when the "
                              "job is preempted or cancelled.")
    job_ttl = Integer(3600, config=True,
                      help="ttlSecondsAfterFinished of the Jobs (the service reads the end "
                           "long before).")
    extra_env = Dict({}, config=True, help="Extra environment variables for every job.")
    pod_security_context = Dict(
        {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}, config=True,
        help="Pod securityContext of job pods (restricted Pod Security Standard by default).")
    container_security_context = Dict(
        dict(ko.RESTRICTED_CONTAINER), config=True,
        help="Container securityContext of job pods (no privilege escalation, all "
             "capabilities dropped, non-root, RuntimeDefault seccomp).")
    tolerations = List(
        Dict(), [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        config=True, help="Tolerations of job pods (GPU nodes are often tainted "
                          "nvidia.com/gpu:NoSchedule by the GPU operator).")
    node_selector = Unicode("", config=True,
                            help="Label selector of the nodes that form the inventory "
                                 "(empty: every node).")
    cordon_nodes = Bool(True, config=True,
                        help="Carry the core's drain into the cluster by cordoning the node "
                             "(needs 'patch' on nodes). False: the core still gives a drained "
                             "node nothing new; the node is not touched.")
    request_timeout = Float(30.0, config=True, help="Seconds for one API request.")
    dcgm_metrics_url = Unicode("", config=True,
                               help="A page in Prometheus's text format with the DCGM "
                                    "exporter's per-pod GPU readings (its /metrics, or "
                                    "Prometheus's /federate): how busy the workloads' GPUs "
                                    "are (backends/k8s_busy.py). Empty: unknown.")
    start_grace = Float(30.0, config=True,
                        help="Seconds after a workload's attempt was opened during which its "
                             "Job not shown by the API server (yet) counts as starting, not "
                             "lost: a service that took over may find one launched late by "
                             "the one before. After it, an attempt with no Job and no pods "
                             "has ended.")
    launch_concurrency = Integer(32, min=1, config=True,
                                 help="Jobs created at once when one scheduling cycle starts "
                                      "many workloads (their creates are sent to the API "
                                      "server concurrently, at most this many in flight; 1: "
                                      "one after another).")
    watch_timeout = Integer(60, config=True,
                            help="Seconds a watch stays open before it is renewed from its "
                                 "resourceVersion.")

    @property  # type: ignore[override]
    def concurrent_launch(self) -> int:  # a cycle's Jobs are created concurrently
        return int(self.launch_concurrency)

    @default("namespace")
    def _default_namespace(self) -> str:
        p = Path(self.incluster_token_file).with_name("namespace")
        try:
            return p.read_text().strip() or "default"
        except OSError:
            return "default"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.placement_cfg = KubePlacement(parent=self)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._tasks: list[asyncio.Future] = []
        self.jobs = self.pods = self.nodes = None  # type: ignore[assignment]
        self._ended: set[str] = set()
        #: nodes this process cordoned: an undrain straight after the drain lifts the cordon
        #: even when the node watch has not yet shown it (the label says so after a restart)
        self._cordoned: set[str] = set()
        self._connected = False
        self.api_client: Any = None

    # ------------------------------------------------------------------ loop plumbing
    def _ensure(self) -> None:
        with self._lock:
            if self._connected:
                return
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, daemon=True, name="k8s-backend")
                self._thread.start()
                started.wait(10)
                self._loop = loop
            try:
                self._call(self._connect(), timeout=self.request_timeout * 2)
            except BaseException:
                self._call(self._disconnect(), timeout=10)
                raise
            self._connected = True

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        assert self._loop is not None
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout if timeout is not None else self.request_timeout * 3)

    def close(self) -> None:
        """Stop the watches and the backend's event loop."""
        if self._loop is None:
            return

        try:
            self._call(self._disconnect(), timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(10)
            self._loop = None
            self._connected = False

    async def _disconnect(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if getattr(self, "api_client", None) is not None:
            await self.api_client.close()
            self.api_client = None

    async def _connect(self) -> None:
        from kubernetes_asyncio import client, config
        from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

        conf = client.Configuration()
        incluster = self.config_source == "incluster" or (
            self.config_source == "auto" and os.environ.get("KUBERNETES_SERVICE_HOST"))
        if incluster:
            InClusterConfigLoader(token_filename=self.incluster_token_file,
                                  cert_filename=self.incluster_ca_file).load_and_set(conf)
            self.log.info("kubernetes backend: in-cluster configuration (%s)", conf.host)
        else:
            path = self.kubeconfig or os.environ.get("KUBECONFIG") or \
                os.path.expanduser("~/.kube/config")
            await config.load_kube_config(config_file=path, context=self.context or None,
                                          client_configuration=conf, persist_config=False)
            self.log.info("kubernetes backend: kubeconfig %s (%s)", path, conf.host)
        # the three watches hold a connection each; the launches of a cycle share the rest
        conf.connection_pool_maxsize = max(conf.connection_pool_maxsize,
                                           self.launch_concurrency + 8)
        self.api_client = client.ApiClient(conf)
        self.core = client.CoreV1Api(self.api_client)
        self.batch = client.BatchV1Api(self.api_client)
        self.resource = client.ResourceV1Api(self.api_client)
        await self._check_access()
        sel = f"{ko.MANAGED_BY[0]}={ko.MANAGED_BY[1]}"
        self.jobs, self.pods, self.nodes = _Cache("jobs"), _Cache("pods"), _Cache("nodes")
        ns = self.namespace
        self._tasks = [
            asyncio.ensure_future(self._reflect(self.jobs, self.batch.list_namespaced_job,
                                                {"namespace": ns, "label_selector": sel},
                                                self._on_job)),
            asyncio.ensure_future(self._reflect(self.pods, self.core.list_namespaced_pod,
                                                {"namespace": ns, "label_selector": sel},
                                                self._on_pod)),
            asyncio.ensure_future(self._reflect(self.nodes, self.core.list_node,
                                                {"label_selector": self.node_selector})),
        ]
        await asyncio.wait_for(asyncio.gather(self.jobs.synced.wait(), self.pods.synced.wait(),
                                              self.nodes.synced.wait()),
                               self.request_timeout)

    def needed_access(self) -> list[tuple[str, str, str, bool]]:
        """What this backend does in the cluster, as (verb, resource, API group, namespaced):
        the rules hub_config/z2jh/rbac.yaml grants the service's account."""
        need = [(v, "jobs", "batch", True) for v in ("create", "delete", "get", "list", "watch")]
        need += [(v, "pods", "", True) for v in ("list", "watch")]
        need += [(v, "nodes", "", False) for v in ("list", "watch")]
        if self.cordon_nodes:
            need.append(("patch", "nodes", "", False))
        if self.placement_cfg.mode == "dra":
            need += [(v, "resourceclaimtemplates", "resource.k8s.io", True)
                     for v in ("create", "delete")]
        return need

    async def _check_access(self) -> None:
        """Ask the API server (SelfSubjectAccessReview) whether these credentials may do all
        the backend does; refuse to start, naming each missing verb, rather than fail later
        (a watch the account may not open would leave the backend blind, retrying)."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        authz = client.AuthorizationV1Api(self.api_client)

        async def allowed(verb: str, res: str, group: str, namespaced: bool) -> bool:
            attrs = {"verb": verb, "resource": res, "group": group}
            if namespaced:
                attrs["namespace"] = self.namespace
            r = await self._again("asking what this account may do", lambda: authz
                                  .create_self_subject_access_review(
                                      {"apiVersion": "authorization.k8s.io/v1",
                                       "kind": "SelfSubjectAccessReview",
                                       "spec": {"resourceAttributes": attrs}},
                                      _request_timeout=self.request_timeout))
            return bool(r.status and r.status.allowed)

        need = self.needed_access()
        # every review ends before any failure is raised (none is left pending)
        got = await asyncio.gather(*(allowed(*n) for n in need), return_exceptions=True)
        for g in got:
            if isinstance(g, ApiException):  # 401: a wrong or expired token
                raise RuntimeError(f"kubernetes backend: the API server refused these "
                                   f"credentials: {g.status} {_api_message(g)}") from None
            if isinstance(g, BaseException):
                raise g
        missing = [f"{verb} {res}{'.' + group if group else ''}"
                   + (f" in namespace {self.namespace}" if namespaced else " (cluster-wide)")
                   for (verb, res, group, namespaced), ok in zip(need, got, strict=True)
                   if not ok]
        if not missing:
            return
        who = "these credentials"
        try:
            me = await client.AuthenticationV1Api(self.api_client).create_self_subject_review(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                _request_timeout=self.request_timeout)
            who = me.status.user_info.username or who
        except Exception:  # noqa: BLE001 - the name only makes the message clearer
            pass
        raise RuntimeError(f"kubernetes backend: {who} may not {'; '.join(missing)}. Grant "
                           "these verbs to the service's account (hub_config/z2jh/rbac.yaml "
                           "lists what the service needs)")

    async def _reflect(self, cache: _Cache, list_fn: Callable, kw: dict,
                       on_event: Callable[[str, dict], None] | None = None) -> None:
        """List, then watch from the list's resourceVersion; a 410 Gone (history compacted)
        or a broken stream means list again."""
        from kubernetes_asyncio import watch
        from kubernetes_asyncio.client.exceptions import ApiException

        delay = 0.1
        while True:
            try:
                resp = await list_fn(**kw, _preload_content=False,
                                     _request_timeout=self.request_timeout)
                data = json.loads(await resp.read())
                cache.replace(data.get("items") or [])
                cache.rv = data["metadata"]["resourceVersion"]
                cache.relists += 1
                cache.synced.set()
                for o in list(cache.items.values()):
                    if on_event:
                        on_event("ADDED", o)
                while True:
                    w = watch.Watch()
                    async with w.stream(list_fn, **kw, resource_version=cache.rv,
                                        timeout_seconds=self.watch_timeout,
                                        _request_timeout=self.watch_timeout + 10) as stream:
                        async for ev in stream:
                            obj = ev["raw_object"]
                            name = obj["metadata"]["name"]
                            if ev["type"] == "DELETED":
                                cache.pop(name)
                            elif ev["type"] in ("ADDED", "MODIFIED"):
                                cache.put(obj)
                            cache.rv = obj["metadata"].get("resourceVersion") or cache.rv
                            if on_event:
                                on_event(ev["type"], obj)
                    delay = 0.1
            except asyncio.CancelledError:
                raise
            except ApiException as e:
                if e.status != 410:
                    self.log.warning("kubernetes backend: watching %s: %s", cache.name, e)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10)
                else:
                    self.log.info("kubernetes backend: %s watch expired (410): listing again",
                                  cache.name)
            except Exception as e:  # noqa: BLE001 - connection lost: list again after a pause
                self.log.warning("kubernetes backend: watching %s failed (%s); retrying",
                                 cache.name, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)

    def _on_job(self, typ: str, job: dict) -> None:
        name = job["metadata"]["name"]
        if typ == "DELETED" or not _terminal(job) or name in self._ended:
            return
        self._ended.add(name)
        if _failed(job):  # a gang is all or nothing: a failed part ends the others
            labels = job["metadata"].get("labels") or {}
            for other in list(self.jobs.items.values()):
                ol = other["metadata"].get("labels") or {}
                if other is not job and ol.get(ko.L_GANG) == labels.get(ko.L_GANG) and \
                        not _terminal(other):
                    self._tasks.append(asyncio.ensure_future(
                        self._delete_job(other["metadata"]["name"])))
        self._kick()

    def _on_pod(self, typ: str, pod: dict) -> None:
        """A job pod ended or went away: its attempt may have ended (the Job's and the pods'
        watches are separate streams, either may tell first)."""
        phase = (pod.get("status") or {}).get("phase")
        if typ == "DELETED" or phase in ("Succeeded", "Failed"):
            self._kick()

    def _kick(self) -> None:
        if self.on_exit is not None:
            try:
                self.on_exit()
            except RuntimeError:  # the service is shutting down
                pass

    async def _delete_job(self, name: str) -> None:
        from kubernetes_asyncio.client import V1DeleteOptions
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            # Foreground: the Job goes only after its pods are gone (batch/v1's default
            # would orphan them, and the slice would stay occupied)
            await self.batch.delete_namespaced_job(
                name, self.namespace,
                body=V1DeleteOptions(propagation_policy="Foreground",
                                     grace_period_seconds=self.stop_grace),
                _request_timeout=self.request_timeout)
        except ApiException as e:
            if e.status != 404:
                raise

    # ------------------------------------------------------------------ helpers
    def busy_now(self, running: list[tuple[str, float]], now: float
                 ) -> list[tuple[str, float, float, float, str]]:
        """Busy samples of the ``(workload, started_at)`` running, from the DCGM exporter's
        page (``dcgm_metrics_url``, backends/k8s_busy.py); none without it."""
        if not self.dcgm_metrics_url or self.pods is None:
            return []
        from .k8s_busy import DcgmBusy, pods_of

        if getattr(self, "_dcgm", None) is None:
            self._dcgm = DcgmBusy(self.dcgm_metrics_url, log=self.log)
        return self._dcgm.tick(pods_of(list(self.pods.items.values()), running), now)

    def _mine(self, cache: Any, workload: str, attempt: int) -> list[dict]:
        return [o for o in cache.of(ko.label_value(workload), attempt)
                if (o["metadata"].get("annotations") or {}).get(ko.A_WORKLOAD) == workload]

    def naming(self) -> ko.Naming:
        return self.placement_cfg.naming(ko.node_products(list(self.nodes.items.values())))

    def manifests(self, launch: Launch, naming: ko.Naming | None = None) -> list[dict]:
        """``naming``: the nodes' naming, when the caller made it once for many launches."""
        meta = ko.Meta(workload=launch.workload, project=launch.project, user=launch.user,
                       kind=launch.kind, attempt=launch.attempt,
                       min_runtime=launch.min_runtime,
                       protected_until=launch.protected_until,
                       backed=launch.backed,
                       resumable=launch.resumable)
        return ko.batch_jobs(
            meta=meta, command=list(launch.command),
            env={**self.extra_env, **launch.env, **due_env(launch)},
            placement=launch.placement, naming=naming or self.naming(), namespace=self.namespace,
            image=self.image, grace_seconds=self.stop_grace, ttl_seconds=self.job_ttl,
            service_account=self.service_account or None,
            pod_security=dict(self.pod_security_context),
            container_security=dict(self.container_security_context),
            tolerations=list(self.tolerations))

    def _check_nodes(self, objs: list[dict]) -> None:
        """Refuse at once what would stay Pending forever: a node that does not exist or
        offers none of a resource the pod needs."""
        for job in (o for o in objs if o["kind"] == "Job"):
            spec = job["spec"]["template"]["spec"]
            terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                     .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
            nodes = [v for t in terms.get("nodeSelectorTerms") or []
                     for f in t.get("matchFields") or [] for v in f.get("values") or []]
            nodes += [spec["nodeName"]] if spec.get("nodeName") else []
            limits = (spec["containers"][0].get("resources") or {}).get("limits") or {}
            for n in nodes:
                node = self.nodes.items.get(n)
                if node is None:
                    raise RuntimeError(f"node {n} of the placement is not in the cluster")
                alloc = (node.get("status") or {}).get("allocatable") or {}
                for r, v in limits.items():
                    if "/" in r and ko.quantity(alloc.get(r, 0)) < int(v):
                        raise RuntimeError(f"node {n} offers {alloc.get(r, 0)} of {r}; the "
                                           f"placement needs {v}")

    # ------------------------------------------------------------------ Backend
    def launch(self, launch: Launch) -> str:
        self._ensure()
        objs = self.manifests(launch)
        self._check_nodes(objs)
        return self._call(self._create(objs))

    def launch_many(self, launches: list[Launch]) -> list[str | Exception]:
        """The Starts of one cycle: each attempt's Jobs are created as :meth:`launch` creates
        them, ``launch_concurrency`` attempts at a time; a refused attempt (a node the
        cluster lacks, the API server's refusal) fails alone."""
        if not launches:
            return []
        self._ensure()
        prepared: list[list[dict] | Exception] = []
        naming = self.naming()  # (read from every node: once for the batch)
        for la in launches:
            try:
                objs = self.manifests(la, naming)
                self._check_nodes(objs)
                prepared.append(objs)
            except Exception as e:  # noqa: BLE001 - that attempt's failure
                prepared.append(e)
        waves = -(-len(launches) // self.launch_concurrency)
        return self._call(self._create_many(prepared),
                          timeout=self.request_timeout * (waves + 2))

    async def _create_many(self, prepared: list[list[dict] | Exception]
                           ) -> list[str | Exception]:
        sem = asyncio.Semaphore(self.launch_concurrency)

        async def one(objs: list[dict] | Exception) -> str | Exception:
            if isinstance(objs, Exception):
                return objs
            async with sem:
                try:
                    return await self._create(objs)
                except Exception as e:  # noqa: BLE001 - that attempt's failure
                    return e
        return list(await asyncio.gather(*(one(p) for p in prepared)))

    async def _create(self, objs: list[dict]) -> str:
        from kubernetes_asyncio.client.exceptions import ApiException

        names = []
        for o in objs:
            if o["kind"] != "ResourceClaimTemplate":
                names.append(o["metadata"]["name"])
            what = f"creating {o['kind']} {o['metadata']['name']}"
            try:
                if o["kind"] == "ResourceClaimTemplate":
                    await self._again(what, lambda o=o: self.resource
                                      .create_namespaced_resource_claim_template(
                                          self.namespace, o,
                                          _request_timeout=self.request_timeout))
                else:
                    made = await self._again(what, lambda o=o: self.batch.create_namespaced_job(
                        self.namespace, o, _request_timeout=self.request_timeout))
                    # read-your-writes: the watch may deliver the new Job a moment later
                    if o["metadata"]["name"] not in self.jobs.items:
                        self.jobs.put(self.api_client.sanitize_for_serialization(made))
            except ApiException as e:
                if e.status != 409:  # 409: created before a restart of the service (or by
                    # this create, answered late and sent again)
                    raise RuntimeError(f"{what}: {e.status} {_api_message(e)}") from None
        self.log.info("kubernetes backend: created Job(s) %s", ", ".join(names))
        return ",".join(names)

    async def _again(self, what: str, call: Callable[[], Any]) -> Any:
        """``await call()``, sent again while the API server asks for it (429: it sheds load,
        API Priority and Fairness; or a 5xx with Retry-After), as client-go does, for at
        most ``request_timeout``; its last refusal is raised."""
        from kubernetes_asyncio.client.exceptions import ApiException

        deadline = time.monotonic() + self.request_timeout
        while True:
            try:
                return await call()
            except ApiException as e:
                wait = _retry_after(e)
                if wait is None or time.monotonic() + wait >= deadline:
                    raise
                self.log.info("kubernetes backend: %s: %s; again in %.1f s", what, e.status,
                              wait)
                await asyncio.sleep(wait)

    def status(self, workload: str, attempt: int) -> BackendStatus:
        self._ensure()
        # read from the watches' caches in the caller's thread (the loop asks it of every
        # running workload each cycle); only an attempt whose Job they lack is read from
        # the API server, on the backend's event loop
        jobs = self._mine(self.jobs, workload, attempt)
        if jobs:
            return self._judge(workload, attempt, jobs)
        return self._call(self._status(workload, attempt))

    async def _status(self, workload: str, attempt: int) -> BackendStatus:
        jobs = self._mine(self.jobs, workload, attempt) or \
            await self._read_jobs(workload, attempt)
        return self._judge(workload, attempt, jobs)

    def _judge(self, workload: str, attempt: int, jobs: list[dict]) -> BackendStatus:
        pods = [p for p in self._mine(self.pods, workload, attempt)
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        if not jobs:
            # no Job (deleted, or never created); pods still stopping hold their slices
            return BackendStatus(True) if pods else BackendStatus(False, launched=False)
        if pods or not all(_terminal(j) for j in jobs):
            return BackendStatus(True)  # running, or a failed gang's other parts stopping
        ended = max((_ended_at(j) or 0.0) for j in jobs) or None
        if any(_failed(j) for j in jobs):
            return BackendStatus(False, self._exit_code(workload, attempt), ended)
        return BackendStatus(False, 0, ended)

    async def _read_jobs(self, workload: str, attempt: int) -> list[dict]:
        """One direct read when the watch has not (yet) shown the attempt's Job."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            resp = await self.batch.read_namespaced_job(
                ko.job_name(workload, attempt), self.namespace, _preload_content=False,
                _request_timeout=self.request_timeout)
            job = json.loads(await resp.read())
        except ApiException as e:
            if e.status == 404:
                return []
            raise
        return [job] if (job["metadata"].get("annotations") or {}).get(ko.A_WORKLOAD) \
            == workload else []

    def _exit_code(self, workload: str, attempt: int) -> int:
        for p in self._mine(self.pods, workload, attempt):
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                code = ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
                if code:
                    return int(code)
        return 1  # failed without a container exit code (e.g. evicted, deadline)

    def stop(self, workload: str, attempt: int) -> BackendStatus:
        self._ensure()
        return self._call(self._stop(workload, attempt),
                          timeout=self.stop_grace + self.request_timeout * 3)

    async def _stop(self, workload: str, attempt: int) -> BackendStatus:
        from kubernetes_asyncio.client.exceptions import ApiException

        before = await self._status(workload, attempt)
        jobs = self._mine(self.jobs, workload, attempt)
        for j in jobs:
            await self._delete_job(j["metadata"]["name"])
        deadline = time.monotonic() + self.stop_grace + self.request_timeout
        while time.monotonic() < deadline and (self._mine(self.pods, workload, attempt)
                                               or self._mine(self.jobs, workload, attempt)):
            await asyncio.sleep(0.05)  # the watches report the pods' and Jobs' deletion
        for j in jobs:
            tpl = f"{j['metadata']['name']}-gpu"
            try:
                await self.resource.delete_namespaced_resource_claim_template(
                    tpl, self.namespace, _request_timeout=self.request_timeout)
            except ApiException as e:
                if e.status != 404:
                    self.log.warning("deleting ResourceClaimTemplate %s: %s", tpl, e.reason)
        left = self._mine(self.pods, workload, attempt)
        if left:
            self.log.warning("kubernetes backend: pods of %s attempt %d still present after "
                             "%d s: %s", workload, attempt, self.stop_grace,
                             ", ".join(p["metadata"]["name"] for p in left))
        if not before.alive and before.launched:
            return before
        return BackendStatus(False, None, time.time())

    def orphans(self, running: set[tuple[str, int]]) -> list[tuple[str, int]]:
        self._ensure()
        out: set[tuple[str, int]] = set()
        for j in list(self.jobs.items.values()):
            md = j["metadata"]
            wid = (md.get("annotations") or {}).get(ko.A_WORKLOAD)
            att = (md.get("labels") or {}).get(ko.L_ATTEMPT, "")
            if wid and att.isdigit() and (wid, int(att)) not in running and not _terminal(j):
                out.add((wid, int(att)))
        return sorted(out)

    # ------------------------------------------------------------------ the engine's view
    def discover_inventory(self) -> Any:
        self._ensure()
        return ko.inventory_from_nodes(list(self.nodes.items.values()))

    def node_health(self) -> dict[str, str]:
        self._ensure()
        return ko.node_health(list(self.nodes.items.values()))

    def drain_node(self, node: str, reason: str) -> None:
        if not self.cordon_nodes:
            self.log.info("kubernetes backend: drain of %s not carried out (cordon_nodes is "
                          "off): %s", node, reason)
            return
        self._ensure()
        cur = self.nodes.items.get(node)
        if cur is not None and (cur.get("spec") or {}).get("unschedulable") and \
                not ko.drained_by_us(cur):
            self.log.info("kubernetes backend: node %s is already cordoned by someone else",
                          node)
            return
        self._call(self.core.patch_node(node, ko.cordon_patch(reason, time.time()),
                                        _content_type="application/merge-patch+json",
                                        _request_timeout=self.request_timeout))
        self._cordoned.add(node)
        self.log.warning("kubernetes backend: cordoned node %s (%s)", node, reason)

    def undrain_node(self, node: str) -> None:
        if not self.cordon_nodes:
            return
        self._ensure()
        cur = self.nodes.items.get(node)
        if node not in self._cordoned and (cur is None or not ko.drained_by_us(cur)):
            return
        self._call(self.core.patch_node(node, ko.uncordon_patch(),
                                        _content_type="application/merge-patch+json",
                                        _request_timeout=self.request_timeout))
        self._cordoned.discard(node)
        self.log.info("kubernetes backend: uncordoned node %s", node)


def _api_message(e: Any) -> str:
    """The API server's own words for a refused request (its Status message names the verb,
    resource and user on a 403), else the HTTP reason."""
    try:
        return str(json.loads(e.body).get("message") or e.reason)
    except (TypeError, ValueError, AttributeError):
        return str(e.reason)


def _retry_after(e: Any) -> float | None:
    """Seconds to wait before sending a refused request again, when the API server asks for
    it: 429 (too many requests) or a 5xx with a ``Retry-After`` header; else None."""
    headers = getattr(e, "headers", None) or {}
    raw = headers.get("Retry-After") if hasattr(headers, "get") else None
    if e.status != 429 and not (raw and 500 <= (e.status or 0) < 600):
        return None
    try:
        return min(max(float(raw), 0.1), 10.0) if raw else 1.0
    except ValueError:
        return 1.0


def _terminal(job: dict) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def _failed(job: dict) -> bool:
    return any(c.get("type") == "Failed" and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def _ended_at(job: dict) -> float | None:
    st = job.get("status") or {}
    if st.get("completionTime"):
        return _ts(st["completionTime"])
    for c in st.get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return _ts(c.get("lastTransitionTime"))
    return None
