"""Drains: of unhealthy nodes (docs/core.md semantics 12), and of the GPUs a gang has reserved
when waiting for their last stragglers would hold many GPUs idle — the latter within a
budget of what preemptions may throw away in a day.

- :func:`drain_nodes`: an unhealthy node gets nothing new; unprotected work on it is
  preempted at once, and once nothing on it is protected any more it is reported drained.
- :func:`finish_drain` (``Policy.finish_drain_ratio``): a gang that has just reserved GPUs
  still held by a few stragglers preempts them and starts now, when the idle GPU-hours that
  saves outweigh what they lose.
- :class:`LossBudget` (``Policy.finish_drain_budget``): the GPU-hours preemptions threw
  away over the trailing ``LOSS_WINDOW``; no drain is finished once they reach the budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from .capacity import Cluster
from .model import HOUR, Decision, Drain, Placement, Policy, Reserve, Workload
from .preemption import Preempter, Take, fits_without, preemption_cost
from .ranking import INF, Standings

#: ``Policy.finish_drain_ratio`` looks only at reservations at least this far away (seconds):
#: nearer ones cost little idle time, and their stragglers are about to end anyway
FINISH_DRAIN_AFTER = 3600.0
#: ``Policy.finish_drain_budget`` sums what preemptions threw away over this trailing window
LOSS_WINDOW = 24 * 3600.0


class LossBudget:
    """(time, GPU-hours thrown away) of the preemptions in the trailing ``LOSS_WINDOW``,
    oldest first, against ``Policy.finish_drain_budget``'s share of the cluster."""

    def __init__(self, policy: Policy, gpu_count: int,
                 losses: Iterable[tuple[float, float]] = ()) -> None:
        self.policy = policy
        self.gpu_count = gpu_count
        self.losses: deque[tuple[float, float]] = deque(losses)

    def add(self, now: float, lost: float) -> None:
        """A preemption at ``now`` threw away ``lost`` GPU-hours."""
        self.losses.append((now, lost))

    def recent(self, now: float) -> float:
        """GPU-hours preemptions threw away in the trailing ``LOSS_WINDOW``."""
        losses = self.losses
        while losses and losses[0][0] < now - LOSS_WINDOW:
            losses.popleft()
        return sum(x for _, x in losses)

    def budget(self) -> float:
        """GPU-hours preemptions may throw away in ``LOSS_WINDOW`` before no drain is
        finished (0: no budget)."""
        return self.policy.finish_drain_budget * self.gpu_count * LOSS_WINDOW / HOUR

    def allows(self, lost: float, now: float) -> bool:
        """Would ``lost`` more GPU-hours thrown away keep the trailing day's within the
        budget's share of the cluster's GPU-hours?"""
        room = self.budget()
        return room <= 0 or self.recent(now) + lost <= room


def drain_nodes(now: float, out: list[Decision], unhealthy: Iterable[str], drained: set[str],
                cluster: Cluster, running: Mapping[str, Workload], preempt: Preempter) -> None:
    """Drain every ``unhealthy`` node not yet ``drained``: its unprotected work is preempted
    (``preempt``, the scheduler's) at once; protected work keeps its time, and the node is
    reported drained (and added to ``drained``) once none is left."""
    for node in sorted(unhealthy):
        if node in drained or node not in cluster.by_name:
            continue
        on_node = [w for w in running.values() if w.placement and node in w.placement.nodes]
        for w in on_node:  # unprotected work leaves at once; protected work keeps its time
            if not w.stopping and not w.is_protected(now):
                preempt(w, now, f"node {node} is draining", None, out)
        if any(w.is_protected(now) and not w.stopping for w in on_node):
            continue
        drained.add(node)
        out.append(Drain(node))


def finish_drain(w: Workload, at: float, placement: Placement, end: float, now: float,
                 pool: dict[str, Workload], res_times: list[float], out: list[Decision], *,
                 cluster: Cluster, policy: Policy, st: Standings | None,
                 reservations: dict[str, tuple[float, Placement]], losses: LossBudget,
                 take: Take) -> bool:
    """``Policy.finish_drain_ratio``: gang ``w`` has just reserved ``placement`` from
    ``at``; if that is at least ``FINISH_DRAIN_AFTER`` away and every workload still
    running on those GPUs may be preempted (unprotected, stops at once, of a project
    standing level with ``w``'s or above it), preempt them and start ``w`` now when the
    idle GPU-hours saved (the reserved GPUs free now × the time to ``at``) are at least
    the ratio × what they lose, tolls included. Its reservation then leaves
    ``reservations``, ``res_times`` (the times GPUs are held to) and ``out``. True if ``w``
    started; otherwise nothing has changed."""
    if at - now < FINISH_DRAIN_AFTER:
        return False
    gpus = [cluster.by_name[sl.node].gpus[sl.gpu] for sl in placement.slices]
    stragglers = {t for g in gpus for t in g.tenants}
    if not stragglers or st is None or w.project not in st.path_standing:
        return False
    paths, mine = st.path_standing, st.path_standing[w.project]
    victims = []
    for wid in sorted(stragglers):
        v = pool.get(wid)
        if v is None or v.stopping or not v.stops_at_once or v.is_protected(now):
            return False
        if paths.get(v.project, ()) < mine:  # work of a project standing below w's
            return False
        victims.append(v)
    lost_of = {v.id: preemption_cost(v, now, policy) for v in victims}
    costs = {wid: lost + policy.preemption_toll for wid, lost in lost_of.items()}
    idle_hours = sum(1 for g in gpus if g.free) * (at - now) / HOUR
    if idle_hours < policy.finish_drain_ratio * sum(costs.values()):
        return False
    if not losses.allows(sum(lost_of.values()), now):
        return False
    # the reservation gives way to the start (its GPUs are w's either way)
    for g in gpus:
        if g.reserved_at == at:
            g.reserved_at = INF
    if not fits_without(cluster, victims, w.request, end):
        cluster.reserve(placement, at)
        return False
    del reservations[w.id]
    res_times.remove(at)
    out[:] = [d for d in out if not (isinstance(d, Reserve) and d.workload == w.id)]
    take(w, victims, end, now, out, pool,
         lambda v: f"the last of a drain for gang {w.id}, which would hold "
                   f"{idle_hours:.1f} idle GPU-hours (loses {costs[v.id]:.2f} GPU-h)")
    return True
