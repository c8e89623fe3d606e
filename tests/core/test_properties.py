"""Property tests over random clusters and workloads for the core's invariants (docs/core.md, semantics 1-5):
capacity, protection, standing, backing, gang, backfill reservation — and determinism."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import (
    HOUR,
    ChargeInterval,
    Policy,
    Preempt,
    Reserve,
    SliceRequest,
    Start,
    Workload,
)
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule

from .helpers import THREE_PROJECTS, check_capacity, prop_settings, tree

SETTINGS = prop_settings(60)

PROJECTS = ["p", "q", "r"]


@st.composite
def inventories(draw) -> Inventory:
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        gpus = draw(st.integers(1, 8))
        model = draw(st.sampled_from(["H100-80GB", "A100-40GB", "H200-141GB"]))
        mig = tuple(j for j in range(gpus) if draw(st.booleans()) and j % 3 == 2)
        nodes.append(make_node(f"n{i}", model, gpus, mig=mig, rack=f"r{i % 2}",
                               cpu_milli=draw(st.sampled_from([0, 64000]))))
    return Inventory(tuple(nodes))


requests = st.one_of(
    st.builds(lambda n, single: SliceRequest.whole(n, single_node=single),
              st.integers(1, 10), st.booleans()),
    st.builds(SliceRequest.mig, st.sampled_from(
        ["1g.10gb", "2g.20gb", "3g.40gb", "1g.5gb", "1g.18gb", "4g.71gb", "7g.80gb"])),
    st.builds(lambda m: SliceRequest.mps(m, cpu_milli=4000), st.sampled_from([100, 250, 500, 700])),
)


@st.composite
def workloads(draw, n_max: int = 14) -> list[Workload]:
    out = []
    for i in range(draw(st.integers(1, n_max))):
        out.append(Workload(
            f"w{i}", draw(st.sampled_from(PROJECTS)), draw(st.sampled_from(["ann", "ben"])),
            draw(requests), submitted_at=float(draw(st.integers(0, 50))),
            kind=draw(st.sampled_from(["interactive", "batch", "debug"])),
            min_runtime=draw(st.sampled_from([0, 600, 3600, 4 * 3600, 20 * 3600])),
            resumable=draw(st.booleans()),
            time_limit=draw(st.sampled_from([None, 1800.0, 7200.0, 36000.0]))))
    return out


grants = st.fixed_dictionaries({k: st.sampled_from([0, 5, 20, 100, 1000])
                                for k in ["g1", "g2", "gp", "gq", "gr"]})


def _check_cycle(s: Scheduler, decisions, now: float, protected_before: set[str],
                 backed_before: dict[str, bool], victims: dict[str, str] | None = None,
                 overdue: set[str] | None = None, kinds: dict[str, str] | None = None) -> None:
    victims = victims or {}
    overdue = overdue or set()
    kinds = kinds or {}
    check_capacity(s.inventory, s.running.values())
    starts = {d.workload: d for d in decisions if isinstance(d, Start)}
    reserved: list[tuple[float, set[tuple[str, int]]]] = []
    for d in decisions:
        if isinstance(d, Preempt):
            # protection: never a workload protected at the time of the decision
            assert d.workload not in protected_before, f"protected {d.workload} preempted"
            if d.for_workload is not None:
                # backing: only backed work preempts, and a backed victim only for a
                # workload whose project stands strictly lower — unless the victim was
                # backfilled onto reserved GPUs and is still running past that reservation
                assert starts[d.for_workload].backed
                if d.reason.startswith("backfilled"):
                    assert d.workload in overdue, f"{d.workload} reclaimed but not overdue"
                elif d.reason.startswith("a short debug run"):
                    # the short lane takes only batch work that has just saved its progress
                    assert kinds[d.workload] == "batch"
                    assert s.short(s.running[d.for_workload])
                elif d.reason.startswith("the last of a drain"):
                    # finish_drain_ratio: a gang's straggler, of a project standing level
                    # with the gang's or above it
                    st_ = s._st
                    assert st_ is not None
                    gang = s.running[d.for_workload]
                    assert gang.request.kind == "gpu" and gang.request.gpus >= 2
                    mine = st_.path_standing[gang.project]
                    assert mine <= st_.path_standing[victims[d.workload]]
                elif backed_before.get(d.workload):
                    st_ = s._st
                    assert st_ is not None
                    mine = st_.path_standing[s.running[d.for_workload].project]
                    assert mine < st_.path_standing[victims[d.workload]]
        elif isinstance(d, Reserve):
            reserved.append((d.at, {(x.node, x.gpu) for x in d.placement.slices}))
        elif isinstance(d, Start):
            w = s.running[d.workload]
            if not d.backed:
                assert d.protected_until is None  # unbacked work is never protected
            req = w.request
            if req.kind == "gpu":  # gang: all or nothing, distinct GPUs
                assert len(d.placement.slices) == req.gpus
                assert len({(x.node, x.gpu) for x in d.placement.slices}) == req.gpus
                if req.single_node:
                    assert len(d.placement.nodes) == 1
            # backfill: reserved GPUs only for work predicted to end before the reservation
            end = now + s.predict_long(w)
            used = {(x.node, x.gpu) for x in d.placement.slices}
            for at, gpus in reserved:
                if used & gpus:
                    assert end <= at, f"{d.workload} backfilled past a reservation"


@SETTINGS
@given(inventories(), workloads(), grants, st.lists(st.integers(0, 7), max_size=12),
       st.lists(st.sampled_from(PROJECTS), max_size=4))
def test_invariants_hold_over_random_event_sequences(inv, ws, g, ops, heavy):
    s = Scheduler(tree(THREE_PROJECTS.format(**g)), inv, Policy(max_reservations=2))
    for p in heavy:
        s.meter.add(ChargeInterval(f"old-{p}", p, "x", 1000, 0.0, 30 * HOUR))
    now = 30 * HOUR
    queue = list(ws)
    for op in ops:
        protected = {wid for wid, w in s.running.items() if w.is_protected(now)}
        backed = {wid: w.backed for wid, w in s.running.items()}
        projects = {wid: w.project for wid, w in s.running.items()}
        overdue = {wid for wid, w in s.running.items()
                   if w.backfill_until is not None and w.backfill_until <= now}
        kinds = {wid: w.kind for wid, w in s.running.items()}
        if op <= 2 and queue:
            w = queue.pop(0)
            ds = s.submit(w, now)
        elif op == 3 and s.running:
            ds = s.finish(sorted(s.running)[0], now)
        elif op == 4:
            node = inv.nodes[0].name
            s.set_healthy(node, node in s.unhealthy)
            ds = []
        else:
            ds = s.cycle(now)
        _check_cycle(s, ds, now, protected, backed, projects, overdue, kinds)
        now += [60.0, 1800.0, 3 * 3600.0][op % 3]
    # nothing is lost: every workload is pending, running or was preempted/finished
    assert set(s.pending).isdisjoint(s.running)


@SETTINGS
@given(inventories(), workloads(), grants, st.lists(st.sampled_from(PROJECTS), max_size=5))
def test_standing_orders_siblings_and_schedule_is_deterministic(inv, ws, g, heavy):
    """Fair Tree: between sibling projects, if the one standing higher started a workload,
    the first pending workload of the lower one — first in its own order: the short lane,
    then by kind, then by submission — started too when it has the same kind, shape and run
    time."""
    g = dict(g, g1=1000, g2=1000, gp=1000, gq=1000, gr=1000)  # everything backed
    charges = [ChargeInterval(f"c{i}", p, "x", 1000, 0.0, (i + 1) * 7 * HOUR)
               for i, p in enumerate(heavy)]
    state = ClusterState(tree(THREE_PROJECTS.format(**g)), inv, Policy(preemption=False, backfill=False),
                         pending=ws, charges=charges)
    now = 40 * HOUR
    ds = schedule(state, now)
    assert ds == schedule(state, now)
    s = Scheduler.from_state(state)
    st_ = s._standings(now)
    started = {d.workload for d in ds if isinstance(d, Start)}
    by_id = {w.id: w for w in ws}
    from jupyter_gpubudget.core.ranking import kind_rank

    heads = {}
    for w in sorted(ws, key=lambda w: (not s.short(w), kind_rank(w.kind), w.submitted_at, w.id)):
        heads.setdefault(w.project, w)
    for a, b in (("p", "q"), ("q", "p")):
        if a not in heads or st_.standing[a] >= st_.standing[b]:
            continue
        x = heads[a]
        for wid in started:
            y = by_id[wid]
            if (y.project == b and y.request.shape == x.request.shape
                    and y.time_limit == x.time_limit and y.kind == x.kind):
                assert x.id in started, f"{y.id} of {b} started before head {x.id} of {a}"


@SETTINGS
@given(inventories(), workloads(n_max=10), grants)
def test_full_cycle_from_state_respects_capacity(inv, ws, g):
    state = ClusterState(tree(THREE_PROJECTS.format(**g)), inv, pending=ws)
    s = Scheduler.from_state(state)
    ds = s.cycle(10 * HOUR)
    _check_cycle(s, ds, 10 * HOUR, set(), {})
    # a second cycle over the resulting state changes nothing that is protected
    state2 = ClusterState(state.accounts, inv, running=list(s.running.values()),
                          pending=list(s.pending.values()), charges=s.meter.charges())
    protected = {wid for wid, w in s.running.items() if w.is_protected(11 * HOUR)}
    s2 = Scheduler.from_state(state2)
    _check_cycle(s2, s2.cycle(11 * HOUR), 11 * HOUR, protected, {})


@SETTINGS
@given(inventories(), workloads(n_max=12), workloads(n_max=6), st.integers(0, 30),
       st.sampled_from([5, 20, 100]))
def test_contention_preempts_only_unprotected_and_eligible(inv, first, second, hours, gr):
    """Phase 1 fills the cluster with an over-used project's work; phase 2, some hours later,
    brings under-used work. Whatever is preempted was unprotected and eligible."""
    t = tree(THREE_PROJECTS.format(g1=1000, g2=1000, gp=500, gq=500, gr=gr))
    s = Scheduler(t, inv, Policy(max_reservations=2))
    s.meter.add(ChargeInterval("past", "r", "x", 1000, 0.0, 10 * HOUR))
    for w in first:
        w.project = "r"
    for w in second:
        w.project = "p"
        w.id = "new-" + w.id
    now = 10 * HOUR
    for w in first:
        s.submit(w, now)
    s.cycle(now)
    later = now + hours * HOUR
    for w in second:
        s.submit(Workload(**{**{f: getattr(w, f) for f in w.__dataclass_fields__},
                             "submitted_at": later}), later)
    protected = {wid for wid, w in s.running.items() if w.is_protected(later)}
    backed = {wid: w.backed for wid, w in s.running.items()}
    projects = {wid: w.project for wid, w in s.running.items()}
    kinds = {wid: w.kind for wid, w in s.running.items()}
    ds = s.cycle(later)
    _check_cycle(s, ds, later, protected, backed, projects, kinds=kinds)
    preempted = {d.workload for d in ds if isinstance(d, Preempt)}
    assert not preempted & protected


@SETTINGS
@given(inventories(), workloads(n_max=8), st.integers(1, 40))
def test_lower_standing_sibling_goes_first_with_mirrored_queues(inv, ws, used_hours):
    """p and q queue identical work; q has used more. Then for every shape, q never has more
    of it started than p, and p's first workload (first in its own order: short lane, kind,
    submission) starts whenever any q workload of its kind, shape and run time does."""
    t = tree(THREE_PROJECTS.format(g1=1000, g2=1000, gp=1000, gq=1000, gr=1000))
    pend = []
    for w in ws:
        for proj in ("p", "q"):
            pend.append(Workload(**{**{f: getattr(w, f) for f in w.__dataclass_fields__},
                                    "id": f"{proj}-{w.id}", "project": proj}))
    charges = [ChargeInterval("c", "q", "x", 1000, 0.0, used_hours * HOUR)]
    state = ClusterState(t, inv, Policy(preemption=False, backfill=False), pending=pend,
                         charges=charges)
    ds = schedule(state, 50 * HOUR)
    started = {d.workload for d in ds if isinstance(d, Start)}
    from jupyter_gpubudget.core.ranking import kind_rank

    s = Scheduler.from_state(state)
    head = min(ws, key=lambda w: (not s.short(w), kind_rank(w.kind), w.submitted_at, w.id))
    for w in ws:
        if f"q-{w.id}" in started and (w.request.shape, w.time_limit, w.kind) == (
                head.request.shape, head.time_limit, head.kind):
            assert f"p-{head.id}" in started
    shapes = {}
    for wid in started:
        proj, orig = wid.split("-", 1)
        shapes.setdefault(next(w.request.shape for w in ws if w.id == orig), []).append(proj)
    for projs in shapes.values():
        assert projs.count("q") <= projs.count("p") + 1
