"""The backend's watches against a real kube-apiserver and etcd (tests/fixtures/k8s.py says
which parts are real): when etcd's history has been compacted past the resourceVersion a
watch resumes from, the real API server answers ``410 Gone`` and the backend lists again —
and so sees a Job made while its watch was expired; when the API server restarts (every
watch broken at once), the backend watches again and sees what changed meanwhile, each
object once."""

from __future__ import annotations

import logging

from jupyter_gpubudget.backends import k8s_objects as ko
from tests.fixtures.k8s import NAMESPACE, wait_for
from tests.kubernetes.test_real_rbac import job, whole


def test_a_watch_resumed_after_compaction_gets_410_and_the_backend_lists_again(k8s,
                                                                             real_backend,
                                                                             caplog):
    caplog.set_level(logging.INFO, logger="test.k8s.real")
    b = real_backend(watch_timeout=1)  # each watch is renewed from its resourceVersion
    b.discover_inventory()
    assert b.jobs.relists == 1

    def revision() -> int:
        return int(k8s.etcd("kv/range", {"key": "AA=="})["header"]["revision"])

    for _ in range(5):
        # the rest of the cluster moves on (kwok's heartbeats write the nodes), then etcd
        # forgets the history the Jobs' watch resumes from
        rv = int(b.jobs.rv)
        wait_for(lambda rv=rv: revision() > rv + 2, "etcd's revision to move on", 30)
        compacted = k8s.compact_etcd()
        if int(b.jobs.rv) < compacted:  # no Job event moved the watch on meanwhile
            break
    else:
        raise AssertionError("the Jobs' watch kept moving; nothing to expire")
    wait_for(lambda: b.jobs.relists >= 2, "the backend to list the Jobs again after 410", 30)
    # the real API server said 410 Gone (not some other failure) and the backend knew it
    assert any("jobs watch expired (410)" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    # ... and it watches on from the new list: a Job made now is seen
    name = "made-after-relist"
    k8s.admin.create(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", {
        "metadata": {"name": name, "labels": {ko.MANAGED_BY[0]: ko.MANAGED_BY[1]}},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never", "nodeSelector": {"gpubudget.test/nowhere": "x"},
            "containers": [{"name": "c", "image": "x", "command": ["true"]}]}}}})
    try:
        wait_for(lambda: name in b.jobs.items, "the backend to see the new Job", 30)
    finally:
        k8s.admin.delete(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{name}",
                         {"propagationPolicy": "Background"})


def test_watches_broken_by_an_api_server_restart_resume_with_nothing_lost(k8s, real_backend):
    b = real_backend(watch_timeout=300)  # each watch ends by the restart, not by a renewal
    b.discover_inventory()
    before, after = "restart00000001", "restart00000002"
    b.launch(job(before, whole("gpu-c", 6)))
    wait_for(lambda: b.status(before, 1).alive and b._mine(b.pods, before, 1),
             "the backend to see the first job's pod", 60)
    k8s.restart("kube-apiserver")
    try:
        # while the backend's watches reconnect: one job ends (its Job deleted by someone
        # else), another starts
        k8s.admin.delete(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{ko.job_name(before, 1)}",
                         {"propagationPolicy": "Background", "gracePeriodSeconds": 0})
        b.launch(job(after, whole("gpu-c", 7)))
        # the pods' and Jobs' watches resumed: the new pod is seen, the ended job is gone
        wait_for(lambda: b._mine(b.pods, after, 1), "the backend to see the new job's pod",
                 90)
        wait_for(lambda: not b.status(before, 1).alive and not b._mine(b.pods, before, 1),
                 "the backend to see the first job gone", 90)
        # each object once
        assert len(b._mine(b.jobs, after, 1)) == 1 and len(b._mine(b.pods, after, 1)) == 1
        assert b.status(after, 1).alive
    finally:
        b.stop(after, 1)
        k8s.admin.delete(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{ko.job_name(before, 1)}",
                         {"propagationPolicy": "Background", "gracePeriodSeconds": 0})
