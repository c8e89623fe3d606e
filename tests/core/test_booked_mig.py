"""Bookings of MIG instances in the core (core/booked_slices.py): properties over many
cycles, and the booking of instances itself.

The driver of tests/core/test_reservations.py's kind runs ``schedule(state, now)`` cycle
after cycle on nodes with a whole GPU and a MIG GPU of a fixed layout, carries out the
starts and preemptions, ends work after a drawn run time, and checks after every cycle from
the running and pending lists alone: no protected work of another project overlaps a
booking's window on its instances, nobody else's work is on them inside the window, and
inside the window the booking's project has no pending work of a booked profile while one of
its instances of that profile is free."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import HOUR, Preempt, SliceRequest, Start, Workload
from jupyter_gpubudget.core.reservations import Booking, BookingError, choose_mig
from jupyter_gpubudget.core.scheduler import ClusterState, schedule

from .helpers import check_capacity, job, prop_settings, tree

STEP = 300.0
H100 = "H100-80GB"
LAYOUTS = {
    "sevens": tuple(("1g.10gb", i) for i in range(7)),
    "mixed": (("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6)),
}
SIZE = {"1g.10gb": 1, "3g.40gb": 4}


def mig_inventory(nodes: int, layout: str) -> Inventory:
    """Nodes of two GPUs: GPU 0 whole, GPU 1 in MIG mode with ``layout``'s instances."""
    return Inventory(tuple(make_node(f"n{i}", H100, 2, mig=(1,),
                                     mig_layout={1: LAYOUTS[layout]}) for i in range(nodes)))


def slots(w: Workload) -> set[tuple[str, int, int]]:
    """The MIG memory slots ``w`` holds (a whole GPU: none of a MIG GPU's)."""
    assert w.placement is not None
    return {(s.node, s.gpu, s.mig_start + k) for s in w.placement.slices if s.kind == "mig"
            for k in range(SIZE[s.profile or ""])}


def booked(b: Booking) -> set[tuple[str, int, int]]:
    return {(m.node, m.gpu, m.start + k) for m in b.mig for k in range(SIZE[m.profile])}


def check(now: float, bookings: list[Booking], running: dict[str, Workload],
          waiting: dict[str, Workload], starts_at: dict[str, float],
          freed: frozenset[tuple[str, int, int]]) -> None:
    """The three properties after a cycle at ``now``. ``freed``: slots this very cycle's
    preemptions emptied; the booking's work may take them in the next cycle."""
    held = set().union(*(slots(w) for w in running.values())) if running else set()
    for b in bookings:
        mine = booked(b)
        for w in running.values():
            if w.project == b.project or not (slots(w) & mine):
                continue
            if w.protected_until is not None:
                assert not (starts_at[w.id] < b.end and b.start < w.protected_until), \
                    f"{w.id} of {w.project} is protected on {b.id}'s instances into its window"
            assert not b.active(now), f"{w.id} of {w.project} runs on {b.id}'s instances"
        if b.active(now):
            for m in b.mig:
                inst = {(m.node, m.gpu, m.start + k) for k in range(SIZE[m.profile])}
                if inst & (held | freed):
                    continue
                fits = [w.id for w in waiting.values() if w.project == b.project
                        and w.submitted_at <= now and w.request.kind == "mig"
                        and w.request.profile == m.profile]
                assert not fits, f"{fits} of {b.project} wait while {m.key} of {b.id} is free"


def drive(inv: Inventory, work: list[Workload], runtimes: dict[str, float],
          bookings: list[Booking], cycles: int) -> list[str]:
    accounts = tree()
    running: dict[str, Workload] = {}
    waiting = {w.id: w for w in work}
    starts_at: dict[str, float] = {}
    starts: list[str] = []
    for i in range(cycles):
        now = STEP * i
        for wid in list(running):
            if now - starts_at[wid] >= runtimes[wid]:
                del running[wid]
        state = ClusterState(accounts, inv, running=list(running.values()),
                             pending=[w for w in waiting.values() if w.submitted_at <= now],
                             bookings=bookings)
        freed: set[tuple[str, int, int]] = set()
        for d in schedule(state, now):
            if isinstance(d, Start):
                w = waiting.pop(d.workload)
                running[w.id] = replace(w, placement=d.placement, started_at=now,
                                        backed=d.backed, protected_until=d.protected_until)
                starts_at[w.id] = now
                starts.append(w.id)
            elif isinstance(d, Preempt) and d.workload in running:
                w = running.pop(d.workload)
                assert not w.is_protected(now)
                freed |= slots(w)
                waiting[w.id] = replace(w, placement=None, started_at=None, backed=False,
                                        protected_until=None)
        check_capacity(inv, list(running.values()))
        check(now, bookings, running, waiting, starts_at, frozenset(freed))
    return starts


def mig_job(wid: str, project: str, profile: str, at: float, **kw) -> Workload:  # noqa: ANN003
    return job(wid, project, at=at, req=SliceRequest.mig(profile), **kw)


@st.composite
def scenario(draw):
    nodes, layout = draw(st.integers(1, 2)), draw(st.sampled_from(sorted(LAYOUTS)))
    inv = mig_inventory(nodes, layout)
    profiles = sorted({p for p, _ in LAYOUTS[layout]})
    bookings: list[Booking] = []
    for k in range(draw(st.integers(1, 3))):
        start = STEP * draw(st.integers(1, 16)) + draw(st.sampled_from([0.0, 1.0, 150.0]))
        end = start + STEP * draw(st.integers(1, 10))
        try:
            chosen = choose_mig(inv, bookings, draw(st.sampled_from(profiles)),
                                draw(st.integers(1, 4)), start, end)
        except BookingError:
            continue
        bookings.append(Booking(f"bk{k}", draw(st.sampled_from(["a", "b"])), start, end, (),
                                chosen))
    work = []
    for i in range(draw(st.integers(1, 16))):
        kw = {"min_runtime": draw(st.sampled_from([0.0, 600.0, 2 * HOUR, 6 * HOUR])),
              "kind": draw(st.sampled_from(["batch", "interactive"])),
              "limit": draw(st.sampled_from([600.0, HOUR, 4 * HOUR, None]))}
        project, at = draw(st.sampled_from(["a", "b"])), STEP * draw(st.integers(0, 18))
        if draw(st.integers(0, 4)) == 0:
            work.append(job(f"w{i}", project, gpus=1, at=at, **kw))
        else:
            work.append(mig_job(f"w{i}", project, draw(st.sampled_from(profiles)), at, **kw))
    runtimes = {w.id: draw(st.sampled_from([300.0, 900.0, 3 * HOUR, 10 * HOUR])) for w in work}
    return inv, bookings, work, runtimes


@given(scenario())
@prop_settings(80)
def test_booked_instances_are_the_bookings_in_their_window(sc):
    inv, bookings, work, runtimes = sc
    drive(inv, work, runtimes, bookings, cycles=30)


def test_a_booking_starts_its_sessions_on_its_instances_and_holds_the_rest():
    """Three 1g.10gb of seven booked for b over [1 h, 2 h). a fills the GPU before the
    window (its work unprotected past the start), at the window b's two sessions start on
    booked instances within the cycle, a's work on them is preempted, and a's new work is
    not placed on the third, free booked instance during the window."""
    inv = mig_inventory(1, "sevens")
    (b,) = [Booking("bk", "b", HOUR, 2 * HOUR, (), choose_mig(inv, [], "1g.10gb", 3,
                                                               HOUR, 2 * HOUR))]
    assert [m.key for m in b.mig] == ["n0:1:1g.10gb@0", "n0:1:1g.10gb@1", "n0:1:1g.10gb@2"]
    work = [mig_job(f"a{i}", "a", "1g.10gb", 0.0, min_runtime=6 * HOUR) for i in range(7)]
    work += [mig_job(f"b{i}", "b", "1g.10gb", HOUR - 600, kind="interactive")
             for i in range(2)]
    work += [mig_job("late", "a", "1g.10gb", HOUR + 600)]
    runtimes = {w.id: 10 * HOUR for w in work}
    starts = drive(inv, work, runtimes, [b], cycles=int(2 * HOUR / STEP) + 2)
    assert set(starts[:7]) == {f"a{i}" for i in range(7)}  # before the window: all of a's
    # b's sessions started at the window's start (the cycle after a's were preempted)
    assert "b0" in starts and "b1" in starts


@pytest.mark.parametrize(("args", "field", "match"), [
    (("2g.20gb", 1), "profile", r"no MIG GPU offers '2g.20gb' \(profiles: .*1g.10gb"),
    (("9g.99gb", 1), "profile", r"no MIG GPU offers '9g.99gb'"),
    (("1g.10gb", 8), "count", r"7 1g.10gb instances are free for this window, 8 asked"),
    (("1g.10gb", 0), "count", r"count: a whole number"),
])
def test_a_booking_that_cannot_be_made_names_its_field(args, field, match):
    inv = mig_inventory(1, "sevens")
    with pytest.raises(BookingError, match=match) as e:
        choose_mig(inv, [], args[0], args[1], HOUR, 2 * HOUR)
    assert e.value.field == field


def test_overlapping_bookings_do_not_share_an_instance():
    """Four of seven booked over [1 h, 3 h); a second booking over [2 h, 4 h) may take the
    other three, not a fourth (naming the booking that holds them), and one after the
    window may take all seven again; on named nodes the error names the nodes."""
    inv = mig_inventory(1, "sevens")
    first = Booking("bk1", "a", HOUR, 3 * HOUR, (),
                    choose_mig(inv, [], "1g.10gb", 4, HOUR, 3 * HOUR))
    got = choose_mig(inv, [first], "1g.10gb", 3, 2 * HOUR, 4 * HOUR)
    assert not {m.start for m in got} & {m.start for m in first.mig}
    with pytest.raises(BookingError, match=r"3 1g.10gb instances .* 4 asked; booked there "
                                           r"in this window: bk1") as e:
        choose_mig(inv, [first], "1g.10gb", 4, 2 * HOUR, 4 * HOUR, nodes=["n0"])
    assert e.value.field == "nodes"
    assert len(choose_mig(inv, [first], "1g.10gb", 7, 3 * HOUR, 4 * HOUR)) == 7
    with pytest.raises(BookingError, match="no node 'n9'"):
        choose_mig(inv, [], "1g.10gb", 1, HOUR, 2 * HOUR, nodes=["n9"])
    with pytest.raises(BookingError, match="end: the window must end after it starts"):
        choose_mig(inv, [], "1g.10gb", 1, 2 * HOUR, HOUR)


def test_mixed_layout_books_its_3g_instance_and_a_whole_gpu_booking_is_unchanged():
    inv = mig_inventory(1, "mixed")
    (m,) = choose_mig(inv, [], "3g.40gb", 1, HOUR, 2 * HOUR)
    assert (m.node, m.gpu, m.profile, m.start, m.mask) == ("n0", 1, "3g.40gb", 0, 0b1111)
    with pytest.raises(BookingError, match="1 3g.40gb instances are free"):
        choose_mig(inv, [], "3g.40gb", 2, HOUR, 2 * HOUR)


@given(scenario())
@prop_settings(30)
def test_a_kept_model_decides_as_a_model_from_scratch_with_booked_instances(sc):
    """The instances a booking holds for the rest of a cycle are allocations no workload
    has: the service's kept model (core/kept.py) releases them at the next cycle's resync,
    so its decisions stay those of a model built from scratch."""
    from jupyter_gpubudget.core.kept import KeptCycle
    from jupyter_gpubudget.core.scheduler import Scheduler

    inv, bookings, work, runtimes = sc
    accounts, kept = tree(), KeptCycle()
    running: dict[str, Workload] = {}
    waiting = {w.id: w for w in work}
    starts_at: dict[str, float] = {}
    for i in range(24):
        now = STEP * i
        for wid in [wid for wid in running if now - starts_at[wid] >= runtimes[wid]]:
            del running[wid]
        state = ClusterState(accounts, inv, running=list(running.values()),
                             pending=[w for w in waiting.values() if w.submitted_at <= now],
                             bookings=bookings)
        want = Scheduler.from_state(state).cycle(now)
        _s, got, _lock = kept.cycle(state, now)
        assert got == want, now
        for d in got:
            if isinstance(d, Start):
                w = waiting.pop(d.workload)
                running[w.id] = replace(w, placement=d.placement, started_at=now,
                                        backed=d.backed, protected_until=d.protected_until)
                starts_at[w.id] = now
            elif isinstance(d, Preempt) and d.workload in running:
                w = running.pop(d.workload)
                waiting[w.id] = replace(w, placement=None, started_at=None, backed=False,
                                        protected_until=None)
