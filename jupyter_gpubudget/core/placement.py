"""Where a request goes: whole GPUs, gangs across nodes, MIG instances, MPS shares.

Packing rules, so that fragments don't strand capacity:
- whole GPUs go to the node with the *fewest* free GPUs that still fits them (best fit), and
  inside it to the NVLink domain that fits them most tightly; full nodes stay whole for gangs;
- gangs that need several nodes take the fewest nodes, in one rack when one rack suffices;
  a gang is never given fewer links than its interconnect asks for (:func:`gang_links`):
  ``nvlink`` keeps each node's ranks in one NVLink domain and a gang that fits one domain
  in it, ``node`` keeps a gang that fits one node on it, and only ``any`` may take, with
  ``Policy.gang_on_mig``, idle MIG-mode GPUs as full-size instances (see
  :func:`idle_mig_for_gangs`);
- MIG instances go to an already partitioned GPU first, at the slot that keeps the most large
  profiles placeable (see :func:`mig.potential`);
- MPS shares go to the fullest shared GPU that still fits them, and only then open a free GPU
  on the fullest node.
- unless the cluster carries an FGD index (``fragmentation.index_for``; the default policy,
  ``placement: fgd``): then MPS shares — and whole GPUs on one node, when the mix has both
  shares and host CPU/memory requests — go where the expected stranded capacity grows least
  (see :mod:`fragmentation`); the rules above remain the fallback.

``end`` is the predicted end of the workload: a GPU reserved for a blocked gang from time T
is used only when ``end <= T`` (backfill).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

from . import fragmentation as frag
from . import mig as migtab
from .capacity import Cluster, Gpu, NodeCap
from .model import MILLI, Placement, SliceAlloc, SliceRequest


def place(cluster: Cluster, req: SliceRequest, end: float) -> Placement | None:
    """Where ``req`` fits now (usable until ``end``), in the cluster it names; naming none,
    anywhere — but a gang never spans clusters: one that only fits across them is placed in
    the first cluster that holds it, else nowhere."""
    if req.cluster is None:
        p = _place_any(cluster, req, end)
        if p is None or len(cluster.cluster_names) <= 1 or cluster.one_cluster(p):
            return p
    elif cluster.cluster_names == (req.cluster,):
        return _place_any(cluster, req, end)
    for name in cluster_choices(cluster, req) or ():
        prev = cluster.bar(name)
        try:
            p = _place_any(cluster, req, end)
        finally:
            cluster.bar(prev)
        if p is not None:
            return p
    return None


def cluster_choices(cluster: Cluster, req: SliceRequest) -> tuple[str, ...] | None:
    """The clusters a request is looked at in, one at a time (:meth:`Cluster.bar`): the one it
    names; else, on an inventory of several, each of them; None: all nodes at once."""
    if req.cluster is not None:
        return None if cluster.cluster_names == (req.cluster,) else (req.cluster,)
    return cluster.cluster_names if len(cluster.cluster_names) > 1 else None


def _place_any(cluster: Cluster, req: SliceRequest, end: float) -> Placement | None:
    if req.kind == "gpu":
        return place_whole(cluster, req, end)
    if req.kind == "mig":
        return place_mig(cluster, req, end)
    if req.kind == "mps":
        return place_mps(cluster, req, end)
    return place_cpu(cluster, req)


def _models(req: SliceRequest) -> frozenset[str] | None:
    return frozenset(req.gpu_model.split("|")) if req.gpu_model else None


# ---------------------------------------------------------------------- whole GPUs


def gang_links(cluster: Cluster, req: SliceRequest) -> tuple[str, bool]:
    """A gang's interconnect (``model.INTERCONNECTS``: declared, else the cluster's default)
    and whether it must stay on one node: it asked for that (``single_node``), or it fits
    one NVLink domain (``nvlink``) or one node (``node``) somewhere in the inventory, where
    splitting it would put the network between ranks that could have shared faster links."""
    level = req.interconnect or cluster.default_interconnect
    if req.single_node:
        return level, True
    if level == "nvlink":
        return level, req.gpus <= cluster.max_domain
    if level == "node":
        return level, req.gpus <= cluster.max_node_whole
    return level, False


def one_domain(n: NodeCap, free: list[int]) -> list[int]:
    """Of a node's free GPUs, those of the NVLink domain with the most of them free (the
    lowest domain on a tie)."""
    if len(n.domains) <= 1:
        return free
    by_dom: dict[int, list[int]] = {}
    for i in free:
        by_dom.setdefault(n.gpus[i].domain, []).append(i)
    best = min(by_dom, key=lambda d: (-len(by_dom[d]), d), default=None)
    return by_dom[best] if best is not None else []


def _usable_whole(n: NodeCap, models: frozenset[str] | None, end: float) -> list[int]:
    out = []
    for i in n.free_whole:
        g = n.gpus[i]
        if end <= g.reserved_at and (models is None or g.model in models):
            out.append(i)
    return out


def _pick_in_node(n: NodeCap, free: list[int], count: int, one_domain: bool = False
                  ) -> list[int]:
    """Choose ``count`` of the node's free GPUs, packed into as few NVLink domains as possible,
    tightest-fitting domain first (``one_domain``: in one domain, else none: [])."""
    if len(n.domains) <= 1:
        return free[:count]
    by_dom: dict[int, list[int]] = {}
    for i in free:
        by_dom.setdefault(n.gpus[i].domain, []).append(i)
    fitting = [d for d, lst in by_dom.items() if len(lst) >= count]
    if fitting:
        best = min(fitting, key=lambda d: (len(by_dom[d]), d))
        return by_dom[best][:count]
    if one_domain:
        return []
    chosen: list[int] = []
    for d in sorted(by_dom, key=lambda d: (-len(by_dom[d]), d)):
        chosen.extend(by_dom[d][: count - len(chosen)])
        if len(chosen) == count:
            break
    return chosen


def _whole_slices(n: NodeCap, idx: list[int], req: SliceRequest, host: bool) -> list[SliceAlloc]:
    """One slice per GPU; a MIG-mode GPU (``Policy.gang_on_mig``) as its full-size instance."""
    out = []
    for k, i in enumerate(idx):
        cpu, mem = (req.cpu_milli, req.memory_mib) if host and k == 0 else (0, 0)
        prof = full_profile(n.gpus[i].model) if n.gpus[i].mig else None
        if prof is not None:
            out.append(SliceAlloc(n.name, i, "mig", prof.milli, 0, prof.name, 0, cpu, mem))
        else:
            out.append(SliceAlloc(n.name, i, "gpu", MILLI, -1, None, 0, cpu, mem))
    return out


def place_whole(cluster: Cluster, req: SliceRequest, end: float) -> Placement | None:
    need = req.gpus
    if need <= 0:
        return place_cpu(cluster, req)
    models = _models(req)
    if need == 1 and cluster.mig_first:
        p = whole_on_mig(cluster, req, end, models)
        if p is not None:
            return p
    level, one_node = gang_links(cluster, req) if need >= 2 else ("any", req.single_node)
    one_domain = level == "nvlink"
    fgd = frag.active(cluster)
    ranked = fgd.rank_whole(req) if fgd is not None and fgd.sharing() else None
    if ranked is not None:  # one node, least fragmentation
        for idx in ranked:
            p = _on_node(cluster.nodes[idx], req, models, end, one_domain)
            if p is not None:
                return p
        # none of the ranked nodes (one per group of identical nodes) could: best fit below
    buckets = cluster.whole_buckets
    # one node, best fit
    for k in range(need, len(buckets)):
        for idx in buckets[k]:
            p = _on_node(cluster.nodes[idx], req, models, end, one_domain)
            if p is not None:
                return p
    if need == 1 and cluster.whole_gpu_on_mig and not cluster.mig_first:
        p = whole_on_mig(cluster, req, end, models)
        if p is not None:
            return p
    if one_node:
        return None
    return _place_gang(cluster, req, end, models, level)


def full_profile(model: str) -> migtab.MigProfile | None:
    """The MIG profile that is the whole GPU (all 7 compute slices), if the model has MIG."""
    for p in migtab.profiles_for(model).values():
        if p.compute == migtab.COMPUTE:
            return p
    return None


def idle_full_mig(cluster: Cluster, models: frozenset[str] | None = None
                  ) -> Iterator[tuple[Gpu, migtab.MigProfile]]:
    """Each MIG-mode GPU with no instance at all whose layout has the full-size instance
    (of a model in ``models``, when given), with that profile: a whole GPU to a one-GPU
    request (``Policy.whole_gpu_on_mig``), a gang's (``Policy.gang_on_mig``) or the short
    lane's. Whether it is usable (reserved, host room, health) is the caller's to check."""
    for (model, layout), by_occ in cluster.mig_index.items():
        if models is not None and model not in models:
            continue
        idle = by_occ.get((0, 0))
        prof = full_profile(model)
        if not idle or prof is None or (layout is not None and (prof.name, 0) not in layout):
            continue  # a fixed layout has no full-size instance to give
        for key in idle:
            yield cluster.gpu(key), prof


def whole_on_mig(cluster: Cluster, req: SliceRequest, end: float,
                 models: frozenset[str] | None) -> Placement | None:
    """One GPU as the full-size instance of an idle MIG-mode GPU (``Policy.whole_gpu_on_mig``;
    tried before the GPUs outside MIG mode with ``Policy.mig_first``, else only when none of
    them is free): the GPU with no instance at all, on the node with the fewest such GPUs
    (keep whole MIG GPUs together for slices)."""
    best: tuple[int, int, Gpu, migtab.MigProfile] | None = None
    for g, prof in idle_full_mig(cluster, models):
        if end > g.reserved_at or not g.node.host_fits(req.cpu_milli, req.memory_mib):
            continue
        spare = sum(1 for x in g.node.gpus if x.mig and x.mask == 0)
        cand = (spare, g.node.idx, g, prof)
        if best is None or cand[:2] < best[:2]:
            best = cand
    if best is None:
        return None
    _, _, g, prof = best
    return Placement((SliceAlloc(g.node.name, g.index, "mig", prof.milli, 0, prof.name, 0,
                                 req.cpu_milli, req.memory_mib),))


def idle_mig_for_gangs(cluster: Cluster, models: frozenset[str] | None, end: float
                       ) -> list[tuple[NodeCap, list[int]]]:
    """The MIG-mode GPUs a gang placed across nodes — one that no node holds on its GPUs
    outside MIG mode — may take as full-size instances
    (``Policy.gang_on_mig``), per node: those with no instance at all, usable until ``end``,
    whose layout has the full-size instance — on each node all but ``gang_on_mig_spare`` of
    them, which stay for the MIG slices and one-GPU work that use such GPUs (so the spare
    grows with the MIG-mode nodes a cluster has; the nodes with the most are offered first)."""
    if not cluster.gang_on_mig:
        return []
    per_node: dict[int, tuple[NodeCap, list[int]]] = {}
    for g, _ in idle_full_mig(cluster, models):
        if end <= g.reserved_at and not g.node.barred:
            per_node.setdefault(g.node.idx, (g.node, []))[1].append(g.index)
    spare = cluster.gang_on_mig_spare
    out: list[tuple[NodeCap, list[int]]] = []
    for n, idx in sorted(per_node.values(), key=lambda c: (-len(c[1]), c[0].idx)):
        if len(idx) > spare:
            idx.sort()
            out.append((n, idx[:len(idx) - spare]))
    return out


def _on_node(n: NodeCap, req: SliceRequest, models: frozenset[str] | None, end: float,
             one_domain: bool = False) -> Placement | None:
    """All of a whole-GPU request on node ``n``, if its free, usable GPUs and host room allow
    (``one_domain``: in one NVLink domain, an ``nvlink`` gang)."""
    if not n.host_fits(req.cpu_milli, req.memory_mib):
        return None
    free = _usable_whole(n, models, end) if (models or _any_reserved(n)) else list(n.free_whole)
    if len(free) < req.gpus:
        return None
    idx = _pick_in_node(n, free, req.gpus, one_domain)
    if not idx:
        return None
    return Placement(tuple(_whole_slices(n, idx, req, True)))


def _any_reserved(n: NodeCap) -> bool:
    for i in n.free_whole:
        if n.gpus[i].reserved_at != float("inf"):
            return True
    return False


def _place_gang(cluster: Cluster, req: SliceRequest, end: float,
                models: frozenset[str] | None, level: str = "any") -> Placement | None:
    """All-or-nothing across nodes: fewest nodes, one rack if one rack suffices; an
    ``nvlink`` gang's ranks on a node in one NVLink domain, idle MIG-mode GPUs only for
    ``any``."""
    need = req.gpus
    cands: list[tuple[NodeCap, list[int]]] = []
    for k in range(len(cluster.whole_buckets) - 1, 0, -1):
        for idx in cluster.whole_buckets[k]:
            n = cluster.nodes[idx]
            free = _usable_whole(n, models, end) if not n.barred else []
            if free and level == "nvlink":
                free = one_domain(n, free)
            if free:
                cands.append((n, free))
    extra = idle_mig_for_gangs(cluster, models, end) if level == "any" else []
    if extra:
        by_node = {n.idx: free for n, free in cands}
        for n, mig_free in extra:
            if n.idx in by_node:
                by_node[n.idx].extend(mig_free)
            else:
                cands.append((n, mig_free))
    if sum(len(f) for _, f in cands) < need:
        return None
    cands.sort(key=lambda c: (-len(c[1]), c[0].idx))

    def greedy(group: list[tuple[NodeCap, list[int]]], want: int
               ) -> list[tuple[NodeCap, list[int]]]:
        chosen: list[tuple[NodeCap, list[int]]] = []
        got = 0
        for n, free in group:
            if got >= want:
                break
            use = _pick_in_node(n, free, min(len(free), want - got))
            chosen.append((n, use))
            got += len(use)
        return chosen

    def take(group: list[tuple[NodeCap, list[int]]]) -> list[tuple[NodeCap, list[int]]] | None:
        """The fewest nodes of ``group`` (the fullest first) with one of them able to hold
        the request's host CPU and memory, which go on that node (listed first)."""
        host = [c for c in group if c[0].host_fits(req.cpu_milli, req.memory_mib)]
        if not host or sum(len(f) for _, f in group) < need:
            return None
        chosen = greedy(group, need)
        at = next((i for i, (n, _) in enumerate(chosen)
                   if n.host_fits(req.cpu_milli, req.memory_mib)), None)
        if at is not None:
            chosen.insert(0, chosen.pop(at))
            return chosen
        # none of the fullest nodes has host room: the fullest node that has anchors it
        anchor = host[0]
        first = greedy([anchor], need)
        rest = greedy([c for c in group if c is not anchor], need - len(first[0][1]))
        return first + rest

    best: list[tuple[NodeCap, list[int]]] | None = None
    racks: dict[str, list[tuple[NodeCap, list[int]]]] = {}
    for c in cands:
        racks.setdefault(c[0].rack, []).append(c)
    for rack in sorted(racks):
        got = take(racks[rack])
        if got is not None and (best is None or len(got) < len(best)):
            best = got
    if best is None:
        best = take(cands)
    if best is None:
        return None
    slices: list[SliceAlloc] = []
    for j, (n, use) in enumerate(best):
        slices.extend(_whole_slices(n, use, req, j == 0))
    return Placement(tuple(slices))


# ---------------------------------------------------------------------- MIG


def place_mig(cluster: Cluster, req: SliceRequest, end: float,
              partitioned_only: bool = False) -> Placement | None:
    """A MIG instance of ``req.profile``: on an already partitioned GPU first, then on the
    one keeping the most placement potential (``partitioned_only``: never an empty GPU)."""
    models = _models(req)
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
    models = _models(req)
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
    models = _models(req)
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


# ---------------------------------------------------------------------- CPU only


def place_cpu(cluster: Cluster, req: SliceRequest) -> Placement | None:
    """CPU-only work goes to the nodes with the fewest free GPUs, leaving GPU nodes whole."""
    for bucket in cluster.whole_buckets:
        for idx in bucket:
            n = cluster.nodes[idx]
            if n.host_fits(req.cpu_milli, req.memory_mib):
                return Placement((SliceAlloc(n.name, -1, "cpu", 0, -1, None, 0,
                                             req.cpu_milli, req.memory_mib),))
    return None
