"""Fixtures for the Kubernetes backend tests: one real control plane per test session (``k8s``,
tests/fixtures/k8s.py; the test_real_*.py tests), and an in-process fake API server with GPU
nodes labelled as GPU feature discovery labels them, kept only for the faults the real one
cannot produce at a chosen moment (the test_fake_api_*.py tests)."""

from __future__ import annotations

import importlib
import logging
import os
import secrets

import pytest

from tests.hub.hubproc import require

try:  # the kubernetes extra: kubernetes-asyncio (and its aiohttp, which the fake server uses)
    import aiohttp  # noqa: F401
    import kubernetes_asyncio  # noqa: F401
except ImportError:
    if os.environ.get("CI") == "true":
        raise  # CI installs '.[kubernetes,test]': a missing part is a failure there
    collect_ignore_glob = ["test_*.py"]  # outside CI: skip the suite without the extra

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}


def gpu_node(api, name: str, gpus: int, mig: dict[str, int] | None = None,
             mig_gpus: int = 0) -> dict:  # noqa: ANN001
    labels = {**H100, "nvidia.com/gpu.count": str(gpus + mig_gpus)}
    alloc = {"nvidia.com/gpu": str(gpus)}
    if mig:
        labels["nvidia.com/mig.strategy"] = "mixed"
        labels["nvidia.com/mig.config.state"] = "success"
        for p, n in mig.items():
            labels[f"nvidia.com/mig-{p}.count"] = str(n)
            alloc[f"nvidia.com/mig-{p}"] = str(n)
    return api.add_node(name, labels, alloc)


def need(module: str) -> object:
    """Import an optional dependency of the Kubernetes tests: skipped without it, except with
    CI=true where a missing part fails (pip install '.[kubernetes,test]')."""
    try:
        return importlib.import_module(module)
    except ImportError:
        require(False, f"{module} (pip install '.[kubernetes,test]')")


@pytest.fixture
def api(tmp_path):
    from tests.kubernetes.fakeapi import FakeApiServer

    server = FakeApiServer(tmp_path / "fake-cluster", token=secrets.token_hex(16)).start()
    yield server
    server.stop()


@pytest.fixture
def kubecfg(api, tmp_path):
    from tests.kubernetes.fakeapi import kubeconfig

    p = tmp_path / "kubeconfig"
    p.write_text(kubeconfig(api.url, api.token))
    return p


@pytest.fixture
def backend(api, kubecfg):
    from jupyter_gpubudget.backends.kubernetes import KubernetesBackend

    made = []

    def make(**kw):  # noqa: ANN003, ANN202
        kw.setdefault("kubeconfig", str(kubecfg))
        kw.setdefault("config_source", "kubeconfig")
        if kw.get("namespace", "") is None:
            kw.pop("namespace")  # the trait's own default
        else:
            kw.setdefault("namespace", "default")
        kw.setdefault("watch_timeout", 3)
        kw.setdefault("stop_grace", 2)
        kw.setdefault("request_timeout", 10)
        b = KubernetesBackend(log=logging.getLogger("test.k8s"), **kw)
        made.append(b)
        return b
    yield make
    for b in made:
        b.close()


# ---------------------------------------------------------------------------- a real cluster


@pytest.fixture(scope="session")
def k8s(tmp_path_factory):
    """ONE real control plane for the whole test session (tests/fixtures/k8s.py: etcd,
    kube-apiserver, kube-scheduler, kube-controller-manager; kwok for the kubelets), with
    hub_config/z2jh/rbac.yaml applied: the service's static token is its service account
    ``jhub/gpubudget``. Not skipped under CI=true: missing binaries fail, naming them."""
    from tests.fixtures.k8s import find_bin_dir, start_control_plane

    bins, why = find_bin_dir()
    require(bins is not None, why)
    cp = start_control_plane(bins, tmp_path_factory.mktemp("k8s"))
    try:
        apply_rbac(cp)
        yield cp
    finally:
        cp.stop()


def rbac_docs() -> list[dict]:
    import yaml

    from tests.fixtures.k8s import ROOT

    return [d for d in yaml.safe_load_all((ROOT / "hub_config" / "z2jh" / "rbac.yaml")
                                          .read_text()) if d]


def rbac_path(doc: dict) -> str:
    kind = doc["kind"].lower() + "s"
    ns = doc["metadata"].get("namespace")
    base = "/apis/rbac.authorization.k8s.io/v1"
    return f"{base}/namespaces/{ns}/{kind}" if ns else f"{base}/{kind}"


def apply_rbac(cp, docs: list[dict] | None = None) -> None:  # noqa: ANN001
    """Create (or replace) the documented RBAC objects, as ``kubectl apply`` would."""
    from tests.fixtures.k8s import KubeError

    for doc in docs if docs is not None else rbac_docs():
        path = rbac_path(doc)
        try:
            cp.admin.create(path, doc)
        except KubeError as e:
            if e.status != 409:
                raise
            cur = cp.admin.get(f"{path}/{doc['metadata']['name']}")
            cp.admin.request("PUT", f"{path}/{doc['metadata']['name']}",
                             {**doc, "metadata": {**doc["metadata"],
                                                  "resourceVersion":
                                                  cur["metadata"]["resourceVersion"]}})


@pytest.fixture
def real_backend(k8s):
    """KubernetesBackend as the service runs it: the service account's token (kubeconfig),
    namespace jhub."""
    from jupyter_gpubudget.backends.kubernetes import KubernetesBackend
    from tests.fixtures.k8s import NAMESPACE

    made = []

    def make(**kw):  # noqa: ANN003, ANN202
        kw.setdefault("kubeconfig", str(k8s.service_kubeconfig))
        kw.setdefault("config_source", "kubeconfig")
        kw.setdefault("namespace", NAMESPACE)
        kw.setdefault("watch_timeout", 5)
        kw.setdefault("stop_grace", 2)
        kw.setdefault("request_timeout", 10)
        b = KubernetesBackend(log=logging.getLogger("test.k8s.real"), **kw)
        made.append(b)
        return b
    yield make
    for b in made:
        b.close()
