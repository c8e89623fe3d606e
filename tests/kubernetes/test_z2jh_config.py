"""hub_config/z2jh: the Zero to JupyterHub values name only real traits, files that parse and
scopes that exist; gpubudget-service.yaml (the service as a Deployment of 2 replicas and its
Service) validates strictly and agrees with the values, the service's routes and rbac.yaml;
rbac.yaml validates strictly, and it is least privilege in fact: every request the Kubernetes
backend makes to the real API server is allowed by it, and every rule it grants is used.

The deployment guide's Zero to JupyterHub steps are tried against the real control plane
(tests/fixtures/k8s.py says which parts are real): the values' hub configuration rendered and
its extraConfig run (helm is not installed: render_hub_config says what stands in for the
chart), a notebook pod from it placed by the real scheduler; the Secrets, rbac.yaml and
gpubudget-service.yaml applied to the real API server; the service run as a replica would, as
its ServiceAccount, running a batch job as a Job."""

from __future__ import annotations

import copy
import importlib
import os
import sys
import time

import pytest
import yaml
from traitlets.config import Config, PyFileConfigLoader

from jupyter_gpubudget.backends.base import Launch
from tests.hub.hubproc import ROOT
from tests.kubernetes.conftest import need

Z2JH = ROOT / "hub_config" / "z2jh"
kv = need("kubernetes_validate")


def values() -> dict:
    return yaml.safe_load((Z2JH / "values.yaml").read_text())


def configurable(name: str) -> type:
    from jupyterhub.app import JupyterHub
    from kubespawner import KubeSpawner

    from jupyter_gpubudget.backends.kubernetes import KubePlacement, KubernetesBackend
    from jupyter_gpubudget.hub import BudgetSpawner
    from jupyter_gpubudget.service.app import GpuBudgetService

    return {c.__name__: c for c in (JupyterHub, KubeSpawner, KubePlacement, KubernetesBackend,
                                    BudgetSpawner, GpuBudgetService)}[name]


def check_traits(cfg: Config) -> int:
    n = 0
    for cls_name, section in cfg.items():
        cls = configurable(cls_name)
        known = set(cls.class_trait_names(config=True))
        for key in section:
            assert key in known, f"{cls_name}.{key} is not a configurable trait"
            n += 1
    return n


def import_string(s: str) -> object:
    mod, _, attr = s.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(mod), attr)


def test_hub_config_names_real_traits_and_classes():
    need("kubespawner")
    v = values()
    cfg = Config(v["hub"]["config"])
    assert check_traits(cfg) >= 10
    assert import_string(cfg.BudgetSpawner.backend_spawner_class).__name__ == "KubeSpawner"
    assert callable(import_string(cfg.BudgetSpawner.child_configurer))
    from jupyter_gpubudget.backends.kubernetes import KubePlacement

    KubePlacement(config=cfg).naming()  # the values are valid trait values
    compile(v["hub"]["extraConfig"]["gpubudget"], "extraConfig.gpubudget", "exec")


def service_docs() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all((Z2JH / "gpubudget-service.yaml").read_text()) if d]
    return {d["kind"]: d for d in docs}


def container() -> dict:
    (c,) = service_docs()["Deployment"]["spec"]["template"]["spec"]["containers"]
    return c


def test_service_config_file_and_budgets(tmp_path):
    from jupyter_gpubudget.core.accounts import load_budgets

    files = service_docs()["ConfigMap"]["data"]
    (tmp_path / "gpubudget_config.py").write_text(files["gpubudget_config.py"])
    cfg = PyFileConfigLoader("gpubudget_config.py", str(tmp_path)).load_config()
    assert check_traits(cfg) >= 8
    backend = import_string(cfg.GpuBudgetService.backend_class)
    assert backend.__name__ == "KubernetesBackend"
    assert "db_url" not in cfg.GpuBudgetService, "replicas need the PostgreSQL URL of the Secret"
    (mount,) = [m["mountPath"] for m in container()["volumeMounts"] if m["name"] == "config"]
    assert f"--config={mount}/gpubudget_config.py" in container()["command"]
    assert cfg.GpuBudgetService.budgets_file == f"{mount}/budgets.yaml"
    load_budgets(files["budgets.yaml"], "gpubudget-service.yaml")
    # the Kubernetes backend's inventory comes from the Node objects: an inventory file would
    # be ignored (the service takes the backend's), so none is given
    assert sorted(files) == ["budgets.yaml", "gpubudget_config.py"]
    assert "inventory_file" not in cfg.GpuBudgetService
    assert "node_selector" in cfg.KubernetesBackend
    # the hub's and the service's placement settings agree
    hub = values()["hub"]["config"]["KubePlacement"]
    for k in ("mode", "mig_strategy", "shared_replicas"):
        assert cfg.KubePlacement[k] == hub[k], k


@pytest.mark.parametrize("version", ["1.32", "1.34", "1.37"])
def test_service_manifest_validates_strictly(version):
    docs = service_docs()
    assert sorted(docs) == ["ConfigMap", "Deployment", "Service", "ServiceAccount"]
    for d in docs.values():
        kv.validate(d, version, strict=True)


def test_service_manifest_two_replicas_behind_the_leaders_readiness():
    """The Deployment, its Service, the probes, the secrets and values.yaml agree: 2 replicas,
    the Service reaches the ready (leading) one, the hub knows it as an external service at
    the Service's address, the probes ask endpoints the service has."""
    from jupyter_gpubudget.service.handlers.system import API_ROUTES

    docs = service_docs()
    dep, svc = docs["Deployment"], docs["Service"]
    pod = dep["spec"]["template"]
    c = container()
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["type"] == "Recreate"  # a standby is never ready
    labels = pod["metadata"]["labels"]
    for sel in (svc["spec"]["selector"], dep["spec"]["selector"]["matchLabels"]):
        assert sel.items() <= labels.items(), sel
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    (sport,) = svc["spec"]["ports"]
    assert sport["targetPort"] in ports
    assert f"--port={ports[sport['targetPort']]}" in c["command"]
    assert "--ip=0.0.0.0" in c["command"]
    env = {e["name"]: e for e in c["env"]}
    prefix = env["JUPYTERHUB_SERVICE_PREFIX"]["value"]
    assert prefix == "/services/gpubudget/"
    routes = {path for path, _h in API_ROUTES}
    for probe, route in (("readinessProbe", "/leader"), ("livenessProbe", "/healthz")):
        get = c[probe]["httpGet"]
        assert get["path"] == prefix + "api/v1" + route and route in routes, (probe, get)
        assert get["port"] in ports
    # each replica tells clients its own address
    assert (f"--GpuBudgetService.replica_url=http://$(POD_IP):{ports['http']}{prefix}"
            in c["command"])
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # one ledger (PostgreSQL, from a Secret) and one login cookie secret for both
    assert env["GPUBUDGET_DB_URL"]["valueFrom"]["secretKeyRef"]["name"] == "gpubudget"
    assert env["JUPYTERHUB_COOKIE_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "gpubudget"
    # the hub: an external service at the Service's address, its chart-generated token
    hub_svc = values()["hub"]["services"]["gpubudget"]
    url = f"http://{svc['metadata']['name']}:{sport['port']}"
    assert hub_svc["url"] == url and "command" not in hub_svc
    assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "hub", "key": "hub.services.gpubudget.apiToken"}
    assert env["JUPYTERHUB_SERVICE_NAME"]["value"] == "gpubudget"
    assert values()["hub"]["config"]["BudgetSpawner"]["service_api_url"] == \
        url + prefix + "api/v1"
    # the flags name real traits
    from jupyter_gpubudget.service.app import GpuBudgetService

    known = set(GpuBudgetService.class_trait_names(config=True))
    for arg in c["command"]:
        if arg.startswith("--GpuBudgetService."):
            assert arg.split("=", 1)[0].split(".", 1)[1] in known, arg
    # non-root, nothing to escalate, bounded
    sc, csc = pod["spec"]["securityContext"], c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= c["resources"]["requests"].keys()
    assert "memory" in c["resources"]["limits"]
    # the service's account is the one rbac.yaml grants the backend's rules to
    sa = pod["spec"]["serviceAccountName"]
    assert sa == docs["ServiceAccount"]["metadata"]["name"]
    for d in rbac_docs():
        if d["kind"].endswith("Binding"):
            assert {"kind": "ServiceAccount", "name": sa,
                    "namespace": dep["metadata"]["namespace"]} in d["subjects"], d["kind"]


def test_roles_use_existing_scopes():
    from jupyter_gpubudget.service.auth import CUSTOM_SCOPES

    for name, role in values()["hub"]["loadRoles"].items():
        for s in role["scopes"]:
            if s.startswith("custom:"):
                assert s in CUSTOM_SCOPES, (name, s)
    assert values()["hub"]["loadRoles"]["gpubudget-spawner"]["services"] == ["gpubudget-spawner"]
    assert "gpubudget-spawner" in values()["hub"]["services"]


def rbac_docs() -> list[dict]:
    return [d for d in yaml.safe_load_all((Z2JH / "rbac.yaml").read_text()) if d]


@pytest.mark.parametrize("version", ["1.32", "1.34", "1.37"])
def test_rbac_manifests_validate_strictly(version):
    docs = rbac_docs()
    assert [d["kind"] for d in docs] == ["Role", "RoleBinding", "ClusterRole",
                                         "ClusterRoleBinding"]
    for d in docs:
        kv.validate(d, version, strict=True)


def granted() -> set[tuple[str, str, str]]:
    out = set()
    for d in rbac_docs():
        for r in d.get("rules") or []:
            for g in r["apiGroups"]:
                for res in r["resources"]:
                    for verb in r["verbs"]:
                        out.add((g, res, verb))
    return out


def used(requests: list[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
    out = set()
    for method, path, query in requests:
        parts = [p for p in path.split("/") if p]
        group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            rest = rest[2:]
        named = len(rest) > 1
        verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}.get(
            method) or ("get" if named else "watch" if "watch=" in query.lower() else "list")
        out.add((group, rest[0], verb))
    return out


def test_rbac_allows_every_request_of_the_backend_and_nothing_unused(k8s, real_backend,
                                                                    monkeypatch):
    """Every request the backend makes to the real API server (recorded in its client, under
    the service account's token with exactly rbac.yaml) is allowed by rbac.yaml — the real
    RBAC would refuse it otherwise —, and every rule rbac.yaml grants is used."""
    import urllib.parse

    from kubernetes_asyncio.client.rest import RESTClientObject

    from tests.fixtures.k8s import EXIT_ENV

    requests: list[tuple[str, str, str]] = []
    real_request = RESTClientObject.request

    async def record(self, method, url, query_params=None, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        requests.append((method, urllib.parse.urlsplit(url).path,
                         urllib.parse.urlencode(query_params or [])))
        return await real_request(self, method, url, query_params, *a, **kw)
    monkeypatch.setattr(RESTClientObject, "request", record)
    b = real_backend()
    dra = real_backend()
    dra.placement_cfg.mode = "dra"
    for i, be in enumerate((b, dra)):
        wid = f"rbacuse00000000{i}"
        be.launch(Launch(workload=wid, attempt=1, user="u", project="p",
                         command=["python", "-c", "pass"], env={EXIT_ENV: "0"},
                         placement=[{"node": "gpu-b", "gpu": 0, "kind": "gpu",
                                     "milli": 1000}]))
        deadline = time.monotonic() + 30
        while not be.status(wid, 1).alive and time.monotonic() < deadline:
            time.sleep(0.05)
        be.stop(wid, 1)
    b.discover_inventory()
    b.node_health()
    b.drain_node("gpu-b", "test")
    b.undrain_node("gpu-b")
    b.orphans(set())
    assert not b.status("neverlaunched000", 1).launched  # the one direct read of a Job
    calls = used(requests)
    # the backend's start-up access check: Kubernetes' default system:basic-user role lets
    # every authenticated user ask these reviews
    allowed = granted() | {("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
                           ("authentication.k8s.io", "selfsubjectreviews", "create")}
    assert calls <= allowed, f"requests rbac.yaml does not allow: {sorted(calls - allowed)}"
    # every rule is needed: the one not exercised here is the hub's DRA notebook claim
    # (created by KubeSpawner's after_pod_created_hook, see test_real_dra.py)
    assert allowed - calls == {("resource.k8s.io", "resourceclaims", "create"),
                               ("authentication.k8s.io", "selfsubjectreviews", "create")}, \
        sorted(allowed - calls)


# ---------------------------------------------------------------------------- the walkthrough
# docs/deployment.md's Zero to JupyterHub steps, tried against the real control plane
# (tests/fixtures/k8s.py says which parts are real). helm is not installed here: the chart's
# own jupyterhub_config.py is not run; render_hub_config() below does with this project's
# values what the chart documents for them.

#: the chart generates these into its Secret "hub" (z2jh.get_secret_value reads them)
def chart_secrets() -> dict[str, str]:
    import secrets

    return {"hub.services.gpubudget.apiToken": secrets.token_hex(24),
            "hub.services.gpubudget-spawner.apiToken": secrets.token_hex(24)}


def render_hub_config(v: dict, secret_values: dict[str, str], monkeypatch) -> Config:  # noqa: ANN001
    """The hub's configuration from values.yaml as the chart builds it: ``hub.config`` loaded
    as is; ``singleuser.extraTolerations``, ``singleuser.cpu/memory.guarantee`` and
    ``scheduling.userPods.nodeAffinity.matchNodePurpose: prefer`` as the KubeSpawner traits
    the chart documents for them; then each ``hub.extraConfig`` snippet run in key order with
    ``c`` and a ``z2jh`` module whose get_secret_value reads the chart's generated secrets
    (a stand-in for the chart's module: helm is not installed here)."""
    import types

    c = Config(copy.deepcopy(v["hub"]["config"]))
    su = v["singleuser"]
    c.KubeSpawner.tolerations = list(su.get("extraTolerations") or [])
    c.KubeSpawner.cpu_guarantee = float(su["cpu"]["guarantee"])
    c.KubeSpawner.mem_guarantee = su["memory"]["guarantee"]
    if v["scheduling"]["userPods"]["nodeAffinity"]["matchNodePurpose"] == "prefer":
        c.KubeSpawner.node_affinity_preferred = [{"weight": 100, "preference": {
            "matchExpressions": [{"key": "hub.jupyter.org/node-purpose", "operator": "In",
                                  "values": ["user"]}]}}]
    z2jh = types.ModuleType("z2jh")

    def get_secret_value(key: str, default: object = None) -> object:
        return secret_values.get(key, default)

    def get_config(key: str, default: object = None) -> object:
        node: object = v
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node
    z2jh.get_secret_value = get_secret_value  # type: ignore[attr-defined]
    z2jh.get_config = get_config  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "z2jh", z2jh)
    for key in sorted(v["hub"].get("extraConfig") or {}):
        exec(compile(v["hub"]["extraConfig"][key], f"extraConfig.{key}", "exec"),  # noqa: S102
             {"c": c, "get_config": lambda: c})
    return c


async def test_the_rendered_hub_config_spawns_a_pod_the_real_scheduler_places(k8s, monkeypatch):
    """The values' hub.extraConfig runs as the hub would run it (custom scopes, the spawner's
    token from the chart's Secret); the KubeSpawner so configured, with the core's placement,
    makes a pod the real API server accepts in the release's namespace and the real scheduler
    binds to the core's node (the pod is created with the admin's credentials: the chart's own
    hub Role is not applied here)."""
    need("kubespawner")
    import kubernetes_asyncio.config.kube_config as kc
    from kubernetes_asyncio.client import ApiClient
    from kubespawner import KubeSpawner

    from jupyter_gpubudget.backends.kubernetes import configure_kubespawner
    from jupyter_gpubudget.service.auth import CUSTOM_SCOPES
    from tests.fixtures.k8s import NAMESPACE, wait_for

    secret_values = chart_secrets()
    c = render_hub_config(values(), secret_values, monkeypatch)
    assert c.JupyterHub.custom_scopes == CUSTOM_SCOPES
    assert c.BudgetSpawner.service_token == secret_values["hub.services.gpubudget-spawner.apiToken"]
    assert check_traits(c) >= 15
    c.KubeSpawner.namespace = NAMESPACE  # the release's namespace
    c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(k8s.admin_kubeconfig))
    monkeypatch.setattr(kc, "KUBE_CONFIG_DEFAULT_LOCATION", str(k8s.admin_kubeconfig))
    sp = KubeSpawner(config=c, _mock=True)
    sp.api_token = "secret-token"
    node = "gpu-b"
    placement = [{"node": node, "gpu": i, "kind": "gpu", "milli": 1000} for i in (2, 3)]
    configure_kubespawner(sp, placement, {"env": {}, "session": "z2jh-1", "project": "astro",
                                          "user": "carol", "kind": "interactive"})
    pod = ApiClient().sanitize_for_serialization(await sp.get_pod_manifest())
    pod["metadata"]["name"] = "z2jh-notebook"
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    try:
        made = k8s.admin.create(pods, pod)
        spec = made["spec"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} \
            in spec["tolerations"]
        res = spec["containers"][0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == "2" and res["requests"]["cpu"] == "1"
        assert spec["terminationGracePeriodSeconds"] == \
            values()["hub"]["config"]["KubePlacement"]["stop_grace"]
        try:
            bound = wait_for(lambda: k8s.admin.get(f"{pods}/z2jh-notebook")["spec"].get(
                "nodeName"), "the notebook pod to be bound", 180)  # (earlier tests' pods on
            # the node may still be going: their Jobs are deleted in the background)
        except AssertionError as e:  # say why the scheduler did not bind it
            status = k8s.admin.get(f"{pods}/z2jh-notebook").get("status", {})
            there = [(p["metadata"]["namespace"], p["metadata"]["name"],
                      p["status"].get("phase"))
                     for p in k8s.admin.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")[
                         "items"]]
            raise AssertionError(f"{e}: {status.get('conditions')}; on {node}: {there}; "
                                 f"node: {k8s.admin.get(f'/api/v1/nodes/{node}')['spec']}") \
                from None
        assert bound == node
    finally:
        k8s.admin.delete(f"{pods}/z2jh-notebook", {"gracePeriodSeconds": 0})


def api_path(doc: dict) -> str:
    """Where ``kubectl apply`` sends a document (the kinds of hub_config/z2jh)."""
    group = {"Deployment": "apps/v1", "Role": "rbac.authorization.k8s.io/v1",
             "RoleBinding": "rbac.authorization.k8s.io/v1",
             "ClusterRole": "rbac.authorization.k8s.io/v1",
             "ClusterRoleBinding": "rbac.authorization.k8s.io/v1"}.get(doc["kind"])
    base = f"/apis/{group}" if group else "/api/v1"
    ns = doc["metadata"].get("namespace")
    plural = doc["kind"].lower() + ("es" if doc["kind"].endswith("s") else "s")
    return (f"{base}/namespaces/{ns}/{plural}" if ns else f"{base}/{plural}") + \
        f"/{doc['metadata']['name']}"


def server_side_apply(k8s, doc: dict) -> dict:  # noqa: ANN001
    """``kubectl apply --server-side`` of one document, through the REST API."""
    return k8s.admin.request("PATCH", api_path(doc) + "?fieldManager=gpubudget-guide&force=true",
                             doc, "application/apply-patch+yaml")


def adapt_nodes(config: str) -> str:
    """The guide's ADAPT step for the GPU nodes the service uses: here gpu-c alone."""
    line = 'c.KubernetesBackend.node_selector = ""'
    assert line in config, config
    return config.replace(line, 'c.KubernetesBackend.node_selector = '
                                '"kubernetes.io/hostname in (gpu-c)"')


def test_the_guide_s_objects_applied_and_the_service_runs_jobs_as_its_account(k8s, tmp_path,
                                                                             monkeypatch):
    """docs/deployment.md's steps against the real control plane: the Secrets the guide
    creates (and the hub's, which the chart would make), rbac.yaml and gpubudget-service.yaml
    applied (server-side apply, as ``kubectl apply --server-side``; the GPU nodes ADAPTed to
    one of this cluster's) — the real API server accepts every object, and the real Deployment
    controller makes the 2 replicas' pods under the service's account (no kubelet runs them);
    then the service runs as a replica would: the config and budgets as the ConfigMap stores
    them, the Secrets' values in its environment, in-cluster with a real token
    of its ServiceAccount (TokenRequest), the CA and the namespace file. A batch job submitted
    through its REST API becomes a Job its account creates, bound to the core's node, Running;
    cancelling it deletes the Job and its pod. Not tried: helm, the hub image, PostgreSQL
    (the ledger is SQLite here, so one service), the Service's routing to the leader."""
    import base64
    import urllib.parse

    from jupyter_gpubudget.backends import k8s_objects as ko
    from tests.fixtures.hub import ServiceProc, http, start_hub
    from tests.fixtures.k8s import NAMESPACE, wait_for

    ns = NAMESPACE
    secret_values = chart_secrets()
    db_url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    secrets_ = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gpubudget", "namespace": ns},
         "stringData": {"db-url": db_url, "cookie-secret": os.urandom(32).hex()}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hub", "namespace": ns},
         "stringData": dict(secret_values)}]
    docs = rbac_docs() + [d for d in yaml.safe_load_all(
        (Z2JH / "gpubudget-service.yaml").read_text()) if d]
    for d in docs:
        if d["kind"] == "ConfigMap":
            d["data"]["gpubudget_config.py"] = adapt_nodes(d["data"]["gpubudget_config.py"])
    hub = svc = None
    try:
        for d in secrets_ + docs:
            got = server_side_apply(k8s, d)
            assert got["metadata"]["uid"], d["kind"]
        # the real Deployment controller: a ReplicaSet and 2 pods under the service's account,
        # its token mounted by the ServiceAccount admission (Pending: no kubelet runs them)
        sel = "app.kubernetes.io/name=gpubudget"
        pods = wait_for(lambda: (ps := k8s.admin.items(f"/api/v1/namespaces/{ns}/pods", sel))
                        and len(ps) == 2 and ps, "the Deployment's 2 pods", 60)
        for p in pods:
            assert p["spec"]["serviceAccountName"] == "gpubudget"
            assert any(v["name"].startswith("kube-api-access-") for v in p["spec"]["volumes"])

        # a replica, as the Deployment runs it: what the config volume shows ...
        cm = k8s.admin.get(f"/api/v1/namespaces/{ns}/configmaps/gpubudget-config")
        sdir = tmp_path / "svc"
        sdir.mkdir()
        for name, text in cm["data"].items():
            (sdir / name).write_text(text)
        # ... what its env takes from the Secrets ...
        def secret(name: str, key: str) -> str:
            s = k8s.admin.get(f"/api/v1/namespaces/{ns}/secrets/{name}")
            return base64.b64decode(s["data"][key]).decode()
        # ... and its ServiceAccount's token, CA and namespace files
        tr = k8s.admin.create(f"/api/v1/namespaces/{ns}/serviceaccounts/gpubudget/token",
                              {"apiVersion": "authentication.k8s.io/v1",
                               "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}})
        sa = tmp_path / "serviceaccount"
        sa.mkdir()
        (sa / "token").write_text(tr["status"]["token"])
        (sa / "ca.crt").write_bytes(k8s.ca_file.read_bytes())
        (sa / "namespace").write_text(ns)
        u = urllib.parse.urlsplit(k8s.url)
        hub = start_hub(tmp_path / "hub",
                        service_token=secret("hub", "hub.services.gpubudget.apiToken"))
        svc = ServiceProc(hub, sdir, secret("gpubudget", "db-url"), db_via_env=True,
                          extra_env={"KUBERNETES_SERVICE_HOST": u.hostname or "",
                                     "KUBERNETES_SERVICE_PORT": str(u.port),
                                     "JUPYTERHUB_COOKIE_SECRET":
                                         secret("gpubudget", "cookie-secret")},
                          extra_args=[f"--config={sdir / 'gpubudget_config.py'}",
                                      f"--KubernetesBackend.incluster_token_file={sa / 'token'}",
                                      f"--KubernetesBackend.incluster_ca_file={sa / 'ca.crt'}"])
        svc.start()  # the backend's access check passed as system:serviceaccount:jhub:gpubudget
        bob = hub.token("bob")
        st, job = http("POST", svc.api + "/jobs", bob, {
            "command": ["python", "-c", "pass"], "project": "lattice-qcd", "gpus": 1})
        assert st == 201, job
        wid = job["id"]

        def pods_of() -> list[dict]:
            return k8s.admin.items(f"/api/v1/namespaces/{ns}/pods",
                                   f"{ko.L_WORKLOAD}={ko.label_value(wid)}")
        (pod,) = wait_for(lambda: (ps := pods_of()) and ps[0]["status"].get("phase") == "Running"
                          and ps, "the job's pod Running", 90, every=0.5)
        assert pod["spec"]["nodeName"] == "gpu-c"  # the adapted selector's node
        c = pod["spec"]["containers"][0]
        assert c["image"] == "quay.io/jupyter/pytorch-notebook:cuda12-latest"  # the ConfigMap's
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert pod["spec"]["terminationGracePeriodSeconds"] == 60  # the ConfigMap's stop_grace
        st, _ = http("DELETE", f"{svc.api}/jobs/{wid}", bob)
        assert st in (200, 202, 204), st
        wait_for(lambda: not pods_of() and not k8s.admin.items(
            f"/apis/batch/v1/namespaces/{ns}/jobs", f"{ko.L_WORKLOAD}={ko.label_value(wid)}"),
            "the Job and its pod deleted", 90)
    finally:
        if svc is not None:
            svc.stop()
        if hub is not None:
            hub.stop()
        for d in reversed(secrets_ + docs):
            if d["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
                             "ServiceAccount"):
                continue  # the control plane's fixture applied these for the other tests
            k8s.admin.delete(api_path(d), {"propagationPolicy": "Background"})
