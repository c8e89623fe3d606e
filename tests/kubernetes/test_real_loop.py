"""The service's own scheduling loop (ledger on SQLite, the pure core deciding) applying its
decisions through KubernetesBackend against the real control plane (tests/fixtures/k8s.py says
which parts are real; kwok plays the kubelets: a pod ends only when its job says
``GPUBUDGET_TEST_EXIT``), on an inventory discovered from two real Node objects: an unbacked
job runs on the idle GPUs; a backed gang preempts it (its Job deleted, its pods deleted with
the configured grace period — read on the real API server's watch, since kwok removes a deleted
pod at once — and gone before the gang's first pod is made), the decision in the ledger
(preempting, then preempt: for the gang, requeued) with the charge closed by it; the gang runs
as an Indexed Job on the core's nodes — bound there by the real scheduler, its pods made by the
real job controller — and ends done; the preempted job is requeued and starts again."""

from __future__ import annotations

import time

from jupyter_gpubudget.backends import k8s_objects as ko
from jupyter_gpubudget.ledger import Ledger
from tests.fixtures.k8s import EXIT_ENV, NAMESPACE, wait_for
from tests.kubernetes.realpods import PodEvents
from tests.kubernetes.serviceloop import make_loop, run_until

GRACE = 7  # neither the backend's default nor the tests'


def submit(ledger: Ledger, project: str, user: str, gpus: int, env: dict) -> str:
    return ledger.submit(project=project, user=user, kind="batch", now=time.time(),
                         request={"kind": "gpu", "gpus": gpus}, command=["python", "-c", "pass"],
                         env=env, backend="kubernetes", min_runtime=0.0, resumable=True).id


def test_the_loop_runs_a_gang_and_preempts_unbacked_work_on_a_real_cluster(k8s, real_backend,
                                                                         tmp_path):
    # the inventory: the two nodes the selector names (16 GPUs)
    b = real_backend(node_selector="kubernetes.io/hostname in (gpu-a,gpu-b)", stop_grace=GRACE)
    ledger, loop = make_loop(tmp_path, b)
    events = PodEvents(k8s, NAMESPACE)
    events.start()
    assert loop.inventory.gpu_count == 16 and loop.inventory.source == "kubernetes"

    def running(wid: str) -> list[dict]:
        return [p for p in k8s.admin.items(f"/api/v1/namespaces/{NAMESPACE}/pods",
                                           f"{ko.L_WORKLOAD}={wid}")
                if p["status"].get("phase") == "Running"]

    # bob's project has no grant: his job runs unbacked on the idle cluster, all 16 GPUs
    slow = submit(ledger, "scratch", "bob", 16, {})
    run_until(loop, lambda: ledger.get(slow).state == "running", "unbacked job starts", 90)
    assert not ledger.get(slow).backed
    run_until(loop, lambda: len(running(slow)) == 2, "its 2 pods run", 90)

    # alice's backed gang of 16 needs the whole inventory: the core preempts bob's job
    gang = submit(ledger, "lattice", "alice", 16, {EXIT_ENV: "0"})
    run_until(loop, lambda: ledger.get(gang).state in ("running", "done"), "gang starts", 90)
    row = ledger.get(slow)
    assert row.state == "pending" and row.preemptions == 1  # requeued (resumable)
    assert k8s.admin.items(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
                           f"{ko.L_WORKLOAD}={slow},{ko.L_ATTEMPT}=1") == []
    # its pods were deleted with the configured grace period, and are gone
    first = {e.name for e in events.events
             if e.pod["metadata"]["labels"].get(ko.L_WORKLOAD) == slow
             and e.pod["metadata"]["labels"].get(ko.L_ATTEMPT) == "1"}
    assert len(first) == 2
    assert {n: events.grace_asked(n) for n in first} == dict.fromkeys(first, GRACE)
    assert k8s.admin.items(f"/api/v1/namespaces/{NAMESPACE}/pods",
                           f"{ko.L_WORKLOAD}={slow},{ko.L_ATTEMPT}=1") == []
    # ... before the gang's first pod was made: the GPUs were really free
    seq = [(e.type, e.pod["metadata"]["labels"].get(ko.L_WORKLOAD), e.name)
           for e in events.events]
    gone = max(i for i, (t, w, n) in enumerate(seq) if t == "DELETED" and n in first)
    made = min(i for i, (t, w, _) in enumerate(seq) if t == "ADDED" and w == gang)
    assert gone < made, seq
    # the ledger: the decision (asked, then done, for alice's gang, requeued), and the charge
    # closed by the preemption
    kinds = [d.kind for d in reversed(ledger.decisions(workloads=[slow]))]
    assert kinds == ["start", "preempting", "preempt"], kinds
    (pre,) = ledger.decisions(kind="preempt", workloads=[slow])
    assert pre.reason and pre.detail["for"] == gang and pre.detail["requeued"] is True
    (charge,) = ledger.charges(workload=slow)
    assert charge.closed_by == "preempt" and charge.end is not None
    events.check()

    run_until(loop, lambda: ledger.get(gang).state == "done", "gang done", 90)
    placed = {s["node"] for s in ledger.get(gang).placement}

    def gang_pods() -> list[dict]:
        """The last state the pod watch saw of each of the gang's pods, once both are bound
        (read from the watch: the done gang's Job and pods may be deleted by now)."""
        seen = {e.name: e.pod for e in events.events
                if e.pod["metadata"]["labels"].get(ko.L_WORKLOAD) == gang
                and e.pod["spec"].get("nodeName")}
        return list(seen.values()) if len(seen) == 2 else []
    pods = wait_for(gang_pods, "the watch to show the gang's two bound pods", 60)
    assert {p["spec"]["nodeName"] for p in pods} == placed == {"gpu-a", "gpu-b"}
    assert all(p["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
               for p in pods)
    assert ledger.get(gang).exit_code == 0
    # and bob's requeued job starts again once the GPUs are free
    run_until(loop, lambda: ledger.get(slow).state == "running", "requeued job restarts", 90)
    run_until(loop, lambda: len(running(slow)) == 2, "its pods run again", 90)
    loop.cancel(slow, by="test")
    assert not running(slow)
    events.stop()


def test_the_loop_places_only_mig_instances_the_nodes_offer(k8s, real_backend, tmp_path):
    """On every node, gpu-d's MIG GPUs included (a fixed layout of 1g.10gb and 3g.40gb
    instances, as its allocatable resources say): one-GPU jobs and a 3g.40gb job run — each on a
    whole GPU or an instance the node offers, never refused at launch for a profile it lacks."""
    b = real_backend()
    ledger, loop = make_loop(tmp_path, b)
    wids = [submit(ledger, "lattice", "alice", 1, {}) for _ in range(3)]
    mig = ledger.submit(project="lattice", user="alice", kind="batch", now=time.time(),
                        request={"kind": "mig", "profile": "3g.40gb"},
                        command=["python", "-c", "pass"], env={}, backend="kubernetes",
                        min_runtime=0.0, resumable=True).id
    wids.append(mig)
    try:
        run_until(loop, lambda: all(ledger.get(w).state == "running" for w in wids),
                  "the four jobs start", 90)
        offered = {n["metadata"]["name"]: n["status"]["allocatable"]
                   for n in k8s.admin.items("/api/v1/nodes")}
        for w in wids:
            for s in ledger.get(w).placement:
                if s["kind"] == "mig":
                    assert int(offered[s["node"]].get(f"nvidia.com/mig-{s['profile']}", 0)), s
        assert ledger.get(mig).placement[0]["profile"] == "3g.40gb"
        for w in wids:
            run_until(loop, lambda w=w: [p for p in k8s.admin.items(
                f"/api/v1/namespaces/{NAMESPACE}/pods", f"{ko.L_WORKLOAD}={w}")
                if p["status"].get("phase") == "Running"], f"{w}'s pod runs", 90)
            assert ledger.get(w).state == "running", ledger.get(w)
    finally:
        for w in wids:
            if ledger.get(w).state in ("running", "pending"):
                loop.cancel(w, by="test")
