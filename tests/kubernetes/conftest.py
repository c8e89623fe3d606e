"""Fixtures for the Kubernetes backend tests: an in-process fake API server (never a
Kubernetes cluster) with GPU nodes labelled as GPU feature discovery labels them."""

from __future__ import annotations

import logging
import secrets

import pytest

from tests.kubernetes.fakeapi import FakeApiServer, kubeconfig

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}


def gpu_node(api: FakeApiServer, name: str, gpus: int, mig: dict[str, int] | None = None,
             mig_gpus: int = 0, **kw) -> dict:  # noqa: ANN003
    labels = {**H100, "nvidia.com/gpu.count": str(gpus + mig_gpus)}
    alloc = {"nvidia.com/gpu": str(gpus)}
    if mig:
        labels["nvidia.com/mig.strategy"] = "mixed"
        labels["nvidia.com/mig.config.state"] = "success"
        for p, n in mig.items():
            labels[f"nvidia.com/mig-{p}.count"] = str(n)
            alloc[f"nvidia.com/mig-{p}"] = str(n)
    return api.add_node(name, labels, alloc, **kw)


@pytest.fixture
def api(tmp_path):
    server = FakeApiServer(tmp_path / "fake-cluster", token=secrets.token_hex(16)).start()
    yield server
    server.stop()


@pytest.fixture
def kubecfg(api, tmp_path):
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
