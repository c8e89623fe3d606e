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
    issue 16 the fill gave up there: every waiting shape had failed)."""
    s = _held_by_a_stopping_session("7g.80gb", "7g.80gb", "7g.80gb")
    ds = s.finish("sess", NOW + 10)
    assert [d.workload for d in ds] == ["want"]
    check_capacity(s.inventory, s.running.values())


def test_what_a_reservation_held_back_is_looked_at_again_once_it_is_used():
    """b's debug run (1g.10gb) ranks first but may not use the GPU held for a's 4g.40gb;
    once a's session starts there, the GPU is no longer held and the debug run fits beside
    it: it starts in the same fill, not a cycle later (before issue 16: a cycle later)."""
    s = _held_by_a_stopping_session("7g.80gb", "4g.40gb", "1g.10gb")
    ds = s.finish("sess", NOW + 10)
    assert [d.workload for d in ds] == ["want", "debug"]
    assert {d.workload: d.placement.slices[0].mig_start for d in ds} == {"want": 0, "debug": 6}
    check_capacity(s.inventory, s.running.values())
