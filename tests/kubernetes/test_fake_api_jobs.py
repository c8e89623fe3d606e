"""KubernetesBackend (batch Jobs, inventory, health, drain) with the real kubernetes-asyncio
client against the in-process fake API server (not a Kubernetes cluster): its fake scheduler
binds pods to the core's nodes, its fake kubelet runs each container's command as a real local
process and moves the pod Pending -> Running -> Succeeded/Failed, its fake Job controller runs
Indexed Jobs. Job state reaches the backend through watches (list + watch from a
resourceVersion, relist on 410 Gone), never by polling the Job."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace

import pytest

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


def test_job_runs_on_the_core_node_and_succeeds_seen_through_the_watch(api, backend):
    gpu_node(api, "h1", 2)
    gpu_node(api, "h2", 2)
    b = backend()
    exits = threading.Event()
    b.on_exit = exits.set
    code = ("import os, json; assert os.environ['EXTRA'] == 'x'; "
            "print(os.environ['GPUBUDGET_POD_NODE'], os.environ['JOB_COMPLETION_INDEX'])")
    ref = b.launch(launch("aaaa000000000001", whole("h2", 1), code))
    assert ref == "gb-aaaa000000000001-1"
    assert b.status("aaaa000000000001", 1).alive
    assert exits.wait(30), "no on_exit from the watches"
    st = wait(lambda: (s := b.status("aaaa000000000001", 1)) and not s.alive and s, "end")
    assert st.exit_code == 0 and st.ended_at is not None
    (pod,) = pods_of(api, "aaaa000000000001")
    assert pod["spec"]["nodeName"] == "h2"  # the fake scheduler honoured the core's node
    assert pod["status"]["phase"] == "Succeeded"
    log = (api.workdir / f"default_{pod['metadata']['name']}" / "container.log").read_text()
    assert log.split() == ["h2", "0"]
    # state came from list + watch, never from reading the Job
    assert api.count_requests("GET", r"/jobs/gb-") == 0
    assert api.count_requests("GET", r"/jobs$") >= 2  # a list and at least one watch


def test_a_job_on_lent_gpus_is_told_when_they_are_due(api, backend):
    """A backfill or a lease (``Launch.due_at``): its container has ``GPUBUDGET_DUE_AT``."""
    gpu_node(api, "h1", 2)
    b = backend()
    code = "import os; print(os.environ.get('GPUBUDGET_DUE_AT', 'none'))"
    for wid, due, want in (("abab000000000001", 1_800_000_000.0, "2027-01-15T08:00:00Z"),
                           ("abab000000000002", None, "none")):
        b.launch(replace(launch(wid, whole("h1", 0), code), due_at=due))
        wait(lambda wid=wid: (s := b.status(wid, 1)) and not s.alive, "end")
        (pod,) = pods_of(api, wid)
        log = (api.workdir / f"default_{pod['metadata']['name']}" / "container.log")
        assert log.read_text().split() == [want]


def test_failed_job_reports_the_container_exit_code(api, backend):
    gpu_node(api, "h1", 1)
    b = backend()
    b.launch(launch("bbbb000000000001", whole("h1", 0), "raise SystemExit(3)"))
    st = wait(lambda: (s := b.status("bbbb000000000001", 1)) and not s.alive and s, "end")
    assert st.exit_code == 3
    job = api.get("jobs", "gb-bbbb000000000001-1")
    assert job["status"]["conditions"][0]["type"] == "Failed"


def test_launch_is_idempotent_and_survives_a_restart_of_the_service(api, backend):
    gpu_node(api, "h1", 1)
    b = backend()
    lz = launch("cccc000000000001", whole("h1", 0), "import time; time.sleep(30)")
    b.launch(lz)
    b.launch(lz)  # a launch retried after a crash: the Job exists (409), no second one
    assert len(api.list("jobs")) == 1
    b.close()
    b2 = backend()  # a restarted service finds its running attempt again
    assert b2.status("cccc000000000001", 1).alive
    assert b2.orphans(set()) == [("cccc000000000001", 1)]
    assert b2.orphans({("cccc000000000001", 1)}) == []
    b2.stop("cccc000000000001", 1)


RANK_CODE = ("import os; r = int(os.environ['GPUBUDGET_RANK_OFFSET']) + "
             "int(os.environ['JOB_COMPLETION_INDEX']); "
             "print(r, os.environ['GPUBUDGET_GANG_SIZE'], os.environ['GPUBUDGET_POD_NODE'])")


def run_gang(api: FakeApiServer, b, wid: str, placement: list[dict],  # noqa: ANN001
             size: int) -> dict[int, tuple[str, dict]]:
    """Launch a gang whose pods print their rank, the gang's size and their node; wait for
    its end; each rank's node and GPU limits, as its pod saw and asked for them."""
    ref = b.launch(launch(wid, placement, RANK_CODE))
    assert ref.split(",") == [f"gb-{wid}-1", f"gb-{wid}-1-1"]
    st = wait(lambda: (s := b.status(wid, 1)) and not s.alive and s, "gang end")
    assert st.exit_code == 0
    got = {}
    for p in pods_of(api, wid):
        out = (api.workdir / f"default_{p['metadata']['name']}" / "container.log").read_text()
        rank, seen_size, node = out.split()
        assert node == p["spec"]["nodeName"] and seen_size == str(size)
        got[int(rank)] = (node, p["spec"]["containers"][0]["resources"]["limits"])
    return got


def test_gang_runs_as_indexed_jobs_one_pod_per_core_node(api, backend):
    for n in ("h1", "h2", "h3"):
        gpu_node(api, n, 4)
    placement = whole("h1", 0, 1) + whole("h2", 2, 3) + whole("h3", 0)
    got = run_gang(api, backend(), "dddd000000000001", placement, 3)
    # ranks 0..2; the two 2-GPU pods on h1 and h2 (one each, anti-affinity), 1 GPU on h3
    assert sorted(got) == [0, 1, 2]
    assert sorted((n, lim["nvidia.com/gpu"]) for n, lim in got.values()) == [
        ("h1", "2"), ("h2", "2"), ("h3", "1")]


def test_gang_on_full_size_mig_instances_runs_a_pod_per_instance(api, backend):
    """Policy ``gang_on_mig``: a CUDA process sees one MIG instance, so a gang's two instances
    on the MIG-mode node run as two pods there, each asking for one, ranked with the rest."""
    gpu_node(api, "h1", 4)
    gpu_node(api, "m1", 0, mig={"7g.80gb": 2}, mig_gpus=2)
    placement = whole("h1", 0, 1) + [
        {"node": "m1", "gpu": i, "kind": "mig", "milli": 1000, "profile": "7g.80gb",
         "mig_start": 0} for i in (0, 1)]
    assert run_gang(api, backend(), "dddd000000000002", placement, 3) == {
        0: ("h1", {"nvidia.com/gpu": "2"}),
        1: ("m1", {"nvidia.com/mig-7g.80gb": "1"}),
        2: ("m1", {"nvidia.com/mig-7g.80gb": "1"})}


def test_gang_is_all_or_nothing_a_failed_part_stops_the_others(api, backend):
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


def test_job_default_propagation_would_orphan_pods(api):
    """The fake API server keeps batch/v1's default (orphan): the backend's explicit
    Foreground policy above is what frees the slice."""
    gpu_node(api, "h1", 1)
    from tests.kubernetes.fakeapi import BY_KIND

    job = ko.batch_jobs(meta=ko.Meta("gggg000000000001", "p", "u", attempt=1),
                        command=[PY, "-c", "import time; time.sleep(30)"], env={},
                        placement=whole("h1", 0), naming=ko.Naming(), namespace="default",
                        image="x")[0]
    api.call(lambda: api._create(BY_KIND["Job"], "default", job))
    wait(lambda: pods_of(api, "gggg000000000001"), "pod created")
    obj = api.get("jobs", job["metadata"]["name"])
    api.call(lambda: api._delete(BY_KIND["Job"], obj, None, None))
    (pod,) = pods_of(api, "gggg000000000001")
    assert pod["metadata"].get("ownerReferences") == []  # orphaned, still holding its GPU
    api.call(lambda: api._delete(BY_KIND["Pod"], api.objects["pods"][
        ("default", pod["metadata"]["name"])], 0, None))


def test_launch_refuses_a_resource_the_node_does_not_offer(api, backend):
    gpu_node(api, "h1", 1, mig={"1g.10gb": 7}, mig_gpus=1)
    b = backend()
    bad = [{"node": "h1", "gpu": 1, "kind": "mig", "profile": "3g.40gb", "mig_start": 0,
            "milli": 429}]
    with pytest.raises(RuntimeError, match="offers 0 of nvidia.com/mig-3g.40gb"):
        b.launch(launch("hhhh000000000001", bad, "pass"))
    with pytest.raises(RuntimeError, match="node nope"):
        b.launch(launch("hhhh000000000002", whole("nope", 0), "pass"))
    assert api.list("jobs") == []
    ok = [{**bad[0], "profile": "1g.10gb", "milli": 143}]
    b.launch(launch("hhhh000000000003", ok, "print('mig ok')"))
    st = wait(lambda: (s := b.status("hhhh000000000003", 1)) and not s.alive and s, "mig job")
    assert st.exit_code == 0
    (pod,) = pods_of(api, "hhhh000000000003")
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}


def test_inventory_health_drain_and_undrain(api, backend):
    gpu_node(api, "h1", 2)
    gpu_node(api, "h2", 1, mig={"1g.10gb": 7}, mig_gpus=1)
    gpu_node(api, "h3", 2, ready=False)
    gpu_node(api, "ops", 1, unschedulable=True)  # cordoned by an operator, not by us
    b = backend()
    inv = b.discover_inventory()
    assert {n.name: len(n.gpus) for n in inv.nodes} == {"h1": 2, "h2": 2, "h3": 2, "ops": 1}
    assert [g.mig for g in inv.node("h2").gpus] == [False, True]
    assert b.node_health() == {"h3": "NotReady (KubeletNotReady)", "ops": "cordoned"}

    b.drain_node("h1", "core drain: unhealthy GPU")
    n = api.get("nodes", "h1")
    assert n["spec"]["unschedulable"] is True
    assert n["metadata"]["annotations"][ko.A_DRAIN_REASON] == "core drain: unhealthy GPU"
    wait(lambda: "h1" in b.node_health(), "the node watch sees the cordon")
    assert b.node_health()["h1"] == "cordoned (core drain: unhealthy GPU)"
    # nothing new lands on a cordoned node
    b.launch(launch("iiii000000000001", whole("h1", 0), "print(1)"))
    pod = wait(lambda: [p for p in pods_of(api, "iiii000000000001")
                        if p["status"].get("conditions")], "scheduling attempt")[0]
    cond = pod["status"]["conditions"][0]
    assert cond["reason"] == "Unschedulable" and "h1: unschedulable" in cond["message"]
    b.undrain_node("h1")
    wait(lambda: "h1" not in b.node_health(), "uncordoned")
    st = wait(lambda: (s := b.status("iiii000000000001", 1)) and not s.alive and s, "ran")
    assert st.exit_code == 0
    b.undrain_node("ops")  # someone else's cordon is left alone
    b.drain_node("ops", "core drain")
    assert "drain-reason" not in str(api.get("nodes", "ops")["metadata"].get("annotations"))
    assert api.get("nodes", "ops")["spec"]["unschedulable"] is True

    api.set_node_label("h2", "nvidia.com/mig.config.state", "pending")
    wait(lambda: b.node_health().get("h2") == "MIG reconfiguration pending", "mig state")


def test_watch_relists_after_410_gone_and_keeps_reporting(api, backend):
    gpu_node(api, "h1", 1)
    b = backend()
    b.discover_inventory()  # connects: list + watch
    relists = b.jobs.relists
    api.compact()  # history gone: the next watch from an old resourceVersion gets 410
    api.drop_watches()
    wait(lambda: b.jobs.relists > relists, "relist after 410")
    assert api.gone_sent >= 1  # the renewed watches were answered 410 Gone
    ended = threading.Event()
    b.on_exit = ended.set
    b.launch(launch("jjjj000000000001", whole("h1", 0), "print('after 410')"))
    assert ended.wait(30)
    st = wait(lambda: (s := b.status("jjjj000000000001", 1)) and not s.alive and s, "end")
    assert st.exit_code == 0


def test_in_cluster_configuration_with_tls_and_service_account_token(tmp_path, monkeypatch,
                                                                     backend):
    import shutil
    import subprocess

    from tests.hub.hubproc import require

    require(shutil.which("openssl") is not None, "openssl (to make the fake server's cert)")
    key, crt = tmp_path / "tls.key", tmp_path / "tls.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("sa-token-123")
    (sa / "ca.crt").write_text(crt.read_text())
    (sa / "namespace").write_text("jhub")
    server = FakeApiServer(tmp_path / "tls-cluster", token="sa-token-123",
                           tls=(str(crt), str(key))).start()
    try:
        gpu_node(server, "h1", 1)
        server.call(lambda: server.objects["namespaces"].__setitem__(
            ("", "jhub"), {"metadata": {"name": "jhub", "uid": "x", "resourceVersion": "1"}}))
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
        b = backend(config_source="auto", kubeconfig="/nonexistent",
                    incluster_token_file=str(sa / "token"),
                    incluster_ca_file=str(sa / "ca.crt"), namespace=None)
        assert b.namespace == "jhub"  # from the service account's namespace file
        assert [n.name for n in b.discover_inventory().nodes] == ["h1"]
        b.launch(launch("kkkk000000000001", whole("h1", 0), "print('in cluster')"))
        st = wait(lambda: (s := b.status("kkkk000000000001", 1)) and not s.alive and s, "ran")
        assert st.exit_code == 0
        assert server.list("jobs")[0]["metadata"]["namespace"] == "jhub"
    finally:
        server.stop()


def test_wrong_token_is_refused_by_the_fake_api_server(api, tmp_path, backend):
    from tests.kubernetes.fakeapi import kubeconfig

    bad = tmp_path / "bad-kubeconfig"
    bad.write_text(kubeconfig(api.url, "wrong"))
    b = backend(kubeconfig=str(bad), request_timeout=2)
    with pytest.raises(RuntimeError, match="refused these credentials: 401"):
        b.discover_inventory()  # the start-up access check is answered 401: no watch starts
    assert api.count_requests("GET", r"/api/v1/nodes") == 0
