"""KubernetesBackend under faults the real control plane cannot produce at a chosen moment
(kwok plays the kubelets there: it fails every pod of a Job alike and removes a deleted pod at
once). Everything else the backend does is tested against the real control plane
(test_real_jobs, test_real_scheduling, test_real_loop, test_real_nodes, test_real_watch,
test_real_rbac, test_real_dra).

Against the in-process fake API server (not a Kubernetes cluster), with the real
kubernetes-asyncio client: its fake scheduler binds pods to the core's nodes, its fake kubelet
runs each container's command as a real local process (SIGTERM, the grace period, then SIGKILL
on deletion), its fake Job controller runs Indexed Jobs."""

from __future__ import annotations

import sys
import time

from jupyter_gpubudget.backends import k8s_objects as ko
from jupyter_gpubudget.backends.base import Launch
from tests.kubernetes.conftest import gpu_node
from tests.kubernetes.fakeapi import FakeApiServer

PY = sys.executable


def whole(node: str, *idx: int) -> list[dict]:
    return [{"node": node, "gpu": i, "kind": "gpu", "milli": 1000} for i in idx]


def launch(wid: str, placement: list[dict], code: str, attempt: int = 1) -> Launch:
    return Launch(workload=wid, attempt=attempt, user="alice", project="lattice",
                  command=[PY, "-c", code], placement=placement, env={"EXTRA": "x"},
                  kind="batch", min_runtime=600.0, protected_until=time.time() + 600,
                  backed=True, resumable=False)


def wait(pred, what: str, timeout: float = 30):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.05)


def pods_of(api: FakeApiServer, wid: str) -> list[dict]:
    return api.list("pods", f"{ko.L_WORKLOAD}={wid}")


def test_gang_is_all_or_nothing_a_failed_part_stops_the_others(api, backend):
    """Needs one part of a gang to fail while the others run (kwok ends every pod of a Job
    alike): the backend reports the gang failed with that part's exit code and stops the
    rest."""
    gpu_node(api, "h1", 2)
    gpu_node(api, "h2", 1)
    b = backend()
    placement = whole("h1", 0, 1) + whole("h2", 0)
    code = ("import os, time\n"
            "if os.environ['GPUBUDGET_POD_NODE'] == 'h2': raise SystemExit(7)\n"
            "time.sleep(60)")
    b.launch(launch("eeee000000000001", placement, code))
    st = wait(lambda: (s := b.status("eeee000000000001", 1)) and not s.alive and s,
              "gang failure", timeout=40)
    assert st.exit_code == 7
    # the healthy part was stopped too: no pod of the gang is left running
    assert not [p for p in pods_of(api, "eeee000000000001")
                if p["status"]["phase"] not in ("Succeeded", "Failed")]
    assert any(what == "SIGTERM" for _, _, what in api.kubelet_log)


def test_preemption_deletes_the_job_gracefully_and_waits_for_its_pods(api, backend):
    """Needs a pod that outlives its Job's deletion through its grace period (kwok removes a
    deleted pod at once): stop returns only once the pod is gone, after SIGTERM, the grace
    period and SIGKILL, so the slice is free when the next workload starts on it."""
    gpu_node(api, "h1", 1)
    b = backend(stop_grace=1)
    # ignores SIGTERM: the kubelet must kill it after the grace period
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open('ready', 'w').close(); time.sleep(60)")
    b.launch(launch("ffff000000000001", whole("h1", 0), code))
    (pod,) = wait(lambda: pods_of(api, "ffff000000000001"), "pod")
    wait(lambda: (api.workdir / f"default_{pod['metadata']['name']}" / "ready").exists(),
         "running, SIGTERM ignored")
    t0 = time.monotonic()
    st = b.stop("ffff000000000001", 1)
    took = time.monotonic() - t0
    assert not st.alive and st.exit_code is None  # stopped, not ended by itself
    assert pods_of(api, "ffff000000000001") == []  # the slice is free when stop returns
    assert api.list("jobs") == []  # Foreground deletion: the Job went after its pods
    events = [w for _, pod, w in api.kubelet_log if pod.startswith("gb-ffff")]
    assert events == ["started", "SIGTERM", "SIGKILL", "exited 137"], events
    assert took >= 1.0  # the grace period was given
    assert not b.status("ffff000000000001", 1).launched
    # the Job's DELETE asked for Foreground propagation (batch/v1 would orphan the pods)
    assert any(m == "DELETE" and "/jobs/gb-ffff" in p for m, p, _ in api.requests)
