"""Whole cycles over random clusters that mix whole GPUs, MIG instances (fixed layouts and
carved GPUs) and MPS shares on the same nodes, with running work that is backed, unbacked,
idle, stopping or protected, charges in the window, and a queue of every kind. Each property
names the semantics of docs/core.md it guards; everything is checked against figures the test
computes itself (usage from the charges, grants from the budgets text, occupancy recounted
from the placements), never against the scheduler's own bookkeeping."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.inventory import Inventory, carve, make_node
from jupyter_gpubudget.core.model import (
    HOUR,
    MILLI,
    ChargeInterval,
    Policy,
    Preempt,
    Reserve,
    SliceRequest,
    Start,
    Workload,
    request_milli,
)
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule

from .helpers import THREE_PROJECTS, check_capacity, prop_settings, tree

PATHS = {"p": ("prog1", "p"), "q": ("prog1", "q"), "r": ("prog2", "r")}
PROJECTS = ["p", "q", "r"]
H100 = "H100-80GB"
FIXED = carve(H100, [("3g.40gb", None), ("2g.20gb", None), ("1g.10gb", None),
                     ("1g.10gb", None)])


@st.composite
def inventories(draw) -> Inventory:
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        gpus = draw(st.integers(1, 4))
        mig = tuple(j for j in range(gpus) if draw(st.integers(0, 3)) == 0)
        layout = {j: FIXED for j in mig if draw(st.booleans())}
        nodes.append(make_node(f"n{i}", H100, gpus, mig=mig, rack=f"r{i % 2}",
                               cpu_milli=draw(st.sampled_from([0, 32000])),
                               mig_layout=layout))
    return Inventory(tuple(nodes))


requests = st.one_of(
    st.builds(lambda n, single: SliceRequest.whole(n, single_node=single),
              st.sampled_from([1, 1, 2, 3, 5]), st.booleans()),
    st.builds(SliceRequest.mig, st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"])),
    st.builds(lambda m: SliceRequest.mps(m, cpu_milli=2000), st.sampled_from([250, 500, 700])),
    st.just(SliceRequest.cpu_only(cpu_milli=1000)),
)


@st.composite
def workloads(draw, prefix: str, n_max: int, at: float) -> list[Workload]:
    out = []
    for i in range(draw(st.integers(0, n_max))):
        out.append(Workload(
            f"{prefix}{i}", draw(st.sampled_from([*PROJECTS, "p", "nope"])),
            draw(st.sampled_from(["ann", "ben"])), draw(requests),
            submitted_at=at + draw(st.integers(0, 50)),
            kind=draw(st.sampled_from(["interactive", "batch", "debug"])),
            min_runtime=draw(st.sampled_from([0, 600, 3600, 4 * 3600, 20 * 3600])),
            resumable=draw(st.booleans()),
            time_limit=draw(st.sampled_from([None, 600.0, 1800.0, 7200.0, 36000.0])),
            snapshot_cost=draw(st.sampled_from([0.0, 30.0])),
            stops_at_once=draw(st.booleans())))
    return out


grants = st.fixed_dictionaries({k: st.sampled_from([0, 2, 10, 40, 1000])
                                for k in ["g1", "g2", "gp", "gq", "gr"]})


@st.composite
def states(draw) -> tuple[ClusterState, float]:
    """A cluster some hours into its life: work started by the scheduler itself earlier,
    some of it since reported idle or asked to stop, charges of the past, and a queue."""
    inv = draw(inventories())
    g = draw(grants)
    policy = Policy(max_reservations=draw(st.sampled_from([0, 1, 2])),
                    preemption_margin=draw(st.sampled_from([0.0, 0.25])),
                    preemption_toll=draw(st.sampled_from([0.0, 0.25])),
                    placement=draw(st.sampled_from(["fgd", "pack"])),
                    mig_first=draw(st.booleans()), mps_on_mig=draw(st.booleans()),
                    short_lane_patience=draw(st.sampled_from([0.0, 180.0])),
                    gang_overdue_after=draw(st.sampled_from([0.0, 600.0])),
                    backfill_lease=draw(st.sampled_from([0.0, 600.0, 3600.0])),
                    finish_drain_ratio=draw(st.sampled_from([0.0, 0.0, 4.0])),
                    gang_on_mig=draw(st.booleans()),
                    gang_on_mig_spare=draw(st.sampled_from([0, 1])))
    t = tree(THREE_PROJECTS.format(**g))
    s = Scheduler(t, inv, policy)
    for p in draw(st.lists(st.sampled_from(PROJECTS), max_size=3)):
        s.meter.add(ChargeInterval(f"old-{p}", p, "x", 2000, 0.0,
                                   draw(st.sampled_from([2, 8, 30])) * HOUR))
    t0 = 30 * HOUR
    for w in draw(workloads("old", 10, t0)):
        s.submit(replace(w, submitted_at=t0), t0)
    s.cycle(t0)
    now = t0 + draw(st.sampled_from([60.0, 1800.0, 3 * HOUR, 10 * HOUR]))
    running = []
    for w in s.running.values():
        flip = draw(st.integers(0, 5))
        if flip == 0 and w.kind == "interactive":
            w = replace(w, idle=True)
        elif flip == 1:
            w = replace(w, stopping=True, stops_at_once=False)
        running.append(w)
    pending = list(s.pending.values()) + draw(workloads("new", 8, now))
    return ClusterState(t, inv, policy, running, pending, s.meter.charges()), now


def usage_now(state: ClusterState, now: float) -> dict[str, float]:
    """GPU-hours per account in the window, from the charges (semantics 7)."""
    out = dict.fromkeys(["prog1", "prog2", *PROJECTS], 0.0)
    for c in state.charges:
        end = now if c.end is None else min(c.end, now)
        lo = max(c.start, now - state.policy.window)
        if end > lo and c.project in PATHS:
            for a in PATHS[c.project]:
                out[a] += c.milli / MILLI * (end - lo) / HOUR
    return out


def grants_of(state: ClusterState) -> dict[str, float]:
    return {a: state.accounts.get(a).grant_hours or 0.0 for a in state.accounts.accounts}


@prop_settings(120, 30)
@given(states())
def test_a_cycle_keeps_every_promise(state_now):
    """Semantics 1 (capacity: recounted from the placements), 2 (nothing protected is
    preempted; a preempted session that does not stop at once keeps its slice), 4 and the
    backing rule (a Start is backed exactly when every account on its project's path has room
    for its usage, the protected time already promised and this workload's protected
    GPU-hours — computed here from the charges and the budgets), protection (a backed start
    is protected for its capped min_runtime, an unbacked one not at all), 5 (gangs all or
    nothing), and work conservation: nothing that fits idle capacity is left waiting."""
    state, now = state_now
    s = Scheduler.from_state(state)
    assert not s.inconsistent
    before = {w.id: w for w in state.running}
    ds = s.cycle(now)
    assert ds == schedule(state, now)  # deterministic, and the state is left untouched
    check_capacity(state.inventory, s.running.values())
    usage, g = usage_now(state, now), grants_of(state)
    committed = dict.fromkeys(g, 0.0)
    for w in state.running:
        if w.backed and w.protected_until and w.protected_until > now and w.placement:
            for a in PATHS[w.project]:
                committed[a] += w.placement.fraction * (w.protected_until - now) / HOUR
    pending = {w.id: w for w in state.pending}
    for d in ds:
        if isinstance(d, Start):
            w = pending[d.workload]
            assert w.project in PATHS, "work of an unknown project started"
            protect = max(0.0, min(w.min_runtime, state.policy.cap_for(w.kind)))
            need = request_milli(w.request) / MILLI * protect / HOUR
            backed = all(g[a] > 0 and usage[a] + committed[a] + need <= g[a] + 1e-9
                         for a in PATHS[w.project])
            assert d.backed == backed, (w, usage, committed)
            assert d.protected_until == (now + protect if backed else None)
            if backed:
                for a in PATHS[w.project]:
                    committed[a] += d.placement.fraction * protect / HOUR
            if w.request.kind == "gpu":
                assert len({(x.node, x.gpu) for x in d.placement.slices}) == w.request.gpus
            assert s.running[d.workload].placement == d.placement
        elif isinstance(d, Preempt):
            v = before[d.workload]
            assert not v.is_protected(now), f"protected {v.id} preempted"
            assert not v.stopping, f"{v.id} asked to stop twice"
            if v.stops_at_once:
                assert d.workload not in s.running
            else:
                assert s.running[d.workload].stopping
                assert s.running[d.workload].placement == v.placement
        elif isinstance(d, Reserve):
            assert d.workload in s.pending and d.at >= now
    # work conservation: what still waits does not fit what is idle
    for w in s.pending.values():
        if w.project in PATHS:
            assert s._place(w, now + s.predict_long(w)) is None, f"{w.id} fits but waits"
    # nothing lost or duplicated
    assert set(s.pending) | set(s.running) | {d.workload for d in ds if isinstance(d, Preempt)
                                              } >= set(pending) | set(before)
    assert not set(s.pending) & set(s.running)


@prop_settings(80, 20)
@given(states(), st.data())
def test_the_incremental_path_keeps_capacity_and_fills_what_frees(state_now, data):
    """Semantics 1 and work conservation on the incremental path: arrivals start only on
    idle capacity; a finish or cancel fills what it frees in rank order so that nothing that
    fits is left waiting; node failures stop what was on the node, protected or not."""
    state, now = state_now
    s = Scheduler.from_state(state)
    s.cycle(now)
    for step in range(data.draw(st.integers(1, 8))):
        now += data.draw(st.sampled_from([1.0, 600.0, 3600.0]))
        op = data.draw(st.sampled_from(["submit", "finish", "cancel", "fail", "cycle"]))
        if op == "submit":
            (w,) = data.draw(workloads(f"s{step}-", 1, now).filter(len))
            before = dict(s.running)
            ds = s.submit(w, now)
            assert set(s.running) - set(before) <= {w.id}
            assert [d.workload for d in ds] in ([], [w.id])
            if not ds:
                assert w.id in s.pending
        elif op in ("finish", "cancel") and s.running:
            wid = data.draw(st.sampled_from(sorted(s.running)))
            ds = s.finish(wid, now) if op == "finish" else s.cancel(wid, now)
            assert wid not in s.running
            for w in s.pending.values():
                if w.project in PATHS:
                    assert s._place(w, now + s.predict_long(w)) is None, f"{w.id} waits"
            assert all(isinstance(d, Start) for d in ds)
        elif op == "fail":
            node = data.draw(st.sampled_from(state.inventory.nodes)).name
            on = {wid for wid, w in s.running.items() if node in w.placement.nodes}
            assert set(s.fail_node(node, now)) == on
            assert not on & set(s.running)
        else:
            s.cycle(now)
        check_capacity(state.inventory, s.running.values())
        assert not set(s.pending) & set(s.running)
