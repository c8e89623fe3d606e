"""Advance reservations ("bookings") in the core (core/reservations.py): properties over many
cycles, and the booking of GPUs itself.

A small driver runs ``schedule(state, now)`` cycle after cycle with the bookings in the
state, carries out its decisions (starts, preemptions), ends running work after a drawn run
time, and checks after every cycle, from the running and pending lists alone: no protected
work of another project overlaps a booking's window on its GPUs, nobody else's work is on
them inside the window, and inside the window the booking's project has no pending work
that fits the booking's free GPUs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.model import HOUR, Preempt, Start, Workload
from jupyter_gpubudget.core.reservations import Booking, BookingError, choose_gpus
from jupyter_gpubudget.core.scheduler import ClusterState, schedule

from .helpers import inventory, job, prop_settings, tree

STEP = 300.0  # seconds between cycles


def gpus_of(w: Workload) -> set[tuple[str, int]]:
    assert w.placement is not None
    return {(s.node, s.gpu) for s in w.placement.slices if s.gpu >= 0}


def check(now: float, bookings: list[Booking], running: dict[str, Workload],
          waiting: dict[str, Workload], starts_at: dict[str, float],
          requeued: frozenset[str] = frozenset()) -> None:
    """The three properties after a cycle at ``now``. ``requeued``: work this very cycle
    preempted (e.g. off another booking's GPUs at its window's start); it is pending again
    only from the next cycle on, so it may start there, not in the cycle that stopped it."""
    held = {key: w for w in running.values() for key in gpus_of(w)}
    for b in bookings:
        booked = set(b.gpus)
        for w in running.values():
            if w.project == b.project or not (gpus_of(w) & booked):
                continue
            if w.protected_until is not None:
                assert not (starts_at[w.id] < b.end and b.start < w.protected_until), \
                    f"{w.id} of {w.project} is protected on {b.id}'s GPUs into its window"
            assert not b.active(now), f"{w.id} of {w.project} runs on {b.id}'s GPUs in its window"
        if b.active(now):
            free = sum(1 for key in booked if key not in held)
            fits = [w.id for w in waiting.values() if w.project == b.project
                    and w.submitted_at <= now and w.request.gpus <= free
                    and w.id not in requeued]
            assert not fits, f"{fits} of {b.project} wait while {free} GPUs of {b.id} are free"


def drive(work: list[Workload], runtimes: dict[str, float], bookings: list[Booking],
          nodes: int, gpus: int, cycles: int) -> list[str]:
    inv = inventory(nodes=nodes, gpus=gpus)
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
        requeued: set[str] = set()
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
                requeued.add(w.id)
                waiting[w.id] = replace(w, placement=None, started_at=None, backed=False,
                                        protected_until=None)
        check(now, bookings, running, waiting, starts_at, frozenset(requeued))
    return starts


@st.composite
def scenario(draw):
    nodes, gpus = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    inv = inventory(nodes=nodes, gpus=gpus)
    bookings: list[Booking] = []
    for k in range(draw(st.integers(1, 3))):
        start = STEP * draw(st.integers(1, 20)) + draw(st.sampled_from([0.0, 1.0, 150.0]))
        end = start + STEP * draw(st.integers(1, 12))
        want = draw(st.integers(1, nodes * gpus))
        try:
            chosen = choose_gpus(inv, bookings, want, start, end)
        except BookingError:
            continue
        bookings.append(Booking(f"bk{k}", draw(st.sampled_from(["a", "b"])), start, end,
                                chosen))
    work = []
    for i in range(draw(st.integers(1, 14))):
        w = job(f"w{i}", draw(st.sampled_from(["a", "b"])),
                gpus=draw(st.integers(1, min(2, nodes * gpus))),
                at=STEP * draw(st.integers(0, 20)),
                min_runtime=draw(st.sampled_from([0.0, 600.0, 2 * HOUR, 6 * HOUR])),
                kind=draw(st.sampled_from(["batch", "interactive"])),
                limit=draw(st.sampled_from([600.0, HOUR, 4 * HOUR, None])))
        work.append(w)
    runtimes = {w.id: draw(st.sampled_from([300.0, 900.0, 3 * HOUR, 10 * HOUR])) for w in work}
    return nodes, gpus, bookings, work, runtimes


@given(scenario())
@prop_settings(80)
def test_no_protected_work_of_others_overlaps_a_booking_and_its_work_starts_in_one_cycle(sc):
    nodes, gpus, bookings, work, runtimes = sc
    drive(work, runtimes, bookings, nodes, gpus, cycles=40)


@given(gpus=st.integers(1, 4), n=st.integers(1, 6), min_runtime=st.sampled_from([0.0, 8 * HOUR]))
@prop_settings(40)
def test_at_the_windows_start_the_bookings_work_starts_within_one_cycle(gpus, n, min_runtime):
    """Others fill the cluster first (long, protected where they may be); the booking's
    project submits before its window; at the first cycle inside it, what fits starts."""
    inv = inventory(nodes=1, gpus=gpus)
    start = 10 * STEP
    b = Booking("bk", "a", start, start + 4 * HOUR, choose_gpus(inv, [], gpus, start,
                                                                start + 4 * HOUR))
    others = [job(f"o{i}", "b", at=0.0, min_runtime=min_runtime, limit=600.0)
              for i in range(gpus)]
    mine = [job(f"m{i}", "a", at=STEP, limit=None) for i in range(n)]
    runtimes = {w.id: 24 * HOUR for w in others + mine}
    starts = drive(others + mine, runtimes, [b], 1, gpus, cycles=12)
    assert sum(1 for s in starts if s.startswith("m")) == min(n, gpus)


@given(nodes=st.integers(1, 3), gpus=st.integers(1, 4), data=st.data())
@prop_settings(100)
def test_no_booking_exceeds_the_clusters_capacity_for_its_window(nodes, gpus, data):
    inv = inventory(nodes=nodes, gpus=gpus)
    names = [n.name for n in inv.nodes]
    accepted: list[Booking] = []
    for k in range(data.draw(st.integers(1, 8))):
        start = 3600.0 * data.draw(st.integers(0, 10))
        end = start + 3600.0 * data.draw(st.integers(1, 6))
        want = data.draw(st.integers(1, nodes * gpus + 1))
        on = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=2))
        free = [(n, i) for n in (on or names) for i in range(gpus)
                if not any(b.overlaps(start, end) and (n, i) in b.gpus for b in accepted)]
        try:
            chosen = choose_gpus(inv, accepted, want, start, end, nodes=on)
        except BookingError as e:
            assert len(free) < want, f"refused ({e}) with {len(free)} free for {want}"
            assert e.field == ("nodes" if on else "gpus")
            continue
        assert len(chosen) == want == len(set(chosen)) and set(chosen) <= set(free)
        accepted.append(Booking(f"bk{k}", "a", start, end, chosen))
    for x in accepted:  # never one GPU twice in overlapping windows
        for y in accepted:
            if x is not y and x.overlaps(y.start, y.end):
                assert not set(x.gpus) & set(y.gpus)


def test_work_of_others_placed_before_a_window_is_protected_only_until_its_start():
    inv = inventory(nodes=1, gpus=2)
    b = Booking("bk", "a", 2 * HOUR, 4 * HOUR, (("n0", 0), ("n0", 1)))
    w = job("x", "b", at=0.0, min_runtime=3 * HOUR, limit=HOUR)
    [d] = schedule(ClusterState(tree(), inv, pending=[w], bookings=[b]), 0.0)
    assert isinstance(d, Start) and d.protected_until == 2 * HOUR
    long = job("y", "b", at=0.0, limit=3 * HOUR)  # predicted to run into the window
    assert schedule(ClusterState(tree(), inv, pending=[long], bookings=[b]), 0.0) == []
    ran = replace(w, placement=d.placement, started_at=0.0, backed=True,
                  protected_until=d.protected_until)
    out = schedule(ClusterState(tree(), inv, running=[ran], pending=[job("m", "a")],
                                bookings=[b]), 2 * HOUR)
    assert [type(d).__name__ for d in out] == ["Preempt", "Start"]
    assert "booked" in out[0].reason and out[1].workload == "m"


def test_after_its_window_the_gpus_are_ordinary_again():
    inv = inventory(nodes=1, gpus=1)
    b = Booking("bk", "a", 0.0, HOUR, (("n0", 0),))
    w = job("x", "b", at=0.0, limit=10 * HOUR)
    assert schedule(ClusterState(tree(), inv, pending=[w], bookings=[b]), 1800.0) == []
    [d] = schedule(ClusterState(tree(), inv, pending=[w], bookings=[b]), HOUR)
    assert isinstance(d, Start)


@pytest.mark.parametrize("kw,field", [
    (dict(gpus=0, start=0.0, end=1.0), "gpus"),
    (dict(gpus=True, start=0.0, end=1.0), "gpus"),
    (dict(gpus=10**9, start=0.0, end=1.0), "gpus"),
    (dict(gpus=1, start=5.0, end=5.0), "end"),
    (dict(gpus=1, start=0.0, end=10 * 366 * 86400.0), "end"),
    (dict(gpus=1, start=0.0, end=1.0, nodes=["nope"]), "nodes"),
    (dict(gpus=9, start=0.0, end=1.0), "gpus"),
    (dict(gpus=1, start=0.0, end=1.0, cluster="elsewhere"), "cluster"),
])
def test_a_booking_that_cannot_be_made_names_its_field(kw, field):
    with pytest.raises(BookingError) as e:
        choose_gpus(inventory(nodes=2, gpus=4), [], **kw)
    assert e.value.field == field


def test_a_node_booked_in_an_overlapping_window_is_refused_with_the_other_booking():
    inv = inventory(nodes=2, gpus=2)
    first = Booking("course", "a", 0.0, 7200.0, choose_gpus(inv, [], 2, 0.0, 7200.0))
    node = first.gpus[0][0]
    with pytest.raises(BookingError, match="course") as e:
        choose_gpus(inv, [first], 1, 3600.0, 9000.0, nodes=[node])
    assert e.value.field == "nodes"
    assert choose_gpus(inv, [first], 1, 7200.0, 9000.0, nodes=[node])  # after it: free
    assert {n for n, _ in choose_gpus(inv, [first], 2, 3600.0, 9000.0)} != {node}
