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
  on the fullest node (MIG instances and MPS shares: sharing.py).
- unless the cluster carries an FGD index (``fragmentation.index_for``; the default policy,
  ``placement: fgd``): then MPS shares — and whole GPUs on one node, when the mix has both
  shares and host CPU/memory requests — go where the expected stranded capacity grows least
  (see :mod:`fragmentation`); the rules above remain the fallback.

``end`` is the predicted end of the workload: a GPU reserved for a blocked gang from time T
is used only when ``end <= T`` (backfill).
"""

from __future__ import annotations

from collections.abc import Iterator

from . import fragmentation as frag
from . import mig as migtab
from .capacity import Cluster, Gpu, NodeCap
from .model import MILLI, Placement, SliceAlloc, SliceRequest
from .sharing import gpu_models as _models
from .sharing import place_mig, place_mps


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
    buckets = cluster.whole_buckets
    if not (cluster.gang_on_mig and level == "any") and sum(
            k * len(buckets[k]) for k in range(1, len(buckets))) < need:
        return None  # fewer free whole GPUs than it needs, usable or not: nothing to search
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
