"""Notebooks on the Kubernetes backend, end to end against the in-process fake API server
(not a Kubernetes cluster): a real JupyterHub and configurable-http-proxy run
hub_config/jupyterhub_config.kubernetes.py, whose BudgetSpawner wraps the real KubeSpawner
(kubeconfig -> the fake API server; the real kubernetes-asyncio client underneath). The fake
kubelet runs each pod's jupyterhub-singleuser as a real process on the pod's own loopback IP,
so the hub's readiness check and the proxy reach a real server.

On a one-GPU node: alice's session starts -> runs (pod pinned to the core's node with
nvidia.com/gpu: 1, labels and annotations from the grant); carol's session preempts it (the
pod's preStop snapshot hook runs before SIGTERM, within the grace period); carol stops hers;
every charge ends; a reflector reconnect (watches dropped) does not disturb KubeSpawner."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.backends import k8s_objects as ko
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


def wait(pred, what: str, hub: DemoHub, timeout: float = 60):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"{what}\n{hub.logtail(12000)}"
        time.sleep(0.2)


def session(hub: DemoHub, user: str) -> dict:
    st, out = http("GET", hub.svc + f"/sessions?user={user}", hub.token)
    assert st == 200, out
    return out["sessions"][-1]


def user_pods(api: FakeApiServer, user: str) -> list[dict]:
    return [p for p in api.list("pods", "component=singleuser-server")
            if (p["metadata"].get("annotations") or {}).get(ko.A_USER) == user]


def test_notebook_start_runs_as_a_pod_pinned_to_the_granted_gpu(cluster):
    api, hub = cluster
    st, body = http("POST", f"{hub.api}/users/alice/server", hub.token,
                    {"project": "lattice", "slice": "gpu:1", "min_runtime": "0"})
    assert st in (201, 202), body
    hub.wait_ready("alice", timeout=120)
    sess = session(hub, "alice")
    assert sess["state"] == "running"
    (pod,) = user_pods(api, "alice")
    assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == "gpu-a"
    c = pod["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchFields"] == [{"key": "metadata.name", "operator": "In",
                                        "values": ["gpu-a"]}]
    md = pod["metadata"]
    assert md["labels"][ko.L_WORKLOAD] == sess["id"]
    assert md["labels"][ko.L_PROJECT] == "lattice"
    assert md["annotations"][ko.A_PROJECT] == "lattice"
    assert json.loads(md["annotations"][ko.A_CONTRACT])["kind"] == "interactive"
    assert json.loads(md["annotations"][ko.A_PLACEMENT])[0]["node"] == "gpu-a"
    assert c["lifecycle"]["preStop"]["exec"]["command"] == SNAPSHOT
    assert pod["spec"]["terminationGracePeriodSeconds"] == 10
    env = {x["name"]: x.get("value") for x in c["env"]}
    assert env["GPUBUDGET_SESSION"] == sess["id"] and "CUDA_VISIBLE_DEVICES" not in env
    # the real single-user server answers through the proxy at the pod's IP
    st, ver = http("GET", f"{hub.url}/user/alice/api")
    assert st == 200 and "version" in ver, ver
    assert pod["status"]["podIP"].startswith("127.")
    assert ko.check_manifest(pod) == []


def test_reflector_reconnects_when_the_watches_drop(cluster):
    api, hub = cluster
    before = api.count_requests("GET", r"/namespaces/default/pods$")
    api.drop_watches()  # KubeSpawner's reflectors list and watch again
    wait(lambda: api.count_requests("GET", r"/namespaces/default/pods$") >= before + 2,
         "pod reflector reconnect", hub)
    st, u = http("GET", f"{hub.api}/users/alice", hub.token)
    assert u["servers"][""]["ready"]  # still running, nothing disturbed


def test_preemption_snapshots_before_the_pod_stops(cluster):
    api, hub = cluster
    alice = session(hub, "alice")
    (alice_pod,) = user_pods(api, "alice")
    st, body = http("POST", f"{hub.api}/users/carol/server", hub.token,
                    # no protected run asked: astro stands below lattice (which has used
                    # GPU time), so the core preempts alice's unprotected session
                    {"project": "astro", "slice": "gpu:1", "min_runtime": "0"})
    assert st in (201, 202), body
    hub.wait_ready("carol", timeout=120)
    # alice's session was preempted for carol's: its charge ended by preemption
    s = wait(lambda: (x := session(hub, "alice"))["state"] != "running" and x,
             "alice's session ends", hub)
    assert s["id"] == alice["id"] and s["state"] == "preempted", s
    name = alice_pod["metadata"]["name"]
    steps = [w for _, p, w in api.kubelet_log if p == name]
    # the kubelet ran the snapshot hook first, then SIGTERM, and the server exited
    assert steps[:3] == ["started", "preStop", "preStop exit 0"], steps
    assert steps[3] == "SIGTERM" and steps[-1].startswith("exited"), steps
    snap = api.workdir / f"default_{name}" / "snapshot.txt"
    assert snap.read_text().strip() == alice["id"]  # the hook ran inside the session's pod
    assert user_pods(api, "alice") == []
    st, u = http("GET", f"{hub.api}/users/alice", hub.token)
    assert "" not in u["servers"]
    (carol_pod,) = user_pods(api, "carol")
    assert carol_pod["spec"]["nodeName"] == "gpu-a"
    assert carol_pod["metadata"]["annotations"][ko.A_PROJECT] == "astro"


def test_notebook_stop_deletes_the_pod_and_ends_the_charge(cluster):
    api, hub = cluster
    carol = session(hub, "carol")
    (pod,) = user_pods(api, "carol")
    st, _ = http("DELETE", f"{hub.api}/users/carol/server", hub.token)
    assert st in (202, 204)
    wait(lambda: not user_pods(api, "carol"), "carol's pod deleted", hub)
    s = wait(lambda: (x := session(hub, "carol"))["state"] != "running" and x,
             "carol's charge ends", hub)
    assert s["id"] == carol["id"] and s["state"] == "done", s
    steps = [w for _, p, w in api.kubelet_log if p == pod["metadata"]["name"]]
    assert "preStop" in steps and "SIGTERM" in steps
    # KubeSpawner deleted it with the configured grace period, not at once
    assert any(m == "DELETE" and p.endswith(pod["metadata"]["name"]) for m, p, _ in api.requests)
