"""Whom to preempt so a blocked, backed workload fits.

Only *eligible* victims are considered: never a protected one (DESIGN semantics 2); any
unbacked one (semantics 4); any session reported idle; another backed one only when its
project stands above the requester's — counted after the requester's protected run — at the
first level where their paths differ (so preemption never flips straight back). Among the sets that make the
request fit, the chosen one is the smallest, then the one with the fewest backed victims, the
fewest non-resumable ones and the cheapest snapshots. A gang is preempted as a whole.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from typing import Any

from . import mig as migtab
from .capacity import Cluster, Gpu
from .model import MILLI, SliceRequest, Workload

SetCost = tuple[int, int, int, float, float]


def victim_cost(v: Workload, standing: float) -> tuple[int, float, int, float, float]:
    """Lower is preempted first: already stopping (free to take), unbacked, then idle, then
    most over its grant, resumable, cheap to snapshot, most recently started."""
    return (-1 if v.stopping else 0 if not v.backed else 1 if v.idle else 2, -standing,
            0 if v.resumable else 1, v.snapshot_cost, -(v.started_at or 0.0))


def set_cost(vs: list[Workload], standing: Callable[[Workload], float]) -> SetCost:
    """Workloads already stopping cost nothing: their slices are being released anyway."""
    vs = [v for v in vs if not v.stopping]
    return (len(vs), sum(1 for v in vs if v.backed), sum(1 for v in vs if not v.resumable),
            sum(v.snapshot_cost for v in vs), -sum(min(standing(v), 1e9) for v in vs))


def choose_victims(cluster: Cluster, req: SliceRequest, end: float,
                   eligible: dict[str, Workload], standing: Callable[[Workload], float]
                   ) -> list[Workload] | None:
    """The cheapest set of eligible victims whose removal lets ``req`` fit, or None."""
    if not eligible:
        return None
    nodes = sorted({cluster.by_name[s.node].idx
                    for wid in eligible for s in cluster.allocations[wid].slices})
    models = frozenset(req.gpu_model.split("|")) if req.gpu_model else None
    key = lambda v: victim_cost(v, standing(v))  # noqa: E731
    best: tuple[SetCost, list[Workload]] | None = None

    def consider(vs: list[Workload]) -> None:
        nonlocal best
        c = set_cost(vs, standing)
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
            found = _smallest_freeing_set(held, need, eligible, key)
            if found:
                consider(found)
                found_single = True
        if not found_single and not req.single_node and req.gpus > 1:
            # a gang across nodes: free GPUs everywhere, then the cheapest freeable ones
            have = sum(1 for n in cluster.nodes if n.healthy
                       for i in n.free_whole if gpu_ok(n.gpus[i]))
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
                    if chosen and start in migtab.fits(g.model, p.name, mask, compute):
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


def _smallest_freeing_set(held: list[tuple[Gpu, frozenset[str]]], need: int,
                          eligible: dict[str, Workload], key: Callable[[Workload], Any]
                          ) -> list[Workload] | None:
    """Fewest victims on one node whose removal frees ``need`` GPUs (a GPU is freed when all
    its holders go): exhaustive up to three victims, cheapest first; greedy beyond."""
    ids = sorted({wid for _, t in held for wid in t}, key=lambda wid: key(eligible[wid]))
    for size in range(1, min(3, len(ids)) + 1):
        for combo in combinations(ids[:12], size):
            chosen = set(combo)
            if sum(1 for _, t in held if t <= chosen) >= need:
                return [eligible[w] for w in combo]
    # greedy: take victims in order of GPUs they alone free, then cost
    chosen_set: set[str] = set()
    order = sorted(ids, key=lambda wid: (-sum(1 for _, t in held if wid in t), key(eligible[wid])))
    for wid in order:
        chosen_set.add(wid)
        if sum(1 for _, t in held if t <= chosen_set) >= need:
            return [eligible[w] for w in order if w in chosen_set]
    return None
