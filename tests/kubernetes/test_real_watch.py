"""The backend's watches against a real kube-apiserver and etcd (tests/fixtures/k8s.py says
which parts are real): when etcd's history has been compacted past the resourceVersion a
watch resumes from, the real API server answers ``410 Gone`` and the backend lists again —
and so sees a Job made while its watch was expired."""

from __future__ import annotations

import logging

from jupyter_gpubudget.backends import k8s_objects as ko
from tests.fixtures.k8s import NAMESPACE, wait_for


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
