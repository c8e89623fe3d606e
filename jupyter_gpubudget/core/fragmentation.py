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

The mix is a decayed histogram of the shapes the scheduler has seen (:class:`ShapeMix`); the
most frequent shapes that make up ``threshold`` (95 %) of it are the "typical" ones used for F,
as in the paper's artifact. Nothing here reads files or the clock.

:class:`FragIndex` keeps per-node arrays (free milli per GPU, free CPU and host memory, and per
shape: how many GPUs could host it and how much free capacity is too small for it) so scoring
every node for a request is a few numpy operations over (nodes × shapes), not a Python loop.
It stays in step with a :class:`~jupyter_gpubudget.core.capacity.Cluster` through
:func:`index_for`, which learns which nodes changed from the cluster's allocation table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .model import MILLI, SliceRequest

if TYPE_CHECKING:  # pragma: no cover
    from .capacity import Cluster

BIG = np.int64(1) << 60  # "not tracked" CPU / memory


# ---------------------------------------------------------------------- the mix


@dataclass(frozen=True, slots=True)
class Shape:
    """What fragmentation cares about in a request: per-GPU milli, GPU count, host needs, model."""

    milli: int  # per GPU (1000 for whole GPUs, 0 for CPU-only)
    gpus: int
    cpu_milli: int = 0
    memory_mib: int = 0
    models: frozenset[str] | None = None

    @staticmethod
    def of(req: SliceRequest) -> Shape | None:
        """The shape of a request, or None for MIG requests (MIG has its own packing rule)."""
        models = frozenset(req.gpu_model.split("|")) if req.gpu_model else None
        if req.kind == "gpu":
            return Shape(MILLI if req.gpus > 0 else 0, max(req.gpus, 0), req.cpu_milli,
                         req.memory_mib, models)
        if req.kind == "mps":
            return Shape(req.milli, 1, req.cpu_milli, req.memory_mib, models)
        if req.kind == "cpu":
            return Shape(0, 0, req.cpu_milli, req.memory_mib, None)
        return None


class ShapeMix:
    """A decayed histogram of request shapes.

    ``decay`` is the weight an observation keeps after each later one (1.0: plain counts).
    :meth:`typical` gives the most frequent shapes covering ``threshold`` of the weight,
    renormalised, in a deterministic order.
    """

    def __init__(self, decay: float = 0.9995, threshold: float = 0.95,
                 max_shapes: int = 256) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError("decay must be in (0, 1]")
        self.decay = decay
        self.threshold = threshold
        self.max_shapes = max_shapes
        self.weights: dict[Shape, float] = {}
        self._inc = 1.0
        self.version = 0  # bumped on every change
        self._typical: tuple[int, list[tuple[Shape, float]]] | None = None

    def observe(self, req: SliceRequest | Shape, weight: float = 1.0) -> None:
        shape = req if isinstance(req, Shape) else Shape.of(req)
        if shape is None:
            return
        if self.decay < 1.0:
            self._inc /= self.decay
            if self._inc > 1e100:  # renormalise before overflow
                for k in self.weights:
                    self.weights[k] /= self._inc
                self._inc = 1.0
        self.weights[shape] = self.weights.get(shape, 0.0) + weight * self._inc
        if len(self.weights) > self.max_shapes:
            keep = sorted(self.weights.items(), key=lambda kv: (-kv[1], _shape_key(kv[0])))
            self.weights = dict(keep[: self.max_shapes // 2])
        self.version += 1

    def observe_all(self, reqs: Iterable[SliceRequest | Shape]) -> None:
        for r in reqs:
            self.observe(r)

    def __len__(self) -> int:
        return len(self.weights)

    def typical(self) -> list[tuple[Shape, float]]:
        if self._typical is not None and self._typical[0] == self.version:
            return self._typical[1]
        items = sorted(self.weights.items(), key=lambda kv: (-kv[1], _shape_key(kv[0])))
        total = sum(w for _, w in items)
        out: list[tuple[Shape, float]] = []
        if total > 0:
            cum = 0.0
            for s, w in items:
                out.append((s, w))
                cum += w
                if cum >= self.threshold * total - 1e-12:
                    break
            kept = sum(w for _, w in out)
            out = [(s, w / kept) for s, w in out]
        self._typical = (self.version, out)
        return out


def _shape_key(s: Shape) -> tuple[Any, ...]:
    return (s.milli, s.gpus, s.cpu_milli, s.memory_mib, sorted(s.models or ()))


# ---------------------------------------------------------------------- per-node arrays


class FragIndex:
    """Per-node free capacity plus per-shape counts, for vectorised FGD scoring.

    Pure data: nodes are numbered 0..N-1, GPUs 0..G-1 per node (missing GPUs and MIG GPUs are
    held at 0 free, so they never count). ``set_node`` updates one node; everything else is
    derived. Shapes are registered on first sight (a column per shape).
    """

    def __init__(self, gpus_per_node: Sequence[int], models: Sequence[str],
                 cpu_free: Sequence[int], mem_free: Sequence[int]) -> None:
        n = len(gpus_per_node)
        g = max(gpus_per_node, default=0) or 1
        self.n, self.g = n, g
        self.free = np.zeros((n, g), dtype=np.int64)
        for i, k in enumerate(gpus_per_node):
            self.free[i, :k] = MILLI
        self.cpu = np.asarray(cpu_free, dtype=np.int64).copy()
        self.mem = np.asarray(mem_free, dtype=np.int64).copy()
        self.total = self.free.sum(axis=1)
        self.models = list(models)
        self.model_names = sorted(set(self.models))
        mid = {m: i for i, m in enumerate(self.model_names)}
        self.model_id = np.array([mid[m] for m in self.models], dtype=np.int64)
        self.ok = np.ones(n, dtype=bool)  # healthy / usable
        self.frag_memory = False  # host memory is not part of F (as in the paper)
        # shape registry
        self.shapes: list[Shape] = []
        self.shape_col: dict[Shape, int] = {}
        self.s_milli = np.zeros(0, dtype=np.int64)
        self.s_gpus = np.zeros(0, dtype=np.int64)
        self.s_cpu = np.zeros(0, dtype=np.int64)
        self.s_mem = np.zeros(0, dtype=np.int64)
        self.access = np.zeros((n, 0), dtype=bool)  # node model allowed for shape
        self.cnt = np.zeros((n, 0), dtype=np.int64)  # GPUs with free >= shape milli
        self.small = np.zeros((n, 0), dtype=np.int64)  # free on GPUs with free < shape milli
        self._wver = -1
        self._w = np.zeros(0)

    # ---- shapes -----------------------------------------------------------
    def column(self, s: Shape) -> int:
        c = self.shape_col.get(s)
        if c is not None:
            return c
        c = len(self.shapes)
        self.shapes.append(s)
        self.shape_col[s] = c
        self.s_milli = np.append(self.s_milli, s.milli)
        self.s_gpus = np.append(self.s_gpus, s.gpus)
        self.s_cpu = np.append(self.s_cpu, s.cpu_milli)
        self.s_mem = np.append(self.s_mem, s.memory_mib)
        if s.models is None:
            acc = np.ones(self.n, dtype=bool)
        else:
            allowed = np.array([m in s.models for m in self.model_names], dtype=bool)
            acc = allowed[self.model_id] if len(allowed) else np.zeros(self.n, dtype=bool)
        self.access = np.concatenate([self.access, acc[:, None]], axis=1)
        ge = self.free >= s.milli if s.milli > 0 else np.zeros_like(self.free, dtype=bool)
        self.cnt = np.concatenate([self.cnt, ge.sum(axis=1)[:, None]], axis=1)
        self.small = np.concatenate(
            [self.small, np.where(ge, 0, self.free).sum(axis=1)[:, None]], axis=1)
        return c

    def weights(self, mix: ShapeMix) -> np.ndarray:
        """Weights per registered column for the mix's typical shapes (cached per version)."""
        if self._wver == mix.version and len(self._w) == len(self.shapes):
            return self._w
        typ = mix.typical()
        for s, _ in typ:
            self.column(s)
        w = np.zeros(len(self.shapes))
        for s, p in typ:
            w[self.shape_col[s]] = p
        self._w, self._wver = w, mix.version
        return w

    # ---- state ------------------------------------------------------------
    def set_node(self, i: int, free: Sequence[int], cpu: int, mem: int, ok: bool = True) -> None:
        row = self.free[i]
        row[:] = 0
        row[: len(free)] = free
        self.cpu[i] = cpu
        self.mem[i] = mem
        self.total[i] = row.sum()
        self.ok[i] = ok
        if self.shapes:
            m = self.s_milli
            ge = (row[:, None] >= m[None, :]) & (m[None, :] > 0)
            self.cnt[i] = ge.sum(axis=0)
            self.small[i] = np.where(ge, 0, row[:, None]).sum(axis=0)

    def frag(self, nodes: np.ndarray | None = None, w: np.ndarray | None = None) -> np.ndarray:
        """F per node (expected stranded milli under the weights ``w``)."""
        idx = np.arange(self.n) if nodes is None else nodes
        f = self._f(idx, self.cpu[idx], self.mem[idx], self.cnt[idx], self.small[idx],
                    self.total[idx])
        return f @ (w if w is not None else np.ones(len(self.shapes)) / max(1, len(self.shapes)))

    def _f(self, idx: np.ndarray, cpu: np.ndarray, mem: np.ndarray, cnt: np.ndarray,
           small: np.ndarray, total: np.ndarray) -> np.ndarray:
        fits = (self.access[idx]
                & (cpu[:, None] >= self.s_cpu[None, :])
                & (cnt >= self.s_gpus[None, :])
                & (self.s_gpus[None, :] > 0))
        if self.frag_memory:
            fits &= mem[:, None] >= self.s_mem[None, :]
        return np.where(fits, small, total[:, None])

    # ---- scoring ----------------------------------------------------------
    def score_whole(self, s: Shape, w: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """ΔF for taking ``s.gpus`` wholly free GPUs (and the host needs) on each candidate."""
        k = s.gpus
        cpu0, mem0 = self.cpu[cand], self.mem[cand]
        cnt0, small0, tot0 = self.cnt[cand], self.small[cand], self.total[cand]
        before = self._f(cand, cpu0, mem0, cnt0, small0, tot0) @ w
        # a wholly free GPU counts for every GPU shape (free 1000 >= any milli); taken, it is 0
        gpu_shape = (self.s_milli > 0)[None, :]
        after = self._f(cand, cpu0 - s.cpu_milli, mem0 - s.memory_mib,
                        cnt0 - k * gpu_shape, small0, tot0 - k * MILLI) @ w
        return after - before

    def score_share(self, s: Shape, w: np.ndarray, cand: np.ndarray, gpu: np.ndarray
                    ) -> np.ndarray:
        """ΔF for taking ``s.milli`` of GPU ``gpu[j]`` on node ``cand[j]`` (pairs)."""
        u = s.milli
        a = self.free[cand, gpu][:, None]  # free before, per pair
        b = a - u
        m = self.s_milli[None, :]
        pos = m > 0
        ge_a = (a >= m) & pos
        ge_b = (b >= m) & pos
        cnt0, small0, tot0 = self.cnt[cand], self.small[cand], self.total[cand]
        cpu0, mem0 = self.cpu[cand], self.mem[cand]
        before = self._f(cand, cpu0, mem0, cnt0, small0, tot0) @ w
        cnt1 = cnt0 - ge_a + ge_b
        small1 = small0 - np.where(ge_a, 0, a) + np.where(ge_b, 0, b)
        after = self._f(cand, cpu0 - s.cpu_milli, mem0 - s.memory_mib, cnt1, small1,
                        tot0 - u) @ w
        return after - before

    def candidates_whole(self, s: Shape) -> np.ndarray:
        col = self.column(s)
        ok = (self.ok & self.access[:, col] & (self.cpu >= s.cpu_milli)
              & (self.mem >= s.memory_mib) & ((self.free == MILLI).sum(axis=1) >= s.gpus))
        return np.flatnonzero(ok)

    def candidates_share(self, s: Shape) -> tuple[np.ndarray, np.ndarray]:
        col = self.column(s)
        node_ok = (self.ok & self.access[:, col] & (self.cpu >= s.cpu_milli)
                   & (self.mem >= s.memory_mib))
        pairs = (self.free >= s.milli) & node_ok[:, None]
        n, g = np.nonzero(pairs)
        return n, g

    def best_share(self, s: Shape, mix: ShapeMix, dedupe: bool = True
                   ) -> list[tuple[int, int]]:
        """Candidate (node, gpu) pairs for a share of one GPU, best (least ΔF) first."""
        n, g = self.candidates_share(s)
        if len(n) == 0:
            return []
        if dedupe:  # equal free on one node gives equal ΔF: keep the first GPU of each value
            key = n * (MILLI + 1) + self.free[n, g]
            _, first = np.unique(key, return_index=True)
            first.sort()
            n, g = n[first], g[first]
        w = self.weights(mix)
        d = self.score_share(s, w, n, g)
        # ties: the tighter GPU, then the node with less free CPU, then lower index
        order = np.lexsort((g, n, self.cpu[n], self.free[n, g], np.round(d, 6)))
        return list(zip(n[order].tolist(), g[order].tolist(), strict=True))

    def best_whole(self, s: Shape, mix: ShapeMix) -> list[int]:
        """Candidate nodes for ``s.gpus`` whole GPUs on one node, best (least ΔF) first."""
        cand = self.candidates_whole(s)
        if len(cand) == 0:
            return []
        w = self.weights(mix)
        d = self.score_whole(s, w, cand)
        nfree = (self.free[cand] == MILLI).sum(axis=1)
        order = np.lexsort((cand, self.cpu[cand], nfree, np.round(d, 6)))
        return cand[order].tolist()


# ---------------------------------------------------------------------- cluster adapter


class _TrackedAllocations(dict):  # type: ignore[type-arg]
    """The cluster's allocation table, noting which nodes each change touches."""

    __slots__ = ("touched",)

    def __init__(self, base: dict[str, Any], touched: set[str]) -> None:
        super().__init__(base)
        self.touched = touched

    def __setitem__(self, key: str, placement: Any) -> None:
        self.touched.update(placement.nodes)
        super().__setitem__(key, placement)

    def pop(self, key: str, *default: Any) -> Any:
        p = super().pop(key, *default)
        if p is not None:
            self.touched.update(p.nodes)
        return p

    def __delitem__(self, key: str) -> None:
        self.touched.update(self[key].nodes)
        super().__delitem__(key)


class ClusterFrag:
    """A :class:`FragIndex` kept in step with a live cluster, plus the mix it scores against."""

    def __init__(self, cluster: Cluster, mix: ShapeMix | None = None) -> None:
        self.cluster = cluster
        self.mix = mix if mix is not None else ShapeMix()
        nodes = cluster.nodes
        self.index = FragIndex([len(n.gpus) for n in nodes],
                               [n.gpus[0].model if n.gpus else "" for n in nodes],
                               [0] * len(nodes), [0] * len(nodes))
        self.touched: set[str] = set()
        cluster.allocations = _TrackedAllocations(cluster.allocations, self.touched)
        self._health = [n.healthy for n in nodes]
        for i in range(len(nodes)):
            self._refresh(i)

    def _refresh(self, i: int) -> None:
        n = self.cluster.nodes[i]
        free = [0 if g.mig or g.whole else MILLI - g.used_milli for g in n.gpus]
        cpu = int(BIG) if not n.cpu_total else n.cpu_total - n.cpu_used
        mem = int(BIG) if not n.mem_total else n.mem_total - n.mem_used
        self.index.set_node(i, free, cpu, mem, n.healthy)
        self._health[i] = n.healthy

    def sync(self) -> None:
        if self.touched:
            by_name = self.cluster.by_name
            for name in sorted(self.touched):
                self._refresh(by_name[name].idx)
            self.touched.clear()
        for i, n in enumerate(self.cluster.nodes):  # health flips are rare; cheap check
            if n.healthy != self._health[i]:
                self._refresh(i)

    def observe(self, req: SliceRequest) -> None:
        self.mix.observe(req)


def index_for(cluster: Cluster, mix: ShapeMix | None = None) -> ClusterFrag:
    """The cluster's FGD index (created on first use; ``mix`` replaces the mix if given)."""
    cf = cluster.__dict__.get("_frag")
    if cf is None:
        cf = ClusterFrag(cluster, mix)
        cluster.__dict__["_frag"] = cf
    elif mix is not None:
        cf.mix = mix
    return cf


def cluster_fragmentation(cluster: Cluster, mix: ShapeMix | None = None) -> float:
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


__all__ = ["Shape", "ShapeMix", "FragIndex", "ClusterFrag", "index_for",
           "cluster_fragmentation"]
