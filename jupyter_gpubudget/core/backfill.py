"""Runtime prediction and reservations for blocked gangs (DESIGN semantics 5).

A blocked whole-GPU gang gets a *reservation*: the earliest time at which, as running work
ends at its predicted time, enough GPUs come free for it, and which GPUs those are. Work ranked
after it may use those GPUs only when it is predicted to end before that time.
"""

from __future__ import annotations

from collections.abc import Iterable

from .capacity import Cluster
from .model import MILLI, Placement, Policy, RuntimeHistory, SliceAlloc, SliceRequest, Workload


def predict_runtime(w: Workload, history: RuntimeHistory, policy: Policy) -> float:
    """Seconds: 90th percentile of this user's runs in this project and kind (≥ 3 samples),
    else of the project's runs in this kind, else the declared time limit, else the policy
    default; never beyond the declared limit."""
    if not history.pooled:  # nothing learnt yet
        guess = w.time_limit or policy.default_runtime
        return max(guess, 1.0)
    samples = history.samples.get((w.user, w.project, w.kind))
    if not samples or len(samples) < 3:
        pooled = history.pooled.get((w.project, w.kind))
        samples = pooled if pooled and len(pooled) >= 3 else None
    if samples:
        s = sorted(samples)
        guess = s[min(len(s) - 1, int(0.9 * len(s)))]
    elif w.time_limit:
        guess = w.time_limit
    else:
        guess = policy.default_runtime
    if w.time_limit:
        guess = min(guess, w.time_limit)
    return max(guess, 1.0)


def plan_reservation(cluster: Cluster, req: SliceRequest, now: float,
                     ends: Iterable[tuple[float, str]]) -> tuple[float, Placement] | None:
    """When and where a whole-GPU request could start as running work ends.

    ``ends`` is (predicted end, workload id) for running work, ascending. GPUs already
    reserved for another gang are not reserved twice.
    """
    models = frozenset(req.gpu_model.split("|")) if req.gpu_model else None
    inf = float("inf")
    avail: dict[int, list[int]] = {}
    for n in cluster.nodes:
        if not n.healthy:
            continue
        lst = [i for i in n.free_whole if n.gpus[i].reserved_at == inf
               and (models is None or n.gpus[i].model in models)]
        if lst:
            avail[n.idx] = lst

    def fit() -> list[tuple[int, list[int]]] | None:
        for idx, lst in avail.items():
            if len(lst) >= req.gpus:
                return [(idx, lst[: req.gpus])]
        if req.single_node:
            return None
        if sum(len(v) for v in avail.values()) < req.gpus:
            return None
        chosen, got = [], 0
        for idx, lst in sorted(avail.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            take = lst[: req.gpus - got]
            chosen.append((idx, take))
            got += len(take)
            if got >= req.gpus:
                return chosen
        return None

    at = now
    got = fit()
    if got is None:
        for end, wid in ends:
            placement = cluster.allocations.get(wid)
            if placement is None:
                continue
            changed = False
            for s in placement.slices:
                if s.kind != "gpu":
                    continue
                n = cluster.by_name[s.node]
                g = n.gpus[s.gpu]
                if n.healthy and g.reserved_at == inf and (models is None or g.model in models):
                    avail.setdefault(n.idx, []).append(s.gpu)
                    changed = True
            if changed:
                at = max(end, now)
                got = fit()
                if got is not None:
                    break
    if got is None:
        return None
    slices = tuple(SliceAlloc(cluster.nodes[idx].name, i, "gpu", MILLI)
                   for idx, lst in got for i in lst)
    return at, Placement(slices)
