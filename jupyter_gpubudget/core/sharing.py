"""Placing requests that share a GPU: MIG instances and MPS shares (placement.py's
:func:`~placement.place` hands them here).

- MIG instances go to an already partitioned GPU first, at the slot that keeps the most large
  profiles placeable (see :func:`mig.potential`);
- MPS shares go where the cluster's FGD index (``fragmentation.index_for``) expects the least
  stranded capacity, else to the fullest shared GPU that still fits them, and only then open a
  free GPU on the fullest node; with ``Policy.mps_on_mig`` a share may take a MIG instance
  (:func:`mps_as_mig`), before a shared GPU with ``Policy.mps_mig_first``.

``end`` is the predicted end of the workload: a GPU reserved for a blocked gang from time T
is used only when ``end <= T`` (backfill).
"""

from __future__ import annotations

from functools import cache

from . import fragmentation as frag
from . import mig as migtab
from .capacity import Cluster, Gpu
from .model import MILLI, Placement, SliceAlloc, SliceRequest


def gpu_models(req: SliceRequest) -> frozenset[str] | None:
    """The GPU models ``req`` accepts (None: any)."""
    return frozenset(req.gpu_model.split("|")) if req.gpu_model else None


def place_mig(cluster: Cluster, req: SliceRequest, end: float,
              partitioned_only: bool = False) -> Placement | None:
    """A MIG instance of ``req.profile``: on an already partitioned GPU first, then on the
    one keeping the most placement potential (``partitioned_only``: never an empty GPU)."""
    models = gpu_models(req)
    best: tuple[tuple[int, int, int, str], Gpu, int] | None = None
    profile = req.profile or ""
    for cls, by_occ in cluster.mig_index.items():
        model, layout = cls
        if models is not None and model not in models:
            continue
        if profile not in migtab.profiles_for(model):
            continue
        if layout is not None and not any(n == profile for n, _ in layout):
            continue  # no such instance in this fixed layout
        # occupancies in order of preference (kept until the set of occupancies changes),
        # then the first usable GPU in each
        version = cluster.mig_version.get(cls, 0)
        cached = cluster.mig_scored.get((cls, profile))
        if cached is not None and cached[0] == version:
            scored = cached[1]
        else:
            scored = []
            for occ in by_occ:
                choice = _mig_choice(model, layout, profile, occ[0], occ[1])
                if choice is not None:
                    scored.append((choice[0], occ, choice[1]))
            scored.sort()
            cluster.mig_scored[(cls, profile)] = (version, scored)
        for score, occ, start in scored:
            if best is not None and best[0] <= score:
                break
            if partitioned_only and not occ[0]:
                break  # the partitioned occupancies sort first
            for key in by_occ[occ]:
                g = cluster.gpu(key)
                if end <= g.reserved_at and g.node.host_fits(req.cpu_milli, req.memory_mib):
                    best = (score, g, start)
                    break
            else:
                continue
            break
    if best is None:
        return None
    _, g, start = best
    p = migtab.profiles_for(g.model)[profile]
    return Placement((SliceAlloc(g.node.name, g.index, "mig", p.milli, start, profile, 0,
                                 req.cpu_milli, req.memory_mib),))


@cache
def _mig_choice(model: str, layout: frozenset[tuple[str, int]] | None, profile: str, mask: int,
                used: int) -> tuple[tuple[int, int, int, str], int] | None:
    """Best start slot for ``profile`` on a GPU in this occupancy (of a fixed layout: only its
    free instances of that profile), with its score (lower is better): partitioned GPUs
    first, then the most placement potential left, then the highest slot (small instances
    fill from the end, as nvidia-smi does)."""
    p = migtab.profiles_for(model)[profile]
    best = None
    for start in migtab.fits_in(model, layout, profile, mask, used):
        new_mask = migtab.occupy(p, start, mask)
        score = (0 if mask else 1, -migtab.potential(model, new_mask, used + p.compute),
                 -start, model)
        if best is None or score < best[0]:
            best = (score, start)
    return best


# ---------------------------------------------------------------------- MPS


def _mps_ok(g: Gpu, req: SliceRequest, models: frozenset[str] | None, end: float) -> bool:
    return (end <= g.reserved_at and (models is None or g.model in models)
            and (not g.memory_mib or g.mem_used + req.gpu_memory_mib <= g.memory_mib)
            and g.node.host_fits(req.cpu_milli, req.memory_mib))


def place_mps(cluster: Cluster, req: SliceRequest, end: float) -> Placement | None:
    if not 0 < req.milli <= MILLI:
        return None
    models = gpu_models(req)
    if cluster.mps_on_mig and cluster.mps_mig_first:
        p = mps_as_mig(cluster, req, end, partitioned_only=True)
        if p is not None:
            return p
    fgd = frag.active(cluster)
    shares = fgd.rank_share(req) if fgd is not None else None
    if shares is not None:  # least fragmentation (the index already left out what cannot fit)
        for i, gi in shares:
            g = cluster.nodes[i].gpus[gi]
            if _mps_ok(g, req, models, end):
                return _mps_alloc(g, req)
        # none of the ranked GPUs could (reservations, GPU memory): pack below
    room = MILLI - req.milli
    for used in sorted((u for u in cluster.shared if u <= room), reverse=True):
        for key in cluster.shared[used]:
            g = cluster.gpu(key)
            if _mps_ok(g, req, models, end):
                return _mps_alloc(g, req)
    if cluster.mps_on_mig:
        p = mps_as_mig(cluster, req, end)
        if p is not None:
            return p
    # open a free GPU on the fullest node that has one
    for k in range(1, len(cluster.whole_buckets)):
        for idx in cluster.whole_buckets[k]:
            n = cluster.nodes[idx]
            for i in n.free_whole:
                g = n.gpus[i]
                if _mps_ok(g, req, models, end):
                    return _mps_alloc(g, req)
    return None


def mps_as_mig(cluster: Cluster, req: SliceRequest, end: float,
               partitioned_only: bool = False) -> Placement | None:
    """An MPS share as a MIG instance (``Policy.mps_on_mig``): of each MIG model, the smallest
    profile with at least the share's compute and GPU memory — a share that sets no memory
    limit would use the GPU's memory alongside others, so it needs its part of the GPU's memory
    (its milli of it) — placed like a MIG request (partitioned GPUs first; with
    ``partitioned_only``, only there); the slice is charged the share's milli, not the
    instance's."""
    models = gpu_models(req)
    best: Placement | None = None
    best_key: tuple[int, int] | None = None
    for model, _ in cluster.mig_index:
        if models is not None and model not in models:
            continue
        table = migtab.profiles_for(model).values()
        gpu_gb = max(p.memory_gb for p in table)
        need_mib = req.gpu_memory_mib or gpu_gb * 1024 * req.milli // MILLI
        fit = [p for p in table if p.milli >= req.milli and p.memory_gb * 1024 >= need_mib]
        if not fit:
            continue
        prof = min(fit, key=lambda p: (p.compute, p.size))
        key = (prof.compute, prof.size)
        if best_key is not None and best_key <= key:
            continue
        got = place_mig(cluster, SliceRequest.mig(prof.name, gpu_model=model,
                                                  cpu_milli=req.cpu_milli,
                                                  memory_mib=req.memory_mib), end,
                        partitioned_only)
        if got is not None:
            best, best_key = got, key
    if best is None:
        return None
    s = best.slices[0]
    return Placement((SliceAlloc(s.node, s.gpu, "mig", req.milli, s.mig_start, s.profile, 0,
                                 req.cpu_milli, req.memory_mib),))


def _mps_alloc(g: Gpu, req: SliceRequest) -> Placement:
    return Placement((SliceAlloc(g.node.name, g.index, "mps", req.milli, -1, None,
                                 req.gpu_memory_mib, req.cpu_milli, req.memory_mib),))
