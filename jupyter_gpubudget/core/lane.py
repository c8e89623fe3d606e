"""The short lane: GPUs kept for short debug runs, and the cheap preemptions they may make.

Debug work predicted to run at most ``Policy.short_lane`` ranks ahead of all other waiting
work (ranking.py). So that it need not wait for a GPU to come free, each cycle keeps up to
``Policy.short_lane_hold`` whole GPUs that stand free for it (:class:`ShortLane`): work is
placed there only when predicted to end within the lane's time, as on GPUs reserved from
then. A short run that still finds no room may take the GPU of batch work whose preemption
costs almost nothing right now (:func:`lane_preempt`). docs/core.md, "The short lane".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from .capacity import Cluster, Gpu
from .model import Decision, Policy, RuntimeHistory, Workload
from .placement import idle_full_mig
from .preemption import Take, choose_victims, fits_without, preemption_cost
from .ranking import INF, Standings


class ShortLane:
    """The GPUs kept for the short lane in this cycle, and until when."""

    def __init__(self) -> None:
        self.held: list[Gpu] = []
        self.until = INF
        self.room = 0  # healthy whole GPUs outside MIG mode that are not kept
        self.on = False  # is the lane keeping GPUs in this cycle?

    def keeps(self, g: Gpu) -> bool:
        """Is ``g`` held back only for the short lane (short work is never reclaimed from
        it, unlike backfill on a gang's reserved GPUs)?"""
        return g.reserved_at == self.until and g in self.held

    def hold(self, cluster: Cluster, policy: Policy, history: RuntimeHistory,
             now: float) -> None:
        """Keep up to ``policy.short_lane_hold`` whole GPUs that stand free for the short
        lane until the next cycle: work is placed there only when predicted to end within
        ``policy.short_lane`` (as on GPUs reserved from then), and a gang is placed and
        reserved around them unless it needs them to fit at all. The GPUs on the nodes with
        the fewest free GPUs are kept, so that free nodes stay whole for gangs; with none
        free, an idle MIG-mode GPU (:meth:`keep`). Nothing is kept until debug work has been
        seen."""
        self.held = []
        self.on = False
        hold, lane = policy.short_lane_hold, policy.short_lane
        if hold <= 0 or lane <= 0 or not history.kind_version.get("debug"):
            return
        self.on = True
        self.until = now + lane
        kept = self.keep(cluster, policy, hold)
        self.room = sum(1 for n in cluster.nodes if n.healthy
                        for g in n.gpus if not g.mig) - sum(1 for g in kept if not g.mig)

    def keep(self, cluster: Cluster, policy: Policy, count: int) -> list[Gpu]:
        """Keep up to ``count`` idle GPUs that no gang has reserved for the short lane:
        whole GPUs outside MIG mode, on the nodes with the fewest free; when none stands
        free, idle MIG-mode GPUs that a one-GPU run may take whole
        (``Policy.whole_gpu_on_mig``). Otherwise, with every GPU outside MIG mode busy, the
        lane would keep nothing until one came free — and it would then keep that one from
        the gangs, although an idle MIG-mode GPU, which serves no gang, would do."""
        if any(n.free_whole for n in cluster.nodes if n.healthy):
            free = sorted((len(n.free_whole), n.idx, i) for n in cluster.nodes
                          if n.healthy for i in n.free_whole if n.gpus[i].reserved_at == INF)
            kept = [cluster.nodes[idx].gpus[i] for _, idx, i in free[:count]]
        else:
            kept = idle_mig_gpus(cluster, policy)[:count]
        for g in kept:
            g.reserved_at = self.until
            self.held.append(g)
        return kept

    def top_up(self, cluster: Cluster, policy: Policy) -> None:
        """With leases (``policy.backfill_lease``) or drains finished by preemption
        (``policy.finish_drain_ratio``), between cycles a GPU that comes free is kept for the
        short lane first when fewer than ``policy.short_lane_hold`` of the kept GPUs still
        stand free (short work used them): otherwise, with every GPU busy or leased when the
        cycle began — and no reserved GPU standing idle for short work to use — the lane
        would keep nothing until a cycle finds a GPU free. Only GPUs no gang has reserved;
        the same choice as :meth:`hold`."""
        hold = policy.short_lane_hold
        if not self.on or hold <= 0 or (policy.backfill_lease <= 0
                                        and policy.finish_drain_ratio <= 0):
            return
        kept = sum(1 for g in self.held if lane_idle(g) and g.reserved_at == self.until)
        if kept < hold:
            self.keep(cluster, policy, hold - kept)

    @contextmanager
    def closed(self, now: float) -> Iterator[None]:
        """The GPUs kept for the short lane closed to everything for a while (a lease is
        never taken on them)."""
        held = [g for g in self.held if g.reserved_at == self.until]
        for g in held:
            g.reserved_at = now
        try:
            yield
        finally:
            for g in held:
                if g.reserved_at == now:
                    g.reserved_at = self.until

    @contextmanager
    def lifted(self) -> Iterator[None]:
        """The lane's hold lifted for a while (a gang may use the kept GPUs, to start or to
        reserve them); kept again afterwards where still free."""
        held = [g for g in self.held if g.reserved_at == self.until]
        for g in held:
            g.reserved_at = INF
        try:
            yield
        finally:
            for g in held:
                if lane_idle(g):
                    g.reserved_at = min(g.reserved_at, self.until)


def idle_mig_gpus(cluster: Cluster, policy: Policy) -> list[Gpu]:
    """MIG-mode GPUs with no instance, whose layout has the full-size one, on healthy
    nodes, that nothing holds back — each one a whole GPU to a one-GPU request when
    ``Policy.whole_gpu_on_mig``."""
    if not policy.whole_gpu_on_mig:
        return []
    out = [g for g, _ in idle_full_mig(cluster) if g.node.healthy and g.reserved_at == INF]
    return sorted(out, key=lambda g: (g.node.idx, g.index))


def lane_idle(g: Gpu) -> bool:
    """Nothing runs on ``g`` (a MIG-mode GPU: no instance)."""
    return g.free or (g.mig and g.mask == 0)


def lane_preempt(w: Workload, end: float, now: float, pool: dict[str, Workload],
                 running: Mapping[str, Workload], cluster: Cluster, policy: Policy,
                 st: Standings | None, take: Take, out: list[Decision]) -> bool:
    """A short-lane run (backed debug work predicted short) that finds no room may take
    the GPU of unprotected batch work whose preemption costs almost nothing right now —
    it saved its progress moments ago: at most ``policy.short_lane_cost`` GPU-hours lost,
    reload and toll included; once the run has waited ``policy.short_lane_patience``, up
    to ``policy.short_lane_late_cost``. Sessions are never taken for it. ``pool``: the
    running work that may be preempted; ``take`` preempts the chosen victims and starts
    ``w`` (the scheduler's)."""
    pol = policy
    cap = pol.short_lane_cost
    if pol.short_lane_patience > 0 and now - w.submitted_at >= pol.short_lane_patience:
        cap = max(cap, pol.short_lane_late_cost)
    toll = policy.preemption_toll
    costs: dict[str, float] = {}
    eligible: dict[str, Workload] = {}
    for wid, v in pool.items():
        if wid not in running or v.kind != "batch" or v.stopping:
            continue
        c = preemption_cost(v, now, policy) + toll
        if c <= cap:
            costs[wid] = c
            eligible[wid] = v
    if not eligible:
        return False
    victims = choose_victims(cluster, w.request, end, eligible,
                             lambda v: st.standing.get(v.project, INF) if st else INF,
                             lambda v: costs[v.id], whole_on_mig=True)
    if not victims or sum(costs[v.id] for v in victims) > cap:
        return False
    if not fits_without(cluster, victims, w.request, end):
        return False
    take(w, victims, end, now, out, pool,
         lambda v: f"a short debug run takes it (loses {costs[v.id] - toll:.2f} GPU-h)")
    return True
