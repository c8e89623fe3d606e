"""The scheduler's rules one at a time, with figures chosen to be exact in binary so that
each boundary (≤ against <, the margin, the toll) is tested where it lies: when a preemption
pays (docs/core.md, "Preemption — only when it pays"), how much sooner capacity frees anyway,
the arrival order of the incremental path, backing level by level (semantics 4), and the
bookkeeping of promised protected time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jupyter_gpubudget.core.model import (
    HOUR,
    ChargeInterval,
    Placement,
    Policy,
    Preempt,
    Reserve,
    SliceAlloc,
    SliceRequest,
    Start,
)
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule

from .helpers import inventory, job, tree

NOW = 1000 * HOUR
POW2 = """
accounts:
  lab:
    grant: 128
    children:
      a: {grant: 64}
      b: {grant: 64}
"""


def used(project: str, hours: float) -> ChargeInterval:
    return ChargeInterval(f"u-{project}", project, "x", 1000, NOW - hours * HOUR, NOW)


def held(wid: str, project: str, gpu: int = 0, *, since: float = 780.0, backed: bool = True,
         **kw):
    w = job(wid, project, resumable=True, limit=10 * HOUR, **kw)
    return replace(w, started_at=NOW - since, backed=backed,
                   placement=Placement((SliceAlloc("n0", gpu),)))


def preempted(ds) -> list[tuple[str, str]]:
    return [(d.workload, d.reason) for d in ds if isinstance(d, Preempt)]


def contention(toll: float, margin: float = 0.25, victim_backed: bool = True,
               b_used: float = 32.0, idle: bool = False, a_min: float = 2 * HOUR):
    """One GPU, held by b's resumable job (780 s in: 780 s + 120 s reload = 0.25 GPU-h
    lost). a (nothing used of 64) asks for it with 2 protected hours. b has used 32 of 64."""
    victim = held("v", "b", backed=victim_backed, kind="interactive" if idle else "batch")
    if idle:
        victim = replace(victim, idle=True, checkpoint_interval=1800.0)
    state = ClusterState(tree(POW2), inventory(gpus=1),
                         Policy(preemption_toll=toll, preemption_margin=margin),
                         running=[victim], pending=[job("r", "a", min_runtime=a_min)],
                         charges=[used("b", b_used)])
    return schedule(state, NOW)


def test_a_preemption_pays_exactly_up_to_its_gain():
    """Gain: a's 2 protected GPU-hours × gap. After its run a stands at 2/64, with the 25 %
    margin at 0.0390625; b stands at 0.5: gap (0.5 − 0.0390625) / 0.5 = 0.921875, gain
    1.84375 GPU-h. Cost: 0.25 + the toll. A toll of 1.59375 makes them equal: it pays."""
    assert preempted(contention(1.59375)) == [("v", "project b stands above a (loses 1.84 GPU-h)")]
    assert preempted(contention(1.59376)) == []
    # without the margin the gap is (0.5 − 0.03125) / 0.5 = 0.9375: gain 1.875
    assert preempted(contention(1.625, margin=0.0)) == [
        ("v", "project b stands above a (loses 1.88 GPU-h)")]
    assert preempted(contention(1.62501, margin=0.0)) == []
    # b not above a by the margin: nothing, however cheap
    assert preempted(contention(0.0, b_used=2.5)) == []  # 2.5/64 = 0.0390625: no gap
    # 3/64 = 0.046875: gap 1/6, gain 1/3 GPU-h ≥ 0.25 lost
    assert [w for w, _ in preempted(contention(0.0, b_used=3.0))] == ["v"]
    assert preempted(contention(0.0, b_used=2.8)) == []  # gap 0.107: gain 0.214 < 0.25


def test_unbacked_and_idle_victims_and_their_reasons():
    """Unbacked b counts the protected runs promised to it, like backing does; an idle
    session yields with a gap of 1 (gain 2 GPU-h), whatever the standings."""
    got = preempted(contention(0.0, victim_backed=False))
    assert got == [("v", "unbacked work yields to backed work (loses 0.25 GPU-h)")]
    # idle: a full gap even though b stands below a
    got = preempted(contention(1.75, idle=True, b_used=0.0))
    assert got == [("v", "an idle session yields to waiting work (loses 2.00 GPU-h)")]
    assert preempted(contention(1.76, idle=True, b_used=0.0)) == []


def test_the_gain_is_what_the_preemption_moves_earlier():
    """b's job is predicted to end in 30 min: preempting it buys a 30 min of its 2 h,
    0.5 × 0.921875 = 0.4609375 GPU-h, against 0.25 lost + toll."""
    victim = replace(held("v", "b"), time_limit=780.0 + 1800.0)
    for toll, expect in ((0.2109375, ["v"]), (0.211, [])):
        state = ClusterState(tree(POW2), inventory(gpus=1), Policy(preemption_toll=toll),
                             running=[victim], pending=[job("r", "a", min_runtime=2 * HOUR)],
                             charges=[used("b", 32.0)])
        assert [w for w, _ in preempted(schedule(state, NOW))] == expect


def test_work_asking_no_protection_gains_its_predicted_run_capped_like_protection():
    s = Scheduler(tree(POW2), inventory(gpus=1))
    assert s.gain_horizon(job("x1", "a", min_runtime=2 * HOUR)) == 2 * HOUR
    assert s.gain_horizon(job("x2", "a", min_runtime=100 * HOUR)) == 48 * HOUR  # batch cap
    assert s.gain_horizon(job("x3", "a", limit=3 * HOUR)) == 3 * HOUR
    assert s.gain_horizon(job("x4", "a", limit=100 * HOUR)) == 48 * HOUR
    assert s.gain_horizon(job("x5", "a", kind="interactive", limit=100 * HOUR)) == 8 * HOUR
    assert s.gain_horizon(job("x6", "a", kind="other", limit=100 * HOUR)) == 100 * HOUR


def test_next_free_by_the_kind_of_capacity_asked_for():
    from jupyter_gpubudget.core.inventory import Inventory, make_node

    inv = Inventory((make_node("n0", "H100-80GB", 2), make_node("n1", "H100-80GB", 1, mig=(0,)),
                     make_node("n2", "A100-80GB", 1)))

    def r(wid, node, gpu, limit, kind="gpu", milli=1000, profile=None, start=-1):
        w = job(wid, "a", limit=limit)
        return replace(w, started_at=NOW, placement=Placement(
            (SliceAlloc(node, gpu, kind, milli, start, profile),)))

    running = [r("whole", "n0", 0, 2 * HOUR), r("share", "n0", 1, 3 * HOUR, "mps", 300),
               r("inst", "n1", 0, HOUR, "mig", 143, "1g.10gb", 6),
               r("other", "n2", 0, 30 * 60), r("cpu", "n1", -1, 20 * 60, "cpu", 0)]
    s = Scheduler.from_state(ClusterState(tree(POW2), inv, running=running))
    nf = lambda req: s.next_free(req, NOW)  # noqa: E731
    assert nf(SliceRequest.whole(1)) == 30 * 60  # the A100 frees first
    assert nf(SliceRequest.whole(1, gpu_model="H100-80GB")) == 2 * HOUR
    assert nf(SliceRequest.whole(2, gpu_model="H100-80GB")) == 3 * HOUR
    assert nf(SliceRequest.whole(3, gpu_model="H100-80GB")) == float("inf")
    assert nf(SliceRequest.whole(3)) == 3 * HOUR
    assert nf(SliceRequest.mps(100)) == 30 * 60
    assert nf(SliceRequest.mps(100, gpu_model="H100-80GB")) == 2 * HOUR
    assert nf(SliceRequest.mig("1g.10gb")) == HOUR
    assert nf(SliceRequest.mig("1g.10gb", gpu_model="A100-80GB")) == float("inf")
    assert nf(SliceRequest.cpu_only()) == 20 * 60
    s.set_healthy("n2", False)  # an unhealthy node frees nothing anyone can use
    assert nf(SliceRequest.whole(1)) == 2 * HOUR
    assert nf(SliceRequest.mps(100)) == 2 * HOUR
    # free GPUs count: one free H100 needs nothing to end
    s.finish("whole", NOW)
    assert nf(SliceRequest.whole(1)) == 0.0
    assert nf(SliceRequest.whole(2, gpu_model="H100-80GB")) == 3 * HOUR
    # reserved GPUs do not count as free
    s.cluster.reserve(Placement((SliceAlloc("n0", 0),)), NOW + 5.0)
    assert nf(SliceRequest.whole(1, gpu_model="H100-80GB")) == 3 * HOUR
    # past its predicted end (3 h), the share is expected to run half again as long as it
    # has so far: 4 h in, 2 h more
    assert s.next_free(SliceRequest.whole(1, gpu_model="H100-80GB"), NOW + 4 * HOUR) == 2 * HOUR


def test_backing_is_checked_at_every_level_of_the_tree():
    """a has room in its own grant but its program does not: unbacked (semantics 4). The
    protected time promised to running work counts too."""
    text = """
accounts:
  prog:
    grant: 10
    children:
      a: {grant: 100}
      b: {grant: 100}
"""
    s = Scheduler(tree(text), inventory(gpus=4))
    s.meter.add(ChargeInterval("c", "b", "x", 1000, NOW - 8 * HOUR, NOW))
    ok = job("ok", "a", min_runtime=2 * HOUR)
    too_much = job("big", "a", min_runtime=2 * HOUR + 1)
    assert s.is_backed(ok, NOW) and not s.is_backed(too_much, NOW)
    (d,) = s.submit(ok, NOW)
    assert d.backed and d.protected_until == NOW + 2 * HOUR
    # its 2 promised GPU-hours fill the program: nothing more is backed now
    assert not s.is_backed(job("next", "b", min_runtime=60.0), NOW)
    assert s.is_backed(job("free", "b"), NOW)  # asks no protection: needs nothing
    # once it has finished, its promise goes with it: 9 of 10 used
    s.finish("ok", NOW + HOUR)
    assert s.is_backed(job("n1", "b", min_runtime=HOUR), NOW + HOUR)
    assert not s.is_backed(job("n2", "b", min_runtime=HOUR + 1), NOW + HOUR)
    s2 = Scheduler(tree(text), inventory(gpus=4))
    s2.meter.add(ChargeInterval("c", "b", "x", 1000, NOW - 8 * HOUR, NOW))
    s2.submit(ok, NOW)
    s2.cancel("ok", NOW)  # stopped at once: nothing used, nothing promised
    assert s2.is_backed(job("again", "a", min_runtime=2 * HOUR), NOW)
    assert not s2.is_backed(job("x", "nope"), NOW)
    zero = tree("accounts:\n  z: {grant: 0}\n")
    assert not Scheduler(zero, inventory()).is_backed(job("z", "z"), NOW)


def test_promised_time_counts_in_standings_of_the_next_cycle():
    s = Scheduler(tree(POW2), inventory(gpus=2))
    s.submit(job("p", "a", min_runtime=4 * HOUR, gpus=2), NOW)
    s._standings(NOW + HOUR)
    assert s._committed == {"lab": 6.0, "a": 6.0}  # 2 GPUs × 3 h left
    s._standings(NOW + 5 * HOUR)
    assert s._committed == {}


def test_arrivals_queue_behind_the_demand_already_waiting_in_their_tree():
    """Between cycles a newcomer is placed by the standing of its top-level account after
    the demand queued under it (and started since the last cycle, not yet in its usage):
    a's 10-hour job and four 1-hour jobs put a's work at 1.0-1.4 of pa's 10 GPU-hours, b's
    first at 0."""
    s = Scheduler(tree("""
accounts:
  pa: {grant: 10, children: {a: {grant: 10}}}
  pb: {grant: 10, children: {b: {grant: 10}}}
"""), inventory(gpus=1))
    s.submit(job("run", "a", limit=10 * HOUR), NOW)
    for i in range(4):
        s.submit(job(f"a{i}", "a", at=i), NOW)
    s.submit(job("b0", "b", at=10), NOW)
    s.submit(job("a4", "a", at=11), NOW)
    s.submit(job("x", "nope", at=12), NOW)
    assert s.queue() == ["b0", "a0", "a1", "a2", "a3", "a4", "x"]
    # a short debug run goes ahead of all of it
    s.submit(job("d", "b", kind="debug", limit=600.0, at=13), NOW)
    assert s.queue()[0] == "d"
    # a full cycle ranks exactly (a and b stand level, a0 was submitted first); the debug
    # run takes the GPU of a's job, which has saved its progress (the short lane)
    ds = s.cycle(NOW)
    assert [(type(d).__name__, d.workload) for d in ds] == [("Preempt", "run"), ("Start", "d")]
    assert s.queue() == ["a0", "b0", "a1", "a2", "a3", "a4", "x"]


def test_inconsistent_running_records_are_reported_not_fatal():
    bad_gpu = replace(job("far", "a"), started_at=NOW,
                      placement=Placement((SliceAlloc("n0", 7),)))
    bad_node = replace(job("gone", "a"), started_at=NOW,
                       placement=Placement((SliceAlloc("n9", 0),)))
    ok = replace(job("ok", "a"), started_at=NOW, placement=Placement((SliceAlloc("n0", 0),)))
    s = Scheduler.from_state(ClusterState(tree(), inventory(gpus=2),
                                          running=[ok, bad_gpu, bad_node],
                                          pending=[job("w", "b")]))
    assert dict(s.inconsistent) == {"far": "node n0 has no GPU 7", "gone": "unknown node n9"}
    assert set(s.running) == {"ok"}
    assert [d.workload for d in s.cycle(NOW) if isinstance(d, Start)] == ["w"]
    assert s.cluster.frag is not None  # the rebuilt cluster keeps its FGD index
    pack = Scheduler.from_state(ClusterState(
        tree(), inventory(gpus=2), Policy(placement="pack", mig_first=False, mps_on_mig=False,
                                          gang_on_mig=True, gang_on_mig_spare=3),
        running=[ok, bad_gpu]))
    assert pack.cluster.frag is None and set(pack.running) == {"ok"}
    # ... and the policy's placement rules
    c = pack.cluster
    assert (c.whole_gpu_on_mig, c.mig_first, c.mps_on_mig) == (True, False, False)
    assert (c.gang_on_mig, c.gang_on_mig_spare) == (True, 3)
    assert (s.cluster.mig_first, s.cluster.mps_on_mig, s.cluster.gang_on_mig) == (
        True, True, False)  # gang_on_mig: off by default (the policy goals over seeds 0-20)


def test_preempting_protected_work_is_refused_as_a_bug():
    s = Scheduler(tree(), inventory(gpus=1))
    s.submit(job("p", "a", min_runtime=HOUR), NOW)
    with pytest.raises(AssertionError, match="refusing to preempt protected workload p"):
        s._preempt(s.running["p"], NOW + 60, "test", None, [])
    s._preempt(s.running["p"], NOW + HOUR, "test", None, [])  # protection over
    assert "p" not in s.running


def test_a_known_workload_cannot_be_queued_twice():
    s = Scheduler(tree(), inventory(gpus=1))
    s.submit(job("w", "a"), NOW)
    with pytest.raises(ValueError, match="workload w is already known"):
        s.submit(job("w", "a"), NOW)
    s.submit(job("q", "a"), NOW)
    with pytest.raises(ValueError, match="workload q is already known"):
        s.submit(job("q", "b"), NOW)


def test_arrival_keys_by_hand_after_a_cycle():
    """After a cycle (which knows the usage), a newcomer's key is (its top-level account's
    usage + the demand already queued under it) / that account's grant; a short debug run's
    is its top-level account's standing less LANE_OFFSET; an account without a grant: ∞.
    pa has used 4 of 10 GPU-hours and has two one-GPU jobs (2 GPU-hours each) waiting; pb has
    used 0.2 of 0.5. (One-GPU jobs: on this one-GPU node a gang would be of whole nodes,
    which the projection leaves out.)"""
    from jupyter_gpubudget.core.ranking import INF, LANE_OFFSET

    t = tree("""
accounts:
  pa: {grant: 10, children: {a: {grant: 5}}}
  pb: {grant: 0.5, children: {b: {grant: 0.25}}}
  pz: {grant: 0, children: {z: {grant: 0}}}
""")
    run = replace(held("run", "a", since=0.0), protected_until=NOW + 20 * HOUR)
    pend = [job("p0", "a", limit=2 * HOUR), job("p1", "a", at=1.0, limit=2 * HOUR)]
    state = ClusterState(t, inventory(gpus=1), running=[run], pending=pend,
                         charges=[used("a", 4.0), used("b", 0.2)])
    s = Scheduler.from_state(state)
    assert not [d for d in s.cycle(NOW) if not isinstance(d, Reserve)]
    for w in (job("x1", "a", at=2), job("y1", "b", at=3), job("x2", "a", at=4),
              job("y2", "b", at=5), job("z1", "z", at=6),
              job("d", "b", kind="debug", limit=600.0, at=7)):
        s.submit(w, NOW)
    keys = {wid: k for k, _, wid in s._order if wid not in ("p0", "p1")}
    assert keys == pytest.approx({"x1": (4 + 4) / 10, "y1": 0.2 / 0.5, "x2": (4 + 5) / 10,
                                  "y2": (0.2 + 1) / 0.5, "z1": INF,
                                  "d": 0.2 / 0.5 - LANE_OFFSET}, rel=1e-12)
    assert [w for w in s.queue() if w[0] != "p"] == ["d", "y1", "x1", "x2", "y2", "z1"]


def test_the_scheduler_is_built_as_configured():
    from jupyter_gpubudget.core.model import RuntimeHistory

    t = tree("accounts:\n  x: {share: 50%}\n  y: {grant: 10}\n")
    h = RuntimeHistory()
    s = Scheduler(t, inventory(gpus=4), history=h)
    assert s.history is h
    assert s.capacity_gpu_hours == 4 * 7 * 24  # GPUs × the window in hours
    assert s.grants() == {"x": 0.5 * 4 * 7 * 24, "y": 10.0}
    assert s.cluster.frag is not None  # fgd (the default) scores against the shapes seen
    s.submit(job("m", "x", req=SliceRequest.mps(500)), NOW)
    assert [sh.milli for sh, _ in s.cluster.frag.mix.typical()] == [500]
    assert Scheduler(t, inventory(gpus=4), Policy(placement="pack")).cluster.frag is None


def test_the_queue_keeps_counts_and_drops_stale_entries():
    """Queued work is counted per shape (and in the mix); cancelled work leaves stale entries
    in the order list, which is compacted once it holds more than 64 entries and more than
    twice the pending work."""
    s = Scheduler(tree(), inventory(gpus=0))
    for i in range(70):
        s.submit(job(f"w{i:02d}", "a", gpus=1 + i % 2, at=float(i)), NOW)
    one, two = SliceRequest.whole(1).shape, SliceRequest.whole(2).shape
    assert s._shape_count == {one: 35, two: 35} and s.mix == {one: 35.0, two: 35.0}
    assert [seq for _, seq, _ in sorted(s._order, key=lambda e: e[1])] == list(range(70))
    assert s.demand(s.pending["w00"]) == 1.0  # 1 GPU × its 1-hour limit
    assert s.demand(s.pending["w01"]) == 0.0  # 2 GPUs where no node has 2: of whole nodes
    for i in range(35):
        s.cancel(f"w{i:02d}", NOW)
    assert len(s._order) == 70  # 70 entries for 35 pending: not yet more than twice
    s.cancel("w35", NOW)
    assert len(s._order) == 34  # compacted
    for i in range(36, 40):
        s.cancel(f"w{i:02d}", NOW)
    assert len(s._order) == 34 and s.queue() == [f"w{i:02d}" for i in range(40, 70)]
    assert s._shape_count == {one: 15, two: 15} and s.mix == {one: 35.0, two: 35.0}


def test_a_cancelled_gang_gives_back_its_reservation():
    run = replace(held("run", "a", since=0.0), protected_until=NOW + 20 * HOUR)
    s = Scheduler.from_state(ClusterState(tree(), inventory(gpus=2), running=[run],
                                          pending=[job("gang", "a", gpus=2)]))
    ds = s.cycle(NOW)
    assert [d.workload for d in ds if isinstance(d, Reserve)] == ["gang"]
    assert [g.reserved_at for g in s.cluster.nodes[0].gpus] != [float("inf")] * 2
    s.cancel("gang", NOW)
    assert [g.reserved_at for g in s.cluster.nodes[0].gpus] == [float("inf")] * 2
    assert s.reservations == {}


@pytest.mark.parametrize(("n", "compacted"), [(64, False), (65, True)])
def test_the_order_list_is_compacted_only_beyond_64_entries(n, compacted):
    s = Scheduler(tree(), inventory(gpus=0))
    for i in range(n):
        s.submit(job(f"w{i:02d}", "a", at=float(i)), NOW)
    for i in range(n - 30):  # 30 left: fewer than half of the entries
        s.cancel(f"w{i:02d}", NOW)
    assert (len(s._order) < n) is compacted
    assert s.queue() == [f"w{i:02d}" for i in range(n - 30, n)]


def lane_state(cap: float, toll: float = 0.0, charges=(), **policy) -> ClusterState:
    """GPU 0: a batch job that saved its progress 60 s ago (it would lose those 60 s and a
    120-s reload: 0.05 GPU-hours); GPU 1: a session (never taken for the lane). A 10-minute
    debug run of a arrives."""
    saved = held("saved", "b", 0, since=1860.0)
    sess = replace(held("sess", "b", 1, since=60.0), kind="interactive")
    return ClusterState(tree(), inventory(gpus=2),
                        Policy(short_lane_cost=cap, preemption_toll=toll,
                               short_lane_patience=0.0, **policy),
                        running=[sess, saved],
                        pending=[job("d", "a", kind="debug", limit=600.0)],
                        charges=charges)


def test_the_short_lane_takes_a_gpu_that_costs_at_most_its_cap():
    ds = schedule(lane_state(cap=0.05), NOW)  # costs exactly the cap: taken
    assert [d for d in ds if isinstance(d, Preempt)] == [
        Preempt("saved", "a short debug run takes it (loses 0.05 GPU-h)", "d")]
    (start,) = [d for d in ds if isinstance(d, Start)]
    assert (start.workload, start.backed, start.placement.slices[0].gpu) == ("d", True, 0)
    # the toll counts towards the cap, and is not part of what the reason says is lost
    ds = schedule(lane_state(cap=0.35, toll=0.25), NOW)
    assert [d for d in ds if isinstance(d, Preempt)] == [
        Preempt("saved", "a short debug run takes it (loses 0.05 GPU-h)", "d")]
    assert not [d for d in schedule(lane_state(cap=0.049), NOW) if isinstance(d, Preempt)]
    # the lane refuses (over its cap), yet b stands far above a: an ordinary preemption
    # that pays goes ahead, of the cheapest victim — the session (a 120-s reload, nothing
    # unsaved: 0.033 GPU-h), which the lane itself never takes
    ds = schedule(lane_state(cap=0.049, charges=[used("b", 90.0)]), NOW)
    pre = [d for d in ds if isinstance(d, Preempt)]
    assert [(d.workload, d.for_workload) for d in pre] == [("sess", "d")]
    assert not pre[0].reason.startswith("a short debug run")


def test_a_grant_under_one_gpu_hour_still_backs_what_it_covers():
    s = Scheduler(tree("accounts:\n  p: {grant: 10, children: {a: {grant: 0.5}}}\n"),
                  inventory(gpus=1))
    s._standings(NOW)
    assert s.is_backed(job("q", "a", min_runtime=HOUR / 4), NOW)  # 0.25 of 0.5 GPU-hours
    assert not s.is_backed(job("r", "a", min_runtime=HOUR), NOW)  # 1 of 0.5
