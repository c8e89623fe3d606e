"""The capacity model by hand (docs/core.md, semantics 1: no GPU, MIG slice or MPS capacity is
ever allocated twice or beyond its size): each refusal with its reason, rollback of a failed
multi-slice allocation, release, the look-up indexes, reservations and health — every case
small enough to count on one's fingers, each checked against the independent recount in
helpers.py as well."""

from __future__ import annotations

import copy

import pytest

from jupyter_gpubudget.core.capacity import INF, CapacityError, Cluster
from jupyter_gpubudget.core.inventory import Inventory, carve, make_node
from jupyter_gpubudget.core.model import Placement, SliceAlloc

from .helpers import assert_cluster_matches

H100 = "H100-80GB"
MEM = 81559  # MiB of an H100-80GB (inventory.GPU_MEMORY_MIB)


def inv(cpu: int = 0, mem: int = 0, gpus: int = 4, mig: tuple[int, ...] = (3,),
        layout: dict | None = None, nodes: int = 1) -> Inventory:
    return Inventory(tuple(make_node(f"n{i}", H100, gpus, mig=mig, cpu_milli=cpu,
                                     memory_mib=mem, mig_layout=layout, rack=f"r{i}")
                           for i in range(nodes)))


def whole(gpu: int, node: str = "n0", **kw) -> SliceAlloc:
    return SliceAlloc(node, gpu, "gpu", 1000, **kw)


def mps(gpu: int, milli: int, mem: int = 0, node: str = "n0", **kw) -> SliceAlloc:
    return SliceAlloc(node, gpu, "mps", milli, -1, None, mem, **kw)


def mig(gpu: int, profile: str, start: int, node: str = "n0", **kw) -> SliceAlloc:
    from jupyter_gpubudget.core.mig import profiles_for

    return SliceAlloc(node, gpu, "mig", profiles_for(H100)[profile].milli, start, profile,
                      **kw)


def P(*slices: SliceAlloc) -> Placement:
    return Placement(tuple(slices))


def refused(c: Cluster, wid: str, placement: Placement, words: str) -> None:
    """allocate refuses with a reason that ends with ``words`` (after the GPU it names) and
    changes nothing at all."""
    before = snapshot(c)
    with pytest.raises(CapacityError) as e:
        c.allocate(wid, placement)
    assert str(e.value).endswith(words), str(e.value)
    assert snapshot(c) == before, "a refused allocation changed the cluster"


def snapshot(c: Cluster) -> object:
    """Everything a Cluster holds, as plain data (but the order of its sets, and the MIG
    index's version counter, which only invalidates placement's cache)."""
    return (
        [(n.name, n.cpu_used, n.mem_used, n.healthy, sorted(n.free_whole),
          [(g.used_milli, g.mem_used, g.whole, g.mask, g.compute_used, dict(g.tenants),
            g.reserved_at) for g in n.gpus]) for n in c.nodes],
        [sorted(b) for b in c.whole_buckets],
        {u: sorted(b) for u, b in c.shared.items()},
        {cls: {occ: sorted(b) for occ, b in by.items()} for cls, by in c.mig_index.items()},
        dict(c.allocations), c.used_milli, c.total_milli)


# ---------------------------------------------------------------- MPS shares


def test_an_mps_share_counts_itself_when_it_checks_the_room_left():
    c = Cluster(inv())
    c.allocate("a", P(mps(0, 600)))
    refused(c, "b", P(mps(0, 500)), "400 milli free, 500 asked")
    c.allocate("c", P(mps(0, 400)))  # exactly full is fine
    refused(c, "d", P(mps(0, 1)), "0 milli free, 1 asked")
    assert c.gpu((0, 0)).used_milli == 1000
    assert_cluster_matches(c, inv())


def test_an_mps_share_must_ask_for_something():
    c = Cluster(inv())
    refused(c, "z", P(mps(0, 0)), "1000 milli free, 0 asked")
    refused(c, "n", P(mps(0, -5)), "1000 milli free, -5 asked")


def test_mps_shares_and_whole_gpus_never_share_a_gpu():
    c = Cluster(inv())
    c.allocate("share", P(mps(0, 100)))
    refused(c, "whole", P(whole(0)), "not free")
    c.allocate("w1", P(whole(1)))
    refused(c, "share2", P(mps(1, 100)), "0 milli free, 100 asked")
    refused(c, "w2", P(whole(1)), "not free")
    assert_cluster_matches(c, inv())


def test_mps_gpu_memory_is_counted_with_the_new_share():
    c = Cluster(inv())
    c.allocate("a", P(mps(0, 300, MEM - 1000)))
    refused(c, "b", P(mps(0, 300, 1001)), "too little memory for the MPS share")
    c.allocate("c", P(mps(0, 300, 1000)))  # exactly the GPU's memory
    assert c.gpu((0, 0)).mem_used == MEM
    c.release("a")
    assert c.gpu((0, 0)).mem_used == 1000 and c.gpu((0, 0)).used_milli == 300
    # a GPU whose memory is not known (0) does not limit shares by memory
    free_mem = Inventory((make_node("n0", "GPU", 1, gpu_memory_mib=0),))
    c2 = Cluster(free_mem)
    c2.allocate("x", P(mps(0, 500, 10**9)))
    assert_cluster_matches(c2, free_mem)


# ---------------------------------------------------------------- MIG


def test_mig_instances_may_not_overlap_nor_exceed_seven_compute_slices():
    c = Cluster(inv())
    c.allocate("a", P(mig(3, "3g.40gb", 0)))
    refused(c, "b", P(mig(3, "4g.40gb", 0)), "4g.40gb does not fit at slot 0")
    refused(c, "c", P(mig(3, "1g.10gb", 3)), "1g.10gb does not fit at slot 3")
    c.allocate("d", P(mig(3, "3g.40gb", 4)))  # slots 4-7: 6 compute slices in use
    g = c.gpu((0, 3))
    assert (g.mask, g.compute_used) == (0xFF, 6)
    # 1g.10gb at slot 7 overlaps; every slot is taken
    refused(c, "e", P(mig(3, "1g.10gb", 7)), "does not fit at slot 7")
    c.release("a")
    assert (g.mask, g.compute_used) == (0xF0, 3)
    # 4 slots free, but a 4g needs 4 compute slices on top of 3: 7 — fits exactly
    c.allocate("f", P(mig(3, "4g.40gb", 0)))
    assert (g.mask, g.compute_used) == (0xFF, 7)
    assert_cluster_matches(c, inv())


def test_compute_slices_limit_mig_even_where_memory_slots_are_free():
    c = Cluster(inv())
    # 1g.20gb takes 2 memory slots but 1 compute slice; 2g.20gb 2 and 2
    c.allocate("a", P(mig(3, "2g.20gb", 0)))
    c.allocate("b", P(mig(3, "2g.20gb", 2)))
    c.allocate("c", P(mig(3, "2g.20gb", 4)))  # 6 compute slices, slots 0-5
    c.allocate("d", P(mig(3, "1g.10gb", 6)))  # 7 compute slices, slot 7 still free
    g = c.gpu((0, 3))
    assert (g.mask, g.compute_used) == (0x7F, 7)
    refused(c, "e", P(mig(3, "1g.10gb", 6)), "1g.10gb does not fit at slot 6")
    from jupyter_gpubudget.core import mig as migtab

    assert migtab.fits(H100, "1g.10gb", 0x7F, 7) == ()  # slot 7 is free but no compute
    assert migtab.fits(H100, "1g.10gb", 0x7F, 6) == ()  # 1g.10gb may not start at 7
    assert migtab.fits(H100, "1g.20gb", 0x3F, 6) == (6,)


def test_a_mig_gpu_takes_mig_instances_only_and_others_take_none():
    c = Cluster(inv())
    refused(c, "w", P(whole(3)), "in MIG mode; it takes MIG instances only")
    refused(c, "s", P(mps(3, 100)), "in MIG mode; it takes MIG instances only")
    refused(c, "m", P(mig(0, "1g.10gb", 6)), "not in MIG mode")
    refused(c, "p", P(SliceAlloc("n0", 3, "mig", 143, 0, "1g.5gb")),
            "H100-80GB has no MIG profile 1g.5gb")


def test_a_fixed_layout_admits_its_instances_only():
    layout = carve(H100, [("3g.40gb", 4), ("2g.20gb", 2), ("1g.10gb", 1), ("1g.10gb", 0)])
    fixed = inv(layout={3: layout})
    c = Cluster(fixed)
    refused(c, "x", P(mig(3, "1g.10gb", 6)), "no 1g.10gb instance at slot 6 in this GPU's "
            "MIG layout (it is fixed: 1g.10gb@0, 1g.10gb@1, 2g.20gb@2, 3g.40gb@4)")
    for wid, (name, start) in zip("abcd", layout, strict=True):
        c.allocate(wid, P(mig(3, name, start)))
    refused(c, "y", P(mig(3, "1g.10gb", 0)), "1g.10gb does not fit at slot 0")
    assert_cluster_matches(c, fixed)


# ---------------------------------------------------------------- host, nodes, workloads


def test_host_cpu_and_memory_are_limits_where_they_are_tracked():
    c = Cluster(inv(cpu=8000, mem=1000))
    c.allocate("a", P(whole(0, cpu_milli=6000, memory_mib=400)))
    refused(c, "b", P(whole(1, cpu_milli=2001)), "node n0 has no room for 2001 CPU milli / 0 MiB")
    refused(c, "c", P(whole(1, memory_mib=601)), "node n0 has no room for 0 CPU milli / 601 MiB")
    c.allocate("d", P(whole(1, cpu_milli=2000, memory_mib=600)))  # exactly full
    n = c.nodes[0]
    assert (n.cpu_used, n.mem_used) == (8000, 1000)
    refused(c, "e", P(SliceAlloc("n0", -1, "cpu", 0, cpu_milli=1)), "no room for 1 CPU milli / 0 MiB")
    c.release("a")
    assert (n.cpu_used, n.mem_used) == (2000, 600)
    # untracked (0): no limit
    c2 = Cluster(inv())
    c2.allocate("big", P(SliceAlloc("n0", -1, "cpu", 0, cpu_milli=10**9, memory_mib=10**9)))
    assert c2.nodes[0].cpu_used == 10**9 and not c2.allocations["big"].milli


def test_unknown_nodes_gpus_and_workloads_are_refused():
    c = Cluster(inv())
    refused(c, "x", P(whole(0, node="n9")), "unknown node n9")
    refused(c, "y", P(whole(4)), "node n0 has no GPU 4")
    refused(c, "z", P(whole(0), whole(0)), "z holds GPU n0/0 twice")
    c.allocate("a", P(whole(0)))
    refused(c, "a", P(whole(1)), "workload a is already placed")


def test_a_failed_multi_slice_allocation_is_rolled_back():
    """A gang's third GPU is taken: its first two and its host resources are given back, and
    so is an MPS share's and a MIG instance's — the cluster is exactly as before."""
    layout_free = inv(cpu=10000, mem=100)
    c = Cluster(layout_free)
    c.allocate("busy", P(whole(2)))
    c.allocate("share", P(mps(1, 300, 100)))
    refused(c, "gang", P(whole(0, cpu_milli=4000, memory_mib=50), mps(1, 200, 50),
                         mig(3, "3g.40gb", 4), whole(2)), "not free")
    c.allocate("gang2", P(whole(0, cpu_milli=4000, memory_mib=50), mps(1, 200, 50),
                          mig(3, "3g.40gb", 4)))
    assert_cluster_matches(c, layout_free)
    g1 = c.gpu((0, 1))
    assert (g1.used_milli, g1.mem_used, g1.tenants) == (500, 150, {"share": 300, "gang2": 200})


def test_release_gives_back_exactly_what_was_taken():
    c = Cluster(inv(cpu=4000, mem=64))
    empty = snapshot(c)
    placements = {"w": P(whole(0, cpu_milli=1000, memory_mib=8), whole(1)),
                  "s": P(mps(2, 250, 1024, cpu_milli=500)),
                  "m": P(mig(3, "2g.20gb", 4, memory_mib=16)),
                  "c": P(SliceAlloc("n0", -1, "cpu", 0, cpu_milli=100))}
    for wid, p in placements.items():
        c.allocate(wid, p)
    assert c.used_milli == 2000 + 250 + 286
    assert_cluster_matches(c, inv(cpu=4000, mem=64))
    for wid in list(placements):
        assert c.release(wid) == placements[wid]
        assert c.release(wid) is None
    assert snapshot(c) == empty


def test_every_slice_of_a_workload_is_released_and_its_tenancy_goes():
    c = Cluster(inv())
    c.allocate("g", P(whole(0), whole(1), whole(2)))
    assert [c.gpu((0, i)).tenants for i in range(3)] == [{"g": 1000}] * 3
    c.release("g")
    assert all(not c.gpu((0, i)).tenants and not c.gpu((0, i)).whole for i in range(3))
    assert list(c.nodes[0].free_whole) == [0, 1, 2]


# ---------------------------------------------------------------- indexes and figures


def test_indexes_follow_every_change():
    inv2 = inv(nodes=2)
    c = Cluster(inv2)
    assert {k: set(b) for k, b in enumerate(c.whole_buckets) if b} == {3: {0, 1}}
    c.allocate("a", P(whole(0)))
    assert {k: set(b) for k, b in enumerate(c.whole_buckets) if b} == {2: {0}, 3: {1}}
    c.allocate("s", P(mps(1, 250)))
    assert {u: set(b) for u, b in c.shared.items()} == {250: {(0, 1)}}
    c.allocate("t", P(mps(1, 750)))
    assert c.shared == {}  # full: no longer a shared GPU with room
    c.release("t")
    assert {u: set(b) for u, b in c.shared.items()} == {250: {(0, 1)}}
    c.allocate("m", P(mig(3, "1g.10gb", 6, node="n1")))
    cls = (H100, None)
    assert {occ: set(b) for occ, b in c.mig_index[cls].items()} == {
        (0, 0): {(0, 3)}, (1 << 6, 1): {(1, 3)}}
    assert_cluster_matches(c, inv2)
    v = c.mig_version[cls]
    c.allocate("m2", P(mig(3, "1g.10gb", 6)))  # n0's GPU joins an existing occupancy
    assert c.mig_version[cls] == v + 1  # (0, 0) left the index
    c.allocate("m3", P(mig(3, "1g.10gb", 5)))
    assert c.mig_version[cls] == v + 2  # a new occupancy appeared (and (1<<6, 1) stays)
    assert_cluster_matches(c, inv2)


def test_stranded_capacity_is_the_free_part_of_partly_used_gpus():
    c = Cluster(inv())
    assert c.stranded_milli() == 0
    c.allocate("s", P(mps(0, 300)))
    c.allocate("w", P(whole(1)))
    c.allocate("m", P(mig(3, "2g.20gb", 0)))
    assert c.stranded_milli() == 700 + round(5 * 1000 / 7)
    c.allocate("t", P(mps(0, 700)))
    assert c.stranded_milli() == round(5 * 1000 / 7)
    assert c.total_milli == 4000


def test_reservations_keep_the_earliest_time_and_clear():
    c = Cluster(inv())
    c.reserve(P(whole(0), whole(1), SliceAlloc("n0", -1, "cpu", 0)), 500.0)
    c.reserve(P(whole(1), whole(2)), 300.0)
    c.reserve(P(whole(0)), 900.0)
    assert [g.reserved_at for g in c.nodes[0].gpus] == [500.0, 300.0, 300.0, INF]
    c.clear_reservations()
    assert [g.reserved_at for g in c.nodes[0].gpus] == [INF] * 4


def test_an_unhealthy_node_leaves_every_index_and_comes_back():
    inv2 = inv(nodes=2)
    c = Cluster(inv2, unhealthy=["n1"])
    assert not c.nodes[1].healthy and c.nodes[0].healthy
    assert_cluster_matches(c, inv2)
    c.allocate("s", P(mps(0, 100, node="n1")))  # allocation itself is not refused
    c.set_healthy("n1", True)
    assert_cluster_matches(c, inv2)
    assert {u: set(b) for u, b in c.shared.items()} == {100: {(1, 0)}}
    c.set_healthy("n1", True)  # no change: nothing indexed twice
    c.set_healthy("n0", False)
    c.set_healthy("n0", False)
    assert_cluster_matches(c, inv2)
    assert {k: set(b) for k, b in enumerate(c.whole_buckets) if b} == {2: {1}}
    c.allocate("w", P(whole(0)))  # on the unhealthy node: nothing reindexed
    c.release("s")
    assert_cluster_matches(c, inv2)
    c.set_healthy("n0", True)
    assert_cluster_matches(c, inv2)


def test_bulk_load_refuses_like_allocate_and_indexes_once():
    base = inv(nodes=2)
    good = [("a", P(whole(0))), ("b", P(mps(1, 400), mps(1, 100, node="n1"))),
            ("c", P(mig(3, "3g.40gb", 4, node="n1")))]
    c = Cluster(base)
    c.load(good)
    assert_cluster_matches(c, base)
    one = Cluster(base)
    for wid, p in good:
        one.allocate(wid, p)
    assert snapshot(one)[:4] == snapshot(c)[:4]
    for bad, words in ((("a", P(whole(2))), "already placed"),
                       (("d", P(mps(1, 601))), "600 milli free, 601 asked")):
        c = Cluster(base)
        with pytest.raises(CapacityError, match=words):
            c.load([*good, bad])
        # what was loaded before the bad record is indexed
        assert_cluster_matches(c, base, dict(c.allocations))


def test_a_copy_of_a_cluster_is_independent():
    c = Cluster(inv())
    c.allocate("a", P(whole(0)))
    d = copy.deepcopy(c)
    d.release("a")
    assert c.allocations and not d.allocations


def test_the_smallest_mps_share_is_one_milli_and_is_indexed_as_shared():
    c = Cluster(inv())
    c.allocate("s", P(mps(0, 1)))
    assert {u: set(b) for u, b in c.shared.items()} == {1: {(0, 0)}}
    assert c.stranded_milli() == 999
    c.allocate("t", P(mps(1, 400)))
    assert c.stranded_milli() == 999 + 600  # every partly used GPU counts
    c.release("s")
    assert {u: set(b) for u, b in c.shared.items()} == {400: {(0, 1)}}
    assert_cluster_matches(c, inv())


def test_nvlink_domains_hold_the_non_mig_gpus_unlisted_ones_in_the_last():
    spec = make_node("n0", H100, 5, mig=(4,), nvlink=((0, 1), (2,)))
    c = Cluster(Inventory((spec, make_node("n1", H100, 2))))
    n0, n1 = c.nodes
    assert n0.domains == [[0, 1], [2, 3]]  # GPU 3 is in no group: the last domain
    assert [g.domain for g in n0.gpus] == [0, 0, 1, 1, 1]
    assert n1.domains == [[0, 1]] and [g.domain for g in n1.gpus] == [0, 0]
    assert [g.layout for g in n0.gpus] == [None] * 5  # carved freely: no fixed layout
    assert c.max_gpus_per_node == 5 and len(c.whole_buckets) == 6
    assert c.total_milli == 7000 and c.used_milli == 0
    assert c.whole_gpu_on_mig is False  # a whole GPU never lands on a MIG GPU unless asked
    empty = Cluster(Inventory((make_node("cpu", H100, 0),)))
    assert empty.max_gpus_per_node == 0 and [set(b) for b in empty.whole_buckets] == [{0}]
    assert empty.nodes[0].domains == [[]]


def test_health_is_false_not_just_falsy():
    c = Cluster(inv(nodes=2), unhealthy=["n1"])
    assert c.nodes[1].healthy is False
    c.set_healthy("n0", False)
    assert c.nodes[0].healthy is False
