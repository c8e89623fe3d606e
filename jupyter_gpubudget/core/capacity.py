"""The live capacity model: what is free on every GPU, MIG slot map and node, with indexes so
placement is a few look-ups instead of a scan of the cluster.

Invariant (docs/core.md semantics 1): nothing is allocated twice or beyond its size. ``allocate``
checks every slice against current occupancy and raises :class:`CapacityError` otherwise, so
a bug elsewhere cannot silently overcommit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import mig as migtab
from .inventory import Inventory
from .model import MILLI, Placement, SliceAlloc

INF = float("inf")


class CapacityError(RuntimeError):
    pass


class Gpu:
    __slots__ = ("node", "index", "model", "memory_mib", "mig", "domain", "used_milli",
                 "mem_used", "whole", "mask", "compute_used", "tenants", "reserved_at", "key",
                 "layout", "mig_class")

    def __init__(self, node: NodeCap, index: int, model: str, memory_mib: int, mig: bool,
                 domain: int, layout: frozenset[tuple[str, int]] | None = None) -> None:
        self.node = node
        self.index = index
        self.model = model
        self.memory_mib = memory_mib
        self.mig = mig
        self.domain = domain
        #: a MIG GPU's fixed instances (profile, start), the only ones placed on; None: carved
        self.layout = layout
        #: MIG GPUs of one class (model and layout) accept the same instances in the same
        #: occupancy: the placement index and its cache are kept per class
        self.mig_class: tuple[str, frozenset[tuple[str, int]] | None] = (model, layout)
        self.used_milli = 0  # MPS/whole use (non-MIG)
        self.mem_used = 0
        self.whole = False  # allocated as a whole GPU
        self.mask = 0  # MIG memory slots in use
        self.compute_used = 0  # MIG compute slices in use
        self.tenants: dict[str, int] = {}  # workload id -> milli held on this GPU
        self.reserved_at = INF  # a blocked gang will need this GPU from then on
        self.key = (node.idx, index)

    @property
    def free(self) -> bool:
        return not self.mig and self.used_milli == 0 and not self.whole


class NodeCap:
    __slots__ = ("name", "idx", "rack", "gpus", "cpu_total", "mem_total", "cpu_used",
                 "mem_used", "healthy", "free_whole", "domains", "cluster", "barred")

    def __init__(self, name: str, idx: int, rack: str, cpu: int, mem: int,
                 cluster: str = "default") -> None:
        self.name = name
        self.idx = idx
        self.rack = rack
        self.cluster = cluster
        #: outside the cluster placement is looking in right now (:meth:`Cluster.bar`):
        #: it has room for nothing
        self.barred = False
        self.gpus: list[Gpu] = []
        self.cpu_total = cpu
        self.mem_total = mem
        self.cpu_used = 0
        self.mem_used = 0
        self.healthy = True
        self.free_whole: dict[int, None] = {}  # indices of wholly free non-MIG GPUs
        self.domains: list[list[int]] = []

    def host_fits(self, cpu: int, mem: int) -> bool:
        return not self.barred and ((not self.cpu_total or self.cpu_used + cpu <= self.cpu_total)
                and (not self.mem_total or self.mem_used + mem <= self.mem_total))


class Cluster:
    """Occupancy of every node and GPU plus look-up indexes, kept in step by allocate/release."""

    def __init__(self, inventory: Inventory, unhealthy: Iterable[str] = ()) -> None:
        self.nodes: list[NodeCap] = []
        self.by_name: dict[str, NodeCap] = {}
        self.max_gpus_per_node = 0
        # node idx ordered sets keyed by count of wholly free non-MIG GPUs (healthy nodes)
        self.whole_buckets: list[dict[int, None]] = []
        # shared (MPS) non-MIG GPUs with 0 < used < 1000: used -> ordered set of gpu keys
        self.shared: dict[int, dict[tuple[int, int], None]] = {}
        # MIG GPUs by model and occupancy: model -> (mask, compute) -> ordered set of gpu keys
        self.mig_index: dict[tuple, dict[tuple[int, int], dict[tuple[int, int], None]]] = {}
        self.allocations: dict[str, Placement] = {}
        # names of nodes changed since the fragmentation index last looked (None: untracked)
        self.touched: set[str] | None = None
        self.frag: Any = None  # placement's fragmentation index, when the policy uses one
        self.whole_gpu_on_mig = False  # may a one-GPU request take an idle MIG GPU (7g)?
        self.mig_first = False  # ... before the GPUs outside MIG mode?
        self.mps_on_mig = False  # may an MPS share with no room take a MIG instance?
        self.mps_mig_first = False  # ... one on a partitioned MIG GPU before a shared GPU?
        self.gang_on_mig = False  # may a gang across nodes take idle MIG GPUs (7g)?
        self.gang_on_mig_spare = 0  # ... leaving this many of them idle on each node
        # bumped whenever an occupancy key appears in or leaves mig_index[class]
        self.mig_version: dict[tuple, int] = {}
        self.mig_scored: dict[tuple, tuple[int, list]] = {}  # placement's cache
        self.total_milli = 0
        self.used_milli = 0
        for i, spec in enumerate(inventory.nodes):
            n = NodeCap(spec.name, i, spec.rack, spec.cpu_milli, spec.memory_mib, spec.cluster)
            dom_of = {}
            for d, group in enumerate(spec.nvlink or (tuple(g.index for g in spec.gpus),)):
                for gi in group:
                    dom_of[gi] = d
            ndom = (max(dom_of.values()) + 1) if dom_of else 1
            n.domains = [[] for _ in range(ndom)]
            for g in spec.gpus:
                gpu = Gpu(n, g.index, g.model, g.memory_mib, g.mig, dom_of.get(g.index, ndom - 1),
                          g.layout if g.mig else None)
                n.gpus.append(gpu)
                if not g.mig:
                    n.domains[gpu.domain].append(g.index)
            self.nodes.append(n)
            self.by_name[n.name] = n
            self.max_gpus_per_node = max(self.max_gpus_per_node, len(spec.gpus))
            self.total_milli += MILLI * len(spec.gpus)
        self.whole_buckets = [{} for _ in range(self.max_gpus_per_node + 1)]
        #: the named clusters of the inventory (one, "default", unless it has several)
        self.cluster_names: tuple[str, ...] = inventory.clusters or ("default",)
        self._barred_to: str | None = None
        # the interconnect facts placement reads (model.INTERCONNECTS): the largest NVLink
        # domain and the most GPUs outside MIG mode on any node; a gang that fits one is
        # never split (``nvlink`` / ``node``); the default is ``nvlink`` where some node
        # has a domain of two or more GPUs
        self.max_domain = max((len(d) for n in self.nodes for d in n.domains), default=0)
        self.max_node_whole = max((sum(1 for g in n.gpus if not g.mig) for n in self.nodes),
                                  default=0)
        self.default_interconnect = "nvlink" if self.max_domain >= 2 else "node"
        for n in self.nodes:
            for gpu in n.gpus:
                if not gpu.mig:
                    n.free_whole[gpu.index] = None
        bad = set(unhealthy)
        for n in self.nodes:
            if n.name in bad:
                n.healthy = False
            self._index_node(n)

    # ------------------------------------------------------------------ indexes
    def _index_node(self, n: NodeCap) -> None:
        if not n.healthy:
            return
        self.whole_buckets[len(n.free_whole)][n.idx] = None
        for g in n.gpus:
            self._index_gpu(g)

    def _unindex_node(self, n: NodeCap) -> None:
        if not n.healthy:
            return
        self.whole_buckets[len(n.free_whole)].pop(n.idx, None)
        for g in n.gpus:
            self._unindex_gpu(g)

    def _index_gpu(self, g: Gpu) -> None:
        if g.mig:
            by_occ = self.mig_index.setdefault(g.mig_class, {})
            occ = (g.mask, g.compute_used)
            bucket = by_occ.get(occ)
            if bucket is None:
                bucket = by_occ[occ] = {}
                self.mig_version[g.mig_class] = self.mig_version.get(g.mig_class, 0) + 1
            bucket[g.key] = None
        elif 0 < g.used_milli < MILLI and not g.whole:
            self.shared.setdefault(g.used_milli, {})[g.key] = None

    def _unindex_gpu(self, g: Gpu) -> None:
        if g.mig:
            b = self.mig_index[g.mig_class][(g.mask, g.compute_used)]
            del b[g.key]
            if not b:
                del self.mig_index[g.mig_class][(g.mask, g.compute_used)]
                self.mig_version[g.mig_class] += 1
        elif 0 < g.used_milli < MILLI and not g.whole:
            b = self.shared[g.used_milli]
            del b[g.key]
            if not b:
                del self.shared[g.used_milli]

    def _unindex_one(self, n: NodeCap, g: Gpu | None) -> None:
        if n.healthy:
            self.whole_buckets[len(n.free_whole)].pop(n.idx, None)
            if g is not None:
                self._unindex_gpu(g)

    def _index_one(self, n: NodeCap, g: Gpu | None) -> None:
        if n.healthy:
            self.whole_buckets[len(n.free_whole)][n.idx] = None
            if g is not None:
                self._index_gpu(g)

    def gpu(self, key: tuple[int, int]) -> Gpu:
        return self.nodes[key[0]].gpus[key[1]]

    def set_healthy(self, name: str, healthy: bool) -> None:
        n = self.by_name[name]
        if n.healthy == healthy:
            return
        if healthy:
            n.healthy = True
            self._index_node(n)
        else:
            self._unindex_node(n)
            n.healthy = False

    # ------------------------------------------------------------------ changes
    def allocate(self, wid: str, placement: Placement) -> None:
        if wid in self.allocations:
            raise CapacityError(f"workload {wid} is already placed")
        done: list[SliceAlloc] = []
        try:
            for s in placement.slices:
                self._take(wid, s)
                done.append(s)
        except CapacityError:
            for s in reversed(done):
                self._give(wid, s)
            raise
        self.allocations[wid] = placement
        if self.touched is not None:
            self.touched.update(placement.nodes)

    def load(self, running: Iterable[tuple[str, Placement]]) -> None:
        """Allocate many placements at once (a state read from the ledger): every slice is
        checked as in :meth:`allocate`, and the look-up indexes are rebuilt once at the end."""
        self.whole_buckets = [{} for _ in self.whole_buckets]
        self.shared.clear()
        self.mig_index.clear()
        try:
            for wid, placement in running:
                if wid in self.allocations:
                    raise CapacityError(f"workload {wid} is already placed")
                for s in placement.slices:
                    self._take(wid, s, index=False)
                self.allocations[wid] = placement
                if self.touched is not None:
                    self.touched.update(placement.nodes)
        finally:
            for n in self.nodes:
                self._index_node(n)

    def resync(self, running: list[tuple[str, Placement]], unhealthy: set[str]) -> None:
        """Bring a model kept from an earlier cycle to ``running`` (in that order) and the
        ``unhealthy`` nodes, exactly as a new model that :meth:`load` ed them: what left or
        moved is released, what is new allocated, and then every order placement reads —
        the index buckets, each node's free GPUs, each GPU's tenants, the allocations — is
        laid out again as a load makes it (a kept model's orders follow its history of
        allocations; placement would pick other GPUs). Raises :class:`CapacityError` when the
        new work does not fit (the caller loads a new model then)."""
        want = dict(running)
        for wid in [wid for wid, p in self.allocations.items()
                    if (q := want.get(wid)) is None or (q is not p and q != p)]:
            self.release(wid)
        for wid, p in running:
            if wid not in self.allocations:
                for s in p.slices:
                    self._take(wid, s, index=False)
                self.allocations[wid] = p
        self.allocations = {wid: self.allocations[wid] for wid, _ in running}
        self.whole_buckets = [{} for _ in self.whole_buckets]
        self.shared.clear()
        self.mig_index.clear()
        self.mig_scored.clear()
        for n in self.nodes:
            n.healthy = n.name not in unhealthy
            n.free_whole = {g.index: None for g in n.gpus
                            if not g.mig and not g.whole and g.used_milli == 0}
            for g in n.gpus:
                g.tenants = {}
                g.reserved_at = INF
        for wid, p in running:
            for s in p.slices:
                if s.gpu >= 0:
                    self.by_name[s.node].gpus[s.gpu].tenants[wid] = s.milli
        for n in self.nodes:
            self._index_node(n)

    def release(self, wid: str) -> Placement | None:
        placement = self.allocations.pop(wid, None)
        if placement is not None:
            for s in placement.slices:
                self._give(wid, s)
            if self.touched is not None:
                self.touched.update(placement.nodes)
        return placement

    def _take(self, wid: str, s: SliceAlloc, index: bool = True) -> None:
        n = self.by_name.get(s.node)
        if n is None:
            raise CapacityError(f"unknown node {s.node}")
        if not n.host_fits(s.cpu_milli, s.memory_mib):
            raise CapacityError(f"node {s.node} has no room for {s.cpu_milli} CPU milli / "
                                f"{s.memory_mib} MiB")
        if s.gpu >= len(n.gpus):  # checked before the GPU is looked up
            raise CapacityError(f"node {s.node} has no GPU {s.gpu}")
        g = n.gpus[s.gpu] if s.gpu >= 0 else None
        if g is not None:
            if wid in g.tenants:
                raise CapacityError(f"{wid} holds GPU {s.node}/{s.gpu} twice")
            self._check(g, s)
        if index:
            self._unindex_one(n, g)
        n.cpu_used += s.cpu_milli
        n.mem_used += s.memory_mib
        if g is not None:
            if s.kind == "mig":
                p = migtab.profiles_for(g.model)[s.profile or ""]
                g.mask = migtab.occupy(p, s.mig_start, g.mask)
                g.compute_used += p.compute
            elif s.kind == "gpu":
                g.whole = True
                g.used_milli = MILLI
            else:
                g.used_milli += s.milli
                g.mem_used += s.gpu_memory_mib
            g.tenants[wid] = s.milli
            self.used_milli += s.milli
            if not g.mig and g.index in n.free_whole:
                del n.free_whole[g.index]
        if index:
            self._index_one(n, g)

    def _check(self, g: Gpu, s: SliceAlloc) -> None:
        problem = _problem(g, s)
        if problem:
            raise CapacityError(f"{g.node.name}/GPU{g.index}: {problem}")

    def _give(self, wid: str, s: SliceAlloc) -> None:
        n = self.by_name[s.node]
        g = n.gpus[s.gpu] if s.gpu >= 0 else None
        self._unindex_one(n, g)
        n.cpu_used -= s.cpu_milli
        n.mem_used -= s.memory_mib
        if g is not None:
            del g.tenants[wid]
            self.used_milli -= s.milli
            if s.kind == "mig":
                p = migtab.profiles_for(g.model)[s.profile or ""]
                g.mask = migtab.release(p, s.mig_start, g.mask)
                g.compute_used -= p.compute
            elif s.kind == "gpu":
                g.whole = False
                g.used_milli = 0
            else:
                g.used_milli -= s.milli
                g.mem_used -= s.gpu_memory_mib
            if not g.mig and not g.whole and g.used_milli == 0:
                n.free_whole[g.index] = None
        self._index_one(n, g)

    # ------------------------------------------------------------------ named clusters
    def bar(self, name: str | None) -> str | None:
        """Let placement look only at the nodes of cluster ``name`` (None: every node) until
        the next call; returns the cluster it looked at before, to restore. The nodes of
        other clusters have room for nothing meanwhile (``NodeCap.host_fits``)."""
        prev = self._barred_to
        if name != prev:
            for n in self.nodes:
                n.barred = name is not None and n.cluster != name
            self._barred_to = name
        return prev

    def one_cluster(self, placement: Placement) -> bool:
        """Are all of a placement's nodes in one cluster?"""
        return len({self.by_name[s.node].cluster for s in placement.slices}) <= 1

    # ------------------------------------------------------------------ reservations
    def clear_reservations(self) -> None:
        for n in self.nodes:
            for g in n.gpus:
                g.reserved_at = INF

    def reserve(self, placement: Placement, at: float) -> None:
        for s in placement.slices:
            if s.gpu >= 0:
                g = self.by_name[s.node].gpus[s.gpu]
                g.reserved_at = min(g.reserved_at, at)

    # ------------------------------------------------------------------ figures
    def stranded_milli(self) -> int:
        """Free GPU capacity on GPUs that are partly used (shared or MIG): it can only take
        small requests. A measure of fragmentation."""
        total = 0
        for n in self.nodes:
            for g in n.gpus:
                if g.mig and g.compute_used:
                    total += round((migtab.COMPUTE - g.compute_used) * MILLI / migtab.COMPUTE)
                elif not g.mig and 0 < g.used_milli < MILLI:
                    total += MILLI - g.used_milli
        return total


def _problem(g: Gpu, s: SliceAlloc) -> str | None:
    """Why slice ``s`` cannot go on ``g`` now, or None if it can."""
    if s.kind == "mig":
        if not g.mig:
            return "not in MIG mode"
        if s.profile not in migtab.profiles_for(g.model):
            return f"{g.model} has no MIG profile {s.profile}"
        if g.layout is not None and (s.profile, s.mig_start) not in g.layout:
            return (f"no {s.profile} instance at slot {s.mig_start} in this GPU's MIG layout "
                    f"(it is fixed: {', '.join(f'{n}@{st}' for n, st in sorted(g.layout))})")
        if s.mig_start not in migtab.fits(g.model, s.profile, g.mask, g.compute_used):
            return f"{s.profile} does not fit at slot {s.mig_start}"
    elif g.mig:
        return "in MIG mode; it takes MIG instances only"
    elif s.kind == "gpu":
        if g.whole or g.used_milli:
            return "not free"
    elif g.whole or g.used_milli + s.milli > MILLI or s.milli <= 0:
        return f"{MILLI - g.used_milli} milli free, {s.milli} asked"
    elif g.memory_mib and g.mem_used + s.gpu_memory_mib > g.memory_mib:
        return "too little memory for the MPS share"
    return None
