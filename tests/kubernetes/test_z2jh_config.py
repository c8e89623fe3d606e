"""hub_config/z2jh: the Zero to JupyterHub values name only real traits, files that parse and
scopes that exist; gpubudget-service.yaml (the service as a Deployment of 2 replicas and its
Service) validates strictly and agrees with the values, the service's routes and rbac.yaml
(schema checks only: Kubernetes cannot run here); rbac.yaml validates strictly, and it is least privilege in fact: every
request the Kubernetes backend makes against the fake API server (not a Kubernetes cluster) is
allowed by it, and every rule it grants is used."""

from __future__ import annotations

import importlib
import sys
import time

import pytest
import yaml
from traitlets.config import Config, PyFileConfigLoader

from jupyter_gpubudget.backends.base import Launch
from tests.hub.hubproc import ROOT
from tests.kubernetes.conftest import gpu_node, need

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


def test_service_config_file_budgets_and_inventory(tmp_path):
    from jupyter_gpubudget.core.accounts import load_budgets
    from jupyter_gpubudget.core.inventory import load_inventory

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
    assert cfg.GpuBudgetService.inventory_file == f"{mount}/inventory.yaml"
    load_budgets(files["budgets.yaml"], "gpubudget-service.yaml")
    load_inventory(files["inventory.yaml"], "gpubudget-service.yaml")
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


def test_rbac_allows_every_request_of_the_backend_and_nothing_unused(api, backend):
    gpu_node(api, "h1", 2)
    b = backend()
    dra = backend()
    dra.placement_cfg.mode = "dra"
    py = sys.executable
    for i, be in enumerate((b, dra)):
        wid = f"rbac00000000000{i}"
        be.launch(Launch(workload=wid, attempt=1, user="u", project="p",
                         command=[py, "-c", "import time; time.sleep(30)"],
                         placement=[{"node": "h1", "gpu": 0, "kind": "gpu", "milli": 1000}]))
        deadline = time.monotonic() + 20
        while not be.status(wid, 1).alive and time.monotonic() < deadline:
            time.sleep(0.05)
        be.stop(wid, 1)
    b.discover_inventory()
    b.node_health()
    b.drain_node("h1", "test")
    b.undrain_node("h1")
    b.orphans(set())
    assert not b.status("neverlaunched000", 1).launched  # the one direct read of a Job
    calls = used(api.requests)
    # the backend's start-up access check: Kubernetes' default system:basic-user role lets
    # every authenticated user ask these reviews
    allowed = granted() | {("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
                           ("authentication.k8s.io", "selfsubjectreviews", "create")}
    assert calls <= allowed, f"requests rbac.yaml does not allow: {sorted(calls - allowed)}"
    # every rule is needed: the one not exercised here is the hub's DRA notebook claim
    # (created by KubeSpawner's after_pod_created_hook, see test_objects.py)
    assert allowed - calls == {("resource.k8s.io", "resourceclaims", "create"),
                               ("authentication.k8s.io", "selfsubjectreviews", "create")}, \
        sorted(allowed - calls)
