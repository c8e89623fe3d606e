"""The Starts of one scheduling cycle reach the real API server concurrently (tests/fixtures/
k8s.py says which parts are real; kwok plays the kubelets): 25 one-GPU jobs decided in one
cycle by the service's own loop are created with several Job creates in flight at once, each
workload is recorded once (one start, one open charge, its Job as its reference) and its pod
runs where the core placed it; the one the core placed on a node the cluster lacks fails
alone, with the reason, and changes nothing for the others. The ledger records the cycle's
Starts in batches of ``launch_concurrency``: one transaction per batch before its Jobs are
created, one after for their launches (counted with SQLAlchemy's session events). On an API server that refuses
creates beyond one in flight (429 Too Many Requests), every create of the burst is sent again
when the server asks, and all of them are made."""

from __future__ import annotations

import asyncio
import time

from jupyter_gpubudget.backends import k8s_objects as ko
from jupyter_gpubudget.backends.base import Launch
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.fixtures.k8s import NAMESPACE, FakeNode, find_bin_dir, start_control_plane, wait_for
from tests.kubernetes.conftest import apply_rbac
from tests.kubernetes.serviceloop import make_loop

LABEL = "gpubudget.test/batch-launch"
NODES = ("launch-a", "launch-b", "launch-c")  # 3 x 8 GPUs, only this test's work on them
GHOST = "launch-ghost"  # in the core's inventory, not in the cluster
MINE = f"{ko.MANAGED_BY[0]}={ko.MANAGED_BY[1]}"


def add_nodes(k8s) -> None:  # noqa: ANN001
    for n in NODES:
        m = FakeNode(n, 8).manifest()
        m["metadata"]["labels"][LABEL] = "true"
        k8s.admin.create("/api/v1/nodes", m)

    def ready() -> bool:
        nodes = k8s.admin.items("/api/v1/nodes", f"{LABEL}=true")
        return len(nodes) == len(NODES) and all(
            any(c["type"] == "Ready" and c["status"] == "True"
                for c in n["status"].get("conditions") or []) for n in nodes)
    wait_for(ready, "the test's kwok nodes Ready", 60)


def count_in_flight(backend) -> dict:  # noqa: ANN001
    """Counts the Job creates in flight at once (the real API server still answers each)."""
    seen = {"now": 0, "max": 0, "calls": 0}
    create = backend.batch.create_namespaced_job

    async def counted(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        seen["now"] += 1
        seen["calls"] += 1
        seen["max"] = max(seen["max"], seen["now"])
        try:
            await asyncio.sleep(0)  # every create of a wave is sent before any answer
            return await create(*a, **kw)
        finally:
            seen["now"] -= 1
    backend.batch.create_namespaced_job = counted
    return seen


def count_write_transactions(ledger) -> list[int]:  # noqa: ANN001
    """One entry per write transaction the ledger commits: the start decisions it holds."""
    from sqlalchemy import event

    from jupyter_gpubudget.ledger.models import DecisionRow

    commits: list[int] = []

    def committed(s) -> None:  # noqa: ANN001
        if s.in_nested_transaction():  # (a savepoint released, not a commit)
            return
        commits.append(s.info.pop("test.starts", 0))

    def flushed(s, _ctx, _instances) -> None:  # noqa: ANN001
        s.info["test.starts"] = s.info.get("test.starts", 0) + sum(
            1 for o in s.new if isinstance(o, DecisionRow) and o.kind == "start")
    event.listen(ledger._sessions, "after_commit", committed)
    event.listen(ledger._sessions, "before_flush", flushed)
    return commits


def test_one_cycles_starts_are_created_at_once_and_each_recorded_once(k8s, real_backend,
                                                                     tmp_path):
    add_nodes(k8s)
    wids: list[str] = []
    try:
        b = real_backend(node_selector=f"{LABEL}=true", launch_concurrency=8)
        ledger, loop = make_loop(tmp_path, b)
        assert loop.inventory.gpu_count == 24
        ghost = ko.inventory_from_nodes([FakeNode(GHOST, 1).manifest()]).nodes
        loop = SchedulingLoop(ledger, loop.tree_fn,
                              type(loop.inventory)(loop.inventory.nodes + ghost, "kubernetes"),
                              loop.policy_fn, b)
        seen = count_in_flight(b)
        writes = count_write_transactions(ledger)
        wids += [ledger.submit(project="lattice", user="alice", kind="batch", now=time.time(),
                              request={"kind": "gpu", "gpus": 1},
                              command=["python", "-c", "pass"], backend="kubernetes",
                              min_runtime=0.0, resumable=False).id for _ in range(25)]

        writes.clear()
        decisions = loop.cycle()  # ONE cycle decides and launches all of them
        assert len([d for d in decisions if type(d).__name__ == "Start"]) == 25
        # the ledger's writes come in batches of launch_concurrency (8): per batch one
        # transaction records its Starts before any of its Jobs is created, one records their
        # launches (the failed one's end among them) — 2 x 4, not 2 per Start
        assert len(writes) == 2 * 4, writes
        assert sorted(n for n in writes if n) == [1, 8, 8, 8], writes  # start decisions
        rows = {w: ledger.get(w) for w in wids}
        on_ghost = [w for w, r in rows.items() if {s["node"] for s in r.placement} == {GHOST}]
        assert len(on_ghost) == 1, [r.placement for r in rows.values()]
        bad = rows[on_ghost[0]]
        assert bad.state == "failed"
        assert bad.reason == f"launch failed: node {GHOST} of the placement is not in the cluster"
        good = [w for w in wids if w != bad.id]
        assert all(rows[w].state == "running" for w in good)
        # sent at once: several creates in flight (8 at most), one create per workload
        assert seen["calls"] == 24 and 1 < seen["max"] <= 8, seen

        # each recorded once: one start decision, one open charge, its own Job
        starts = ledger.decisions(kind="start", workloads=wids, limit=1000)
        assert sorted(d.workload for d in starts) == sorted(wids)
        for w in good:
            charges = ledger.charges(workload=w)
            assert len(charges) == 1 and charges[0].end is None and charges[0].seq == 1
            assert rows[w].backend_ref == ko.job_name(w, 1)
        assert [c.end is not None for c in ledger.charges(workload=bad.id)] == [True]

        def pods() -> dict[str, dict]:
            return {p["metadata"]["labels"][ko.L_WORKLOAD]: p
                    for p in k8s.admin.items(f"/api/v1/namespaces/{NAMESPACE}/pods", MINE)
                    if p["metadata"]["labels"].get(ko.L_WORKLOAD) in
                    {ko.label_value(w) for w in wids}}

        def all_running() -> bool:
            ps = pods()
            return len(ps) == 24 and all(p["status"].get("phase") == "Running"
                                         for p in ps.values())
        wait_for(all_running, "the 24 pods Running", 120, every=0.5)
        ps = pods()
        jobs = k8s.admin.items(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", MINE)
        mine = [j for j in jobs if (j["metadata"].get("annotations") or {})
                .get(ko.A_WORKLOAD) in wids]
        assert len(mine) == 24  # one Job each; none for the failed one
        for w in good:  # bound by the real scheduler where the core placed it
            assert ps[ko.label_value(w)]["spec"]["nodeName"] == rows[w].placement[0]["node"]
    finally:
        for w in wids:
            k8s.admin.delete(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{ko.job_name(w, 1)}",
                             {"propagationPolicy": "Background"})
        for n in NODES:
            k8s.admin.delete(f"/api/v1/nodes/{n}")


def test_creates_refused_for_load_are_sent_again(tmp_path, real_backend):
    """Its own control plane: the API server without API Priority and Fairness, allowing one
    mutating request in flight, answers the rest of a burst of creates 429 at once."""
    from kubernetes_asyncio.client.exceptions import ApiException

    bins, why = find_bin_dir()
    assert bins is not None, why
    cp = start_control_plane(bins, tmp_path / "cp", {"kube-apiserver": [
        "--enable-priority-and-fairness=false", "--max-mutating-requests-inflight=1"]})
    wids = [f"burst{i:02d}" for i in range(20)]
    try:
        apply_rbac(cp)
        b = real_backend(kubeconfig=str(cp.service_kubeconfig),
                         node_selector="kubernetes.io/hostname in (gpu-a,gpu-b,gpu-c)",
                         launch_concurrency=20, request_timeout=60)  # (the creates are
        # sent again for at most request_timeout: one at a time on a loaded machine, the
        # burst's last may wait longer than the suite's usual 10 s)
        b._ensure()
        refused = {"429": 0}
        create = b.batch.create_namespaced_job

        async def counted(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            try:
                return await create(*a, **kw)
            except ApiException as e:
                refused["429"] += e.status == 429
                raise
        b.batch.create_namespaced_job = counted
        nodes = ("gpu-a", "gpu-b", "gpu-c")
        got = b.launch_many([Launch(
            workload=w, attempt=1, user="alice", project="lattice",
            command=["python", "-c", "pass"],
            placement=[{"node": nodes[i % 3], "gpu": i // 3, "kind": "gpu", "milli": 1000}])
            for i, w in enumerate(wids)])
        assert refused["429"] > 0  # the server did shed load
        assert got == [ko.job_name(w, 1) for w in wids], got
        made = [j["metadata"]["name"] for j in
                cp.admin.items(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", MINE)]
        assert sorted(made) == sorted(ko.job_name(w, 1) for w in wids)
    finally:
        cp.stop()
