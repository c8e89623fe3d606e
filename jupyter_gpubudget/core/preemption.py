"""Whom to preempt so a blocked, backed workload fits — and whether it pays at all.

Only *eligible* victims are considered: never a protected one (docs/core.md semantics 2); any
unbacked one (semantics 4); any session reported idle; another backed one only when its
project stands above the requester's — counted after the requester's protected run — at the
first level where their paths differ (so preemption never flips straight back).

A preemption is not free. :func:`preemption_cost` is what it throws away, in GPU-hours: the
work a resumable job did since its last checkpoint plus the time its restart spends
reloading, a session's snapshot and restore, or all of a non-resumable job's run. It happens
only when it pays (:func:`preemption_pays`): the set's cost must not exceed what the
requester gains in standing over its protected run (:func:`preemption_gain`) — its
protected GPU-hours (its predicted run, capped like a protection, when it asks for none)
times the relative gap between the victim's standing and its own after that run
(:func:`standing_gap`; 1 for unbacked or idle victims). Two projects at nearly the same
standing gain almost nothing from preempting each other, so they do not take turns.

Among the sets that make the request fit, a set of unbacked victims only goes first
(semantics 4); then the least cost, then the fewest victims. A gang is preempted as a whole.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from typing import Any

from . import mig as migtab
from .capacity import Cluster, Gpu
from .model import HOUR, MILLI, Decision, Placement, Policy, SliceRequest, Workload
from .placement import cluster_choices, full_profile, gang_links, idle_mig_for_gangs, place

SetCost = tuple[int, float, int, int, float]
#: the scheduler's way of acting on a choice: ``take(w, victims, end, now, out, pool,
#: reason)`` preempts ``victims`` for ``w`` (each for ``reason(victim)``), drops them from
#: ``pool`` and starts ``w`` on what they free — or reserves it there until they have stopped
Take = Callable[[Workload, list[Workload], float, float, list[Decision],
                 dict[str, Workload] | None, Callable[[Workload], str]], None]
#: the scheduler's preemption of one workload: ``preempt(victim, now, reason, for_wid, out)``
Preempter = Callable[[Workload, float, str, str | None, list[Decision]], None]
#: the scheduler's start of one workload: ``start(w, placement, backed, now, out)``
Starter = Callable[[Workload, Placement, bool, float, list[Decision]], None]
INF = float("inf")


def last_checkpoint(v: Workload, elapsed: float, policy: Policy) -> float:
    """Seconds into its current run at which ``v`` last saved its progress: every
    ``policy.checkpoint_interval_of(v)`` seconds (0: continuously, i.e. now); and a backfilled
    job, told when its borrowed GPUs are due (``backfill_until``), also saves then."""
    elapsed = max(0.0, elapsed)
    ci = policy.checkpoint_interval_of(v)
    if ci <= 0:
        return elapsed
    last = ci * (elapsed // ci)
    if v.backfill_until is not None and v.started_at is not None:
        due = v.backfill_until - v.started_at
        if 0.0 <= due <= elapsed:
            last = max(last, due)
    return last


def lost_seconds(v: Workload, elapsed: float, policy: Policy) -> float:
    """Wall seconds of ``v``'s GPU time that a preemption after ``elapsed`` seconds of its
    current run throws away: a non-resumable batch job loses its whole run; anything else
    loses what it did since its last checkpoint (:func:`last_checkpoint`), plus its snapshot
    and the restart's reload time."""
    elapsed = max(0.0, elapsed)
    if not v.resumable and v.kind != "interactive":
        return elapsed
    since = elapsed - last_checkpoint(v, elapsed, policy)
    return since + max(0.0, v.snapshot_cost) + policy.restart_overhead_of(v)


def preemption_cost(v: Workload, now: float, policy: Policy) -> float:
    """GPU-hours a preemption of running ``v`` at ``now`` throws away (slice fraction × the
    seconds of :func:`lost_seconds`); the simulator charges exactly this as lost."""
    if v.placement is None:
        return 0.0
    started = v.started_at if v.started_at is not None else now
    return v.placement.fraction * lost_seconds(v, now - started, policy) / HOUR


def standing_gap(mine_after: float, theirs: float) -> float:
    """The share of a requester's protected run that corrects unfairness: how far the
    victim's account stands above the requester's (after that run), relative to the
    victim's standing — 1 when the victim's account has no grant, 0 when it does not stand
    above."""
    if theirs == INF:
        return 1.0
    if theirs <= mine_after or theirs <= 0:
        return 0.0
    return (theirs - mine_after) / theirs


def preemption_gain(need_hours: float, gap: float) -> float:
    """GPU-hours of fairness a preemption buys: the requester's protected GPU-hours × the
    standing gap."""
    return max(0.0, need_hours) * max(0.0, min(1.0, gap))


def preemption_pays(cost: float, gain: float) -> bool:
    """A preemption happens only when what it throws away does not exceed what it buys."""
    return cost <= gain


def victim_cost(v: Workload, standing: float, cost: float = 0.0
                ) -> tuple[int, float, float, int, float, float, str]:
    """Lower is preempted first: already stopping (its slice is being released anyway),
    unbacked, then idle, then the cheapest to preempt, most over its grant, resumable, cheap
    to snapshot, most recently started (then by id, so the choice never depends on the order
    of a set)."""
    return (-1 if v.stopping else 0 if not v.backed else 1 if v.idle else 2, round(cost, 9),
            -standing,
            0 if v.resumable else 1, v.snapshot_cost, -(v.started_at or 0.0), v.id)


def set_cost(vs: list[Workload], standing: Callable[[Workload], float],
             cost: Callable[[Workload], float] = lambda v: 0.0) -> SetCost:
    """Workloads already stopping cost nothing: their slices are being released anyway."""
    vs = [v for v in vs if not v.stopping]
    return (1 if any(v.backed for v in vs) else 0, round(sum(cost(v) for v in vs), 9), len(vs),
            sum(1 for v in vs if not v.resumable),
            -sum(min(standing(v), 1e9) for v in vs))


def place_without(cluster: Cluster, victims: list[Workload], req: SliceRequest, end: float
                  ) -> Placement | None:
    """Where ``req`` would go once ``victims`` are gone: their capacity is freed
    tentatively and given back."""
    saved = [(v, cluster.release(v.id)) for v in victims]
    p = place(cluster, req, end)
    for v, placement in saved:
        if placement is not None:
            cluster.allocate(v.id, placement)
    return p


def fits_without(cluster: Cluster, victims: list[Workload], req: SliceRequest, end: float
                 ) -> bool:
    """Would ``req`` fit once ``victims`` are gone? Nothing changes."""
    return place_without(cluster, victims, req, end) is not None


def _full_instance_ok(g: Gpu) -> bool:
    """Can MIG-mode GPU ``g``, once empty, hold its full-size (7g) instance?"""
    prof = full_profile(g.model)
    return prof is not None and (g.layout is None or (prof.name, 0) in g.layout)


def choose_victims(cluster: Cluster, req: SliceRequest, end: float,
                   eligible: dict[str, Workload], standing: Callable[[Workload], float],
                   cost: Callable[[Workload], float] = lambda v: 0.0,
                   whole_on_mig: bool = False) -> list[Workload] | None:
    """:func:`victims_in` the cluster ``req`` names; naming none, on an inventory of several
    clusters, the cheapest set found in any one of them (a gang never spans clusters)."""
    names = cluster_choices(cluster, req)
    if names is None:
        return victims_in(cluster, req, end, eligible, standing, cost, whole_on_mig)
    best: tuple[SetCost, list[Workload]] | None = None
    for name in names:
        prev = cluster.bar(name)
        try:
            vs = victims_in(cluster, req, end, eligible, standing, cost, whole_on_mig)
        finally:
            cluster.bar(prev)
        if vs is not None and (best is None or set_cost(vs, standing, cost) < best[0]):
            best = (set_cost(vs, standing, cost), vs)
    return best[1] if best is not None else None


def victims_in(cluster: Cluster, req: SliceRequest, end: float,
               eligible: dict[str, Workload], standing: Callable[[Workload], float],
               cost: Callable[[Workload], float] = lambda v: 0.0,
               whole_on_mig: bool = False) -> list[Workload] | None:
    """The cheapest set of eligible victims whose removal lets ``req`` fit, or None
    (``cost``: GPU-hours each victim's preemption throws away; ``whole_on_mig``: a one-GPU
    request may also empty a MIG-mode GPU, to take it whole)."""
    if not eligible:
        return None
    nodes = sorted({cluster.by_name[s.node].idx
                    for wid in eligible for s in cluster.allocations[wid].slices
                    if not cluster.by_name[s.node].barred})
    models = frozenset(req.gpu_model.split("|")) if req.gpu_model else None
    key = lambda v: victim_cost(v, standing(v), cost(v))  # noqa: E731
    best: tuple[SetCost, list[Workload]] | None = None

    def consider(vs: list[Workload]) -> None:
        nonlocal best
        c = set_cost(vs, standing, cost)
        if best is None or c < best[0]:
            best = (c, vs)

    def gpu_ok(g: Gpu) -> bool:
        return end <= g.reserved_at and (models is None or g.model in models)

    def occupants(g: Gpu) -> list[Workload] | None:
        """Eligible workloads that hold ``g``; None if someone ineligible holds it."""
        out = []
        for wid in g.tenants:
            v = eligible.get(wid)
            if v is None:
                return None
            out.append(v)
        return out

    if req.kind == "gpu":
        pool: list[tuple[list[tuple[object, ...]], list[Workload], Gpu]] = []
        found_single = False
        for idx in nodes:
            n = cluster.nodes[idx]
            if not n.healthy:
                continue
            free = sum(1 for g in n.gpus if g.free and gpu_ok(g))
            held: list[tuple[Gpu, frozenset[str]]] = []
            for g in n.gpus:
                if g.mig or g.free or not gpu_ok(g):
                    continue
                occ = occupants(g)
                if occ:
                    held.append((g, frozenset(v.id for v in occ)))
                    pool.append((sorted(key(v) for v in occ), occ, g))
            need = req.gpus - free
            if need <= 0 or len(held) < need or not n.host_fits(req.cpu_milli, req.memory_mib):
                continue
            found = _cheapest_freeing_set(held, need, eligible, key,
                                          lambda vs: set_cost(vs, standing, cost))
            if found:
                consider(found)
                found_single = True
        if req.gpus == 1 and whole_on_mig and cluster.whole_gpu_on_mig:
            # one GPU may also be a MIG-mode GPU emptied of its instances (its full-size one)
            for idx in nodes:
                n = cluster.nodes[idx]
                if not n.healthy or not n.host_fits(req.cpu_milli, req.memory_mib):
                    continue
                for g in n.gpus:
                    if g.mig and g.tenants and gpu_ok(g) and _full_instance_ok(g):
                        occ = occupants(g)
                        if occ:
                            consider(occ)
        level, one_node = gang_links(cluster, req) if req.gpus > 1 else ("any", True)
        if not found_single and not one_node:
            # a gang across nodes: free GPUs everywhere, then the cheapest freeable ones
            # (a set that does not fit its interconnect is refused by the caller's check)
            have = sum(1 for n in cluster.nodes if n.healthy and not n.barred
                       for i in n.free_whole if gpu_ok(n.gpus[i]))
            if level == "any":
                have += sum(len(idx) for _, idx in idle_mig_for_gangs(cluster, models, end))
            pool.sort(key=lambda t: t[0])
            vs: dict[str, Workload] = {}
            freed: set[tuple[int, int]] = set()
            for _, occ, _g in pool:
                if have + len(freed) >= req.gpus:
                    break
                for v in occ:
                    vs[v.id] = v
                    for s in cluster.allocations[v.id].slices:
                        if s.kind == "gpu":
                            freed.add((cluster.by_name[s.node].idx, s.gpu))
            if vs and have + len(freed) >= req.gpus:
                consider(list(vs.values()))
    elif req.kind == "mig":
        for idx in nodes:
            n = cluster.nodes[idx]
            if not n.healthy or not n.host_fits(req.cpu_milli, req.memory_mib):
                continue
            for g in n.gpus:
                if not g.mig or not gpu_ok(g) or not g.tenants:
                    continue
                p = migtab.profiles_for(g.model).get(req.profile or "")
                if p is None:
                    continue
                inst = []  # (workload, profile, start) on this GPU
                for wid in g.tenants:
                    for s in cluster.allocations[wid].slices:
                        if s.node == n.name and s.gpu == g.index:
                            inst.append((wid, migtab.profiles_for(g.model)[s.profile or ""],
                                         s.mig_start))
                for start in p.starts:
                    span = ((1 << p.size) - 1) << start
                    hit = [t for t in inst if span & (((1 << t[1].size) - 1) << t[2])]
                    if any(t[0] not in eligible for t in hit):
                        continue
                    mask, compute = g.mask, g.compute_used
                    for _, tp, ts in hit:
                        mask = migtab.release(tp, ts, mask)
                        compute -= tp.compute
                    chosen = [eligible[t[0]] for t in hit]
                    # the compute limit may need more victims elsewhere on the GPU
                    rest = sorted((t for t in inst if t not in hit and t[0] in eligible),
                                  key=lambda t: key(eligible[t[0]]))
                    while compute + p.compute > migtab.COMPUTE and rest:
                        wid, tp, ts = rest.pop(0)
                        mask = migtab.release(tp, ts, mask)
                        compute -= tp.compute
                        chosen.append(eligible[wid])
                    if chosen and start in migtab.fits_in(g.model, g.layout, p.name, mask,
                                                          compute):
                        consider(chosen)
    elif req.kind == "mps":
        for idx in nodes:
            n = cluster.nodes[idx]
            if not n.healthy or not n.host_fits(req.cpu_milli, req.memory_mib):
                continue
            for g in n.gpus:
                if g.mig or not g.tenants or not gpu_ok(g):
                    continue
                tenants = sorted(g.tenants, key=lambda wid: key(eligible[wid])
                                 if wid in eligible else (9,))
                free = MILLI - g.used_milli
                mem_free = (g.memory_mib - g.mem_used) if g.memory_mib else None
                chosen = []
                for wid in tenants:
                    if free >= req.milli and (mem_free is None or mem_free >= req.gpu_memory_mib):
                        break
                    cand = eligible.get(wid)
                    if cand is None:
                        break
                    chosen.append(cand)
                    free += g.tenants[wid]
                    if mem_free is not None:
                        for s in cluster.allocations[wid].slices:
                            if s.node == n.name and s.gpu == g.index:
                                mem_free += s.gpu_memory_mib
                if chosen and free >= req.milli and (
                        mem_free is None or mem_free >= req.gpu_memory_mib):
                    consider(chosen)
    return best[1] if best is not None else None


def _cheapest_freeing_set(held: list[tuple[Gpu, frozenset[str]]], need: int,
                          eligible: dict[str, Workload], key: Callable[[Workload], Any],
                          set_key: Callable[[list[Workload]], Any]) -> list[Workload] | None:
    """The cheapest set (by ``set_key``) of victims on one node whose removal frees ``need``
    GPUs (a GPU is freed when all its holders go): exhaustive up to three victims among the
    twelve cheapest; greedy beyond."""
    ids = sorted({wid for _, t in held for wid in t}, key=lambda wid: key(eligible[wid]))
    best: tuple[Any, list[Workload]] | None = None
    for size in range(1, min(3, len(ids)) + 1):
        for combo in combinations(ids[:12], size):
            chosen = set(combo)
            if sum(1 for _, t in held if t <= chosen) >= need:
                vs = [eligible[w] for w in combo]
                k = set_key(vs)
                if best is None or k < best[0]:
                    best = (k, vs)
    if best is not None:
        return best[1]
    # greedy: take victims in order of GPUs they alone free (a GPU they share frees nothing
    # by itself), then cost; then give back, latest taken first, every victim the set frees
    # enough without (one taken early may have been made unneeded by those taken after it)
    def frees(chosen: set[str]) -> int:
        return sum(1 for _, t in held if t <= chosen)

    chosen_set: set[str] = set()
    order = sorted(ids, key=lambda wid: (-sum(1 for _, t in held if t == {wid}),
                                         key(eligible[wid])))
    for wid in order:
        chosen_set.add(wid)
        if frees(chosen_set) >= need:
            for extra in [w for w in reversed(order) if w in chosen_set]:
                if frees(chosen_set - {extra}) >= need:
                    chosen_set.discard(extra)
            return [eligible[w] for w in order if w in chosen_set]
    return None
