"""A gang's interconnect (docs/core.md "Interconnect"): the core never places a
gang on fewer links than it asked for — ``nvlink``: its ranks on a node in one NVLink domain
and never on MIG instances, a gang that fits one domain never split; ``node``: a gang that
fits one node never split across nodes; ``any``: also split as it comes and, with
``gang_on_mig``, on MIG-mode GPUs as full-size instances."""

from __future__ import annotations

from jupyter_gpubudget.core.backfill import plan_reservation
from jupyter_gpubudget.core.capacity import Cluster
from jupyter_gpubudget.core.explain import why_waiting
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import (
    HOUR,
    Placement,
    Policy,
    Reserve,
    SliceAlloc,
    SliceRequest,
)
from jupyter_gpubudget.core.placement import place
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler

from .helpers import job, tree

H100 = "H100-80GB"
TWO_DOMAINS = ((0, 1, 2, 3), (4, 5, 6, 7))


def links_of(c: Cluster, p: Placement) -> tuple[int, int, int]:
    """(nodes, NVLink domains, MIG instances) a placement's ranks are on."""
    doms = {(s.node, c.by_name[s.node].gpus[s.gpu].domain) for s in p.slices}
    return len(p.nodes), len(doms), sum(1 for s in p.slices if s.kind == "mig")


def fragmented() -> Cluster:
    """n0: two NVLink domains of 4 with 2 GPUs free in each; n1: 2 GPUs free of 4; m: a
    MIG-mode node of 4 idle GPUs; gang_on_mig on, no spare."""
    c = Cluster(Inventory((make_node("n0", H100, 8, nvlink=TWO_DOMAINS),
                           make_node("n1", H100, 4), make_node("m", H100, 4, mig=(0, 1, 2, 3)))))
    c.gang_on_mig, c.gang_on_mig_spare = True, 0
    c.allocate("a", Placement(tuple(SliceAlloc("n0", g) for g in (0, 1, 4, 5))))
    c.allocate("b", Placement(tuple(SliceAlloc("n1", g) for g in (0, 1))))
    return c


def test_an_nvlink_gang_is_never_placed_across_mig_instances_or_nvlink_domains():
    c = fragmented()
    assert c.default_interconnect == "nvlink"  # the inventory has NVLink domains
    # 4 GPUs are free on n0 but in two domains, 2 on n1, 4 MIG-mode GPUs on m: an nvlink
    # gang of 3 or 4 fits none of them without crossing a domain, a node or a MIG instance
    for n in (3, 4):
        for links in (None, "nvlink"):
            assert place(c, SliceRequest.whole(n, interconnect=links), 0.0) is None
    # a pair fits one domain: it gets one
    p = place(c, SliceRequest.whole(2, interconnect="nvlink"), 0.0)
    assert p is not None and links_of(c, p) == (1, 1, 0)
    # ``node``: one node, across its domains (n0), never split across nodes or on MIG
    p = place(c, SliceRequest.whole(4, interconnect="node"), 0.0)
    assert p is not None and links_of(c, p) == (1, 2, 0)
    assert place(c, SliceRequest.whole(5, interconnect="node"), 0.0) is None
    # ``any`` may be split across nodes and domains and take MIG-mode GPUs whole
    p = place(c, SliceRequest.whole(10, interconnect="any"), 0.0)
    assert p is not None and links_of(c, p) == (3, 4, 4)
    c.gang_on_mig = False  # off (the default): no MIG instances, even for ``any``
    assert place(c, SliceRequest.whole(10, interconnect="any"), 0.0) is None
    p = place(c, SliceRequest.whole(6, interconnect="any"), 0.0)
    assert p is not None and links_of(c, p)[2] == 0


def test_a_gang_larger_than_a_domain_spans_nodes_one_domain_on_each():
    c = Cluster(Inventory((make_node("n0", H100, 8, nvlink=TWO_DOMAINS),
                           make_node("n1", H100, 8, nvlink=TWO_DOMAINS))))
    c.allocate("a", Placement((SliceAlloc("n0", 0), SliceAlloc("n1", 4))))
    # 6 > a domain of 4: it spans nodes; on each node its ranks share one domain
    p = place(c, SliceRequest.whole(6), 0.0)
    assert p is not None
    for node in p.nodes:
        assert len({c.by_name[node].gpus[s.gpu].domain for s in p.slices if s.node == node}) == 1
    # 9: the four full domains less the two held GPUs give 4 + 4 on two nodes at most
    assert place(c, SliceRequest.whole(9), 0.0) is None
    assert place(c, SliceRequest.whole(9, interconnect="node"), 0.0) is not None


def test_without_nvlink_domains_the_default_is_node():
    c = Cluster(Inventory((make_node("n0", H100, 2, nvlink=((0,), (1,))),
                           make_node("n1", H100, 2, nvlink=((0,), (1,))))))
    assert c.default_interconnect == "node"
    c.allocate("a", Placement((SliceAlloc("n0", 0),)))
    assert place(c, SliceRequest.whole(2), 0.0).nodes == ("n1",)
    c.allocate("b", Placement((SliceAlloc("n1", 0),)))
    assert place(c, SliceRequest.whole(2), 0.0) is None  # fits one node: never split
    assert len(place(c, SliceRequest.whole(2, interconnect="any"), 0.0).nodes) == 2


def test_a_reservation_is_planned_on_the_links_asked_for():
    c = Cluster(Inventory((make_node("n0", H100, 2), make_node("n1", H100, 2))))
    c.allocate("a", Placement((SliceAlloc("n0", 0),)))
    c.allocate("b", Placement((SliceAlloc("n1", 0),)))
    ends = [(50.0, "a"), (80.0, "b")]
    at, p = plan_reservation(c, SliceRequest.whole(2), 0.0, ends)
    assert (at, p.nodes) == (50.0, ("n0",))  # not now, split over n0 and n1
    at, p = plan_reservation(c, SliceRequest.whole(2, interconnect="any"), 0.0, ends)
    assert at == 0.0 and len(p.nodes) == 2


def test_the_policy_sets_the_default_per_kind_and_the_queue_says_why_a_gang_waits():
    inv = Inventory((make_node("n0", H100, 2), make_node("n1", H100, 2)))
    a, b = job("a", gpus=1), job("b", gpus=1)
    a.placement = Placement((SliceAlloc("n0", 0),))
    b.placement = Placement((SliceAlloc("n1", 0),))
    for w in (a, b):
        w.started_at, w.backed, w.protected_until = 0.0, True, 10 * HOUR
    gang = job("g", gpus=2, at=1.0)
    state = ClusterState(tree(), inv, Policy(), running=[a, b], pending=[gang])
    wait = why_waiting(state, 2.0)["g"]
    assert wait.reason == "interconnect"
    assert wait.message == (
        "2 whole GPUs are free, but not with the nvlink interconnect it asked for (NVLink "
        "between its ranks on a node (one NVLink domain; a gang that fits one is not "
        "split)): it waits for its interconnect")
    # a batch gang under ``interconnect: {batch: any}`` starts split over the two nodes
    loose = ClusterState(tree(), inv, Policy(interconnect=(("batch", "any"),)),
                         running=[a, b], pending=[gang])
    (start,) = Scheduler.from_state(loose).cycle(2.0)
    assert start.workload == "g" and len(start.placement.nodes) == 2
    sessions_only = ClusterState(tree(), inv, Policy(interconnect=(("interactive", "any"),)),
                                 running=[a, b], pending=[gang])
    (reserve,) = Scheduler.from_state(sessions_only).cycle(2.0)  # a batch gang: nvlink
    assert isinstance(reserve, Reserve) and reserve.placement.nodes == ("n0",)
