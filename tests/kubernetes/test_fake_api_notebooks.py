"""KubeSpawner under a fault the real control plane cannot produce at a chosen moment: every
watch connection dropped at once while a session runs (a real API server drops them only when it
restarts). Everything else about notebooks on Kubernetes is tested against the real control
plane (test_real_hub_notebooks, test_real_scheduling, test_real_dra).

Against the in-process fake API server (not a Kubernetes cluster): a real JupyterHub and
configurable-http-proxy run hub_config/jupyterhub_config.kubernetes.py, whose BudgetSpawner
wraps the real KubeSpawner (kubeconfig -> the fake API server; the real kubernetes-asyncio
client underneath); the fake kubelet runs the pod's jupyterhub-singleuser as a real process on
the pod's own loopback IP. The watches drop under alice's running session: KubeSpawner's
reflectors list and watch again, and her server stays up and reachable."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

import pytest

from tests.hub.hubproc import ROOT, DemoHub, free_port, http, launch_hub, require_hub_parts
from tests.kubernetes.conftest import gpu_node, need
from tests.kubernetes.fakeapi import FakeApiServer, kubeconfig

CONFIG = ROOT / "hub_config" / "jupyterhub_config.kubernetes.py"

BUDGETS = """\
window: 7d
admins: [admin]
policy:
  min_runtime_cap: {interactive: 8h, batch: 2d, debug: 1h}
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 60, members: [alice]}
      astro: {grant: 40, members: [carol]}
"""

INVENTORY = """\
nodes:
  - name: gpu-a
    model: H100-80GB
    gpus: 1
"""

SNAPSHOT = ["/bin/sh", "-c", 'echo "$GPUBUDGET_SESSION" > snapshot.txt']


def start_hub(d: Path, api: FakeApiServer) -> DemoHub:
    need("kubespawner")
    require_hub_parts()
    (d / "budgets.yaml").write_text(BUDGETS)
    (d / "inventory.yaml").write_text(INVENTORY)
    (d / "kubeconfig").write_text(kubeconfig(api.url, api.token))
    port, token = free_port(), secrets.token_hex(16)
    bindir = Path(sys.executable).parent
    e = dict(os.environ)
    e.update({
        "GPUBUDGET_HUB_DIR": str(d / "state"), "GPUBUDGET_HUB_PORT": str(port),
        "GPUBUDGET_SERVICE_PORT": str(free_port()), "GPUBUDGET_PROXY_API_PORT": str(free_port()),
        "GPUBUDGET_HUB_API_PORT": str(free_port()), "GPUBUDGET_TEST_TOKEN": token,
        "GPUBUDGET_CYCLE_INTERVAL": "1", "GPUBUDGET_QUEUE_POLL": "0.3",
        "GPUBUDGET_HEARTBEAT": "0.5", "GPUBUDGET_POLL_INTERVAL": "1",
        "GPUBUDGET_SLOW_SPAWN": "1", "GPUBUDGET_IDLE_LIMIT": "0",
        "GPUBUDGET_BUDGETS": str(d / "budgets.yaml"),
        "GPUBUDGET_INVENTORY": str(d / "inventory.yaml"),
        "KUBECONFIG": str(d / "kubeconfig"),
        "GPUBUDGET_K8S_CMD": json.dumps([str(bindir / "jupyterhub-singleuser")]
                                        + (["--allow-root"] if os.geteuid() == 0 else [])),
        "GPUBUDGET_K8S_SNAPSHOT_CMD": json.dumps(SNAPSHOT),
        "GPUBUDGET_K8S_STOP_GRACE": "10",
        # only the pod's preStop hook saves here: with both sessions unprotected, a requeued
        # (snapshotted) session would preempt its preemptor in turn
        "GPUBUDGET_SNAPSHOT_ON_PREEMPT": "0",
        "PATH": str(bindir) + os.pathsep + os.environ.get("PATH", ""),
    })
    e.pop("KUBERNETES_SERVICE_HOST", None)
    return launch_hub([sys.executable, "-m", "jupyterhub", "-f", str(CONFIG)], d, e, port,
                      token)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_hub_parts()  # JupyterHub, JupyterLab, configurable-http-proxy (CI: must exist)
    d = tmp_path_factory.mktemp("k8s-notebooks")
    api = FakeApiServer(d / "fake-cluster", token=secrets.token_hex(16)).start()
    gpu_node(api, "gpu-a", 1)
    hub = start_hub(d, api)
    yield api, hub
    hub.stop()
    api.stop()


def test_kubespawner_lists_and_watches_again_when_every_watch_drops(cluster):
    api, hub = cluster
    st, body = http("POST", f"{hub.api}/users/alice/server", hub.token,
                    {"project": "lattice", "slice": "gpu:1", "min_runtime": "0"})
    assert st in (201, 202), body
    hub.wait_ready("alice", timeout=120)
    before = api.count_requests("GET", r"/namespaces/default/pods$")
    api.drop_watches()  # the fault, at this moment
    deadline = time.monotonic() + 60
    while api.count_requests("GET", r"/namespaces/default/pods$") < before + 2:
        assert time.monotonic() < deadline, f"pod reflector reconnect\n{hub.logtail(12000)}"
        time.sleep(0.2)
    st, u = http("GET", f"{hub.api}/users/alice", hub.token)
    assert u["servers"][""]["ready"]  # still running, nothing disturbed
    st, ver = http("GET", f"{hub.url}/user/alice/api")
    assert st == 200 and "version" in ver, ver
    st, _ = http("DELETE", f"{hub.api}/users/alice/server", hub.token)
    assert st in (202, 204)
