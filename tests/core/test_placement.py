"""Where a request goes (docs/core.md, "Placement"), each rule on a cluster small enough to
work out by hand: best fit for whole GPUs, the tightest NVLink domain, gangs on the fewest
nodes in one rack, MIG instances on partitioned GPUs at the slot that keeps the most room,
MPS shares on the fullest GPU, CPU-only work away from free GPUs, an idle MIG GPU taken whole,
reservations (semantics 5) and GPU models. The plain packing rules hold where no FGD index is
attached (a bare Cluster; ``placement: pack``)."""

from __future__ import annotations

from jupyter_gpubudget.core import mig as migtab
from jupyter_gpubudget.core.capacity import Cluster
from jupyter_gpubudget.core.inventory import Inventory, carve, make_node
from jupyter_gpubudget.core.model import Placement, SliceAlloc, SliceRequest
from jupyter_gpubudget.core.placement import (
    _models,
    _pick_in_node,
    full_profile,
    idle_mig_for_gangs,
    place,
    place_cpu,
    place_mig,
    place_mps,
    place_whole,
    whole_on_mig,
)

H100 = "H100-80GB"


def cluster(*nodes, unhealthy=()) -> Cluster:
    """A capacity model whose gangs accept any links (``interconnect: any``): these tests
    are about placement's mechanics; the interconnect's rules are test_interconnect.py's."""
    c = Cluster(Inventory(tuple(nodes)), unhealthy)
    c.default_interconnect = "any"
    return c


def node(name: str, gpus: int = 4, rack: str = "r0", **kw):
    return make_node(name, kw.pop("model", H100), gpus, rack=rack, **kw)


def busy(c: Cluster, wid: str, where: str, *gpus: int) -> None:
    c.allocate(wid, Placement(tuple(SliceAlloc(where, g) for g in gpus)))


def share(c: Cluster, wid: str, where: str, gpu: int, milli: int, mem: int = 0) -> None:
    c.allocate(wid, Placement((SliceAlloc(where, gpu, "mps", milli, -1, None, mem),)))


def gpus_of(p: Placement | None) -> list[tuple[str, int]]:
    assert p is not None
    return [(s.node, s.gpu) for s in p.slices]


# ---------------------------------------------------------------- whole GPUs


def test_whole_gpus_go_to_the_node_with_the_fewest_free_that_fits():
    c = cluster(node("n0"), node("n1"), node("n2"))
    busy(c, "x", "n0", 0, 1)  # n0: 2 free
    busy(c, "y", "n1", 0)  # n1: 3 free; n2: 4 free
    assert gpus_of(place(c, SliceRequest.whole(1), 0.0)) == [("n0", 2)]
    assert gpus_of(place(c, SliceRequest.whole(2), 0.0)) == [("n0", 2), ("n0", 3)]
    assert gpus_of(place(c, SliceRequest.whole(3), 0.0)) == [("n1", 1), ("n1", 2), ("n1", 3)]
    assert gpus_of(place(c, SliceRequest.whole(4), 0.0)) == [("n2", i) for i in range(4)]


def test_a_whole_gpu_request_asks_its_host_cpu_of_the_first_gpu_node_only():
    c = cluster(node("n0", cpu_milli=4000), node("n1", cpu_milli=16000))
    busy(c, "x", "n0", 0)  # n0 is the better fit, but has too little CPU for 8 cores
    p = place(c, SliceRequest.whole(2, cpu_milli=8000, memory_mib=7), 0.0)
    assert gpus_of(p) == [("n1", 0), ("n1", 1)]
    assert [(s.cpu_milli, s.memory_mib) for s in p.slices] == [(8000, 7), (0, 0)]
    p = place(c, SliceRequest.whole(2, cpu_milli=4000), 0.0)
    assert gpus_of(p) == [("n0", 1), ("n0", 2)]


def test_the_tightest_nvlink_domain_that_fits_and_the_fullest_domains_otherwise():
    c = cluster(node("n", 8, nvlink=((0, 1, 2, 3), (4, 5, 6, 7))))
    busy(c, "x", "n", 0, 1)  # domain 0: 2 free; domain 1: 4 free
    assert gpus_of(place(c, SliceRequest.whole(2), 0.0)) == [("n", 2), ("n", 3)]
    assert gpus_of(place(c, SliceRequest.whole(3), 0.0)) == [("n", 4), ("n", 5), ("n", 6)]
    # 5 fit no domain: the fullest domain first (4 of domain 1), then domain 0
    assert gpus_of(place(c, SliceRequest.whole(5), 0.0)) == [
        ("n", 4), ("n", 5), ("n", 6), ("n", 7), ("n", 2)]
    n = c.nodes[0]
    assert _pick_in_node(n, [2, 3, 4, 5, 6, 7], 1) == [2]  # ties: the lower domain
    busy(c, "y", "n", 4, 5)  # both domains have 2 free now
    assert _pick_in_node(n, [2, 3, 6, 7], 2) == [2, 3]
    assert _pick_in_node(n, [2, 3, 6, 7], 3) == [2, 3, 6]


def test_gangs_take_the_fewest_nodes_and_one_rack_when_one_suffices():
    c = cluster(node("n0", rack="r0"), node("n1", rack="r0"), node("n2", rack="r1"),
                node("n3", rack="r1"))
    busy(c, "a", "n0", 0)  # r0: n0 3 free, n1 2 free
    busy(c, "b", "n1", 0, 1)
    busy(c, "c", "n3", 0, 1, 2)  # r1: n2 4 free, n3 1 free
    # 5 GPUs: r0 gives 3 + 2 on two nodes, r1 gives 4 + 1 on two: a tie, the first rack;
    # across racks the fullest nodes would be n2 + n0
    assert gpus_of(place(c, SliceRequest.whole(5), 0.0)) == [
        ("n0", 1), ("n0", 2), ("n0", 3), ("n1", 2), ("n1", 3)]
    # 6 fit only across racks: the fullest nodes first, fewest nodes
    assert gpus_of(place(c, SliceRequest.whole(6), 0.0)) == [
        ("n2", 0), ("n2", 1), ("n2", 2), ("n2", 3), ("n0", 1), ("n0", 2)]
    assert place(c, SliceRequest.whole(6, single_node=True), 0.0) is None
    assert place(c, SliceRequest.whole(11), 0.0) is None  # 10 free in all
    assert len(place(c, SliceRequest.whole(10), 0.0).slices) == 10


def test_a_gang_puts_its_host_needs_on_a_node_that_has_room():
    """The fullest node has no CPU left: the gang still starts, its CPU on the other node
    (it was once refused although it fitted)."""
    c = cluster(node("a", 4, cpu_milli=1000), node("b", 1, cpu_milli=8000))
    c.allocate("hog", Placement((SliceAlloc("a", -1, "cpu", 0, cpu_milli=1000),)))
    p = place(c, SliceRequest.whole(5, cpu_milli=2000), 0.0)
    assert gpus_of(p) == [("b", 0), ("a", 0), ("a", 1), ("a", 2), ("a", 3)]
    assert [s.cpu_milli for s in p.slices] == [2000, 0, 0, 0, 0]
    c.allocate("gang", p)
    # the host node among the fullest ones goes first, keeping the fewest nodes
    c2 = cluster(node("a", 4, cpu_milli=1000), node("b", 2, cpu_milli=8000),
                 node("c", 1, cpu_milli=8000))
    c2.allocate("hog", Placement((SliceAlloc("a", -1, "cpu", 0, cpu_milli=1000),)))
    p = place(c2, SliceRequest.whole(6, cpu_milli=2000), 0.0)
    assert gpus_of(p) == [("b", 0), ("b", 1), ("a", 0), ("a", 1), ("a", 2), ("a", 3)]
    # no node with free GPUs has the room: nothing
    c3 = cluster(node("a", 2, cpu_milli=1000), node("b", 2, cpu_milli=1000))
    assert place(c3, SliceRequest.whole(3, cpu_milli=2000), 0.0) is None


def test_unhealthy_nodes_get_nothing():
    c = cluster(node("n0", 2), node("n1", 1), unhealthy=["n1"])
    assert gpus_of(place(c, SliceRequest.whole(1), 0.0)) == [("n0", 0)]
    assert place(c, SliceRequest.whole(3), 0.0) is None
    assert place(c, SliceRequest.mps(100), 0.0).slices[0].node == "n0"
    c.set_healthy("n1", True)
    assert gpus_of(place(c, SliceRequest.whole(1), 0.0)) == [("n1", 0)]


def test_gpu_models_restrict_where_work_goes():
    c = cluster(node("a", 2, model="A100-80GB"), node("h", 3, model=H100))
    assert _models(SliceRequest.whole(1, gpu_model="A100-80GB|T4")) == frozenset(
        {"A100-80GB", "T4"})
    assert _models(SliceRequest.whole(1)) is None
    assert gpus_of(place(c, SliceRequest.whole(1, gpu_model=H100), 0.0)) == [("h", 0)]
    assert gpus_of(place(c, SliceRequest.whole(1, gpu_model="T4|A100-80GB"), 0.0)) == [
        ("a", 0)]
    assert place(c, SliceRequest.whole(3, gpu_model="A100-80GB"), 0.0) is None
    assert place(c, SliceRequest.whole(1, gpu_model="T4"), 0.0) is None
    assert len(place(c, SliceRequest.whole(5, gpu_model="A100-80GB|H100-80GB"), 0.0).slices) == 5
    assert place(c, SliceRequest.whole(4, gpu_model="H100-80GB"), 0.0) is None
    assert place(c, SliceRequest.mps(100, gpu_model="T4"), 0.0) is None
    assert place(c, SliceRequest.mps(100, gpu_model="A100-80GB"), 0.0).slices[0].node == "a"


def test_reserved_gpus_take_only_work_that_ends_in_time():
    """Semantics 5: a GPU reserved from time T takes work predicted to end by T (T itself
    included), nothing that would still run then."""
    c = cluster(node("n0", 2))
    c.reserve(Placement((SliceAlloc("n0", 0),)), 100.0)
    assert gpus_of(place(c, SliceRequest.whole(1), 100.0)) == [("n0", 0)]
    assert gpus_of(place(c, SliceRequest.whole(1), 101.0)) == [("n0", 1)]
    assert place(c, SliceRequest.whole(2), 101.0) is None
    assert gpus_of(place(c, SliceRequest.whole(2), 50.0)) == [("n0", 0), ("n0", 1)]
    assert place(c, SliceRequest.whole(2, single_node=True), 101.0) is None
    # shares and gangs across nodes respect it too
    assert gpus_of(place(c, SliceRequest.mps(300), 101.0)) == [("n0", 1)]
    c2 = cluster(node("n0", 1), node("n1", 1))
    c2.reserve(Placement((SliceAlloc("n1", 0),)), 10.0)
    assert place(c2, SliceRequest.whole(2), 11.0) is None
    assert len(place(c2, SliceRequest.whole(2), 10.0).slices) == 2
    busy(c2, "x", "n0", 0)
    assert place(c2, SliceRequest.mps(100), 11.0) is None
    assert place(c2, SliceRequest.mps(100), 9.0) is not None


# ---------------------------------------------------------------- a whole MIG GPU


def test_an_idle_mig_gpu_is_taken_whole_on_the_node_with_the_fewest_of_them():
    c = cluster(node("n0", 3, mig=(1, 2)), node("n1", 2, mig=(0,)))
    c.whole_gpu_on_mig = True
    busy(c, "x", "n0", 0)
    busy(c, "y", "n1", 1)
    # no non-MIG GPU free: n1 has one idle MIG GPU, n0 two: keep n0's together
    p = place(c, SliceRequest.whole(1), 0.0)
    (s,) = p.slices
    assert (s.node, s.gpu, s.kind, s.profile, s.milli, s.mig_start) == (
        "n1", 0, "mig", "7g.80gb", 1000, 0)
    assert full_profile(H100).name == "7g.80gb" and full_profile("T4") is None
    c.allocate("w", p)
    # an instance on n0's GPU 1 makes it busy: GPU 2 is the idle one left
    c.allocate("m", Placement((SliceAlloc("n0", 1, "mig", 143, 6, "1g.10gb"),)))
    assert gpus_of(place(c, SliceRequest.whole(1), 0.0)) == [("n0", 2)]
    assert place(c, SliceRequest.whole(2), 0.0) is None  # only ever one GPU
    c.whole_gpu_on_mig = False
    assert place(c, SliceRequest.whole(1), 0.0) is None


def test_a_whole_mig_gpu_respects_models_reservations_host_and_layouts():
    c = cluster(node("n0", 2, mig=(0, 1), cpu_milli=4000))
    c.reserve(Placement((SliceAlloc("n0", 0),)), 50.0)
    assert gpus_of(whole_on_mig(c, SliceRequest.whole(1), 60.0, None)) == [("n0", 1)]
    assert gpus_of(whole_on_mig(c, SliceRequest.whole(1), 50.0, None)) == [("n0", 0)]
    assert whole_on_mig(c, SliceRequest.whole(1), 60.0, frozenset({"A100-80GB"})) is None
    assert whole_on_mig(c, SliceRequest.whole(1, cpu_milli=4001), 0.0, None) is None
    p = whole_on_mig(c, SliceRequest.whole(1, cpu_milli=4000, memory_mib=3), 0.0, None)
    assert (p.slices[0].cpu_milli, p.slices[0].memory_mib) == (4000, 3)
    small = carve(H100, [("3g.40gb", None), ("4g.40gb", None)])
    full = carve(H100, [("7g.80gb", None)])
    c2 = Cluster(Inventory((make_node("n0", H100, 2, mig=(0, 1),
                                      mig_layout={0: small, 1: full}),)))
    assert gpus_of(whole_on_mig(c2, SliceRequest.whole(1), 0.0, None)) == [("n0", 1)]
    c2.allocate("w", whole_on_mig(c2, SliceRequest.whole(1), 0.0, None))
    assert whole_on_mig(c2, SliceRequest.whole(1), 0.0, None) is None


def test_a_gang_across_nodes_takes_idle_mig_gpus_only_when_allowed_and_leaves_the_spare():
    c = cluster(node("n0", 4, cpu_milli=8000), node("m", 4, mig=(0, 1, 2, 3)))
    six = SliceRequest.whole(6, cpu_milli=100, memory_mib=10)
    assert place(c, six, 0.0) is None  # off: the MIG-mode GPUs serve no gang
    c.gang_on_mig, c.gang_on_mig_spare = True, 2
    p = place(c, six, 0.0)
    assert p is not None
    assert [(s.node, s.gpu, s.kind, s.profile, s.milli) for s in p.slices] == [
        ("n0", 0, "gpu", None, 1000), ("n0", 1, "gpu", None, 1000),
        ("n0", 2, "gpu", None, 1000), ("n0", 3, "gpu", None, 1000),
        ("m", 0, "mig", "7g.80gb", 1000), ("m", 1, "mig", "7g.80gb", 1000)]
    # the host's CPU and memory go with the first slice only
    assert [(s.cpu_milli, s.memory_mib) for s in p.slices] == [(100, 10)] + [(0, 0)] * 5
    c.gang_on_mig_spare = 3
    assert place(c, six, 0.0) is None  # three of the four stay idle: one is offered
    assert gpus_of(place(c, SliceRequest.whole(5), 0.0))[-1] == ("m", 0)
    c.gang_on_mig_spare = 0
    # a one-node request never spans nodes; nor is a gang ever placed beyond what exists
    assert place(c, SliceRequest.whole(6, single_node=True), 0.0) is None
    assert place(c, SliceRequest.whole(9), 0.0) is None
    # the placement is a real one: capacity takes it and gives it back
    c.allocate("g", place(c, SliceRequest.whole(8), 0.0))
    assert idle_mig_for_gangs(c, None, 0.0) == [] and c.used_milli == 8000
    c.release("g")
    assert c.used_milli == 0 and len(c.nodes[0].free_whole) == 4


def test_a_gang_anchored_on_a_mig_mode_node_gets_exact_slices_of_the_models_it_asks():
    """The MIG-mode node has the most GPUs to give, so it comes first and carries the host's
    CPU and memory; the A100 MIG-mode GPUs are not offered to a gang that asks for H100s; a
    fixed layout that has the full-size instance is offered."""
    full = carve(H100, [("7g.80gb", None)])
    c = cluster(node("n", 1), node("m", 3, mig=(0, 1, 2), mig_layout={2: full}),
                node("a", 4, mig=(0, 1, 2, 3), model="A100-80GB"))
    c.gang_on_mig, c.gang_on_mig_spare = True, 0
    req = SliceRequest.whole(4, gpu_model=H100, cpu_milli=500, memory_mib=64)
    p = place(c, req, 0.0)
    assert p is not None and list(p.slices) == [
        SliceAlloc("m", 0, "mig", 1000, 0, "7g.80gb", 0, 500, 64),
        SliceAlloc("m", 1, "mig", 1000, 0, "7g.80gb", 0, 0, 0),
        SliceAlloc("m", 2, "mig", 1000, 0, "7g.80gb", 0, 0, 0),
        SliceAlloc("n", 0, "gpu", 1000, -1, None, 0, 0, 0)]
    assert place(c, SliceRequest.whole(5, gpu_model=H100), 0.0) is None  # A100s not offered


def test_a_node_with_both_kinds_of_gpu_offers_them_together_to_a_gang():
    c = cluster(node("n", 4, mig=(2, 3)), node("o", 2))
    c.gang_on_mig = True
    c.gang_on_mig_spare = 0
    p = place(c, SliceRequest.whole(5), 0.0)
    assert [(s.node, s.gpu, s.kind) for s in p.slices] == [
        ("n", 0, "gpu"), ("n", 1, "gpu"), ("n", 2, "mig"), ("n", 3, "mig"), ("o", 0, "gpu")]


def test_idle_mig_gpus_for_gangs_skip_busy_reserved_other_models_and_fixed_layouts():
    small = carve(H100, [("3g.40gb", None), ("4g.40gb", None)])
    c = cluster(node("a", 3, mig=(0, 1, 2)), node("b", 2, mig=(0, 1), mig_layout={1: small}),
                node("x", 1, mig=(0,), model="A100-80GB"))
    assert idle_mig_for_gangs(c, None, 0.0) == []  # off
    c.gang_on_mig = True

    def offered(models=None, end=0.0):
        return [(n.name, idx) for n, idx in idle_mig_for_gangs(c, models, end)]

    # the nodes with the most idle ones first; b's GPU 1 has no full-size instance
    assert offered() == [("a", [0, 1, 2]), ("b", [0]), ("x", [0])]
    c.allocate("m", Placement((SliceAlloc("a", 1, "mig", 143, 6, "1g.10gb"),)))
    c.reserve(Placement((SliceAlloc("a", 2),)), 50.0)
    assert offered(end=60.0) == [("a", [0]), ("b", [0]), ("x", [0])]
    assert offered(end=50.0) == [("a", [0, 2]), ("b", [0]), ("x", [0])]
    assert offered(frozenset({"A100-80GB"})) == [("x", [0])]
    c.gang_on_mig_spare = 1  # kept on each node: its highest-numbered idle ones
    assert offered(end=50.0) == [("a", [0])]
    assert offered(end=60.0) == []
    c.set_healthy("a", False)
    assert offered(end=50.0) == []
    c.set_healthy("a", True)
    c.gang_on_mig_spare = 2
    assert offered(end=50.0) == []
    c.gang_on_mig_spare = 9
    assert offered() == []
    c.set_healthy("a", False)
    c.gang_on_mig_spare = 0
    assert offered() == [("b", [0]), ("x", [0])]


# ---------------------------------------------------------------- MIG instances


def test_mig_instances_go_to_a_partitioned_gpu_at_the_slot_that_keeps_most_room():
    c = cluster(node("n0", 2, mig=(0, 1)))
    c.allocate("a", Placement((SliceAlloc("n0", 1, "mig", 143, 6, "1g.10gb"),)))
    # GPU 1 is partitioned (slot 6): 1g.10gb at 4 or 5 leaves as much room; the higher slot
    p = place(c, SliceRequest.mig("1g.10gb"), 0.0)
    (s,) = p.slices
    assert (s.gpu, s.mig_start, s.profile, s.milli, s.kind) == (1, 5, "1g.10gb", 143, "mig")
    c.allocate("b", p)
    # a 4g.40gb still fits on it at slot 0 (the partitioned GPU first)
    s = place(c, SliceRequest.mig("4g.40gb"), 0.0).slices[0]
    assert (s.gpu, s.mig_start, s.milli) == (1, 0, 571)
    # 3g.40gb only fits at 0 on GPU 1 (4-7 hold the small ones): there
    s = place(c, SliceRequest.mig("3g.40gb"), 0.0).slices[0]
    assert (s.gpu, s.mig_start) == (1, 0)
    # 7g.80gb needs an empty GPU
    s = place(c, SliceRequest.mig("7g.80gb"), 0.0).slices[0]
    assert (s.gpu, s.mig_start) == (0, 0)
    # an empty GPU: small instances fill from the top
    c2 = cluster(node("n0", 1, mig=(0,)))
    assert place(c2, SliceRequest.mig("1g.10gb"), 0.0).slices[0].mig_start == 6
    assert place(c2, SliceRequest.mig("2g.20gb"), 0.0).slices[0].mig_start == 4
    assert place(c2, SliceRequest.mig("1g.20gb"), 0.0).slices[0].mig_start == 6
    assert place(c2, SliceRequest.mig("3g.40gb"), 0.0).slices[0].mig_start == 4


def test_mig_placement_respects_profiles_models_layouts_reservations_and_hosts():
    c = cluster(node("a", 1, mig=(0,), model="A100-40GB", cpu_milli=1000),
                node("h", 1, mig=(0,), cpu_milli=1000))
    assert place(c, SliceRequest.mig("1g.5gb"), 0.0).slices[0].node == "a"
    assert place(c, SliceRequest.mig("2g.20gb"), 0.0).slices[0].node == "h"
    # 1g.10gb is a profile of both models (on an A100-40GB it takes two memory slots)
    assert place(c, SliceRequest.mig("1g.10gb", gpu_model="A100-40GB"), 0.0).slices[0].node == "a"
    assert place(c, SliceRequest.mig("1g.10gb", gpu_model=H100), 0.0).slices[0].node == "h"
    assert place(c, SliceRequest.mig("1g.5gb", gpu_model=H100), 0.0) is None
    assert place(c, SliceRequest.mig("9g.99gb"), 0.0) is None
    assert place(c, SliceRequest.mig("2g.20gb", cpu_milli=1001), 0.0) is None
    s = place(c, SliceRequest.mig("2g.20gb", cpu_milli=1000, memory_mib=2), 0.0).slices[0]
    assert (s.cpu_milli, s.memory_mib) == (1000, 2)
    c.reserve(Placement((SliceAlloc("h", 0),)), 5.0)
    assert place(c, SliceRequest.mig("2g.20gb"), 6.0) is None
    assert place(c, SliceRequest.mig("2g.20gb"), 5.0).slices[0].node == "h"
    assert place(c, SliceRequest.mig("1g.10gb"), 6.0).slices[0].node == "a"
    fixed = carve(H100, [("3g.40gb", 4), ("1g.10gb", 3)])
    c2 = Cluster(Inventory((make_node("n", H100, 2, mig=(0, 1), mig_layout={0: fixed}),)))
    # the fixed GPU has a 1g.10gb at slot 3 only; the carved GPU 1 is empty. Both are
    # unpartitioned: slot 6 of GPU 1 keeps more room (a 4g.40gb, a 3g.40gb at 0, ...)
    # than slot 3 of GPU 0
    s = place_mig(c2, SliceRequest.mig("1g.10gb"), 0.0).slices[0]
    assert (s.gpu, s.mig_start) == (1, 6)
    assert migtab.potential(H100, 1 << 6, 1) == 62 and migtab.potential(H100, 1 << 3, 1) == 42
    c2.allocate("x", Placement((SliceAlloc("n", 0, "mig", 429, 4, "3g.40gb"),)))
    s = place_mig(c2, SliceRequest.mig("1g.10gb"), 0.0).slices[0]
    assert (s.gpu, s.mig_start) == (0, 3)  # GPU 0 is partitioned now: first
    c2.allocate("y", Placement((s,)))
    s = place_mig(c2, SliceRequest.mig("1g.10gb"), 0.0).slices[0]
    assert (s.gpu, s.mig_start) == (1, 6)
    assert place_mig(c2, SliceRequest.mig("4g.40gb"), 0.0).slices[0].gpu == 1


def test_the_mig_choice_cache_follows_occupancy_changes():
    c = cluster(node("n0", 2, mig=(0, 1)))
    first = place(c, SliceRequest.mig("4g.40gb"), 0.0)
    c.allocate("a", first)
    second = place(c, SliceRequest.mig("4g.40gb"), 0.0)
    assert gpus_of(first) != gpus_of(second)  # the first GPU's slots 0-3 are taken now
    c.allocate("b", second)
    assert place(c, SliceRequest.mig("4g.40gb"), 0.0) is None
    c.release("a")
    assert gpus_of(place(c, SliceRequest.mig("4g.40gb"), 0.0)) == gpus_of(first)


# ---------------------------------------------------------------- MPS and CPU only


def test_mps_shares_go_to_the_fullest_gpu_that_fits_then_open_one_on_the_fullest_node():
    c = cluster(node("n0", 2), node("n1", 4))
    share(c, "a", "n0", 0, 600)
    share(c, "b", "n1", 0, 300)
    assert gpus_of(place_mps(c, SliceRequest.mps(400), 0.0)) == [("n0", 0)]  # 1000 exactly
    assert gpus_of(place_mps(c, SliceRequest.mps(500), 0.0)) == [("n1", 0)]
    # 800 fits no shared GPU: a free GPU on the node with the fewest free (n0: 1, n1: 3)
    p = place_mps(c, SliceRequest.mps(800, 123), 0.0)
    assert gpus_of(p) == [("n0", 1)]
    s = p.slices[0]
    assert (s.kind, s.milli, s.gpu_memory_mib, s.mig_start, s.profile) == (
        "mps", 800, 123, -1, None)
    assert place_mps(c, SliceRequest.mps(1001), 0.0) is None
    assert place_mps(c, SliceRequest.mps(0), 0.0) is None
    assert gpus_of(place_mps(c, SliceRequest.mps(1000), 0.0)) == [("n0", 1)]


def test_mps_shares_respect_gpu_memory_and_host_room():
    c = cluster(node("n0", 2, cpu_milli=2000, gpu_memory_mib=1000))
    share(c, "a", "n0", 0, 500, 900)
    assert gpus_of(place_mps(c, SliceRequest.mps(100, 100), 0.0)) == [("n0", 0)]
    assert gpus_of(place_mps(c, SliceRequest.mps(100, 101), 0.0)) == [("n0", 1)]
    assert place_mps(c, SliceRequest.mps(100, 1001), 0.0) is None
    p = place_mps(c, SliceRequest.mps(100, cpu_milli=2000, memory_mib=5), 0.0)
    assert (p.slices[0].cpu_milli, p.slices[0].memory_mib) == (2000, 5)
    assert place_mps(c, SliceRequest.mps(100, cpu_milli=2001), 0.0) is None


def test_cpu_only_work_goes_where_the_fewest_gpus_are_free():
    c = cluster(node("n0", 2, cpu_milli=4000), node("n1", 1, cpu_milli=4000),
                node("n2", 0, cpu_milli=1000))
    s = place_cpu(c, SliceRequest.cpu_only(cpu_milli=1000, memory_mib=9)).slices[0]
    assert (s.node, s.gpu, s.kind, s.milli, s.cpu_milli, s.memory_mib) == (
        "n2", -1, "cpu", 0, 1000, 9)
    assert place(c, SliceRequest.cpu_only(cpu_milli=2000), 0.0).slices[0].node == "n1"
    assert place_whole(c, SliceRequest.whole(0, cpu_milli=2000), 0.0).slices[0].node == "n1"
    assert place(c, SliceRequest.cpu_only(cpu_milli=4001), 0.0) is None


def test_mig_profiles_fit_where_slots_and_compute_allow():
    assert migtab.fits_in(H100, None, "1g.10gb", 0, 0) == [0, 1, 2, 3, 4, 5, 6]
    assert migtab.fits_in(H100, frozenset({("1g.10gb", 2)}), "1g.10gb", 0, 0) == [2]
    assert migtab.fits_in(H100, frozenset({("1g.10gb", 2)}), "1g.10gb", 0b100, 1) == []
    assert migtab.fits_in(H100, frozenset(), "1g.10gb", 0, 0) == []


# ---------------------------------------------------------------- edges found by mutation

INF = float("inf")


def gpu(n: str, i: int, cpu: int = 0, mem: int = 0) -> SliceAlloc:
    """A whole GPU exactly as placement writes it (host CPU and memory on the first slice)."""
    return SliceAlloc(n, i, "gpu", 1000, -1, None, 0, cpu, mem)


def test_every_kind_of_slice_word_for_word():
    c = cluster(node("n0", 2, mig=(1,), cpu_milli=8000, memory_mib=8000))
    req = SliceRequest(kind="cpu", cpu_milli=500, memory_mib=100)
    assert place_cpu(c, req) == Placement((SliceAlloc("n0", -1, "cpu", 0, -1, None, 0, 500,
                                                      100),))
    assert place(c, SliceRequest.whole(1, cpu_milli=300, memory_mib=40), INF) == Placement(
        (gpu("n0", 0, 300, 40),))
    assert place(c, SliceRequest.mig("1g.10gb", cpu_milli=7, memory_mib=8), INF) == Placement(
        (SliceAlloc("n0", 1, "mig", 143, 6, "1g.10gb", 0, 7, 8),))
    assert place(c, SliceRequest.mps(250, 1000, cpu_milli=5, memory_mib=6), INF) == Placement(
        (SliceAlloc("n0", 0, "mps", 250, -1, None, 1000, 5, 6),))
    assert whole_on_mig(c, SliceRequest.whole(1, cpu_milli=9, memory_mib=10), INF,
                        None) == Placement((SliceAlloc("n0", 1, "mig", 1000, 0, "7g.80gb", 0, 9,
                                                       10),))
    # host memory is a limit for a whole MIG GPU too
    assert whole_on_mig(c, SliceRequest.whole(1, memory_mib=8001), INF, None) is None


def test_a_gang_anchors_on_a_node_with_host_room():
    # the two fullest nodes have no host room for the gang's CPU; n2 has: it takes the host
    # part and two GPUs, the fullest node the rest — and no node without GPUs in the gang
    c = cluster(node("n0", cpu_milli=1000), node("n1", cpu_milli=1000),
                node("n2", 2, cpu_milli=8000))
    p = place(c, SliceRequest.whole(6, cpu_milli=4000), INF)
    assert p == Placement((gpu("n2", 0, 4000), gpu("n2", 1), gpu("n0", 0), gpu("n0", 1),
                           gpu("n0", 2), gpu("n0", 3)))
    # one of the fullest nodes has room: it goes first with the host part
    c = cluster(node("n0", cpu_milli=1000), node("n1", cpu_milli=8000))
    p = place(c, SliceRequest.whole(6, cpu_milli=4000), INF)
    assert p == Placement((gpu("n1", 0, 4000), gpu("n1", 1), gpu("n0", 0), gpu("n0", 1),
                           gpu("n0", 2), gpu("n0", 3)))
    # exactly enough on the fullest nodes: nothing from a third
    c = cluster(node("n0", 2), node("n1", 2), node("n2", 2, cpu_milli=8000))
    busy(c, "x", "n2", 0)
    p = place(c, SliceRequest.whole(4), INF)
    assert gpus_of(p) == [("n0", 0), ("n0", 1), ("n1", 0), ("n1", 1)]


def test_the_tightest_nvlink_domain_that_fits():
    n = node("n0", 5, nvlink=((0, 1, 2), (3, 4)))
    c = cluster(n)
    assert _pick_in_node(c.nodes[0], [0, 1, 2, 3, 4], 2) == [3, 4]
    assert _pick_in_node(c.nodes[0], [0, 1, 2, 3, 4], 3) == [0, 1, 2]


def test_mps_and_mig_edges():
    c = cluster(node("n0", 1), node("n1", 1, model="A100-80GB"))
    assert place(c, SliceRequest.mps(1), INF) == Placement(
        (SliceAlloc("n0", 0, "mps", 1, -1, None, 0, 0, 0),))  # one milli is a share
    share(c, "s", "n1", 0, 300)
    # the shared A100 would be the fullest, but the request wants an H100
    assert gpus_of(place(c, SliceRequest.mps(300, gpu_model=H100), INF)) == [("n0", 0)]
    # a MIG class without the profile does not end the search
    c = cluster(node("n0", 1, mig=(0,), model="A100-40GB"), node("n1", 1, mig=(0,)))
    assert gpus_of(place(c, SliceRequest.mig("3g.40gb"), INF)) == [("n1", 0)]
    # as good a start on two GPUs: the first found (node order) is kept
    lay = carve(H100, [("1g.10gb", 6)])
    c = cluster(node("n0", 1, mig=(0,)), node("n1", 1, mig=(0,), mig_layout={0: lay}))
    assert place(c, SliceRequest.mig("1g.10gb"), INF).slices[0].node == "n0"


def test_a_whole_mig_gpu_from_the_node_with_fewest_idle_ones():
    c = cluster(node("n0", 2, mig=(0, 1)), node("n1", 4, mig=(0,)),
                node("n2", 1, mig=(0,), model="A100-80GB"))
    busy(c, "x", "n1", 1, 2, 3)
    # n1 has one idle MIG GPU (its busy GPUs are not MIG), n0 two
    assert gpus_of(whole_on_mig(c, SliceRequest.whole(1), INF, None)) == [("n1", 0)]
    # a model filter passes over the classes of other models
    got = whole_on_mig(c, SliceRequest.whole(1), INF, frozenset({"A100-80GB"}))
    assert gpus_of(got) == [("n2", 0)]


def test_a_mig_occupancy_whose_gpus_are_all_held_back_passes_to_the_next():
    # GPU 0 is partitioned (preferred) but reserved for a gang before this work would end
    c = cluster(node("n0", 2, mig=(0, 1)))
    c.allocate("m", Placement((SliceAlloc("n0", 0, "mig", 143, 6, "1g.10gb"),)))
    c.reserve(Placement((SliceAlloc("n0", 0),)), 10.0)
    assert gpus_of(place(c, SliceRequest.mig("1g.10gb"), 5.0)) == [("n0", 0)]
    assert gpus_of(place(c, SliceRequest.mig("1g.10gb"), 100.0)) == [("n0", 1)]


# ---------------------------------------------------------------- MIG-mode GPUs first


def test_an_mps_share_as_the_smallest_mig_instance_of_each_model():
    """``mps_as_mig``: of each MIG model the smallest profile with the share's compute and GPU
    memory; across models the smallest of those (the first model on a tie); GPU models
    asked for, host room and exact edges respected; charged the share's milli, with its
    host CPU and memory."""
    from jupyter_gpubudget.core.sharing import mps_as_mig

    three = cluster(make_node("h", H100, 1, mig=(0,), cpu_milli=4000, memory_mib=4096),
                    make_node("a", "A100-40GB", 1, mig=(0,), cpu_milli=4000, memory_mib=4096),
                    make_node("x", "H200-141GB", 1, mig=(0,), cpu_milli=4000,
                              memory_mib=4096))

    def got(c: Cluster, req: SliceRequest) -> tuple[str, str | None, int] | None:
        p = mps_as_mig(c, req, 0.0)
        return None if p is None else (p.slices[0].node, p.slices[0].profile,
                                       p.slices[0].milli)

    # 10 % with 15,000 MiB: H100 1g.20gb (1 compute, 2 slots), A100-40 3g.20gb, H200
    # 1g.18gb (1, 1): the H200's is the smallest, though it comes last
    req = SliceRequest.mps(100, 15000, cpu_milli=1000, memory_mib=1024)
    assert got(three, req) == ("x", "1g.18gb", 100)
    (sl,) = mps_as_mig(three, req, 0.0).slices  # type: ignore[union-attr]
    assert (sl.kind, sl.gpu, sl.mig_start, sl.gpu_memory_mib, sl.cpu_milli, sl.memory_mib) == (
        "mig", 0, 6, 0, 1000, 1024)
    for model, where, profile in (("H100-80GB", "h", "1g.20gb"), ("A100-40GB", "a", "3g.20gb"),
                                  ("A100-40GB|H100-80GB", "h", "1g.20gb")):
        assert got(three, SliceRequest.mps(100, 15000, gpu_model=model)) == (
            where, profile, 100)
    assert got(three, SliceRequest.mps(100, 15000, gpu_model="A100-80GB")) is None
    # exact edges: 286 milli is 2g's own (2/7); 20,480 MiB is 20 GB, 20,481 is not
    assert got(three, SliceRequest.mps(286, 20000, gpu_model=H100)) == ("h", "2g.20gb", 286)
    assert got(three, SliceRequest.mps(287, 20000, gpu_model=H100)) == ("h", "3g.40gb", 287)
    assert got(three, SliceRequest.mps(100, 20480, gpu_model=H100)) == ("h", "1g.20gb", 100)
    assert got(three, SliceRequest.mps(100, 20481, gpu_model=H100)) == ("h", "3g.40gb", 100)
    # a model where nothing fits is passed over, not the end of the search
    # (60,000 MiB: the H100's 7g, none on the A100-40, the H200's 3g.71gb)
    assert got(three, SliceRequest.mps(100, 60000)) == ("x", "3g.71gb", 100)
    # equal smallest profiles: the first model's GPU
    twins = cluster(make_node("p", "A100-80GB", 1, mig=(0,)), make_node("q", H100, 1, mig=(0,)))
    assert got(twins, SliceRequest.mps(250, 20000)) == ("p", "2g.20gb", 250)
    # host room: the node that has it
    assert got(three, SliceRequest.mps(100, 15000, cpu_milli=5000)) is None
    assert got(three, SliceRequest.mps(100, 15000, memory_mib=5000)) is None
    roomy = cluster(make_node("h", H100, 1, mig=(0,), cpu_milli=1000, memory_mib=1024),
                    make_node("x", "H200-141GB", 1, mig=(0,), cpu_milli=500, memory_mib=4096))
    assert got(roomy, SliceRequest.mps(100, 15000, cpu_milli=800)) == ("h", "1g.20gb", 100)
    assert got(roomy, SliceRequest.mps(100, 15000, memory_mib=2048)) == ("x", "1g.18gb", 100)
    # no MIG-mode GPU at all
    assert got(cluster(node("n", 2)), SliceRequest.mps(100)) is None


def test_place_mps_tries_a_mig_instance_only_when_asked_and_before_a_fresh_gpu():
    c = cluster(node("n", 2), make_node("m", H100, 1, mig=(0,)))
    share(c, "s", "n", 0, 900)
    req = SliceRequest.mps(250, 20000)
    assert gpus_of(place_mps(c, req, 0.0)) == [("n", 1)]  # off: a fresh GPU
    c.mps_on_mig = True
    p = place_mps(c, req, 0.0)
    assert p is not None and p.slices[0].node == "m" and p.slices[0].profile == "2g.20gb"
    assert gpus_of(place_mps(c, SliceRequest.mps(100), 0.0)) == [("n", 0)]  # room first


def test_mig_first_takes_an_idle_mig_gpu_before_a_free_one_for_one_gpu_only():
    c = cluster(node("n", 2), make_node("m", H100, 1, mig=(0,)),
                make_node("a", "A100-80GB", 1, mig=(0,)))
    c.whole_gpu_on_mig = True
    assert gpus_of(place_whole(c, SliceRequest.whole(1), 0.0)) == [("n", 0)]
    c.mig_first = True
    p = place_whole(c, SliceRequest.whole(1), 0.0)
    assert p is not None and p.slices[0].node == "m" and p.slices[0].profile == "7g.80gb"
    p = place_whole(c, SliceRequest.whole(1, gpu_model="A100-80GB"), 0.0)
    assert p is not None and p.slices[0].node == "a"
    assert gpus_of(place_whole(c, SliceRequest.whole(2), 0.0)) == [("n", 0), ("n", 1)]
