"""A preempted workload that does not stop at once (a notebook session being snapshotted)
holds its slice until it is gone: nothing is placed over it (semantics 1), it is not preempted
twice, and the work it yields to waits with a reservation instead of starting on top of it.
A running record that cannot be placed is left out and reported, never stopping the cycle."""

from dataclasses import replace

from jupyter_gpubudget.core.model import (
    HOUR,
    ChargeInterval,
    Placement,
    Preempt,
    Reserve,
    SliceAlloc,
    SliceRequest,
    Start,
)
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule

from .helpers import check_capacity, inventory, job, tree

NOW = 100 * HOUR


def on_gpu(w, gpu, node="n0", started=NOW - HOUR):
    return replace(w, started_at=started, placement=Placement((SliceAlloc(node, gpu),)),
                   backed=False, protected_until=None)


def kinds(ds):
    return [(type(d).__name__, d.workload if hasattr(d, "workload") else d.node) for d in ds]


def contended(victim_stops_at_once: bool, stopping: bool = False) -> ClusterState:
    # one GPU; b is over its grant so its session runs unbacked; a's job arrives backed
    b = on_gpu(job("b-session", "b", kind="interactive"), 0)
    b = replace(b, stops_at_once=victim_stops_at_once, stopping=stopping)
    return ClusterState(tree(), inventory(gpus=1), running=[b],
                        pending=[job("a1", "a", at=NOW - 10)],
                        charges=[ChargeInterval("old", "b", "x", 1000, NOW - 150 * HOUR, NOW)])


def test_a_job_stopped_at_once_is_replaced_in_the_same_cycle():
    ds = schedule(contended(True), NOW)
    assert kinds(ds) == [("Preempt", "b-session"), ("Start", "a1")]


def test_a_session_asked_to_stop_keeps_its_slice_and_the_newcomer_waits():
    ds = schedule(contended(False), NOW)
    assert kinds(ds) == [("Preempt", "b-session"), ("Reserve", "a1")]
    res = next(d for d in ds if isinstance(d, Reserve))
    assert res.at == NOW + contended(False).policy.stop_grace
    assert res.placement.slices[0].gpu == 0  # the slice it waits for


def test_while_it_stops_nothing_is_placed_over_it_nor_preempted_again():
    state = contended(False, stopping=True)
    ds = schedule(state, NOW + 30)
    assert not any(isinstance(d, Start | Preempt) for d in ds), kinds(ds)
    assert kinds(ds) == [("Reserve", "a1")]


def test_a_stopping_session_is_chosen_before_preempting_anyone_else():
    # two GPUs: a stopping session on GPU 0 and an unbacked job on GPU 1; a needs one GPU:
    # it waits for the session's slice instead of preempting the job too
    stopping = replace(on_gpu(job("s", "b", kind="interactive"), 0), stops_at_once=False,
                       stopping=True)
    other = on_gpu(job("j", "b"), 1)
    state = ClusterState(tree(), inventory(gpus=2), running=[stopping, other],
                         pending=[job("a1", "a")],
                         charges=[ChargeInterval("old", "b", "x", 1000, NOW - 150 * HOUR, NOW)])
    ds = schedule(state, NOW)
    assert kinds(ds) == [("Reserve", "a1")]


def test_once_it_is_gone_the_newcomer_starts_on_the_freed_slice():
    state = contended(False)
    state.running = []
    ds = schedule(state, NOW + 60)
    assert kinds(ds) == [("Start", "a1")]


def test_a_cycle_never_allocates_a_slice_twice_with_stopping_holders():
    state = contended(False, stopping=True)
    s = Scheduler.from_state(state)
    s.cycle(NOW)
    check_capacity(state.inventory, s.running.values())
    assert set(s.running) == {"b-session"}


def test_an_inconsistent_record_is_left_out_and_reported():
    # two running records claim GPU 0 (e.g. an external backend reported a start on an
    # occupied GPU): the second is reported, the cycle still schedules the free GPU
    first = on_gpu(job("first", "a"), 0)
    clash = on_gpu(job("clash", "b"), 0)
    nowhere = replace(job("lost", "a"), started_at=NOW)
    state = ClusterState(tree(), inventory(gpus=2), running=[first, clash, nowhere],
                         pending=[job("next", "a")])
    s = Scheduler.from_state(state)
    assert [w for w, _ in s.inconsistent] == ["lost", "clash"]
    assert "not free" in dict(s.inconsistent)["clash"] or "held" in dict(s.inconsistent)["clash"]
    ds = s.cycle(NOW)
    assert kinds(ds) == [("Start", "next")]
    assert ds[0].placement.slices[0].gpu == 1


def _held_by_a_stopping_session(held: str, wants: str, debug_wants: str):
    """One carved MIG GPU held by b's unbacked session (``held``), which is snapshotted
    before it stops; b's short debug run and a's backed session (``wants``) wait."""
    from jupyter_gpubudget.core.model import SliceRequest

    sess = job("sess", "b", kind="interactive", req=SliceRequest.mig(held))
    sess = replace(sess, started_at=NOW - 60, backed=False, stops_at_once=False,
                   placement=Placement((SliceAlloc("n0", 0, "mig", 1000 if held == "7g.80gb"
                                                   else 143, 0 if held == "7g.80gb" else 6,
                                                   held),)))
    debug = job("debug", "b", kind="debug", limit=600.0, req=SliceRequest.mig(debug_wants))
    want = job("want", "a", kind="interactive", req=SliceRequest.mig(wants), at=1.0)
    state = ClusterState(tree(), inventory(gpus=1, mig=(0,)), running=[sess],
                         pending=[debug, want],
                         charges=[ChargeInterval("old", "b", "x", 1000, NOW - 150 * HOUR, NOW)])
    s = Scheduler.from_state(state)
    ds = s.cycle(NOW)
    assert kinds(ds) == [("Preempt", "sess"), ("Reserve", "want")]
    return s


def test_work_reserved_behind_a_stopping_session_starts_when_it_is_gone():
    """The slice freed by the stopped session goes to the session that preempted it at
    once — even though a request of the same shape ranked before it found no room (before
    the mutation-testing fix the fill gave up there: every waiting shape had failed)."""
    s = _held_by_a_stopping_session("7g.80gb", "7g.80gb", "7g.80gb")
    ds = s.finish("sess", NOW + 10)
    assert [d.workload for d in ds] == ["want"]
    check_capacity(s.inventory, s.running.values())


def test_what_a_reservation_held_back_is_looked_at_again_once_it_is_used():
    """b's debug run (1g.10gb) ranks first but may not use the GPU held for a's 4g.40gb;
    once a's session starts there, the GPU is no longer held and the debug run fits beside
    it: it starts in the same fill, not a cycle later (it once started a cycle later)."""
    s = _held_by_a_stopping_session("7g.80gb", "4g.40gb", "1g.10gb")
    ds = s.finish("sess", NOW + 10)
    assert [d.workload for d in ds] == ["want", "debug"]
    assert {d.workload: d.placement.slices[0].mig_start for d in ds} == {"want": 0, "debug": 6}
    check_capacity(s.inventory, s.running.values())


def test_a_short_run_waits_for_a_batch_job_that_does_not_stop_at_once():
    """A debug run may take the GPU of batch work that has just saved its progress (the short
    lane). On a backend where a job does not stop at once (Slurm, Kubernetes) the job keeps
    its GPU until it is gone: the debug run is given a reservation on it, not placed on top
    (this crashed the cycle); and a job already stopping is not asked to stop again."""
    s = Scheduler(tree(), inventory(gpus=1))
    s.meter.add(ChargeInterval("ca", "a", "x", 1000, NOW - 80 * HOUR, NOW - 10 * HOUR))
    s.submit(replace(job("b1", "b", resumable=True, limit=10 * HOUR), stops_at_once=False),
             NOW - 1860.0)
    s.submit(job("d1", "a", kind="debug", limit=600.0, at=1.0), NOW)
    ds = s.cycle(NOW)
    assert kinds(ds) == [("Preempt", "b1"), ("Reserve", "d1")], kinds(ds)
    (p,) = [d for d in ds if isinstance(d, Preempt)]
    assert p.reason.startswith("a short debug run")
    res = next(d for d in ds if isinstance(d, Reserve))
    assert res.at == NOW + s.policy.stop_grace and res.placement.slices[0].gpu == 0
    assert s.running["b1"].stopping and "d1" in s.pending
    check_capacity(s.inventory, s.running.values())
    # the next cycle, b1 still stopping: d1 keeps waiting for it, nobody is asked twice
    ds = s.cycle(NOW + 30)
    assert not any(isinstance(d, Start | Preempt) for d in ds), kinds(ds)
    # once it is gone, d1 starts on its GPU
    s.finish("b1", NOW + 40)
    assert "d1" in s.running and s.running["d1"].placement.slices[0].gpu == 0


def test_what_a_preemption_for_later_work_frees_is_filled_by_work_ranked_before_it():
    """Work conservation within one cycle. One GPU, held by an unbacked job. Two MPS shares
    of the same project wait: the first, ten minutes long, gains too little to pay for a
    preemption; the second, long, preempts the job. The first then fits beside it on the
    freed GPU and starts in the same cycle instead of waiting for the next event."""
    t = tree()
    # b is over its grant: its job runs unbacked; it started a minute ago (cheap to preempt)
    held = on_gpu(job("old", "b", resumable=True, limit=None), 0, started=NOW - 60)
    short = job("s-short", "a", req=SliceRequest.mps(250), kind="interactive", limit=600.0,
                at=NOW - 20)
    long_ = job("s-long", "a", req=SliceRequest.mps(500), kind="interactive", limit=None,
                at=NOW - 10)
    state = ClusterState(t, inventory(gpus=1), running=[held], pending=[short, long_],
                         charges=[ChargeInterval("c", "b", "x", 1000, NOW - 150 * HOUR, NOW)])
    ds = schedule(state, NOW)
    assert ("Preempt", "old") in kinds(ds), kinds(ds)
    assert sorted(d.workload for d in ds if isinstance(d, Start)) == ["s-long", "s-short"]
    s = Scheduler.from_state(state)
    s.cycle(NOW)
    check_capacity(state.inventory, s.running.values())


def test_a_stopping_share_that_is_not_needed_does_not_make_the_newcomer_wait():
    """One GPU shared by MPS: a 250-milli share being snapshotted (still holding it) and an
    idle 500-milli session that stops at once. A 700-milli share arrives: the idle session
    goes, and the newcomer fits beside the stopping share at once — it starts now rather than
    waiting out the stop grace behind a share it does not need gone."""
    def share(wid, milli, **kw):
        w = on_gpu(job(wid, "b", req=SliceRequest.mps(milli), kind="interactive"), 0)
        return replace(w, placement=Placement((SliceAlloc("n0", 0, "mps", milli),)), **kw)

    stopping = share("snap", 250, stopping=True, stops_at_once=False)
    idle = share("idle", 500, idle=True)
    new = job("new", "a", req=SliceRequest.mps(700), kind="interactive", at=NOW - 5)
    state = ClusterState(tree(), inventory(gpus=1), running=[stopping, idle], pending=[new])
    ds = schedule(state, NOW)
    assert kinds(ds) == [("Preempt", "idle"), ("Start", "new")], kinds(ds)
    s = Scheduler.from_state(state)
    s.cycle(NOW)
    check_capacity(state.inventory, s.running.values())
    assert s.running["snap"].stopping


def test_a_finish_fills_with_short_work_where_longer_work_of_its_shape_did_not_fit():
    """Work conservation on the incremental path. Two GPUs; a gang of two waits with a
    reservation from when the longer running job ends. The other job finishes: a one-GPU job
    of three hours ranked first does not fit before the reservation, but a ten-minute one
    ranked after it does, and starts at once as a backfill — the same shape failing for
    longer work does not keep it waiting."""
    from jupyter_gpubudget.core.model import Policy

    s = Scheduler(tree(), inventory(gpus=2), Policy(max_reservations=1))
    # (both protected: nothing is preempted here)
    s.submit(job("long-running", "b", limit=2 * HOUR, min_runtime=2 * HOUR), NOW - 600)
    s.submit(job("ends-soon", "b", limit=HOUR, min_runtime=HOUR), NOW - 600)
    s.submit(job("gang", "a", gpus=2, limit=HOUR, at=NOW - 300), NOW - 300)
    s.submit(job("three-hours", "a", limit=3 * HOUR, at=NOW - 200), NOW - 200)
    s.submit(job("ten-minutes", "a", limit=600.0, at=NOW - 100), NOW - 100)
    ds = s.cycle(NOW)
    assert [d.workload for d in ds if isinstance(d, Reserve)] == ["gang"], kinds(ds)
    ds = s.finish("ends-soon", NOW + 60)
    assert [d.workload for d in ds] == ["ten-minutes"], kinds(ds)
    assert s.running["ten-minutes"].backfill_until is not None
    assert {"gang", "three-hours"} <= set(s.pending)


def test_work_waiting_on_a_stopping_share_starts_where_a_later_preemption_frees_room():
    """Two GPUs. On GPU 0 an idle 250-milli share that is snapshotted when preempted (it
    holds its slice meanwhile) beside a busy 700-milli one; on GPU 1 an idle whole-GPU
    session that stops at once. Two 250-milli shares wait. The first takes the cheaper idle
    share and would wait for it (a reservation); the second takes GPU 1 — where the first
    then fits too: it starts now, and no reservation is left behind for work that started."""
    def on(wid, gpu, milli, kind="mps", **kw):
        req = SliceRequest.mps(milli) if kind == "mps" else SliceRequest.whole(1)
        w = on_gpu(job(wid, "b", req=req, kind="interactive"), gpu, started=NOW - 60)
        return replace(w, placement=Placement((SliceAlloc("n0", gpu, kind, milli),)), **kw)

    running = [on("snap", 0, 250, idle=True, stops_at_once=False), on("busy", 0, 700),
               on("idle-gpu", 1, 1000, kind="gpu", idle=True)]
    pending = [job(f"new{i}", "a", req=SliceRequest.mps(250), kind="interactive", limit=None,
                   at=NOW - 10 + i) for i in range(2)]
    from jupyter_gpubudget.core.model import Policy

    state = ClusterState(tree(), inventory(gpus=2), Policy(preemption_toll=0.0),
                         running=running, pending=pending)
    ds = schedule(state, NOW)
    assert not any(isinstance(d, Reserve) for d in ds), kinds(ds)
    assert ("Preempt", "snap") in kinds(ds) and ("Preempt", "idle-gpu") in kinds(ds)
    assert sorted(d.workload for d in ds if isinstance(d, Start)) == ["new0", "new1"]
    s = Scheduler.from_state(state)
    s.cycle(NOW)
    check_capacity(state.inventory, s.running.values())
    assert not s.reservations
