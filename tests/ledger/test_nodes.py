"""Node health in the ledger (ledger/nodes.py) on SQLite and a real PostgreSQL server: each
change is one transaction with its audit entry; a repeat changes nothing; the audit view
filters; costs so far add every attempt."""

from __future__ import annotations

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger import nodes as N

BUDGETS = "accounts: {lab: {grant: 10, children: {p: {grant: 10, members: [u]}}}}"


def test_node_health_changes_are_audited_once(db_url):
    upgrade(db_url)
    led = Ledger(connect(db_url))
    try:
        led.sync_budgets(load_budgets(BUDGETS), 1.0)
        assert N.node_health(led) == {} and N.unhealthy_nodes(led) == frozenset()
        assert N.mark_unhealthy(led, "n1", "XID 79", "nvml", "health:nvml", 10.0)
        assert not N.mark_unhealthy(led, "n1", "XID 48", "nvml", "health:nvml", 11.0)
        row = N.node_health(led)["n1"]
        assert (row.healthy, row.reason, row.source, row.changed_at) == (False, "XID 79",
                                                                         "nvml", 10.0)
        assert N.unhealthy_nodes(led) == frozenset({"n1"})
        assert N.mark_drained(led, "n1", 20.0).drained_at == 20.0
        assert N.mark_drained(led, "n1", 21.0) is None  # once per episode
        assert N.mark_drained(led, "n2", 21.0) is None  # not unhealthy
        assert N.drains_total(led) == 1
        assert not N.mark_healthy(led, "n2", "x", "admin", "root", 30.0)
        assert N.mark_healthy(led, "n1", "GPU reseated", "admin", "root", 30.0)
        row = N.node_health(led)["n1"]
        assert row.healthy and row.drained_at is None and row.changed_by == "root"
        kinds = [d.kind for d in N.audit(led, kinds=["health", "repair", "undrain"])]
        assert kinds == ["undrain", "repair", "health"]
        assert [d.kind for d in N.audit(led, text="reseated")] == ["undrain"]
        assert [d.kind for d in N.audit(led, actor="health:nvml")] == ["health"]
        assert N.audit(led, kinds=["health"], before=0) == []
        # costs so far: every attempt, an open interval up to now
        w = led.submit(project="p", user="u", kind="batch", request={"kind": "gpu", "gpus": 1},
                       now=100.0)
        led.start(w.id, placement=[], milli=1000, backed=True, protected_until=None, now=100.0)
        led.stop(w.id, now=3700.0, state="pending", closed_by="preempt")
        led.start(w.id, placement=[], milli=500, backed=True, protected_until=None, now=4000.0)
        assert abs(N.costs(led, [w.id], 4000.0 + 7200)[w.id] - 2.0) < 1e-9
        assert [r.id for r in N.workloads_by_id(led, [w.id, "nope"])] == [w.id]
    finally:
        led.dispose()
