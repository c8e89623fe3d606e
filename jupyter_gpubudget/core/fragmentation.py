"""Fragmentation-aware placement: fragmentation gradient descent (FGD).

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent" (USENIX ATC'23). The idea: free GPU capacity is only useful if
the workloads that are likely to arrive can use it. Given the **mix** (how often each request
shape arrives), a node's *fragmentation* is the expected amount of its free GPU capacity that
an arriving workload cannot use:

    F(node) = Σ_m p_m · f_m(node)
    f_m(node) = Σ_g free_g · [free_g < per-GPU demand of m]   if m fits the node
              = Σ_g free_g                                     otherwise (all of it is stranded)

(CPU-only shapes strand all free GPU capacity; a node whose model a shape excludes does too.)
A request goes to the node (and, for a share of one GPU, the GPU) where F grows least.

F sees host CPU only as "the next shape fits or not". Over many placements a node whose CPU
runs out before its GPUs strands GPU capacity that no single-step look sees coming (on openb's
GPU-sharing mixes, 8-GPU nodes with 12 cores per GPU filled with CPU-heavy shares while
CPU-rich 2-GPU nodes stayed idle). So the score adds a *host-stranding* term: with ρ the mix's
CPU per GPU-milli, a node with ``g`` free milli and ``c`` free CPU can feed only ``c / ρ`` of
its GPU capacity to the typical workload, and ``max(0, g − c/ρ)`` is counted as stranded
(:func:`cpu_stranded`); a placement pays ``STRAND_WEIGHT`` × its change.

The mix is a decayed histogram of the shapes the scheduler has seen (:class:`ShapeMix`); the
most frequent shapes that make up ``threshold`` (95 %) of it are the "typical" ones used for F,
as in the paper's artifact. Nothing here reads files or the clock.

:class:`FragIndex` keeps per-node arrays (free milli per GPU, free CPU and host memory, and per
shape: how many GPUs could host it and how much free capacity is too small for it) so scoring
every node for a request is a few numpy operations over (nodes × shapes), not a Python loop.
It stays in step with a :class:`~jupyter_gpubudget.core.capacity.Cluster` through
:func:`index_for`, which learns which nodes changed from the cluster's allocation table.

Modules: the mix (fragmix.py), the per-node arrays and the scores (fragindex.py), and here
the cluster adapter (:class:`ClusterFrag`, :func:`index_for`); the names of all three are
importable from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .fragindex import BIG, FragIndex, cpu_stranded
from .fragmix import MixView, Shape, ShapeMix, cpu_per_milli
from .model import MILLI, SliceRequest

if TYPE_CHECKING:  # pragma: no cover
    from .capacity import Cluster



class ClusterFrag:
    """A :class:`FragIndex` kept in step with a live cluster, plus the mix it scores against."""

    def __init__(self, cluster: Cluster, mix: ShapeMix | MixView | None = None) -> None:
        self.cluster = cluster
        self.mix: ShapeMix | MixView = mix if mix is not None else ShapeMix()
        nodes = cluster.nodes
        self.index = FragIndex([len(n.gpus) for n in nodes],
                               [n.gpus[0].model if n.gpus else "" for n in nodes],
                               [n.cpu_total or int(BIG) for n in nodes],
                               [n.mem_total or int(BIG) for n in nodes])
        self.touched: set[str] = set()
        cluster.touched = self.touched  # the cluster notes the nodes each change touches
        self._health = [n.healthy for n in nodes]
        self._sharing: tuple[int, bool] | None = None
        self._stale = True  # loaded on first use: a scheduler built from state allocates
        # its running work right after attaching, and one bulk load covers both

    def _rebuild(self) -> None:
        """Reload every node from the cluster in one go (at start, or after many changes)."""
        idx = self.index
        nodes = self.cluster.nodes
        free = [[0 if g.mig or g.whole else MILLI - g.used_milli for g in n.gpus] + [0] * (
            idx.g - len(n.gpus)) for n in nodes]
        idx.free[:, :] = np.asarray(free, dtype=np.int64).reshape(idx.n, idx.g)
        idx.cpu[:] = [n.cpu_total - n.cpu_used if n.cpu_total else int(BIG) for n in nodes]
        idx.mem[:] = [n.mem_total - n.mem_used if n.mem_total else int(BIG) for n in nodes]
        self._health = [n.healthy for n in nodes]
        idx.ok[:] = self._health
        idx.recompute()
        self.touched.clear()
        self._stale = False

    def _load(self, rows: list[int]) -> None:
        """Reload some nodes from the cluster, vectorised over them."""
        idx = self.index
        nodes = self.cluster.nodes
        pad = idx.g
        free = []
        for i in rows:
            n = nodes[i]
            f = [0 if g.mig or g.whole else MILLI - g.used_milli for g in n.gpus]
            free.append(f + [0] * (pad - len(f)))
            idx.cpu[i] = n.cpu_total - n.cpu_used if n.cpu_total else int(BIG)
            idx.mem[i] = n.mem_total - n.mem_used if n.mem_total else int(BIG)
            idx.ok[i] = self._health[i] = n.healthy
        idx.set_rows(np.asarray(rows, dtype=np.int64), np.asarray(free, dtype=np.int64))

    def _refresh(self, i: int) -> None:
        n = self.cluster.nodes[i]
        free = [0 if g.mig or g.whole else MILLI - g.used_milli for g in n.gpus]
        cpu = int(BIG) if not n.cpu_total else n.cpu_total - n.cpu_used
        mem = int(BIG) if not n.mem_total else n.mem_total - n.mem_used
        self.index.set_node(i, free, cpu, mem, n.healthy)
        self._health[i] = n.healthy

    def sync(self) -> None:
        if self._stale or len(self.touched) > len(self.cluster.nodes) // 2:
            self._rebuild()
            return
        if self.touched:
            by_name = self.cluster.by_name
            self._load(sorted(by_name[name].idx for name in self.touched))
            self.touched.clear()
        health = [n.healthy for n in self.cluster.nodes]
        if health != self._health:  # health flips are rare
            for i, h in enumerate(health):
                if h != self._health[i]:
                    self._refresh(i)

    def observe(self, req: SliceRequest) -> None:
        if isinstance(self.mix, ShapeMix):
            self.mix.observe(req)

    def sharing(self) -> bool:
        """Should whole-GPU requests be placed by FGD too? Only when GPU sharing is part of the
        mix *and* the mix asks for host CPU or memory: then which node a whole GPU comes from
        decides whether shares (and their CPU) still fit. Otherwise best fit strands nothing
        that FGD would save, at a fraction of the cost."""
        ver = self.mix.version
        if self._sharing is None or self._sharing[0] != ver:
            typ = self.mix.typical()
            shares = any(0 < s.milli < MILLI for s, _ in typ)
            host = any(s.cpu_milli > 0 or s.memory_mib > 0 for s, _ in typ)
            self._sharing = (ver, shares and host)
        return self._sharing[1]

    def rank_share(self, req: SliceRequest) -> Sequence[tuple[int, int]] | None:
        """(node index, GPU index) candidates for an MPS share, least fragmentation first, or
        None when there is no mix to score against yet (the caller then packs). The caller
        still checks reservations, GPU memory and host fit on each."""
        s = Shape.of(req)
        if s is None or not self.mix.typical():
            return None
        self.sync()
        return self.index.best_share(s, self.mix)

    def rank_whole(self, req: SliceRequest) -> Sequence[int] | None:
        """Node indices with enough wholly free GPUs for ``req`` on one node, least
        fragmentation first (models and reservations are the caller's to check); None when
        there is no mix yet."""
        s = Shape.of(req)
        if s is None or not self.mix.typical():
            return None
        self.sync()
        return self.index.best_whole(s, self.mix)


def active(cluster: Cluster) -> ClusterFrag | None:
    """The cluster's FGD index if one was attached (the scheduler attaches one when its policy
    says ``placement: fgd``), else None: placement then packs without it."""
    return cluster.frag  # type: ignore[no-any-return]


def index_for(cluster: Cluster, mix: ShapeMix | MixView | None = None) -> ClusterFrag:
    """The cluster's FGD index (created on first use; ``mix`` replaces the mix if given)."""
    cf = cluster.frag
    if cf is None:
        cf = ClusterFrag(cluster, mix)
        cluster.frag = cf
    elif mix is not None:
        cf.mix = mix
    return cf


def cluster_fragmentation(cluster: Cluster, mix: ShapeMix | MixView | None = None) -> float:
    """Expected stranded GPU fraction of the cluster's free capacity under the mix (0..1)."""
    cf = index_for(cluster, mix)
    cf.sync()
    idx = cf.index
    if not cf.mix.typical():
        return 0.0
    w = idx.weights(cf.mix)
    free = idx.total[idx.ok].sum()
    if free <= 0:
        return 0.0
    return float(idx.frag(np.flatnonzero(idx.ok), w).sum() / free)


__all__ = ["Shape", "ShapeMix", "MixView", "FragIndex", "ClusterFrag", "active", "index_for",
           "cluster_fragmentation", "cpu_stranded", "cpu_per_milli", "BIG"]
