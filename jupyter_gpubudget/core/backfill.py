"""Runtime prediction and reservations for blocked gangs (docs/core.md semantics 5).

A blocked whole-GPU gang gets a *reservation*: the earliest time at which, as running work
ends at its predicted time, enough GPUs come free for it, and which GPUs those are. Work ranked
after it may use those GPUs only when it is predicted to end before that time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from .capacity import Cluster, Gpu
from .model import (
    MILLI,
    Placement,
    Policy,
    RuntimeHistory,
    SliceAlloc,
    SliceRequest,
    Workload,
    feature_chain,
    shape_label,
)
from .placement import cluster_choices, gang_links, one_domain, place

#: the quantile of past run times a prediction aims at (chosen on synthetic seeds 1-3, see
#: bench/policy.py): the median would minimise the error, a higher one lets fewer backfilled
#: jobs overrun the reservation they squeezed in before
PREDICT_QUANTILE = 0.6
#: how many of its own runs a feature key needs before it counts as much as everything
#: broader: a key with n runs gets weight n / (n + SHRINK) against the broader estimate
SHRINK = 4.0
#: runs a feature key needs before it counts at all
MIN_RUNS = 3
#: the quantile placement checks against a gang's reservation: work goes onto reserved GPUs
#: only when this cautious prediction ends before the reservation
BACKFILL_QUANTILE = 0.6
#: the quantile a gang's reservation is planned with: running work is expected to free its
#: GPUs at this cautious prediction of its end. A gang waits for the last of several runs,
#: so ends planned at the typical quantile are nearly always too early: the reservation
#: keeps slipping while the GPUs freed first sit idle, open only to work predicted to end
#: before it (0.9: bench/policy.py, seeds 1-2)
RESERVE_QUANTILE = 0.9


def predict_runtime(w: Workload, history: RuntimeHistory, policy: Policy,
                    q: float = PREDICT_QUANTILE) -> float:
    """Seconds ``w`` is expected to run, from past runs that share its features.

    Every feature key of :func:`~.model.feature_chain` (kind; slice; project; user; command),
    broadest first, refines the estimate:
    the ``q``-quantile of the key's runs, in log seconds, blended with the broader estimate
    by how many runs back it (shrinkage); a key counts from ``MIN_RUNS`` runs. Nothing learnt
    — or only other projects' runs of the kind while the job declares a time limit — the
    declared limit, else the policy default. Never beyond the declared limit; at least one
    second."""
    est: float | None = None
    own = False  # has a key of the workload's own project (or user) enough runs?
    shape = shape_label(w.request)
    if ("ks", w.kind, shape) not in history.runs:
        shape = ""  # runs of this slice were never learnt (or not with slices): plain chain
    for key in feature_chain(w.user, w.project, w.kind, shape, w.command):
        runs = history.runs.get(key)
        if not runs or len(runs) < MIN_RUNS:
            continue
        lq = math.log(max(runs.quantile(q), 1.0))
        n = len(runs)
        est = lq if est is None else (n * lq + SHRINK * est) / (n + SHRINK)
        own = own or key[0] not in ("k", "ks")
    if est is None or (w.time_limit and not own):
        # nothing learnt, or only other projects' runs while the job says how long it takes
        guess = w.time_limit or policy.default_runtime
    else:
        guess = math.exp(est)
    if w.time_limit:
        guess = min(guess, w.time_limit)
    return max(guess, 1.0)


def plain_p90(w: Workload, history: RuntimeHistory, policy: Policy) -> float:
    """The predictor this project had before features (kept as the benchmark's baseline):
    90th percentile of the user's runs in this project and kind (≥ 3 runs), else of the
    project's, else the declared limit, else the policy default; never beyond the limit."""
    samples = history.samples.get((w.user, w.project, w.kind))
    if not samples or len(samples) < 3:
        pooled = history.pooled.get((w.project, w.kind))
        samples = pooled if pooled and len(pooled) >= 3 else None
    if samples:
        xs = sorted(samples)
        guess = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    else:
        guess = w.time_limit or policy.default_runtime
    if w.time_limit:
        guess = min(guess, w.time_limit)
    return max(guess, 1.0)


def predicted_end(w: Workload, now: float, predicted: float) -> float:
    """When running ``w`` is expected to end, given its predicted run time: its start plus
    the prediction; once it has run past that, half again as long as it has run so far (run
    times are heavy-tailed: the longer a job has run, the longer it is likely to go on), at
    least a minute, never past its declared limit."""
    start = w.started_at if w.started_at is not None else now
    end = start + predicted
    if end > now:
        return end
    end = now + max(60.0, 0.5 * (now - start))
    if w.time_limit and start + w.time_limit > now:
        end = min(end, start + w.time_limit)
    return end


def leasable(w: Workload, policy: Policy) -> bool:
    """May ``w`` borrow GPUs reserved for a gang past the gang's start
    (``Policy.backfill_lease``)? Resumable batch work on whole GPUs that saves its
    progress: preempted when the GPUs are due, it loses only its restart."""
    return (policy.backfill_lease > 0 and w.kind == "batch" and w.resumable
            and w.request.kind == "gpu" and policy.checkpoint_interval_of(w) > 0)


def place_reserved(cluster: Cluster, reservations: Mapping[str, tuple[float, Placement]],
                   w: Workload, end: float) -> Placement | None:
    """Place ``w`` to run until ``end``; a workload may always use the GPUs reserved for
    itself (``reservations``: per gang, the time and placement reserved)."""
    own = reservations.get(w.id)
    if own is None:
        return place(cluster, w.request, end)
    at, reserved = own
    gpus = [cluster.by_name[s.node].gpus[s.gpu] for s in reserved.slices]
    for g in gpus:
        g.reserved_at = float("inf")
    p = place(cluster, w.request, end)
    if p is None:
        for g in gpus:
            g.reserved_at = at
    return p


def reserved_until(cluster: Cluster, placement: Placement, kept: Callable[[Gpu], bool]
                   ) -> float | None:
    """When work placed on GPUs another gang has reserved (it ends before the reservation)
    must be gone: a backfill's deadline, the earliest reservation among its GPUs; None on
    GPUs no gang has reserved. GPUs only ``kept`` for the short lane do not count: short
    work is not reclaimed from them."""
    inf = float("inf")
    until = min((g.reserved_at for g in (cluster.by_name[sl.node].gpus[sl.gpu]
                                         for sl in placement.slices if sl.gpu >= 0)
                 if not kept(g)), default=inf)
    return until if until < inf else None


def plan_reservation(cluster: Cluster, req: SliceRequest, now: float,
                     ends: Iterable[tuple[float, str]]) -> tuple[float, Placement] | None:
    """:func:`reservation_in` the cluster ``req`` names; naming none, on an inventory of
    several clusters, in the one where it starts soonest (the first such on a tie)."""
    names = cluster_choices(cluster, req)
    if names is None:
        return reservation_in(cluster, req, now, ends)
    ends = list(ends)
    best: tuple[float, Placement] | None = None
    for name in names:
        prev = cluster.bar(name)
        try:
            got = reservation_in(cluster, req, now, ends)
        finally:
            cluster.bar(prev)
        if got is not None and (best is None or got[0] < best[0]):
            best = got
    return best


def reservation_in(cluster: Cluster, req: SliceRequest, now: float,
                   ends: Iterable[tuple[float, str]]) -> tuple[float, Placement] | None:
    """When and where a whole-GPU request could start as running work ends.

    ``ends`` is (predicted end, workload id) for running work, ascending. GPUs already
    reserved for another gang are not reserved twice.
    """
    models = frozenset(req.gpu_model.split("|")) if req.gpu_model else None
    inf = float("inf")
    avail: dict[int, list[int]] = {}
    for n in cluster.nodes:
        if not n.healthy or n.barred:
            continue
        lst = [i for i in n.free_whole if n.gpus[i].reserved_at == inf
               and (models is None or n.gpus[i].model in models)]
        if lst:
            avail[n.idx] = lst

    level, one_node = gang_links(cluster, req)

    def usable() -> dict[int, list[int]]:
        """What each node can give: an ``nvlink`` gang's ranks share one domain there."""
        if level != "nvlink":
            return avail
        return {idx: one_domain(cluster.nodes[idx], lst) for idx, lst in avail.items()}

    def fit() -> list[tuple[int, list[int]]] | None:
        have = usable()
        for idx, lst in have.items():
            if len(lst) >= req.gpus:
                return [(idx, lst[: req.gpus])]
        if one_node:
            return None
        if sum(len(v) for v in have.values()) < req.gpus:
            return None
        chosen, got = [], 0
        for idx, lst in sorted(have.items(), key=lambda kv: (-len(kv[1]), kv[0])):
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
                if n.healthy and not n.barred and g.reserved_at == inf and (models is None or g.model in models):
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
