"""The state of one full scheduling cycle, passed from step to step (scheduler.py's
``Scheduler._cycle``), with named transitions instead of ad-hoc resets; and the steps for one
blocked, backed workload that need no more than that state: reclaim overdue backfill
(:func:`reclaim`), preempt for it (:func:`preempt_for`), reserve for a gang
(:func:`reserve_gang`).

The cycle remembers which request shapes it already found no room for (the "does not fit"
memo, :func:`memo_key`): a shape that did not fit does not fit again until capacity is freed
or reservations move (:meth:`CycleState.capacity_changed`), which makes a deep queue cheap.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .accounts import AccountTree
from .backfill import leasable, plan_reservation
from .capacity import Cluster
from .drains import LossBudget, finish_drain
from .lane import lane_preempt
from .model import Decision, Placement, Policy, Reserve, Start, Workload
from .preemption import Take
from .preemption_search import overdue_backfill, reclaim_backfill, try_preempt
from .ranking import INF, Standings

Memo = tuple[object, ...]
Shape = tuple[object, ...]


def memo_key(w: Workload, end: float, res_times: list[float], policy: Policy) -> Memo:
    """The "does not fit" memo key of ``w``: its shape, where its end falls among the
    times GPUs are held to (``res_times``, ascending), and whether it may lease reserved
    GPUs."""
    return (w.request.shape, bisect.bisect_left(res_times, end) if res_times else 0,
            policy.backfill_lease > 0 and leasable(w, policy))


def overdue_gang(w: Workload, now: float, policy: Policy, first_planned: Mapping[str, float]
                 ) -> bool:
    """Has gang ``w`` waited ``policy.gang_overdue_after`` past the start its first
    reservation planned for it (``first_planned``)?"""
    after = policy.gang_overdue_after
    first = first_planned.get(w.id)
    return after > 0 and first is not None and now >= first + after


@dataclass(slots=True)
class CycleState:
    """One cycle's clock, standings and decisions, what it has learnt on the way, and the
    scheduler's parts its steps act on (the same objects all cycle long)."""

    now: float
    st: Standings
    policy: Policy
    cluster: Cluster
    running: dict[str, Workload]
    #: per gang, the time and placement reserved for it
    reservations: dict[str, tuple[float, Placement]]
    #: per waiting gang, the start its first reservation planned (Policy.gang_overdue_after)
    first_planned: dict[str, float]
    #: the scheduler's preemption of victims for a workload (preemption.Take)
    take: Take
    out: list[Decision] = field(default_factory=list)
    #: running work that may be preempted in this cycle (empty: preemption is off)
    pool: dict[str, Workload] = field(default_factory=dict)
    #: the times GPUs are held back to by this cycle's reservations, ascending
    res_times: list[float] = field(default_factory=list)
    #: memo keys of the shapes known not to fit now
    failed: set[Memo] = field(default_factory=set)
    #: bumped whenever ``failed`` is reset
    memo_gen: int = 0
    #: per shape, the lowest path standing for which a preemption search found nothing
    preempt_failed: dict[Shape, tuple[float, ...]] = field(default_factory=dict)
    #: per gang constraints, the smallest gang that found no reservation
    no_plan: dict[tuple[object, ...], float] = field(default_factory=dict)
    #: backfill still running past its reservation's time (found once, when first needed)
    overdue: dict[str, Workload] | None = None
    #: unbacked work, and work that could not start in the backed pass; with the memo
    #: generation at which its shape was known not to fit (-1: not known)
    later: list[tuple[Workload, int]] = field(default_factory=list)
    #: per running workload, what its preemption at ``now`` throws away (GPU-hours, found
    #: once: the preemption searches of one cycle ask it of the same victims again and again)
    lost: dict[str, float] = field(default_factory=dict)
    #: the policy's cap on Starts was reached (:meth:`full`)
    capped: bool = False

    def full(self) -> bool:
        """Has this cycle decided ``policy.max_starts_per_cycle`` Starts (0: never)? Then
        nothing more is considered: the rest waits for the next cycle, in rank order."""
        cap = self.policy.max_starts_per_cycle
        if cap and not self.capped and len(self.out) >= cap:
            self.capped = sum(isinstance(d, Start) for d in self.out) >= cap
        return self.capped

    def capacity_changed(self) -> None:
        """Capacity was freed (a preemption) or a reservation moved the times GPUs are held
        to: every shape may fit again, so the memo is reset."""
        self.failed.clear()
        self.memo_gen += 1

    def reserved(self, at: float) -> None:
        """GPUs are now held back to ``at`` (a new reservation): memo keys depend on these
        times, so the memo is reset."""
        bisect.insort(self.res_times, at)
        self.capacity_changed()

    def drop_reserve(self, wid: str) -> None:
        """``wid`` starts now instead: its reservation in this cycle's decisions is moot."""
        self.out[:] = [d for d in self.out if not (isinstance(d, Reserve) and d.workload == wid)]


def nothing_fits(cyc: CycleState, shapes: Iterable[Shape]) -> bool:
    """Is every memo key the queued ``shapes`` can have (any place of an end among
    ``res_times``, leasable or not) known not to fit? Then no queued work is placed."""
    failed, marks = cyc.failed, range(len(cyc.res_times) + 1)
    flags = (False, True) if cyc.policy.backfill_lease > 0 else (False,)
    return all((s, i, f) in failed for s in shapes for i in marks for f in flags)


def idle_pass(cyc: CycleState, pending: Mapping[str, Workload], shapes: Iterable[Shape],
              predict_long: Callable[[Workload], float],
              place: Callable[[Workload, float, float], Placement | None],
              start: Callable[[Workload, Placement], None]) -> None:
    """Unbacked work (``cyc.later``) on whatever is idle (it never preempts), and anything
    whose shape may fit again since a preemption or reservation reset the memo; stops once
    no shape of the queue (``shapes``) fits (:func:`nothing_fits`: the rest would be
    skipped one by one)."""
    now, gen, failed = cyc.now, cyc.memo_gen, cyc.failed
    if nothing_fits(cyc, shapes):
        return
    for w, known_gen in cyc.later:
        if cyc.full():
            return
        if known_gen == gen or w.id not in pending:
            continue
        end = now + predict_long(w)
        memo = memo_key(w, end, cyc.res_times, cyc.policy)
        if memo in failed:
            continue
        p = place(w, end, now)
        if p is None:
            failed.add(memo)
            if nothing_fits(cyc, shapes):
                return
            continue
        if w.id in cyc.reservations:  # it starts now instead: its reservation is moot
            cyc.drop_reserve(w.id)
        start(w, p)


def reclaim(cyc: CycleState, w: Workload, end: float) -> bool:
    """Preempt backfill that outstayed a reservation for gang ``w``
    (:func:`preemption_search.reclaim_backfill`); True if ``w`` started."""
    if cyc.overdue is None:  # once per cycle
        cyc.overdue = overdue_backfill(cyc.running, cyc.now)
    return reclaim_backfill(w, end, cyc.now, cyc.overdue, cyc.running, cyc.cluster,
                            cyc.policy, cyc.st, cyc.take, cyc.out)


def preempt_for(cyc: CycleState, w: Workload, end: float, *,
                gain_horizon: Callable[[], float], short: Callable[[Workload], bool],
                accounts: AccountTree, grants: Mapping[str, float],
                committed: Mapping[str, float]) -> bool:
    """Preempt so that ``w`` starts now (:func:`preemption_search.try_preempt`; its
    ``gain_horizon()``), unless work of its shape standing no higher found nothing in this
    cycle; else, for short-lane work (``short``), take a batch job's GPU cheaply
    (:func:`lane.lane_preempt`). True if ``w`` started (or holds a reservation on what
    stops)."""
    now, st, shape = cyc.now, cyc.st, w.request.shape
    mine = st.path_standing[w.project]
    worst = cyc.preempt_failed.get(shape)
    overdue = overdue_gang(w, now, cyc.policy, cyc.first_planned)
    if overdue or worst is None or mine < worst:
        if try_preempt(w, end, now, cyc.pool, st, cyc.out, overdue,
                       gain_horizon=gain_horizon(), running=cyc.running, cluster=cyc.cluster,
                       policy=cyc.policy, accounts=accounts, grants=grants,
                       committed=committed, first_planned=cyc.first_planned, take=cyc.take,
                       lost=cyc.lost):
            return True
        cyc.preempt_failed[shape] = mine if worst is None else min(worst, mine)
    return (cyc.policy.short_lane_cost > 0 and short(w)
            and lane_preempt(w, end, now, cyc.pool, cyc.running, cyc.cluster, cyc.policy, st,
                             cyc.take, cyc.out))


def reserve_gang(cyc: CycleState, w: Workload, end: float,
                 ends: Callable[[], list[tuple[float, str]]], losses: LossBudget) -> None:
    """Reserve for gang ``w`` the GPUs running work is predicted to free first
    (:func:`backfill.plan_reservation` over the running work's cautious ``ends()``); then,
    with ``Policy.finish_drain_ratio``, perhaps preempt their last stragglers and start it
    now (:func:`drains.finish_drain`, within the ``losses`` budget)."""
    now, req = cyc.now, w.request
    no_plan = (req.gpu_model, req.single_node, req.cpu_milli, req.memory_mib, req.interconnect)
    if cyc.no_plan.get(no_plan, INF) <= req.gpus:
        return  # a gang this large or smaller found no reservation in this cycle
    plan = plan_reservation(cyc.cluster, req, now, ends())
    if plan is None:
        cyc.no_plan[no_plan] = min(cyc.no_plan.get(no_plan, INF), req.gpus)
        return
    at, placement = plan
    cyc.cluster.reserve(placement, at)
    cyc.reservations[w.id] = (at, placement)
    cyc.first_planned.setdefault(w.id, at)
    cyc.reserved(at)
    cyc.out.append(Reserve(w.id, at, placement))
    if (cyc.policy.finish_drain_ratio > 0 and cyc.pool
            and finish_drain(w, at, placement, end, now, cyc.pool, cyc.res_times, cyc.out,
                             cluster=cyc.cluster, policy=cyc.policy, st=cyc.st,
                             reservations=cyc.reservations, losses=losses, take=cyc.take)):
        cyc.capacity_changed()
