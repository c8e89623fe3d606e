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
    c.default_interconnect = "any"  # victim choice's mechanics; the rules: test_interconnect
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


# ---------------------------------------------------------------- edges found by mutation


def test_checkpoints_of_a_short_interval_and_in_the_first_second():
    p = Policy()
    one = w("j", g(0))
    one = replace(one, checkpoint_interval=1.0)
    assert last_checkpoint(one, 10.5, p) == 10.0  # a 1-second interval still rounds down
    assert last_checkpoint(one, 0.5, p) == 0.0  # half a second in: nothing saved yet
    assert last_checkpoint(replace(one, checkpoint_interval=0.0), 0.5, p) == 0.5
    # borrowed GPUs due half a second into the run: saved then
    due = replace(one, checkpoint_interval=60.0, started_at=100.0, backfill_until=100.5)
    assert last_checkpoint(due, 30.0, p) == 0.5


def test_costs_equal_up_to_float_noise_are_equal():
    """A set whose cost differs only by rounding noise (below 1e-9 GPU-hours) from another
    is as cheap: the fewer victims then decide."""
    a, b, c = w("a", g(0)), w("b", g(1)), w("c", g(2))
    noise = {"a": 4e-10, "b": 0.0, "c": 0.0}.__getitem__
    one = set_cost([a], lambda v: 1.0, lambda v: noise(v.id))
    two = set_cost([b, c], lambda v: 1.0, lambda v: noise(v.id))
    assert one[1] == two[1] == 0.0 and one < two
    assert victim_cost(a, 1.0)[1] == 0.0  # no cost given: nothing is thrown away


def test_greedy_gives_back_victims_the_set_does_not_need():
    """Five GPUs to free, no three victims do it: greedy takes a, b, c (each alone on one
    GPU), then s1 and s2 (who share three GPUs); with s1 and s2 gone, c is not needed (a, b
    and the three shared GPUs make five) and is given back — four victims, not five."""
    vs = {x: w(x, g(0)) for x in ("a", "b", "c", "s1", "s2")}
    held = [(None, frozenset({x})) for x in ("a", "b", "c")]
    held += [(None, frozenset({"s1", "s2"})) for _ in range(3)]
    order = {"a": 0, "b": 1, "c": 2, "s1": 3, "s2": 4}
    key = lambda v: (order[v.id],)  # noqa: E731
    sk = lambda s: (sum(order[v.id] for v in s), len(s))  # noqa: E731
    assert ids(_cheapest_freeing_set(held, 5, vs, key, sk)) == ["a", "b", "s1", "s2"]
    # all five are needed for six GPUs
    assert ids(_cheapest_freeing_set(held, 6, vs, key, sk)) == ["a", "b", "c", "s1", "s2"]


def test_greedy_frees_gpus_held_alone_first():
    """Beyond three victims the greedy set takes first those who alone hold a GPU: m shares
    four GPUs with p1..p4 and frees none by itself, s1..s4 each free one."""
    vs = {x: w(x, g(0)) for x in ("m", "p1", "p2", "p3", "p4", "s1", "s2", "s3", "s4")}
    held = [(None, frozenset({"m", f"p{i}"})) for i in range(1, 5)]
    held += [(None, frozenset({f"s{i}"})) for i in range(1, 5)]
    order = {"m": 0, "p1": 1, "p2": 2, "p3": 3, "p4": 4, "s1": 5, "s2": 6, "s3": 7, "s4": 8}
    key = lambda v: (order[v.id],)  # noqa: E731
    sk = lambda s: (sum(order[v.id] for v in s), len(s))  # noqa: E731
    assert ids(_cheapest_freeing_set(held, 4, vs, key, sk)) == ["s1", "s2", "s3", "s4"]
    # a victim alone on two GPUs goes before those alone on one, then by cost
    held2 = [(None, frozenset({"m"})), (None, frozenset({"m"}))]
    held2 += [(None, frozenset({f"s{i}"})) for i in range(1, 5)]
    assert ids(_cheapest_freeing_set(held2, 6, vs, key, sk)) == ["m", "s1", "s2", "s3", "s4"]
    # greedy in cost order, not in the order of names
    rev = {"s1": 4, "s2": 3, "s3": 2, "s4": 1, "m": 9}
    rkey = lambda v: (rev[v.id],)  # noqa: E731
    held3 = [(None, frozenset({f"s{i}"})) for i in range(1, 5)] + [(None, frozenset({"m"}))]
    got = _cheapest_freeing_set(held3, 4, vs, rkey, lambda s: (len(s),))
    assert [v.id for v in got] == ["s4", "s3", "s2", "s1"]
    # five victims share one GPU: all five free it (a GPU held by exactly the chosen set)
    held4 = [(None, frozenset({"p1", "p2", "p3", "p4", "m"}))]
    assert ids(_cheapest_freeing_set(held4, 1, vs, key, sk)) == ["m", "p1", "p2", "p3", "p4"]
    pair = [(None, frozenset({"p1", "p2"}))]
    assert ids(_cheapest_freeing_set(pair, 1, vs, key, sk)) == ["p1", "p2"]


def test_exhaustive_search_looks_at_the_twelve_cheapest_and_up_to_three():
    # 13 victims, named in the reverse order of their cost: the cheapest is a12
    vs = {f"a{i:02d}": w(f"a{i:02d}", g(0)) for i in range(13)}
    key = lambda v: (12 - int(v.id[1:]),)  # noqa: E731
    sk = lambda s: (sum(key(v)[0] for v in s), len(s))  # noqa: E731
    held = [(None, frozenset({x})) for x in vs]
    assert ids(_cheapest_freeing_set(held, 1, vs, key, sk)) == ["a12"]
    # twelve cheap victims share one GPU; the 13th (the dearest) holds one alone
    share = [(None, frozenset(x for x in vs if x != "a00")), (None, frozenset({"a00"}))]
    assert ids(_cheapest_freeing_set(share, 1, vs, key, sk)) == ["a00"]
    # four victims: v4 alone holds two GPUs but is dear; four cheap ones beat any set of three
    v = {f"v{i}": w(f"v{i}", g(0)) for i in range(5)}
    k2 = {"v0": 0, "v1": 1, "v2": 2, "v3": 3, "v4": 100}
    key2 = lambda x: (k2[x.id],)  # noqa: E731
    sk2 = lambda s: (sum(k2[x.id] for x in s), len(s))  # noqa: E731
    held2 = [(None, frozenset({"v4"})), (None, frozenset({"v4"}))]
    held2 += [(None, frozenset({f"v{i}"})) for i in range(4)]
    assert ids(_cheapest_freeing_set(held2, 4, v, key2, sk2)) == ["v0", "v1", "v4"]


def test_whole_gpus_edges_of_choose_victims():
    COSTS.clear()
    COSTS.update({"a": 5.0, "b": 1.0, "u": 1.0, "v": 1.0})
    # a 2-GPU gang: n0 whole once a goes (dear) beats a cheaper set across nodes
    inv = Inventory((make_node("n0", H100, 2), make_node("n1", H100, 1),
                     make_node("n2", H100, 1)))
    a = w("a", g(0), g(1))
    b = w("b", g(0, "n2"))
    c, el = setup(inv, a, b)
    assert ids(choose_victims(c, SliceRequest.whole(2), 0.0, el, standing, cost)) == ["a"]
    # with n0 not whole-freeable, the two GPUs come from two nodes (a 2-GPU gang too)
    c, el = setup(inv, b, ineligible=(a,))
    assert ids(choose_victims(c, SliceRequest.whole(2), 0.0, el, standing, cost)) == ["b"]
    # equal sets: the first found (node order) stands; a reservation at the very end is
    # still fine; an unhealthy first node is passed over, not the end of the search
    inv2 = Inventory((make_node("n0", H100, 1), make_node("n1", H100, 1),
                      make_node("n2", H100, 1)))
    u, v = w("u", g(0, "n1")), w("v", g(0, "n2"))
    z = w("z", g(0, "n0"))
    c, el = setup(inv2, z, u, v)
    el.pop("z")
    assert ids(choose_victims(c, SliceRequest.whole(1), 0.0, el, standing, cost)) == ["u"]
    c.reserve(Placement((g(0, "n1"),)), 100.0)
    assert ids(choose_victims(c, SliceRequest.whole(1), 100.0, el, standing, cost)) == ["u"]
    assert ids(choose_victims(c, SliceRequest.whole(1), 100.5, el, standing, cost)) == ["v"]
    c.set_healthy("n0", False)
    c.set_healthy("n1", False)
    assert ids(choose_victims(c, SliceRequest.whole(1), 0.0, el, standing, cost)) == ["v"]
    # a list of GPU models
    assert ids(choose_victims(c, SliceRequest.whole(1, gpu_model="T4|H100-80GB"), 0.0, el,
                              standing, cost)) == ["v"]
    # host memory is a limit where it is tracked
    inv3 = Inventory((make_node("n0", H100, 1, memory_mib=1000),))
    c, el = setup(inv3, w("q", g(0)))
    assert ids(choose_victims(c, SliceRequest.whole(1, memory_mib=1000), 0.0, el, standing,
                              cost)) == ["q"]
    assert choose_victims(c, SliceRequest.whole(1, memory_mib=1001), 0.0, el, standing,
                          cost) is None
    # MIG tenants never make room for a whole GPU
    inv4 = Inventory((make_node("n0", H100, 2, mig=(0,)),))
    c, el = setup(inv4, w("m", mig(0, "1g.10gb", 0)), ineligible=(w("o", g(1)),))
    assert choose_victims(c, SliceRequest.whole(1), 0.0, el, standing, cost) is None


def test_mig_edges_of_choose_victims():
    COSTS.clear()
    COSTS.update({"v": 0.3, "u": 0.5})
    # an ineligible instance at slots 0-1 blocks start 0 of a 3g.40gb: start 4 is still tried
    inv = one_node(1, mig=(0,))
    o, v = w("o", mig(0, "2g.20gb", 0)), w("v", mig(0, "1g.10gb", 4))
    c, el = setup(inv, v, ineligible=(o,))
    assert ids(choose_victims(c, SliceRequest.mig("3g.40gb"), 0.0, el, standing, cost)) == [
        "v"]
    # asked while the request would fit without anyone going, it still names victims (it is
    # asked only when the request does not fit), never an empty set
    assert ids(choose_victims(c, SliceRequest.mig("1g.10gb"), 0.0, el, standing, cost)) == [
        "v"]
    # the first node unhealthy, the first GPU not MIG, the second node's MIG GPU has the victim
    inv2 = Inventory((make_node("n0", H100, 1, mig=(0,)), make_node("n1", H100, 2, mig=(1,),
                                                                     memory_mib=100)))
    x = w("x", mig(0, "4g.40gb", 0))
    y = w("y", mig(1, "7g.80gb", 0, node="n1"))
    c, el = setup(inv2, x, y)
    c.set_healthy("n0", False)
    assert ids(choose_victims(c, SliceRequest.mig("7g.80gb"), 0.0, el, standing, cost)) == [
        "y"]
    assert ids(choose_victims(c, SliceRequest.mig("7g.80gb", memory_mib=100), 0.0, el,
                              standing, cost)) == ["y"]
    assert choose_victims(c, SliceRequest.mig("7g.80gb", memory_mib=101), 0.0, el, standing,
                          cost) is None
    # a node of two models: the A100-40GB has no 3g.40gb; the H100 after it does
    mixed = replace(make_node("n0", H100, 2, mig=(0, 1)), gpus=(
        replace(make_node("n0", "A100-40GB", 1, mig=(0,)).gpus[0]),
        make_node("n0", H100, 2, mig=(1,)).gpus[1]))
    a40 = w("a40", SliceAlloc("n0", 0, "mig", 143, 0, "1g.5gb"))
    h = w("h", mig(1, "4g.40gb", 0))
    hs = w("hs", mig(1, "3g.40gb", 4))
    c, el = setup(Inventory((mixed,)), a40, h, hs)
    COSTS.update({"h": 0.1, "hs": 0.2, "a40": 0.0})
    assert ids(choose_victims(c, SliceRequest.mig("3g.40gb"), 0.0, el, standing, cost)) == [
        "h"]
    # a fixed layout: only its instances are places for the request
    fixed = one_node(1, mig=(0,), mig_layout={0: (("3g.40gb", 0), ("3g.40gb", 4))})
    c, el = setup(fixed, w("f", mig(0, "3g.40gb", 0)))
    assert ids(choose_victims(c, SliceRequest.mig("3g.40gb"), 0.0, el, standing, cost)) == [
        "f"]
    assert choose_victims(c, SliceRequest.mig("1g.10gb"), 0.0, el, standing, cost) is None


def test_mig_instances_of_a_victim_on_other_gpus_are_not_counted_here():
    """v holds a 1g.10gb on GPU 0 and another on GPU 1 (reserved, so out of the question):
    on GPU 0 it is one victim of cost 0.3, cheaper than u (0.5)."""
    COSTS.clear()
    COSTS.update({"v": 0.3, "u": 0.5})
    inv = one_node(2, mig=(0, 1))
    v = w("v", mig(0, "1g.10gb", 0), mig(1, "1g.10gb", 0))
    u = w("u", mig(0, "1g.10gb", 1))
    fill = w("fill", mig(0, "2g.20gb", 2), mig(1, "2g.20gb", 2))
    fill2 = w("fill2", mig(0, "2g.20gb", 4), mig(1, "2g.20gb", 4))
    fill3 = w("fill3", mig(0, "1g.10gb", 6), mig(1, "1g.10gb", 6))
    c, el = setup(inv, v, u, ineligible=(fill, fill2, fill3))
    c.reserve(Placement((mig(1, "1g.10gb", 0),)), 10.0)
    assert ids(choose_victims(c, SliceRequest.mig("1g.10gb"), 60.0, el, standing, cost)) == [
        "v"]


def test_mps_edges_of_choose_victims():
    COSTS.clear()
    COSTS.update({"s1": 0.1, "s2": 0.2})
    # the first node unhealthy or short of host memory, its first GPU a MIG GPU
    inv = Inventory((make_node("n0", H100, 1), make_node("n1", H100, 2, mig=(0,),
                                                         memory_mib=100)))
    s0 = w("s0", mps(0, 600))
    m = w("m", mig(0, "1g.10gb", 0, node="n1"))
    s1 = w("s1", mps(1, 600, node="n1"))
    c, el = setup(inv, s0, m, s1)
    c.set_healthy("n0", False)
    assert ids(choose_victims(c, SliceRequest.mps(500), 0.0, el, standing, cost)) == ["s1"]
    assert ids(choose_victims(c, SliceRequest.mps(500, memory_mib=100), 0.0, el, standing,
                              cost)) == ["s1"]
    assert choose_victims(c, SliceRequest.mps(500, memory_mib=101), 0.0, el, standing,
                          cost) is None
    # a GPU whose memory is not known: memory never limits
    unknown = Inventory((make_node("n0", "GPU", 1, gpu_memory_mib=0),))
    c, el = setup(unknown, w("s1", mps(0, 600)), w("s2", mps(0, 300)))
    assert ids(choose_victims(c, SliceRequest.mps(300, 100), 0.0, el, standing, cost)) == [
        "s1"]
    # a victim's share on another (reserved) GPU gives no memory here
    inv2 = Inventory((make_node("n0", H100, 2, gpu_memory_mib=1000),))
    v = w("v", mps(0, 300, 100), mps(1, 300, 900))
    o = w("o", mps(0, 300, 800))
    c, el = setup(inv2, v, ineligible=(o,))
    c.reserve(Placement((g(1),)), 10.0)
    assert choose_victims(c, SliceRequest.mps(300, 500), 60.0, el, standing, cost) is None
    assert ids(choose_victims(c, SliceRequest.mps(300, 200), 60.0, el, standing, cost)) == [
        "v"]


def test_mig_compute_limit_beyond_the_overlap_on_a_table_that_needs_it(monkeypatch):
    """With every MIG table NVIDIA ships, the instances overlapping a start always give back
    enough compute slices (each instance has at least one slice per two memory slots and
    the requests at most one per slot). The victim search does not rely on that: on a table
    where compute runs out first, it takes further victims elsewhere on the GPU, cheapest
    first, until the compute slices suffice."""
    from jupyter_gpubudget.core import mig as migtab

    table = {
        "1c.2s": migtab.MigProfile("1c.2s", 1, 2, (0, 2, 4, 6), 10),
        "3c.2s": migtab.MigProfile("3c.2s", 3, 2, (0, 2, 4, 6), 10),
        "3c.top": migtab.MigProfile("3c.top", 3, 2, (6,), 10),
    }
    monkeypatch.setitem(migtab.MIG_TABLES, "X-MIG", table)

    def inst(wid: str, profile: str, start: int) -> Workload:
        return w(wid, SliceAlloc("n0", 0, "mig", table[profile].milli, start, profile))

    COSTS.clear()
    COSTS.update({"x": 0.1, "y": 0.3, "z": 0.2})
    inv = Inventory((make_node("n0", "X-MIG", 1, mig=(0,)),))
    # 7 compute slices in use, slots 6-7 free: the request overlaps nobody, yet needs 3 slices
    x, y, z = inst("x", "1c.2s", 0), inst("y", "3c.2s", 2), inst("z", "3c.2s", 4)
    c, el = setup(inv, x, y, z)
    got = choose_victims(c, SliceRequest.mig("3c.top"), 0.0, el, standing, cost)
    assert [v.id for v in got] == ["x", "z"]  # x (1 slice) is not enough; then z (3)
    # with z ineligible, y is next
    del el["z"]
    got = choose_victims(c, SliceRequest.mig("3c.top"), 0.0, el, standing, cost)
    assert [v.id for v in got] == ["x", "y"]


# ---------------------------------------------------------------- a MIG-mode GPU taken whole


def test_a_one_gpu_request_may_empty_a_mig_gpu_only_when_asked_to():
    """GPU 0 (outside MIG mode) is held by an ineligible job; GPU 1 (MIG mode) by two
    eligible instances. With ``whole_on_mig`` one GPU can be had by preempting both
    instances; without it, or for two GPUs, or with whole MIG GPUs not allowed, there is no
    way. An ineligible instance, a fixed layout without a full-size instance, a reservation,
    a GPU model not asked for, too little host room or an unhealthy node keep the GPU."""
    COSTS.clear()
    x, y = w("x", mig(1, "3g.40gb", 4)), w("y", mig(1, "1g.10gb", 0))
    held = w("held", g(0))
    one = SliceRequest.whole(1)

    def run(inv: Inventory, *, req: SliceRequest = one, end: float = 0.0,
            flag: bool = True, allowed: bool = True, ws: tuple[Workload, ...] = (x, y),
            ineligible: tuple[Workload, ...] = (held,), reserved: float | None = None,
            unhealthy: bool = False):
        c, el = setup(inv, *ws, ineligible=ineligible)
        c.whole_gpu_on_mig = allowed
        if reserved is not None:
            c.nodes[0].gpus[1].reserved_at = reserved
        if unhealthy:
            c.set_healthy("n0", False)
        return ids(choose_victims(c, req, end, el, standing, cost, whole_on_mig=flag))

    inv = one_node(2, mig=(1,), cpu_milli=8000, memory_mib=8192)
    assert run(inv) == ["x", "y"]
    assert run(inv, flag=False) is None
    assert run(inv, allowed=False) is None
    assert run(inv, req=SliceRequest.whole(2)) is None
    assert run(inv, ws=(x,), ineligible=(held, y)) is None  # y may not go
    assert run(inv, reserved=100.0, end=200.0) is None  # held back for a gang
    assert run(inv, reserved=300.0, end=200.0) == ["x", "y"]
    assert run(inv, req=SliceRequest.whole(1, gpu_model="A100-80GB")) is None
    assert run(inv, req=SliceRequest.whole(1, cpu_milli=9000)) is None
    assert run(inv, req=SliceRequest.whole(1, memory_mib=9000)) is None
    assert run(inv, unhealthy=True) is None
    # a free MIG-mode GPU is nobody's to preempt; a GPU outside MIG mode is not "emptied"
    assert run(inv, ws=(), ineligible=(held,)) is None
    small = one_node(2, mig=(1,), mig_layout={1: (("3g.40gb", 4), ("1g.10gb", 0))})
    assert run(small) is None  # no 7g instance in its layout
    full = one_node(2, mig=(1,), mig_layout={1: (("7g.80gb", 0),)})
    z = w("z", mig(1, "7g.80gb", 0))
    assert run(full, ws=(z,)) == ["z"]
    # on a node after one without room: the walk goes on to it
    two = Inventory((make_node("n0", H100, 1, cpu_milli=1000, memory_mib=8192),
                     make_node("n1", H100, 1, mig=(0,), cpu_milli=8000, memory_mib=8192)))
    c, el = setup(two, w("far", SliceAlloc("n1", 0, "mig", 429, 4, "3g.40gb")),
                  ineligible=(held,))
    c.whole_gpu_on_mig = True
    assert ids(choose_victims(c, SliceRequest.whole(1, cpu_milli=2000), 0.0, el, standing,
                              cost, whole_on_mig=True)) == ["far"]


def test_a_full_size_instance_is_possible_on_a_carved_gpu_or_a_layout_that_has_one():
    from jupyter_gpubudget.core.preemption import _full_instance_ok

    c = Cluster(one_node(4, mig=(1, 2, 3), mig_layout={
        2: (("7g.80gb", 0),), 3: (("3g.40gb", 0), ("3g.40gb", 4))}))
    assert [_full_instance_ok(c.nodes[0].gpus[i]) for i in (1, 2, 3)] == [True, True, False]
    assert _full_instance_ok(Cluster(Inventory((make_node("n0", "T4", 1, mig=(0,)),))
                                     ).nodes[0].gpus[0]) is False  # no MIG table at all


def test_a_gang_counts_the_idle_mig_gpus_it_may_take_and_preempts_fewer():
    """Three one-GPU jobs hold node n0; node m has two idle MIG-mode GPUs. A 4-GPU gang
    cannot be had at all unless it may take the MIG-mode GPUs (``gang_on_mig``): then by
    preempting two of the jobs, or three with one MIG-mode GPU kept spare."""
    COSTS.clear()
    jobs = [w(f"j{i}", g(i)) for i in range(3)]
    inv = Inventory((make_node("n0", H100, 3), make_node("m", H100, 2, mig=(0, 1))))
    gang = SliceRequest.whole(4)

    def run(on: bool, spare: int = 0) -> list[str] | None:
        c, el = setup(inv, *jobs)
        c.gang_on_mig, c.gang_on_mig_spare = on, spare
        return ids(choose_victims(c, gang, 0.0, el, standing, cost))

    assert run(False) is None
    assert run(True) == ["j0", "j1"]  # equal in all else: by id
    assert run(True, spare=1) == ["j0", "j1", "j2"]
    assert run(True, spare=2) is None
    # MIG-mode GPUs of another model than the gang asks for are not counted
    a100 = Inventory((make_node("n0", H100, 3), make_node("m", "A100-80GB", 2, mig=(0, 1))))
    c, el = setup(a100, *jobs)
    c.gang_on_mig = True
    assert choose_victims(c, SliceRequest.whole(4, gpu_model=H100), 0.0, el, standing,
                          cost) is None
    assert ids(choose_victims(c, gang, 0.0, el, standing, cost)) == ["j0", "j1"]
