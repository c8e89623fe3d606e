"""Whom to preempt (docs/core.md, "Preemption — only when it pays"; semantics 2 and 4), by
hand: the order of victims (stopping, unbacked, idle, then backed; then cost), the order of
sets (all-unbacked first, then the cheapest, then the fewest), and ``choose_victims`` for
whole GPUs on one node, gangs across nodes, MIG instances and MPS shares, with ineligible
holders, reservations, GPU models, host room and unhealthy nodes in the way."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jupyter_gpubudget.core.capacity import Cluster
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import (
    HOUR,
    Placement,
    Policy,
    SliceAlloc,
    SliceRequest,
    Workload,
)
from jupyter_gpubudget.core.preemption import (
    _cheapest_freeing_set,
    choose_victims,
    last_checkpoint,
    lost_seconds,
    preemption_cost,
    set_cost,
    standing_gap,
    victim_cost,
)

H100 = "H100-80GB"


def w(wid: str, *slices: SliceAlloc, backed: bool = True, idle: bool = False,
      stopping: bool = False, resumable: bool = True, project: str = "b",
      started: float = 0.0, snapshot: float = 0.0) -> Workload:
    return Workload(wid, project, "u", SliceRequest.whole(1), 0.0, resumable=resumable,
                    started_at=started, placement=Placement(tuple(slices)), backed=backed,
                    idle=idle, stopping=stopping, snapshot_cost=snapshot)


def g(gpu: int, node: str = "n0") -> SliceAlloc:
    return SliceAlloc(node, gpu)


def mps(gpu: int, milli: int, mem: int = 0, node: str = "n0") -> SliceAlloc:
    return SliceAlloc(node, gpu, "mps", milli, -1, None, mem)


def mig(gpu: int, profile: str, start: int, node: str = "n0") -> SliceAlloc:
    from jupyter_gpubudget.core.mig import profiles_for

    return SliceAlloc(node, gpu, "mig", profiles_for(H100)[profile].milli, start, profile)


def setup(inv: Inventory, *ws: Workload, ineligible: tuple[Workload, ...] = ()
          ) -> tuple[Cluster, dict[str, Workload]]:
    c = Cluster(inv)
    for x in (*ws, *ineligible):
        assert x.placement is not None
        c.allocate(x.id, x.placement)
    return c, {x.id: x for x in ws}


def ids(vs) -> list[str] | None:
    return None if vs is None else sorted(v.id for v in vs)


def one_node(gpus: int = 4, **kw) -> Inventory:
    return Inventory((make_node("n0", H100, gpus, **kw),))


COSTS = {}


def cost(v: Workload) -> float:
    return COSTS.get(v.id, 1.0)


def standing(v: Workload) -> float:
    return {"b": 2.0, "c": 5.0}.get(v.project, 1.0)


# ---------------------------------------------------------------- what is lost


def test_checkpoints_and_lost_work_at_the_edges():
    p = Policy()  # checkpoint every 1800 s, reload 120 s
    job = w("j", g(0))
    assert last_checkpoint(job, -5.0, p) == 0.0  # clock skew: nothing negative
    assert last_checkpoint(job, 3599.0, p) == 1800.0
    assert last_checkpoint(job, 3600.0, p) == 3600.0
    # a backfilled job also saves when its borrowed GPUs are due: not before its start,
    # not in the future
    due = replace(job, started_at=100.0, backfill_until=1000.0)
    assert last_checkpoint(due, 899.0, p) == 0.0  # due 900 s into its run: not yet
    assert last_checkpoint(due, 900.0, p) == 900.0
    assert last_checkpoint(replace(due, backfill_until=50.0), 1000.0, p) == 0.0
    assert last_checkpoint(replace(due, started_at=None), 1000.0, p) == 0.0
    assert last_checkpoint(replace(job, checkpoint_interval=-1.0), 700.0, p) == 700.0
    assert lost_seconds(job, -10.0, p) == 120.0
    assert lost_seconds(replace(job, resumable=False), -10.0, p) == 0.0
    assert lost_seconds(replace(job, restart_overhead=-3.0), 10.0, p) == 10.0
    assert lost_seconds(replace(job, snapshot_cost=-3.0), 10.0, p) == 130.0
    assert lost_seconds(replace(job, snapshot_cost=7.0), 10.0, p) == 137.0
    # a session that is not resumable still loses only its snapshot and restore
    nb = replace(job, kind="interactive", resumable=False, snapshot_cost=30.0)
    assert lost_seconds(nb, 5000.0, p) == 150.0
    # a debug job checkpoints like batch work
    assert lost_seconds(replace(job, kind="debug"), 2000.0, p) == 320.0


def test_preemption_cost_weights_by_the_slice_and_counts_from_now_when_not_started():
    p = Policy()
    share = w("s", mps(0, 250), resumable=False, started=1000.0)
    assert preemption_cost(share, 1000.0 + 3600.0, p) == pytest.approx(0.25)
    assert preemption_cost(replace(share, started_at=None), 5000.0, p) == 0.0
    two = w("t", g(0), g(1), started=0.0)
    assert preemption_cost(two, 1800.0 + 60.0, p) == pytest.approx(2 * 180.0 / HOUR)


def test_standing_gap_edges():
    assert standing_gap(0.0, 0.0) == 0.0  # nobody stands above anyone
    assert standing_gap(-1.0, 0.0) == 0.0  # a victim at 0 never stands "above"
    assert standing_gap(0.0, 2.0) == 1.0
    assert standing_gap(1.5, 2.0) == 0.25
    assert standing_gap(float("inf"), float("inf")) == 1.0


# ---------------------------------------------------------------- the order of victims


def test_victims_go_stopping_then_unbacked_then_idle_then_backed():
    stopping = w("s", g(0), stopping=True)
    unbacked = w("u", g(0), backed=False)
    idle = w("i", g(0), idle=True)
    backed = w("b", g(0))
    order = sorted([backed, idle, unbacked, stopping], key=lambda v: victim_cost(v, 1.0, 0.0))
    assert [v.id for v in order] == ["s", "u", "i", "b"]
    # unbacked and idle: first by kind, whatever they cost
    assert victim_cost(unbacked, 1.0, 9.0) < victim_cost(idle, 1.0, 0.0)
    assert victim_cost(idle, 1.0, 9.0) < victim_cost(backed, 1.0, 0.0)
    # within a class: cheaper, then the account standing higher, then resumable, then cheap
    # to snapshot, then the most recently started, then by id
    assert victim_cost(backed, 1.0, 0.5) < victim_cost(backed, 1.0, 0.6)
    assert victim_cost(backed, 3.0, 0.5) < victim_cost(backed, 2.0, 0.5)
    assert victim_cost(backed, 1.0, 0.5) < victim_cost(replace(backed, resumable=False), 1.0, 0.5)
    assert victim_cost(replace(backed, snapshot_cost=1.0), 1.0, 0.5) < victim_cost(
        replace(backed, snapshot_cost=2.0), 1.0, 0.5)
    assert victim_cost(replace(backed, started_at=20.0), 1.0, 0.5) < victim_cost(
        replace(backed, started_at=10.0), 1.0, 0.5)
    assert victim_cost(replace(backed, started_at=None), 1.0, 0.5)[5] == 0.0
    assert victim_cost(replace(backed, id="a"), 1.0, 0.5) < victim_cost(backed, 1.0, 0.5)
    assert victim_cost(backed, 1.0, 0.1234567891)[1] == 0.123456789


def test_sets_go_all_unbacked_then_cheapest_then_fewest():
    u1, u2 = w("u1", g(0), backed=False), w("u2", g(1), backed=False, resumable=False)
    b = w("b", g(2))
    idle = w("i", g(3), idle=True)
    st = {"u1": 1.0, "u2": 3.0, "b": 2.0, "i": 0.5}
    c = {"u1": 1.0, "u2": 1.0, "b": 0.1, "i": 0.1}
    S = lambda *vs: set_cost(list(vs), lambda v: st[v.id], lambda v: c[v.id])  # noqa: E731
    assert S(u1, u2) == (0, 2.0, 2, 1, -4.0)
    assert S(b) == (1, 0.1, 1, 0, -2.0)
    assert S(u1, u2) < S(b)  # all unbacked first, though dearer
    assert S(idle) == S(b)[:1] + (0.1, 1, 0, -0.5)  # an idle session is backed work here
    assert S(u1) < S(u1, u2)
    stopping = w("s", g(0), stopping=True)
    assert set_cost([stopping, b], lambda v: 2.0, lambda v: 5.0) == (1, 5.0, 1, 0, -2.0)
    assert set_cost([stopping], lambda v: 2.0, lambda v: 5.0) == (0, 0.0, 0, 0, -0.0)
    assert set_cost([b], lambda v: float("inf"))[4] == -1e9
    assert set_cost([b], lambda v: 1.0) == (1, 0.0, 1, 0, -1.0)  # default cost: 0


# ---------------------------------------------------------------- whole GPUs


def test_whole_gpus_on_one_node_the_cheapest_freeing_set():
    COSTS.clear()
    COSTS.update({"a": 0.5, "b": 0.3, "c": 0.3, "d": 2.0})
    a, b, cc = w("a", g(0)), w("b", g(1)), w("c", g(2))
    d = w("d", g(3))
    c, el = setup(one_node(), a, b, cc, d)
    assert ids(choose_victims(c, SliceRequest.whole(1), 0.0, el, standing, cost)) == ["b"]
    assert ids(choose_victims(c, SliceRequest.whole(2), 0.0, el, standing, cost)) == ["b", "c"]
    assert ids(choose_victims(c, SliceRequest.whole(3), 0.0, el, standing, cost)) == [
        "a", "b", "c"]
    assert ids(choose_victims(c, SliceRequest.whole(4), 0.0, el, standing, cost)) == [
        "a", "b", "c", "d"]
    assert choose_victims(c, SliceRequest.whole(5, single_node=True), 0.0, el, standing,
                          cost) is None
    assert choose_victims(c, SliceRequest.whole(1), 0.0, {}, standing, cost) is None


def test_a_gpu_is_freed_only_when_all_its_holders_go_and_none_is_ineligible():
    COSTS.clear()
    COSTS.update({"s1": 0.1, "s2": 0.1, "x": 0.5})
    s1, s2 = w("s1", mps(0, 300)), w("s2", mps(0, 300))
    x = w("x", g(1))
    keep = w("keep", mps(2, 100))
    c, el = setup(one_node(3), s1, s2, x, ineligible=(keep,))
    # GPU 0: both shares (0.2) beat the single whole job (0.5)
    assert ids(choose_victims(c, SliceRequest.whole(1), 0.0, el, standing, cost)) == [
        "s1", "s2"]
    COSTS["s2"] = 0.45
    assert ids(choose_victims(c, SliceRequest.whole(1), 0.0, el, standing, cost)) == ["x"]
    # GPU 2's holder is not eligible: 3 GPUs can never be freed
    assert choose_victims(c, SliceRequest.whole(3), 0.0, el, standing, cost) is None
    assert ids(choose_victims(c, SliceRequest.whole(2), 0.0, el, standing, cost)) == [
        "s1", "s2", "x"]


def test_free_gpus_count_and_only_what_is_missing_is_freed():
    COSTS.clear()
    a = w("a", g(0))
    c, el = setup(one_node(3), a)
    # GPUs 1 and 2 are free: a 3-GPU request needs only a
    assert ids(choose_victims(c, SliceRequest.whole(3), 0.0, el, standing, cost)) == ["a"]
    # a 2-GPU request fits already: nothing to free on this node
    assert choose_victims(c, SliceRequest.whole(2), 0.0, el, standing, cost) is None


def test_unbacked_victims_go_before_cheaper_backed_and_idle_ones():
    """Semantics 4: a set of unbacked work only, though dearer, before an idle session or
    backed work."""
    COSTS.clear()
    COSTS.update({"unbacked": 3.0, "idle": 0.2, "backed": 0.1})
    ub = w("unbacked", g(0), backed=False)
    idle = w("idle", g(1), idle=True)
    backed = w("backed", g(2))
    c, el = setup(one_node(3), ub, idle, backed)
    assert ids(choose_victims(c, SliceRequest.whole(1), 0.0, el, standing, cost)) == [
        "unbacked"]
    del el["unbacked"]
    assert ids(choose_victims(c, SliceRequest.whole(1), 0.0, el, standing, cost)) == [
        "backed"]


def test_reserved_gpus_other_models_unhealthy_nodes_and_host_room_are_left_alone():
    COSTS.clear()
    inv = Inventory((make_node("n0", H100, 2, cpu_milli=1000),
                     make_node("n1", "A100-80GB", 1, cpu_milli=8000)))
    a, b = w("a", g(0)), w("b", g(1))
    z = w("z", g(0, "n1"))
    c, el = setup(inv, a, b, z)
    c.reserve(Placement((g(0),)), 50.0)
    req = SliceRequest.whole(1, gpu_model=H100)
    assert ids(choose_victims(c, req, 60.0, el, standing, cost)) == ["b"]
    assert len(choose_victims(c, req, 50.0, el, standing, cost)) == 1
    assert choose_victims(c, SliceRequest.whole(2, gpu_model=H100), 60.0, el, standing,
                          cost) is None
    assert ids(choose_victims(c, SliceRequest.whole(1, gpu_model="A100-80GB"), 0.0, el,
                              standing, cost)) == ["z"]
    # n0 has too little CPU for the request
    assert ids(choose_victims(c, SliceRequest.whole(1, cpu_milli=2000), 0.0, el, standing,
                              cost)) == ["z"]
    c.set_healthy("n1", False)
    assert choose_victims(c, SliceRequest.whole(1, cpu_milli=2000), 0.0, el, standing,
                          cost) is None


def test_a_gang_across_nodes_frees_the_cheapest_gpus_everywhere():
    COSTS.clear()
    COSTS.update({"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4})
    inv = Inventory((make_node("n0", H100, 2), make_node("n1", H100, 2),
                     make_node("n2", H100, 1)))
    a, b = w("a", g(0, "n0")), w("b", g(0, "n1"))
    cc, d = w("c", g(1, "n1")), w("d", g(0, "n2"))
    c, el = setup(inv, a, b, cc, d)  # n0's GPU 1 is free
    # 3 GPUs: one free + the two cheapest (a on n0 frees n0 whole; b on n1)
    got = choose_victims(c, SliceRequest.whole(3), 0.0, el, standing, cost)
    assert ids(got) == ["a", "b"]
    assert ids(choose_victims(c, SliceRequest.whole(5), 0.0, el, standing, cost)) == [
        "a", "b", "c", "d"]
    assert choose_victims(c, SliceRequest.whole(6), 0.0, el, standing, cost) is None
    assert choose_victims(c, SliceRequest.whole(3, single_node=True), 0.0, el, standing,
                          cost) is None
    # a 2-GPU gang fits on n0 alone once a goes: that single-node set is what is chosen
    assert ids(choose_victims(c, SliceRequest.whole(2), 0.0, el, standing, cost)) == ["a"]


def test_cheapest_freeing_set_exhaustive_up_to_three_then_greedy():
    COSTS.clear()
    vs = {f"v{i}": w(f"v{i}", g(i)) for i in range(5)}
    gpus = [(None, frozenset({f"v{i}"})) for i in range(5)]
    key = lambda v: (COSTS.get(v.id, int(v.id[1:])),)  # noqa: E731
    sk = lambda s: (sum(key(v)[0] for v in s), len(s))  # noqa: E731
    assert ids(_cheapest_freeing_set(gpus, 2, vs, key, sk)) == ["v0", "v1"]
    # four GPUs: beyond three victims, greedy in key order
    assert ids(_cheapest_freeing_set(gpus, 4, vs, key, sk)) == ["v0", "v1", "v2", "v3"]
    # a victim holding two GPUs frees them both at once
    two = [(None, frozenset({"v4"})), (None, frozenset({"v4"})), (None, frozenset({"v0"}))]
    assert ids(_cheapest_freeing_set(two, 2, vs, key, sk)) == ["v4"]
    assert _cheapest_freeing_set(two, 4, vs, key, sk) is None
    # a GPU held by two victims needs both
    pair = [(None, frozenset({"v1", "v2"})), (None, frozenset({"v3"}))]
    assert ids(_cheapest_freeing_set(pair, 1, vs, key, sk)) == ["v3"]
    assert ids(_cheapest_freeing_set(pair, 2, vs, key, sk)) == ["v1", "v2", "v3"]


# ---------------------------------------------------------------- MIG and MPS


def test_mig_victims_overlapping_the_slot_and_for_the_compute_limit():
    COSTS.clear()
    COSTS.update({"big": 0.5, "s6": 0.1, "s5": 0.2, "s4": 0.3})
    inv = one_node(1, mig=(0,))
    big = w("big", mig(0, "4g.40gb", 0))  # slots 0-3, 4 compute slices
    s6, s5, s4 = w("s6", mig(0, "1g.10gb", 6)), w("s5", mig(0, "1g.10gb", 5)), w(
        "s4", mig(0, "1g.10gb", 4))
    c, el = setup(inv, big, s6, s5, s4)  # 7 compute slices in use: nothing fits
    # a 1g.10gb: any one instance frees a slot and a slice: the cheapest, s6
    assert ids(choose_victims(c, SliceRequest.mig("1g.10gb"), 0.0, el, standing, cost)) == [
        "s6"]
    # a 3g.40gb at slot 4: the three small ones; at 0: the 4g (0.5) plus nothing else? It
    # frees 4 slices: 3 + 3 = 6 ≤ 7: the 4g alone is cheaper (0.5 < 0.6)
    assert ids(choose_victims(c, SliceRequest.mig("3g.40gb"), 0.0, el, standing, cost)) == [
        "big"]
    COSTS["big"] = 0.7
    assert ids(choose_victims(c, SliceRequest.mig("3g.40gb"), 0.0, el, standing, cost)) == [
        "s4", "s5", "s6"]
    # the 7g needs everything
    assert ids(choose_victims(c, SliceRequest.mig("7g.80gb"), 0.0, el, standing, cost)) == [
        "big", "s4", "s5", "s6"]
    del el["s4"]  # an ineligible holder in the way of slot 4 and of the 7g
    assert ids(choose_victims(c, SliceRequest.mig("3g.40gb"), 0.0, el, standing, cost)) == [
        "big"]
    assert choose_victims(c, SliceRequest.mig("7g.80gb"), 0.0, el, standing, cost) is None
    assert choose_victims(c, SliceRequest.mig("1g.5gb"), 0.0, el, standing, cost) is None
    assert choose_victims(c, SliceRequest.mig("1g.10gb", gpu_model="A100-80GB"), 0.0, el,
                          standing, cost) is None


def test_mig_compute_limit_takes_extra_victims_elsewhere_on_the_gpu():
    COSTS.clear()
    COSTS.update({"a": 0.1, "b": 0.2, "c": 0.3})
    inv = one_node(1, mig=(0,))
    # 2g at 0 and 2 and 4 (6 slices, slots 0-5), slots 6-7 free: a 2g.20gb has no slot
    # at 6 and 6 + 2 > 7 slices: the cheapest overlapping one goes, and that is enough
    a, b, cc = w("a", mig(0, "2g.20gb", 0)), w("b", mig(0, "2g.20gb", 2)), w(
        "c", mig(0, "2g.20gb", 4))
    c, el = setup(inv, a, b, cc)
    assert ids(choose_victims(c, SliceRequest.mig("2g.20gb"), 0.0, el, standing, cost)) == [
        "a"]
    c.allocate("x", Placement((mig(0, "1g.10gb", 6),)))  # 7 slices now, x not eligible
    # 1g.20gb at 6 is blocked by x; at 0/2/4 by a/b/c: one of them, the cheapest
    assert ids(choose_victims(c, SliceRequest.mig("1g.20gb"), 0.0, el, standing, cost)) == [
        "a"]
    # 3g.40gb at 0: a and b overlap (4 slices back: 7 - 4 + 3 = 6): enough
    assert ids(choose_victims(c, SliceRequest.mig("3g.40gb"), 0.0, el, standing, cost)) == [
        "a", "b"]


def test_mps_victims_cheapest_first_until_the_share_and_its_memory_fit():
    COSTS.clear()
    COSTS.update({"s1": 0.1, "s2": 0.2, "s3": 0.3})
    inv = Inventory((make_node("n0", H100, 2, gpu_memory_mib=1000),))
    s1, s2, s3 = w("s1", mps(0, 300, 100)), w("s2", mps(0, 300, 100)), w("s3", mps(0, 400, 700))
    other = w("other", g(1))
    c, el = setup(inv, s1, s2, s3, ineligible=(other,))
    assert ids(choose_victims(c, SliceRequest.mps(300), 0.0, el, standing, cost)) == ["s1"]
    assert ids(choose_victims(c, SliceRequest.mps(600), 0.0, el, standing, cost)) == [
        "s1", "s2"]
    # memory: 100 MiB free; 500 asked: s1, s2 give 200 more (300), then s3 (1000)
    assert ids(choose_victims(c, SliceRequest.mps(100, 500), 0.0, el, standing, cost)) == [
        "s1", "s2", "s3"]
    assert ids(choose_victims(c, SliceRequest.mps(100, 300), 0.0, el, standing, cost)) == [
        "s1", "s2"]
    assert choose_victims(c, SliceRequest.mps(100, 1001), 0.0, el, standing, cost) is None
    # an ineligible share first in line stops the walk on that GPU
    COSTS["s1"] = 9.0
    del el["s2"]
    assert ids(choose_victims(c, SliceRequest.mps(400), 0.0, el, standing, cost)) == ["s3"]
    assert choose_victims(c, SliceRequest.mps(800), 0.0, el, standing, cost) is None
    assert choose_victims(c, SliceRequest.mps(100, gpu_model="T4"), 0.0, el, standing,
                          cost) is None
