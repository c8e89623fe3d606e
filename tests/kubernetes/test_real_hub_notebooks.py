"""Notebooks through the real hub on the real control plane: a real JupyterHub and
configurable-http-proxy run hub_config/jupyterhub_config.kubernetes.py, whose BudgetSpawner
wraps the real KubeSpawner, against the real kube-apiserver and kube-scheduler
(tests/fixtures/k8s.py says which parts are real; KubeSpawner uses the admin's kubeconfig).

The spawn completes, which proves the most: kwok moves the pod to Running but runs no process,
so the test plays the container runtime (tests/kubernetes/realpods.py: LoopbackRuntime) — it
runs the pod's own command with the pod's own environment (the hub's token and URLs, the
grant's variables) as a local jupyterhub-singleuser, and the hub reaches it through
``pod_connect_ip`` 127.0.0.1 on the pod's notebook port. Not real: no kubelet, so no preStop
hook runs (the test reads that the pod carries it) and a deleted pod goes at once instead of
after its grace period (the test reads the grace period the deletion asked for on the API
server's own watch).

On gpu-c, declared as the inventory's one GPU (and made the node the scheduler likes least, so
only the core's pin can put a pod there): alice's session starts -> its pod is bound to gpu-c by
the real scheduler with nvidia.com/gpu 1 and the grant's labels, and the spawn completes;
carol's session preempts it (alice's pod deleted with the configured grace period, her charge
ended as preempted); carol stops hers (pod deleted with the grace period, charge ended done)."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.backends import k8s_objects as ko
from tests.fixtures.k8s import KubeError
from tests.hub.hubproc import ROOT, DemoHub, free_port, http, launch_hub, require_hub_parts
from tests.kubernetes.conftest import need
from tests.kubernetes.realpods import LoopbackRuntime, PodEvents, env_of

CONFIG = ROOT / "hub_config" / "jupyterhub_config.kubernetes.py"
NS = "notebooks"
NODE = "gpu-c"
GRACE = 10
AVOID = {"key": "gpubudget.test/avoid", "value": "yes", "effect": "PreferNoSchedule"}

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

INVENTORY = f"""\
nodes:
  - name: {NODE}
    model: H100-80GB
    gpus: 1
"""

SNAPSHOT = ["/bin/sh", "-c", 'echo "$GPUBUDGET_SESSION" > snapshot.txt']

#: what the test adds to the documented config: the pods tolerate the GPU operator's taint
#: (Zero to JupyterHub's singleuser.extraTolerations), and the hub reaches the pod's server
#: on the loopback, where LoopbackRuntime runs it
TEST_CONFIG = f"""\
import os
c = get_config()  # noqa: F821
load_subconfig({str(CONFIG)!r})  # noqa: F821
c.KubeSpawner.tolerations = [{{"key": "nvidia.com/gpu", "operator": "Exists",
                               "effect": "NoSchedule"}}]
c.KubeSpawner.pod_connect_ip = "127.0.0.1"
c.KubeSpawner.port = int(os.environ["GPUBUDGET_TEST_POD_PORT"])
"""


def start_hub(d: Path, k8s) -> DemoHub:  # noqa: ANN001
    (d / "budgets.yaml").write_text(BUDGETS)
    (d / "inventory.yaml").write_text(INVENTORY)
    (d / "jupyterhub_config.py").write_text(TEST_CONFIG)
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
        "KUBECONFIG": str(k8s.admin_kubeconfig),
        "GPUBUDGET_K8S_NAMESPACE": NS,
        "GPUBUDGET_K8S_CMD": json.dumps([str(bindir / "jupyterhub-singleuser")]
                                        + (["--allow-root"] if os.geteuid() == 0 else [])),
        "GPUBUDGET_K8S_SNAPSHOT_CMD": json.dumps(SNAPSHOT),
        "GPUBUDGET_K8S_STOP_GRACE": str(GRACE),
        "GPUBUDGET_TEST_POD_PORT": str(free_port()),
        # with both sessions unprotected, a requeued (snapshotted) session would preempt its
        # preemptor in turn
        "GPUBUDGET_SNAPSHOT_ON_PREEMPT": "0",
        "PATH": str(bindir) + os.pathsep + os.environ.get("PATH", ""),
    })
    e.pop("KUBERNETES_SERVICE_HOST", None)
    return launch_hub([sys.executable, "-m", "jupyterhub", "-f", str(d / "jupyterhub_config.py")],
                      d, e, port, token)


@pytest.fixture(scope="module")
def cluster(k8s, tmp_path_factory):
    need("kubespawner")
    require_hub_parts()  # JupyterHub, JupyterLab, configurable-http-proxy (CI: must exist)
    d = tmp_path_factory.mktemp("k8s-hub")
    try:
        k8s.admin.create("/api/v1/namespaces", {"metadata": {"name": NS}})
    except KubeError as e:
        if e.status != 409:
            raise
    # the scheduler prefers every other node: only the core's pin puts a pod on gpu-c
    taints = k8s.admin.get(f"/api/v1/nodes/{NODE}")["spec"].get("taints") or []
    k8s.admin.merge_patch(f"/api/v1/nodes/{NODE}", {"spec": {"taints": [*taints, AVOID]}})
    runtime = LoopbackRuntime(d / "pods", {"PATH": os.environ.get("PATH", ""),
                                           "LANG": "C.UTF-8"})
    events = PodEvents(k8s, NS, "component=singleuser-server", runtime)
    events.start()
    hub = None
    try:
        hub = start_hub(d, k8s)
        yield hub, events, runtime
    finally:
        if hub is not None:
            hub.stop()
        events.stop()
        runtime.close()
        for p in k8s.admin.items(f"/api/v1/namespaces/{NS}/pods"):
            k8s.admin.delete(f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}",
                             {"gracePeriodSeconds": 0})
        k8s.admin.merge_patch(f"/api/v1/nodes/{NODE}", {"spec": {"taints": taints}})


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
    assert st == 200 and isinstance(out, dict), out
    return out["sessions"][-1]


def user_pods(k8s, user: str) -> list[dict]:  # noqa: ANN001
    return [p for p in k8s.admin.items(f"/api/v1/namespaces/{NS}/pods",
                                       "component=singleuser-server")
            if (p["metadata"].get("annotations") or {}).get(ko.A_USER) == user]


def spawn(hub: DemoHub, user: str, project: str, runtime: LoopbackRuntime) -> None:
    st, body = http("POST", f"{hub.api}/users/{user}/server", hub.token,
                    {"project": project, "slice": "gpu:1", "min_runtime": "0"})
    assert st in (201, 202), body
    try:
        hub.wait_ready(user, timeout=120)
    except AssertionError as e:
        pods = "\n".join(runtime.logtail(n) for n, _ in runtime.log)
        raise AssertionError(f"{e}\nthe pods' servers:\n{pods}") from None


def test_a_session_spawned_through_the_hub_runs_as_a_pod_on_the_core_node(k8s, cluster):
    hub, events, runtime = cluster
    spawn(hub, "alice", "lattice", runtime)
    sess = session(hub, "alice")
    assert sess["state"] == "running"
    (pod,) = user_pods(k8s, "alice")
    # bound by the real scheduler to the node the core chose (the one it likes least),
    # Running as kwok reports it
    assert pod["spec"]["nodeName"] == NODE and pod["status"]["phase"] == "Running"
    c = pod["spec"]["containers"][0]
    # the real API server's defaulting: requests follow the extended resource's limits
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert all({"key": "metadata.name", "operator": "In", "values": [NODE]}
               in t["matchFields"] for t in terms)
    md = pod["metadata"]
    assert md["labels"][ko.L_WORKLOAD] == sess["id"]
    assert md["labels"][ko.L_PROJECT] == "lattice"
    assert md["annotations"][ko.A_PROJECT] == "lattice"
    assert json.loads(md["annotations"][ko.A_CONTRACT])["kind"] == "interactive"
    assert json.loads(md["annotations"][ko.A_PLACEMENT])[0]["node"] == NODE
    assert c["lifecycle"]["preStop"]["exec"]["command"] == SNAPSHOT
    assert pod["spec"]["terminationGracePeriodSeconds"] == GRACE
    env = env_of(pod)
    assert env["GPUBUDGET_SESSION"] == sess["id"] and "CUDA_VISIBLE_DEVICES" not in env
    # the server run from the pod's own command and environment answers through the proxy
    st, ver = http("GET", f"{hub.url}/user/alice/api")
    assert st == 200 and "version" in ver, ver
    events.check()


def test_a_preempted_session_s_pod_is_deleted_with_the_grace_period(k8s, cluster):
    hub, events, runtime = cluster
    alice = session(hub, "alice")
    (alice_pod,) = user_pods(k8s, "alice")
    # no protected run asked: astro stands below lattice (which has used GPU time), so the
    # core preempts alice's unprotected session for carol's
    spawn(hub, "carol", "astro", runtime)
    s = wait(lambda: (x := session(hub, "alice"))["state"] != "running" and x,
             "alice's session ends", hub)
    assert s["id"] == alice["id"] and s["state"] == "preempted", s
    assert user_pods(k8s, "alice") == []
    # the deletion asked for the configured grace period (the time the preStop hook gets)
    assert events.grace_asked(alice_pod["metadata"]["name"]) == GRACE
    # alice's server had stopped before carol's started on the same GPU
    carol_name = user_pods(k8s, "carol")[0]["metadata"]["name"]
    steps = [(n, w.split()[0]) for n, w in runtime.log]
    assert steps.index((alice_pod["metadata"]["name"], "exited")) < steps.index(
        (carol_name, "started")), runtime.log
    st, u = http("GET", f"{hub.api}/users/alice", hub.token)
    assert "" not in u["servers"]
    (carol_pod,) = user_pods(k8s, "carol")
    assert carol_pod["spec"]["nodeName"] == NODE
    assert carol_pod["metadata"]["annotations"][ko.A_PROJECT] == "astro"
    events.check()


def test_stopping_a_session_deletes_its_pod_and_ends_its_charge(k8s, cluster):
    hub, events, runtime = cluster
    carol = session(hub, "carol")
    (pod,) = user_pods(k8s, "carol")
    st, _ = http("DELETE", f"{hub.api}/users/carol/server", hub.token)
    assert st in (202, 204)
    wait(lambda: not user_pods(k8s, "carol"), "carol's pod deleted", hub)
    s = wait(lambda: (x := session(hub, "carol"))["state"] != "running" and x,
             "carol's charge ends", hub)
    assert s["id"] == carol["id"] and s["state"] == "done", s
    assert events.grace_asked(pod["metadata"]["name"]) == GRACE
    events.check()
