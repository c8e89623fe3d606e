"""One test per scheduling rule, on hand-built clusters small enough to reason about."""

import copy

import pytest

from jupyter_gpubudget.core.explain import queue_order
from jupyter_gpubudget.core.model import (
    HOUR,
    ChargeInterval,
    Drain,
    Policy,
    Preempt,
    Reserve,
    SliceRequest,
    Start,
)
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule
from jupyter_gpubudget.core.whatif import standings

from .helpers import check_capacity, inventory, job, tree

NOW = 100 * HOUR


# the rules below other than the toll and the margin, priced by the lost work alone
BARE = Policy(preemption_toll=0.0, preemption_margin=0.0)


def charge(project, hours, gpus=1, end=NOW):
    return ChargeInterval(f"old-{project}-{hours}", project, "x", gpus * 1000,
                          end - hours * HOUR, end)


def starts(decisions):
    return [d.workload for d in decisions if isinstance(d, Start)]


def test_lower_standing_starts_first():
    # b has used more of its (equal) grant, so a's job goes first even though it came later
    state = ClusterState(tree(), inventory(gpus=1),
                         pending=[job("b1", "b", at=0), job("a1", "a", at=10)],
                         charges=[charge("a", 10), charge("b", 50)])
    assert starts(schedule(state, NOW)) == ["a1"]
    assert queue_order(state, NOW) == ["a1", "b1"]


def test_standing_is_level_by_level():
    text = """
accounts:
  p1: {grant: 100, children: {x: {grant: 30}, y: {grant: 70}}}
  p2: {grant: 100, children: {z: {grant: 100}}}
"""
    # x stands above z (20/30 > 60/100), but its program p1 stands below p2 (20/100)
    state = ClusterState(tree(text), inventory(gpus=1),
                         pending=[job("z1", "z", at=0), job("x1", "x", at=1)],
                         charges=[charge("x", 20), charge("z", 60)])
    assert starts(schedule(state, NOW)) == ["x1"]


def test_projected_standing_interleaves_projects():
    # a and b start level; a queued many jobs first, but b's first job is not behind all of them
    pending = [job(f"a{i}", "a", at=i) for i in range(4)] + [job("b0", "b", at=10)]
    order = queue_order(ClusterState(tree(), inventory(gpus=1), pending=pending), NOW)
    assert order.index("b0") <= 1


def test_a_gang_of_whole_nodes_does_not_push_its_projects_other_work_back():
    """Nodes of 4 GPUs. a queued a gang first, then a one-GPU job; b queued a one-GPU job
    last; a and b stand level. A 4-GPU gang (a whole node: it mostly waits for a drain) adds
    nothing to a's projected standing, so a's job keeps its place ahead of b's (equal keys:
    submission time); a 2-GPU gang projects its 20 GPU-hours, so b's job goes ahead of a's."""
    for gang_gpus, expect in ((4, ["gang", "a1", "b1"]), (2, ["gang", "b1", "a1"])):
        pending = [job("gang", "a", gpus=gang_gpus, at=0, limit=10 * HOUR),
                   job("a1", "a", at=1), job("b1", "b", at=2)]
        state = ClusterState(tree(), inventory(nodes=2, gpus=4), pending=pending)
        assert queue_order(state, NOW) == expect, gang_gpus
    s = Scheduler(tree(), inventory(nodes=2, gpus=4))
    assert s.waits_for_nodes(job("g", "a", gpus=4)) and s.waits_for_nodes(job("g", gpus=8))
    assert not s.waits_for_nodes(job("g", "a", gpus=3))
    one = Scheduler(tree(), inventory(nodes=2, gpus=1))
    assert not one.waits_for_nodes(job("g")) and one.waits_for_nodes(job("g", gpus=2))


def test_equal_standing_falls_back_to_submit_time():
    state = ClusterState(tree(), inventory(gpus=1),
                         pending=[job("late", "b", at=5), job("early", "a", at=1)])
    assert starts(schedule(state, NOW)) == ["early"]


def test_backed_work_is_protected_and_unbacked_is_not():
    # a's grant is 100 GPU-hours; 95 are used, so a 10-hour protected job is unbacked
    state = ClusterState(tree(), inventory(gpus=2),
                         pending=[job("a1", "a", min_runtime=10 * HOUR),
                                  job("b1", "b", min_runtime=10 * HOUR, at=1)],
                         charges=[charge("a", 95)])
    ds = {d.workload: d for d in schedule(state, NOW) if isinstance(d, Start)}
    assert ds["b1"].backed and ds["b1"].protected_until == NOW + 10 * HOUR
    assert not ds["a1"].backed and ds["a1"].protected_until is None


def test_min_runtime_is_capped_by_policy():
    state = ClusterState(tree(), inventory(gpus=1),
                         pending=[job("i", "a", kind="interactive", min_runtime=24 * HOUR)])
    (d,) = schedule(state, NOW)
    assert d.protected_until == NOW + 8 * HOUR


def test_protected_work_is_never_preempted():
    # resumable, so that once unprotected its preemption costs little (1 s since its last
    # checkpoint + the restart's reload) and pays; protection is what this test is about
    running = job("b-old", "b", min_runtime=5 * HOUR, resumable=True)
    s = Scheduler(tree(), inventory(gpus=1))
    s.submit(running, NOW)
    assert "b-old" in s.running
    # b is now far over its grant; a is under; but b's job is still protected
    s.meter.add(charge("b", 99))
    s.submit(job("a1", "a", at=NOW), NOW)
    assert not [d for d in s.cycle(NOW + HOUR) if isinstance(d, Preempt)]
    ds = s.cycle(NOW + 5 * HOUR + 1)
    assert [d.workload for d in ds if isinstance(d, Preempt)] == ["b-old"]
    assert starts(ds) == ["a1"]


def test_unbacked_is_preempted_before_backed():
    s = Scheduler(tree(), inventory(gpus=2))
    s.meter.add(charge("b", 150))  # b is over its grant: its work is unbacked
    s.submit(job("b-unbacked", "b"), NOW)
    s.meter.add(charge("a", 20))
    s.submit(job("a-backed", "a", at=1), NOW)
    assert not s.running["b-unbacked"].backed and s.running["a-backed"].backed
    # a newcomer from a barely-used third project needs one GPU
    t = tree("""
accounts:
  lab:
    grant: 300
    children:
      a: {grant: 100}
      b: {grant: 100}
      c: {grant: 100}
""")
    s.set_accounts(t)
    s.submit(job("c1", "c", at=2), NOW)
    ds = s.cycle(NOW + 1)
    assert [d.workload for d in ds if isinstance(d, Preempt)] == ["b-unbacked"]
    assert starts(ds) == ["c1"]


def test_preemption_takes_the_cheapest_set():
    """Victims are chosen by what their preemption throws away (policy: checkpoints every
    30 min, 120 s reload). 40 min in: a non-resumable 1-GPU job loses 40 min (0.667 GPU-h),
    a resumable one 10 + 2 min (0.2 GPU-h)."""
    s = Scheduler(tree(), inventory(gpus=4), BARE)
    s.meter.add(charge("b", 90))
    for i, (g, res) in enumerate([(1, False), (1, True), (2, False)]):
        s.submit(job(f"b{i}", "b", gpus=g, resumable=res, at=i), NOW)
    assert len(s.running) == 3
    s.submit(job("a1", "a", gpus=1, at=5), NOW)
    ds = s.cycle(NOW + 40 * 60)
    assert [d.workload for d in ds if isinstance(d, Preempt)] == ["b1"]  # 0.2, not 0.667


def test_two_cheap_victims_beat_one_dear_one():
    """a needs 2 GPUs. b's two resumable 1-GPU jobs cost 2 × (10 + 2) min = 0.4 GPU-h; its
    non-resumable 2-GPU job 2 × 40 min = 1.33 GPU-h (both pay: a's 2-GPU, 1-hour run gains
    2 GPU-h × a gap of ~1): the cheaper pair goes, not the single dear victim."""
    s = Scheduler(tree(), inventory(gpus=4), BARE)
    s.meter.add(charge("b", 90))
    for i, (g, res) in enumerate([(1, True), (1, True), (2, False)]):
        s.submit(job(f"b{i}", "b", gpus=g, resumable=res, at=i), NOW)
    s.submit(job("a2", "a", gpus=2, at=5), NOW)
    ds = s.cycle(NOW + 40 * 60)
    assert sorted(d.workload for d in ds if isinstance(d, Preempt)) == ["b0", "b1"]
    assert starts(ds) == ["a2"]


def test_same_standing_does_not_preempt():
    s = Scheduler(tree(), inventory(gpus=1))
    s.submit(job("a1", "a"), NOW)
    s.submit(job("a2", "a", at=1), NOW)
    assert not s.cycle(NOW + 1)


def test_gang_is_all_or_nothing_and_spans_nodes_only_when_needed():
    inv = inventory(nodes=3, gpus=4, racks=1)
    ds = schedule(ClusterState(tree(), inv, pending=[job("g", "a", gpus=6)]), NOW)
    (d,) = ds
    assert len(d.placement.slices) == 6 and len(d.placement.nodes) == 2
    ds = schedule(ClusterState(tree(), inv, pending=[job("g4", "a", gpus=4)]), NOW)
    assert len(ds[0].placement.nodes) == 1
    ds = schedule(ClusterState(tree(), inv, pending=[job("big", "a", gpus=13)]), NOW)
    assert not starts(ds)


def test_gang_prefers_one_rack():
    inv = inventory(nodes=4, gpus=4, racks=2)  # n0,n2 in r0; n1,n3 in r1
    s = Scheduler(tree(), inv)
    s.submit(job("x", "a", gpus=1), NOW)  # lands on one node
    d = s.submit(job("g", "a", gpus=8, at=1), NOW)[0]
    racks = {inv.node(n).rack for n in d.placement.nodes}
    assert len(racks) == 1


def test_blocked_gang_gets_reservation_and_backfill_respects_it():
    # (drains not finished by preemption here: r1 would go, test_costs.py has those)
    s = Scheduler(tree(), inventory(gpus=4),
                  policy=Policy(max_reservations=1, finish_drain_ratio=0))
    s.submit(job("r1", "b", gpus=2, limit=2 * HOUR), NOW)  # ends at NOW+2h
    s.submit(job("r2", "b", gpus=1, limit=5 * HOUR, at=1), NOW)
    s.submit(job("gang", "a", gpus=3, at=2), NOW)  # needs 3, only 1 free
    s.submit(job("long", "b", gpus=1, limit=4 * HOUR, at=3), NOW)  # the free GPU is now taken?
    # "long" arrived incrementally and took the idle GPU; run a full cycle from scratch instead
    state = ClusterState(s.accounts, s.inventory, s.policy,
                         running=[s.running["r1"], s.running["r2"]],
                         pending=[job("gang", "a", gpus=3, at=2),
                                  job("long", "b", gpus=1, limit=4 * HOUR, at=3),
                                  job("short", "b", gpus=1, limit=1 * HOUR, at=4)])
    ds = schedule(state, NOW)
    res = [d for d in ds if isinstance(d, Reserve)]
    assert [r.workload for r in res] == ["gang"] and res[0].at == NOW + 2 * HOUR
    reserved = {(x.node, x.gpu) for x in res[0].placement.slices}
    started = {d.workload: d for d in ds if isinstance(d, Start)}
    assert "long" not in started  # would delay the gang
    assert "short" in started  # ends before the reservation: backfilled
    assert {(x.node, x.gpu) for x in started["short"].placement.slices} <= reserved


def test_mig_and_mps_requests():
    inv = inventory(gpus=2, mig=(1,))
    pending = [job("m", "a", req=SliceRequest.mig("3g.40gb")),
               job("s1", "a", req=SliceRequest.mps(300), at=1),
               job("s2", "b", req=SliceRequest.mps(500), at=2),
               job("w", "b", gpus=1, at=3)]
    ds = schedule(ClusterState(tree(), inv, pending=pending), NOW)
    placed = {d.workload: d.placement.slices[0] for d in ds if isinstance(d, Start)}
    assert placed["m"].gpu == 1 and placed["m"].kind == "mig" and placed["m"].milli == 429
    # project b stands lower (a's m started), so s2 comes first: its 500 milli take the
    # partitioned MIG GPU's 4g.40gb (charged 500, not the instance's 571); s1 then finds the
    # MIG GPU full and opens the GPU outside MIG mode as a shared one
    assert (placed["s2"].gpu, placed["s2"].kind, placed["s2"].profile,
            placed["s2"].milli) == (1, "mig", "4g.40gb", 500)
    assert (placed["s1"].gpu, placed["s1"].kind) == (0, "mps")
    assert "w" not in placed  # the only non-MIG GPU is shared now


@pytest.mark.parametrize("first, where", [(True, (1, "mig", "3g.40gb")),
                                          (False, (0, "mps", None))])
def test_an_mps_share_takes_a_partitioned_mig_gpu_before_a_shared_one(
        first: bool, where: tuple[int, str, str | None]) -> None:
    """``Policy.mps_mig_first``: the partitioned MIG GPU's leftover slices first, so that the
    shared GPU outside MIG mode empties sooner for one-GPU work and gangs; off, the shared
    GPU with room first."""
    s = Scheduler(tree(), inventory(gpus=2, mig=(1,)), Policy(mps_mig_first=first))
    s.submit(job("r", "a", req=SliceRequest.mps(300)), NOW)
    s.submit(job("m", "a", req=SliceRequest.mig("3g.40gb"), at=1), NOW)
    assert s.running["r"].placement.slices[0].gpu == 0
    s.submit(job("s", "b", req=SliceRequest.mps(300), at=2), NOW)
    got = s.running["s"].placement.slices[0]
    assert (got.gpu, got.kind, got.profile) == where
    assert got.milli == 300  # charged the share it asked for, not the instance


def test_an_mps_share_never_opens_an_idle_mig_gpu_before_a_shared_one() -> None:
    """Only partitioned MIG GPUs come first: an idle one stays whole for one-GPU work."""
    s = Scheduler(tree(), inventory(gpus=2, mig=(1,)))
    s.submit(job("r", "a", req=SliceRequest.mps(300)), NOW)
    s.submit(job("s", "b", req=SliceRequest.mps(300), at=1), NOW)
    assert [s.running[w].placement.slices[0].gpu for w in ("r", "s")] == [0, 0]
    s.submit(job("w", "b", gpus=1, at=2), NOW)
    assert s.running["w"].placement.slices[0].gpu == 1  # the MIG GPU, whole


def test_drain_waits_for_protection_then_releases():
    inv = inventory(nodes=2, gpus=1)
    s = Scheduler(tree(), inv)
    d = s.submit(job("p", "a", min_runtime=2 * HOUR), NOW)[0]
    node = d.placement.nodes[0]
    s.set_healthy(node, False)
    assert not [x for x in s.cycle(NOW + HOUR) if isinstance(x, Drain)]
    ds = s.cycle(NOW + 3 * HOUR)
    assert Drain(node) in ds and [x.workload for x in ds if isinstance(x, Preempt)] == ["p"]
    # no new work lands on it
    d2 = s.submit(job("q", "a", at=NOW), NOW + 3 * HOUR)[0]
    assert d2.placement.nodes[0] != node


def test_node_failure_stops_even_protected_work():
    s = Scheduler(tree(), inventory(nodes=1, gpus=1))
    s.submit(job("p", "a", min_runtime=5 * HOUR), NOW)
    assert s.fail_node("n0", NOW + 1) == ["p"] and not s.running


def test_incremental_arrival_and_departure():
    s = Scheduler(tree(), inventory(gpus=2))
    assert starts(s.submit(job("a1", "a", gpus=2), NOW)) == ["a1"]
    assert s.submit(job("b1", "b", gpus=1, at=1), NOW) == []
    assert s.queue() == ["b1"]
    assert starts(s.finish("a1", NOW + HOUR)) == ["b1"]
    # the finished run is charged: 2 GPUs for an hour
    assert abs(s.usage_hours(NOW + HOUR)["a"] - 2.0) < 1e-9
    assert s.history.samples[("u", "a", "batch")] == [HOUR]


def test_schedule_is_pure_and_deterministic():
    pending = [job(f"w{i}", "ab"[i % 2], gpus=1 + i % 3, at=i) for i in range(12)]
    state = ClusterState(tree(), inventory(nodes=2, gpus=4), pending=pending)
    before = copy.deepcopy(pending)
    first = schedule(state, NOW)
    assert pending == before
    assert schedule(state, NOW) == first
    s = Scheduler.from_state(state)
    s.cycle(NOW)
    check_capacity(state.inventory, s.running.values())


def test_unknown_project_never_starts():
    ds = schedule(ClusterState(tree(), inventory(), pending=[job("x", "nope")]), NOW)
    assert ds == []


def test_standings_report():
    st = standings(ClusterState(tree(), inventory(), charges=[charge("a", 25)]), NOW)
    assert st["a"]["usage_hours"] == 25 and st["a"]["standing"] == 0.25
    assert st["lab"]["usage_hours"] == 25 and st["lab"]["grant_hours"] == 200


def test_reserved_gang_starts_as_soon_as_capacity_frees():
    s = Scheduler(tree(), inventory(gpus=4), Policy(finish_drain_ratio=0))
    s.submit(job("r1", "b", gpus=3, limit=2 * HOUR), NOW)
    s.submit(job("gang", "a", gpus=4, at=1, limit=8 * HOUR), NOW)
    ds = s.cycle(NOW)
    assert [d.workload for d in ds if isinstance(d, Reserve)] == ["gang"]
    # r1 ends early: the gang takes its own reserved GPUs at once, before the next cycle
    assert starts(s.finish("r1", NOW + HOUR)) == ["gang"]


def test_cancel_frees_capacity_without_teaching_prediction():
    s = Scheduler(tree(), inventory(gpus=1))
    s.submit(job("a1", "a"), NOW)
    s.submit(job("b1", "b", at=1), NOW)
    assert starts(s.cancel("a1", NOW + 60)) == ["b1"]
    assert s.history.samples == {}
    assert s.cancel("nope", NOW) == [] and s.cancel("b1", NOW + 120) == []


def test_the_forecast_replays_the_queue_and_probes_offered_shapes():
    from jupyter_gpubudget.core.offer import forecast

    s = Scheduler(tree(), inventory(gpus=2))
    s.submit(job("r1", "a", gpus=1, limit=2 * HOUR), NOW)
    s.submit(job("r2", "a", gpus=1, limit=5 * HOUR, at=1), NOW)
    state = ClusterState(s.accounts, s.inventory, running=list(s.running.values()),
                         pending=[job("p1", "b", gpus=1, at=2, limit=HOUR),
                                  job("p2", "b", gpus=2, at=3, limit=HOUR),
                                  job("big", "b", gpus=3, at=4)])
    fc = forecast(state, NOW, probes={"gpu:1": SliceRequest.whole(1),
                                      "gpu:2": SliceRequest.whole(2),
                                      "gpu:4": SliceRequest.whole(4)})
    got = fc.starts
    assert got["p1"] == NOW + 2 * HOUR  # when r1 is predicted to end
    assert got["p2"] == NOW + 5 * HOUR  # both GPUs free once r2 ends
    assert "big" not in got  # never fits on two GPUs
    # a newcomer behind the queue: one GPU once p1 (started at 2 h, 1 h long) has ended
    # and r2 still runs; two GPUs once p2 (5 h + 1 h) is done
    assert fc.probe_starts["gpu:1"] == NOW + 3 * HOUR
    assert fc.probe_starts["gpu:2"] == NOW + 6 * HOUR
    assert "gpu:4" not in fc.probe_starts


def test_preemption_needs_a_clear_margin_in_standing():
    """b stands only a little above a: no preemption (no taking turns); far above: preempted."""
    from dataclasses import replace as dc_replace

    for b_used, expect in ((55, False), (90, True)):
        s = Scheduler(tree(), inventory(gpus=1), policy=dc_replace(Policy(), preemption_margin=0.25))
        s.meter.add(charge("a", 50))
        s.meter.add(charge("b", b_used))
        s.submit(job("b1", "b"), NOW)
        s.submit(job("a1", "a", at=1), NOW)
        preempted = [d.workload for d in s.cycle(NOW + 1) if isinstance(d, Preempt)]
        assert preempted == (["b1"] if expect else [])


def test_no_preemption_that_would_flip_back():
    """a stands just below b; a's workload asks for 10 protected GPU-hours, after which a would
    stand above b: preempting b now would only hand the GPU back later, so it is not done."""
    for min_runtime, expect in ((10 * HOUR, []), (0.0, ["b1"])):
        s = Scheduler(tree(), inventory(gpus=1), BARE)
        s.meter.add(charge("a", 50))
        s.meter.add(charge("b", 52))
        s.submit(job("b1", "b"), NOW)
        s.submit(job("a1", "a", at=1, min_runtime=min_runtime), NOW)
        assert [d.workload for d in s.cycle(NOW + 1) if isinstance(d, Preempt)] == expect


def test_idle_session_yields_to_any_backed_work():
    """An idle session (protection already ended) is preempted for backed work even when its
    project stands below the requester's: squatting is what the product exists to stop."""
    from dataclasses import replace as dc_replace

    base = Scheduler(tree(), inventory(gpus=1))
    base.meter.add(charge("b", 30))  # b (the requester) stands above a
    (d,) = base.submit(job("nb", "a", kind="interactive"), NOW)
    running = base.running["nb"]
    for idle, expect in ((False, []), (True, ["nb"])):
        state = ClusterState(base.accounts, base.inventory,
                             running=[dc_replace(running, idle=idle)],
                             pending=[job("b1", "b", at=1)],
                             charges=base.meter.charges())
        ds = schedule(state, NOW + 60)
        assert [x.workload for x in ds if isinstance(x, Preempt)] == expect


def test_reservation_is_planned_at_the_cautious_end_of_running_work():
    """b's 1-GPU runs took 1 h six times, 2 h three times and 4 h once: r1 is typically done
    in 2 h (the 0.6 quantile), but a gang waits for its GPUs until RESERVE_QUANTILE (0.9)
    says they are surely free: NOW + 4 h. "mid" (declared 3 h) ends before that, so it runs
    on a reserved GPU meanwhile instead of leaving it idle; "long" (5 h) would delay the gang."""
    from jupyter_gpubudget.core.backfill import RESERVE_QUANTILE
    from jupyter_gpubudget.core.model import RuntimeHistory

    assert RESERVE_QUANTILE == 0.9
    history = RuntimeHistory()
    past = job("past", "b", user="ben", limit=None)
    for hours in (1, 1, 1, 1, 1, 1, 2, 2, 2, 4):
        history.add_run(past, hours * HOUR)
    s = Scheduler(tree(), inventory(gpus=4), Policy(max_reservations=1, finish_drain_ratio=0),
                  history)
    assert starts(s.submit(job("r1", "b", user="ben", limit=None), NOW)) == ["r1"]
    assert s.predict(s.running["r1"]) == pytest.approx(2 * HOUR)
    # a full cycle from scratch (submitted one by one, "long" would take a free GPU at once)
    ds = schedule(ClusterState(s.accounts, s.inventory, s.policy, running=[s.running["r1"]],
                               pending=[job("gang", "a", gpus=4, at=1, limit=8 * HOUR),
                                        job("long", "a", at=2, limit=5 * HOUR),
                                        job("mid", "a", at=3, limit=3 * HOUR)],
                               history=history), NOW)
    res = [d for d in ds if isinstance(d, Reserve)]
    assert [r.workload for r in res] == ["gang"]
    assert res[0].at == pytest.approx(NOW + 4 * HOUR)
    started = {d.workload: d for d in ds if isinstance(d, Start)}
    assert list(started) == ["mid"]
    assert started["mid"].backfill_until == pytest.approx(NOW + 4 * HOUR)


def _debug_seen():
    from jupyter_gpubudget.core.model import RuntimeHistory

    history = RuntimeHistory()
    history.add_run(job("d0", "b", kind="debug", limit=None), 600)
    return history


def test_a_free_gpu_is_kept_for_the_short_lane_until_the_next_cycle():
    """Four free GPUs, four 4-hour jobs waiting: once debug work has been seen, the cycle
    starts three and keeps one GPU (Policy.short_lane_hold) for short work: a debug run
    that arrives after the cycle starts at once there; a long job arriving then does not."""
    longs = [job(f"long{i}", "a", at=i, limit=4 * HOUR) for i in range(4)]
    s = Scheduler.from_state(ClusterState(tree(), inventory(gpus=4), Policy(),
                                          pending=longs, history=_debug_seen()))
    assert starts(s.cycle(NOW)) == ["long0", "long1", "long2"]
    assert starts(s.submit(job("late", "a", at=5, limit=4 * HOUR), NOW + 60)) == []
    ds = s.submit(job("dbg", "b", at=6, kind="debug", limit=20 * 60), NOW + 60)
    assert starts(ds) == ["dbg"]
    assert ds[0].backfill_until is None  # kept for the lane, not borrowed from a gang


def test_with_every_whole_gpu_busy_the_lane_keeps_an_idle_mig_mode_gpu():
    """A 2-GPU node busy with a pair, and a MIG-mode GPU with no instance: the cycle keeps
    the MIG-mode GPU for short work (a gang cannot use it, a one-GPU run can take it whole),
    so a 4-hour job waits and a debug run arriving later starts at once on it — where
    before the lane kept nothing and the long job took it."""
    from jupyter_gpubudget.core.inventory import Inventory, make_node

    inv = Inventory((make_node("n0", "H100-80GB", 2), make_node("m0", "H100-80GB", 1, mig=(0,))))
    pair = job("pair", "a", gpus=2, limit=4 * HOUR)
    s = Scheduler.from_state(ClusterState(tree(), inv, Policy(), history=_debug_seen(),
                                          pending=[pair]))
    assert starts(s.cycle(NOW)) == ["pair"]  # on the GPUs outside MIG mode, lane and all
    assert starts(s.submit(job("one", "a", at=1, limit=4 * HOUR), NOW + 30)) == ["one"]
    assert s.running["one"].placement.slices[0].node == "m0"
    s.finish("one", NOW + 40)  # the MIG-mode GPU comes free: kept for the lane
    kept = s.cluster.by_name["m0"].gpus[0]
    assert kept.reserved_at == NOW + s.policy.short_lane
    assert starts(s.submit(job("long", "a", at=2, limit=4 * HOUR), NOW + 50)) == []
    assert starts(s.cycle(NOW + 60)) == []  # and at the next cycle too
    assert kept.reserved_at == NOW + 60 + s.policy.short_lane
    ds = s.submit(job("dbg", "b", at=6, kind="debug", limit=20 * 60), NOW + 90)
    assert starts(ds) == ["dbg"] and ds[0].placement.slices[0].node == "m0"


def test_nothing_is_kept_for_the_lane_without_debug_work_or_when_turned_off():
    longs = [job(f"long{i}", "a", at=i, limit=4 * HOUR) for i in range(4)]
    for history, policy in ((None, Policy()), (_debug_seen(), Policy(short_lane_hold=0))):
        state = ClusterState(tree(), inventory(gpus=4), policy, pending=longs, history=history)
        assert len(starts(schedule(state, NOW))) == 4


def test_a_gang_that_needs_every_gpu_is_not_kept_out_by_the_lane():
    state = ClusterState(tree(), inventory(gpus=4), Policy(), history=_debug_seen(),
                         pending=[job("gang", "a", gpus=4, limit=4 * HOUR),
                                  job("pair", "a", gpus=2, at=1, limit=4 * HOUR)])
    assert starts(schedule(state, NOW)) == ["gang"]
    # a smaller gang is placed around the kept GPU
    state = ClusterState(tree(), inventory(gpus=4), Policy(), history=_debug_seen(),
                         pending=[job("three", "a", gpus=3, limit=4 * HOUR),
                                  job("one", "a", at=1, limit=4 * HOUR)])
    assert starts(schedule(state, NOW)) == ["three"]
