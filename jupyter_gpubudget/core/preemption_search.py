"""The preemption search of a cycle: for one blocked, backed workload, which running work to
preempt so that it starts now — by standing (:func:`try_preempt`), or from backfill that
outstayed a gang's reservation (:func:`reclaim_backfill`).

preemption.py prices a preemption and chooses the cheapest set of victims among those
given; this module decides who is eligible for whom and whether the set pays, and leaves
the acting to the scheduler (``take``: preempt, then start or reserve).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .accounts import AccountTree
from .capacity import Cluster
from .model import HOUR, MILLI, Decision, Placement, Policy, Reserve, Workload, request_milli
from .placement import place
from .preemption import (
    Preempter,
    Starter,
    Take,
    choose_victims,
    fits_without,
    place_without,
    preemption_cost,
    preemption_gain,
    preemption_pays,
    standing_gap,
)
from .ranking import INF, Standings


def try_preempt(w: Workload, end: float, now: float, pool: dict[str, Workload],
                st: Standings, out: list[Decision], overdue: bool, *, gain_horizon: float,
                running: Mapping[str, Workload], cluster: Cluster, policy: Policy,
                accounts: AccountTree, grants: Mapping[str, float],
                committed: Mapping[str, float], first_planned: Mapping[str, float],
                take: Take, lost: dict[str, float] | None = None) -> bool:
    """Preempt eligible running work so that ``w`` starts now, if that pays; for an
    overdue gang (``policy.gang_overdue_after``) whatever it costs, but still only work
    of accounts standing above its own. ``pool``: the running work that may be preempted;
    ``gain_horizon``: the seconds of ``w``'s run that starting now instead of when running
    work frees capacity would buy; ``committed``: per account, the GPU-hours promised to
    protected runs; ``first_planned``: per gang, the start its first reservation
    planned; ``lost``: per running workload, what its preemption at ``now`` throws away, as
    far as known (filled in as found: the same for the whole cycle)."""
    margin = policy.preemption_margin
    frac = request_milli(w.request) / MILLI
    need = frac * policy.effective_min_runtime(w) / HOUR
    # what preempting buys: the protected run, but at most as much of it as it moves
    # earlier — capacity frees up anyway when running work ends
    gain_hours = frac * gain_horizon / HOUR
    mine = accounts.path(w.project)
    gaps: dict[tuple[str, bool], float] = {}

    def promised(acc: str, extra: float = 0.0) -> float:
        """Where an account will stand once the protected runs promised to it (and
        ``extra`` GPU-hours) are used: (usage + promised + extra) / grant."""
        g = grants.get(acc, 0.0)
        return (st.usage[acc] + committed.get(acc, 0.0) + extra) / g if g > 0 else INF

    def gap_to(project: str, backed: bool) -> float:
        """At the first level where the paths differ: how far the victim's account
        stands above the requester's — charged for this workload's protected time —
        relative to the victim's (0: not above by the margin; no flip-back, no thrash).
        For unbacked victims both count the protected runs promised to them, as backing
        does (a project whose grant is promised to protected work is unbacked before it
        has used much)."""
        if (project, backed) not in gaps:
            gap = 0.0
            for mine_acc, theirs in zip(mine, accounts.path(project), strict=False):
                if mine_acc != theirs:
                    if backed:
                        g = grants.get(mine_acc, 0.0)
                        after = (st.usage[mine_acc] + need) / g if g > 0 else INF
                        gap = standing_gap(after * (1.0 + margin), st.standing[theirs])
                    else:
                        gap = standing_gap(promised(mine_acc, need) * (1.0 + margin),
                                           promised(theirs))
                    break
            gaps[(project, backed)] = gap
        return gaps[(project, backed)]

    def gap_of(v: Workload) -> float:
        """An idle session yields to any backed work; anyone else only to an account
        that stands clearly below its own (unbacked work too: its project is over its
        grant, but a project that is only a little over does not take turns with one a
        little under)."""
        if v.idle:
            return 1.0
        if v.project not in st.path_standing:
            return 1.0
        return gap_to(v.project, v.backed)

    costs: dict[str, float] = {}
    eligible: dict[str, Workload] = {}
    for wid in pool:
        if wid not in running:
            continue
        v = running[wid]
        if v.stopping:  # already asked to stop: its slice is free to wait for
            costs[wid] = 0.0
            eligible[wid] = v
            continue
        gap = gap_of(v)
        if gap <= 0:
            continue
        c = lost.get(wid) if lost is not None else None
        if c is None:
            c = preemption_cost(v, now, policy)
            if lost is not None:
                lost[wid] = c
        c += policy.preemption_toll
        if overdue or preemption_pays(c, preemption_gain(gain_hours, gap)):
            costs[wid] = c
            eligible[wid] = v
    if not eligible:
        return False
    victims = choose_victims(cluster, w.request, end, eligible,
                             lambda v: st.standing.get(v.project, INF),
                             lambda v: costs[v.id])
    if not victims:
        return False
    total = sum(costs[v.id] for v in victims)
    fresh = [v for v in victims if not v.stopping]
    if fresh and not overdue and not preemption_pays(total, preemption_gain(gain_hours,
                                                            min(gap_of(v) for v in fresh))):
        return False
    # tentatively free their capacity; keep the choice only if the request then fits
    if not fits_without(cluster, victims, w.request, end):
        return False

    def reason(v: Workload) -> str:
        why = ("unbacked work yields to backed work" if not v.backed else
               "an idle session yields to waiting work" if v.idle else
               f"project {v.project} stands above {w.project}")
        if overdue:
            late = (now - first_planned[w.id]) / HOUR
            why += f"; gang {w.id} is {late:.1f} h past the start first planned for it"
        return f"{why} (loses {costs[v.id]:.2f} GPU-h)"

    take(w, victims, end, now, out, pool, reason)
    return True


def take(w: Workload, victims: list[Workload], end: float, now: float, out: list[Decision],
         pool: dict[str, Workload] | None, reason: Callable[[Workload], str], *,
         cluster: Cluster, running: Mapping[str, Workload],
         reservations: dict[str, tuple[float, Placement]], policy: Policy,
         preempt: Preempter, start: Starter) -> None:
    """Preempt ``victims`` (those already stopping are only waited for; ``preempt``, the
    scheduler's) and start ``w`` on their capacity (``start``) — or, when it does not fit
    before a victim that does not stop at once has really stopped (semantics 1), reserve
    that capacity for ``w`` until ``policy.stop_grace`` from now. Victims leave ``pool``."""
    for v in victims:
        if v.stopping:
            continue
        preempt(v, now, reason(v), w.id, out)
        if pool is not None:
            pool.pop(v.id, None)
    holders = [v for v in victims if v.id in running]
    p = place(cluster, w.request, end)  # what stopped at once may be enough
    if p is not None or not holders:
        assert p is not None
        start(w, p, True, now, out)
        return
    p = place_without(cluster, holders, w.request, end)
    assert p is not None
    at = now + policy.stop_grace
    cluster.reserve(p, at)
    reservations[w.id] = (at, p)
    out.append(Reserve(w.id, at, p))


def victim_pool(running: Mapping[str, Workload], now: float) -> dict[str, Workload]:
    """Running work whose slice may be freed for others: unprotected, or already
    stopping."""
    return {wid: w for wid, w in running.items() if w.stopping or not w.is_protected(now)}


def overdue_backfill(running: Mapping[str, Workload], now: float) -> dict[str, Workload]:
    """Work backfilled onto reserved GPUs that is still running when they are due,
    unprotected and not yet stopping."""
    return {wid: v for wid, v in running.items()
            if v.backfill_until is not None and v.backfill_until <= now
            and not v.is_protected(now) and not v.stopping}


def reclaim_backfill(w: Workload, end: float, now: float, overdue: Mapping[str, Workload],
                     running: Mapping[str, Workload], cluster: Cluster, policy: Policy,
                     st: Standings | None, take: Take, out: list[Decision]) -> bool:
    """docs/core.md semantics 5, when a prediction was wrong: work backfilled onto reserved
    GPUs that is still running at the reservation's time, unprotected
    (:func:`overdue_backfill`, found once per cycle: ``overdue``), is preempted for a
    blocked gang that those GPUs (with what is free) would start now. The cheapest such
    set goes; True if ``w`` started."""
    still = {wid: v for wid, v in overdue.items() if running.get(wid) is v}
    if not still:
        return False
    costs = {wid: preemption_cost(v, now, policy) for wid, v in still.items()}
    victims = choose_victims(cluster, w.request, end, still,
                             lambda v: st.standing.get(v.project, INF) if st else INF,
                             lambda v: costs[v.id])
    if not victims:
        return False
    if not fits_without(cluster, victims, w.request, end):
        return False
    take(w, victims, end, now, out, None,
         lambda v: f"backfilled until {v.backfill_until:.0f}, still running "
                   f"(loses {costs[v.id]:.2f} GPU-h)")
    return True
