"""Fixtures for the Kubernetes backend tests: an in-process fake API server (never a
Kubernetes cluster) with GPU nodes labelled as GPU feature discovery labels them."""

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
             mig_gpus: int = 0, **kw) -> dict:  # noqa: ANN001, ANN003
    labels = {**H100, "nvidia.com/gpu.count": str(gpus + mig_gpus)}
    alloc = {"nvidia.com/gpu": str(gpus)}
    if mig:
        labels["nvidia.com/mig.strategy"] = "mixed"
        labels["nvidia.com/mig.config.state"] = "success"
        for p, n in mig.items():
            labels[f"nvidia.com/mig-{p}.count"] = str(n)
            alloc[f"nvidia.com/mig-{p}"] = str(n)
    return api.add_node(name, labels, alloc, **kw)


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
