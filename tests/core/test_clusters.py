"""Several named clusters under one budget tree (docs/core.md "Clusters"):
a workload that names a cluster is placed, given victims and reserved for only there; one
that names none starts wherever it fits now and is reserved where it starts soonest; a gang
never spans clusters."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.backfill import plan_reservation
from jupyter_gpubudget.core.capacity import Cluster
from jupyter_gpubudget.core.inventory import (
    Inventory,
    InventoryError,
    load_inventory,
    make_node,
    merge_clusters,
)
from jupyter_gpubudget.core.model import (
    HOUR,
    Placement,
    Preempt,
    Reserve,
    SliceAlloc,
    SliceRequest,
    Start,
)
from jupyter_gpubudget.core.placement import place
from jupyter_gpubudget.core.scheduler import ClusterState, schedule
from jupyter_gpubudget.core.whatif import standings

from .helpers import job, prop_settings, tree

H100 = "H100-80GB"


def two_clusters(gpus_a: int = 4, gpus_b: int = 4, nodes: int = 1) -> Inventory:
    """Cluster ``local`` (nodes a0..) and cluster ``slurm`` (nodes b0..)."""
    return merge_clusters({
        "local": Inventory(tuple(make_node(f"a{i}", H100, gpus_a) for i in range(nodes))),
        "slurm": Inventory(tuple(make_node(f"b{i}", H100, gpus_b) for i in range(nodes))),
    })


def clusters_of(c: Cluster, p: Placement) -> set[str]:
    return {c.by_name[s.node].cluster for s in p.slices}


def test_an_inventory_without_clusters_is_one_default_cluster():
    inv = load_inventory("nodes:\n  - {name: n0, gpus: 2}\n")
    assert inv.clusters == ("default",)
    assert Cluster(inv).cluster_names == ("default",)
    p = place(Cluster(inv), SliceRequest.whole(1, cluster="default"), HOUR)
    assert p is not None and p.nodes == ("n0",)


def test_a_declared_node_names_its_cluster_and_merging_refuses_a_node_in_two():
    inv = load_inventory("nodes:\n  - {name: n0, gpus: 2, cluster: pool}\n")
    assert inv.clusters == ("pool",)
    one = Inventory((make_node("n0", H100, 1),))
    try:
        merge_clusters({"x": one, "y": one})
    except InventoryError as e:
        assert "n0" in str(e) and "'x'" in str(e) and "'y'" in str(e)
    else:
        raise AssertionError("a node in two clusters was accepted")


def test_a_named_cluster_is_the_only_place_the_request_goes():
    c = Cluster(two_clusters())
    assert c.cluster_names == ("local", "slurm")
    p = place(c, SliceRequest.whole(2, cluster="slurm"), HOUR)
    assert p is not None and clusters_of(c, p) == {"slurm"}
    for req in (SliceRequest.mps(300, cluster="slurm"), SliceRequest.cpu_only(cluster="slurm"),
                SliceRequest.whole(1, cluster="slurm")):
        got = place(c, req, HOUR)
        assert got is not None and clusters_of(c, got) == {"slurm"}, req
    assert place(c, SliceRequest.whole(1, cluster="nowhere"), HOUR) is None
    # and once slurm is full, a request naming it waits although local is empty
    c.allocate("x", Placement(tuple(SliceAlloc("b0", g) for g in range(4))))
    assert place(c, SliceRequest.whole(1, cluster="slurm"), HOUR) is None
    free = place(c, SliceRequest.whole(1), HOUR)
    assert free is not None and clusters_of(c, free) == {"local"}
    # nothing is left barred after a look into one cluster
    assert not any(n.barred for n in c.nodes)


def test_a_gang_never_spans_clusters():
    """Two free GPUs in each cluster: a 4-GPU gang that could cross nodes (``any``) would
    fit across the clusters, and does not; a 2-GPU one fits in one."""
    c = Cluster(two_clusters())
    c.allocate("x", Placement(tuple(SliceAlloc("a0", g) for g in (0, 1))))
    c.allocate("y", Placement(tuple(SliceAlloc("b0", g) for g in (0, 1))))
    assert place(c, SliceRequest.whole(4, interconnect="any"), HOUR) is None
    p = place(c, SliceRequest.whole(2, interconnect="any"), HOUR)
    assert p is not None and len(clusters_of(c, p)) == 1


def test_a_gang_across_nodes_stays_in_one_cluster():
    """Each cluster has two 2-GPU nodes with one GPU free each and the other cluster one more
    free node: a 3-GPU ``any`` gang goes across nodes of one cluster only."""
    inv = merge_clusters({
        "local": Inventory((make_node("a0", H100, 2), make_node("a1", H100, 2))),
        "slurm": Inventory((make_node("b0", H100, 2), make_node("b1", H100, 2))),
    })
    c = Cluster(inv)
    c.allocate("x", Placement((SliceAlloc("a0", 0), SliceAlloc("b0", 0), SliceAlloc("b1", 0))))
    p = place(c, SliceRequest.whole(3, interconnect="any"), HOUR)
    assert p is not None and clusters_of(c, p) == {"local"} and len(p.nodes) == 2


@st.composite
def busy_clusters(draw):
    """Two or three clusters of 1-3 nodes of 1-4 GPUs, some GPUs taken; a whole-GPU request
    of 1-6 GPUs, any interconnect, naming a cluster or not."""
    k = draw(st.integers(2, 3))
    parts = {}
    for ci in range(k):
        parts[f"c{ci}"] = Inventory(tuple(
            make_node(f"c{ci}n{i}", H100, draw(st.integers(1, 4)))
            for i in range(draw(st.integers(1, 3)))))
    c = Cluster(merge_clusters(parts))
    n = 0
    for node in c.nodes:
        for g in node.gpus:
            if draw(st.booleans()):
                c.allocate(f"w{n}", Placement((SliceAlloc(node.name, g.index),)))
                n += 1
    named = draw(st.sampled_from([None, *parts, "elsewhere"]))
    req = SliceRequest.whole(draw(st.integers(1, 6)),
                             interconnect=draw(st.sampled_from(["nvlink", "node", "any"])),
                             cluster=named)
    return c, req


@given(busy_clusters())
@prop_settings(200)
def test_property_placement_stays_in_one_cluster_and_in_the_named_one(case):
    c, req = case
    p = place(c, req, HOUR)
    assert not any(n.barred for n in c.nodes)
    if p is None:
        # nothing fits: no single cluster had the GPUs free (counted independently)
        for name in c.cluster_names if req.cluster is None else (req.cluster,):
            free = sum(len(n.free_whole) for n in c.nodes if n.cluster == name)
            if req.interconnect == "any":
                assert free < req.gpus, (name, free)
        return
    assert len(clusters_of(c, p)) == 1
    if req.cluster is not None:
        assert clusters_of(c, p) == {req.cluster}
    c.allocate("new", p)  # and it is really free there


# ---------------------------------------------------------------- the scheduler


def state(inv: Inventory, running=(), pending=(), charges=()) -> ClusterState:
    return ClusterState(tree(), inv, running=tuple(running), pending=tuple(pending),
                        charges=tuple(charges))


def test_the_core_starts_unnamed_work_on_the_cluster_where_it_fits_now():
    inv = two_clusters()
    full = replace(job("r", "b", 4, at=0.0), started_at=0.0, backed=True,
                   protected_until=10 * HOUR, min_runtime=10 * HOUR,
                   placement=Placement(tuple(SliceAlloc("a0", g) for g in range(4))))
    out = schedule(state(inv, running=[full], pending=[job("w", "a", 2, at=1.0)]), 2.0)
    starts = [d for d in out if isinstance(d, Start)]
    assert [s.workload for s in starts] == ["w"]
    assert set(starts[0].placement.nodes) == {"b0"}


def test_named_work_preempts_only_in_its_cluster():
    """An unbacked job of a project far over its grant holds each cluster's only GPU; a backed
    job naming slurm preempts the one on slurm, never the one on local (unnamed, either)."""
    from jupyter_gpubudget.core.model import ChargeInterval

    inv = two_clusters(1, 1)
    used = [ChargeInterval("old", "b", "ben", 1000, -300 * HOUR, -HOUR)]
    run = [replace(job(f"u{n}", "b", 1, at=0.0), started_at=0.0, backed=False,
                   placement=Placement((SliceAlloc(n, 0),))) for n in ("a0", "b0")]
    for named, victim in (("slurm", "ub0"), ("local", "ua0")):
        w = job("w", "a", at=1.0, req=SliceRequest.whole(1, cluster=named))
        out = schedule(state(inv, running=run, pending=[w], charges=used), 2.0)
        assert [d.workload for d in out if isinstance(d, Preempt)] == [victim]
        start = next(d for d in out if isinstance(d, Start))
        assert start.placement.nodes == (victim[1:],)


def test_a_blocked_gang_is_reserved_in_the_cluster_where_it_starts_soonest():
    """Both clusters are full; local's work ends in 5 h, slurm's in 1 h: the unnamed gang is
    reserved on slurm; one naming local is reserved on local."""
    inv = two_clusters()
    c = Cluster(inv)
    c.allocate("long", Placement(tuple(SliceAlloc("a0", g) for g in range(4))))
    c.allocate("short", Placement(tuple(SliceAlloc("b0", g) for g in range(4))))
    ends = [(1 * HOUR, "short"), (5 * HOUR, "long")]
    at, p = plan_reservation(c, SliceRequest.whole(4), 0.0, ends)
    assert at == 1 * HOUR and set(p.nodes) == {"b0"}
    at, p = plan_reservation(c, SliceRequest.whole(4, cluster="local"), 0.0, ends)
    assert at == 5 * HOUR and set(p.nodes) == {"a0"}
    assert not any(n.barred for n in c.nodes)
    # and the cycle says so
    run = [replace(job("long", "b", 4, at=0.0, limit=5 * HOUR), started_at=0.0, backed=True,
                   protected_until=5 * HOUR, min_runtime=5 * HOUR,
                   placement=Placement(tuple(SliceAlloc("a0", g) for g in range(4)))),
           replace(job("short", "b", 4, at=0.0, limit=1 * HOUR), started_at=0.0, backed=True,
                   protected_until=1 * HOUR, min_runtime=1 * HOUR,
                   placement=Placement(tuple(SliceAlloc("b0", g) for g in range(4))))]
    out = schedule(state(inv, running=run, pending=[job("g", "a", 4, at=1.0)]), 60.0)
    res = [d for d in out if isinstance(d, Reserve)]
    assert len(res) == 1 and set(res[0].placement.nodes) == {"b0"}


def test_usage_on_both_clusters_counts_in_one_standing():
    """The core's charges carry no cluster: a project's GPU-hours on every cluster add up to
    one usage and one standing against its one grant."""
    from jupyter_gpubudget.core.model import ChargeInterval

    inv = two_clusters()
    charges = [ChargeInterval("x", "a", "ann", 1000, 0.0, HOUR),   # on local
               ChargeInterval("y", "a", "ann", 2000, 0.0, HOUR)]   # on slurm
    got = standings(state(inv, charges=charges), HOUR)["a"]
    assert round(got["usage_hours"], 6) == 3.0
    assert round(got["standing"], 6) == round(3.0 / got["grant_hours"], 6)
