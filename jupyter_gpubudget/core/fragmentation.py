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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .model import MILLI, SliceRequest

if TYPE_CHECKING:  # pragma: no cover
    from .capacity import Cluster

BIG = np.int64(1) << 60  # "not tracked" CPU / memory
_HASH = np.random.default_rng(20230710).integers(1, 2**63, size=64, dtype=np.uint64) | 1
FIT_WEIGHT = 0.05
# Weight of the host-stranding term (see the module docstring). Chosen on openb seeds 10-12
# (default, gpushare40, gpushare80; 0.1, 0.3, 0.5 and 1.0 tried, all within 0.1 point of each
# other, 0 is 0.5-0.7 points worse); figures are reported on seeds 0-9 (bench/openb.py).
STRAND_WEIGHT = 0.3


def cpu_stranded(gpu_free: np.ndarray, cpu_free: np.ndarray, cpu_per_milli: float
                 ) -> np.ndarray:
    """GPU milli a node cannot hand out because its free CPU runs out first, when the work
    that arrives asks ``cpu_per_milli`` CPU milli per GPU milli: ``max(0, gpu − cpu / ρ)``.
    Zero for nodes that do not track CPU (free CPU ``BIG``) and when ρ is 0."""
    if cpu_per_milli <= 0:
        return np.zeros(np.shape(gpu_free))
    usable = np.asarray(cpu_free, dtype=float) / cpu_per_milli
    return np.maximum(0.0, np.asarray(gpu_free, dtype=float) - usable)


def cpu_per_milli(typical: Sequence[tuple[Shape, float]]) -> float:
    """ρ of a mix: CPU milli asked per GPU milli asked, over the shapes that ask for a GPU,
    weighted by how often each arrives (0 when none asks for CPU)."""
    cpu = sum(p * s.cpu_milli for s, p in typical if s.gpus > 0 and s.milli > 0)
    gpu = sum(p * s.milli * s.gpus for s, p in typical if s.gpus > 0 and s.milli > 0)
    return cpu / gpu if gpu > 0 else 0.0


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


class MixView:
    """A :class:`ShapeMix`-like view of a plain ``{SliceRequest.shape: weight}`` mapping (the
    scheduler's histogram of submitted shapes). Re-derived when its size or total changes."""

    def __init__(self, counts: dict[tuple[object, ...], float], threshold: float = 0.95) -> None:
        self.counts = counts
        self.threshold = threshold
        self._sig: tuple[int, float] | None = None
        self._calls = 0
        self._ver = 0
        self._typical: list[tuple[Shape, float]] = []

    def _refresh(self) -> None:
        self._calls += 1
        if self._sig is not None and self._calls % 64 and len(self.counts) == self._sig[0]:
            return  # summing the histogram on every placement is wasted work
        n, total = len(self.counts), sum(self.counts.values())
        if self._sig is not None and n == self._sig[0] and total <= self._sig[1] * 1.01:
            return  # the mix moves slowly: re-derive when a new shape appears or 1 % more came
        self._sig = (n, total)
        self._ver += 1
        mix = ShapeMix(decay=1.0, threshold=self.threshold)
        for key, w in self.counts.items():
            if w > 0:
                shape = Shape.of(SliceRequest(*key))  # type: ignore[arg-type]
                if shape is not None:
                    mix.observe(shape, w)
        self._typical = mix.typical()

    @property
    def version(self) -> int:
        self._refresh()
        return self._ver

    def typical(self) -> list[tuple[Shape, float]]:
        self._refresh()
        return self._typical


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
        tracked = self.cpu[self.cpu < BIG]
        self.cpu_scale = float(tracked.max()) if len(tracked) and tracked.max() > 0 else 1.0
        self.mem = np.asarray(mem_free, dtype=np.int64).copy()
        self.total = self.free.sum(axis=1)
        self.models = list(models)
        self.model_names = sorted(set(self.models))
        mid = {m: i for i, m in enumerate(self.model_names)}
        self.model_id = np.array([mid[m] for m in self.models], dtype=np.int64)
        self.ok = np.ones(n, dtype=bool)  # healthy / usable
        self.frag_memory = False  # host memory is not part of F (as in the paper)
        # Weight of best fit next to ΔF, in GPUs: a node's fit score (0 = full, 1 = empty)
        # counts like fit_weight × that many GPUs of stranded capacity. Pure FGD leaves many
        # exact ties (ΔF = 0); packing among them keeps larger holes open. 0.05 measured best
        # on openb (4 seeds, 0.02-0.2 tried; bench/openb.py --policies fgd-index).
        self.fit_weight = FIT_WEIGHT
        self.strand_weight = STRAND_WEIGHT
        self.rho = 0.0  # the mix's CPU milli per GPU milli (set with the weights)
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
        self._cols_for: np.ndarray | None = None
        self._cols_cache = np.zeros(0, dtype=np.int64)
        self._fcur = np.full(n, np.nan)  # F of each node's current state under _fcur_w
        self._fcur_w: np.ndarray | None = None

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

    def weights(self, mix: ShapeMix | MixView) -> np.ndarray:
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
        self.rho = cpu_per_milli(typ)
        return w

    def strand_delta(self, nodes: np.ndarray, cpu: int, milli: int) -> np.ndarray:
        """Change of :func:`cpu_stranded` on each node when ``cpu`` CPU milli and ``milli`` GPU
        milli are taken from it (weights must have been set: ρ comes with them)."""
        if self.rho <= 0 or self.strand_weight == 0:
            return np.zeros(len(nodes))
        c0 = self.cpu[nodes].astype(float)
        g0 = self.total[nodes].astype(float)
        return (cpu_stranded(g0 - milli, c0 - cpu, self.rho)
                - cpu_stranded(g0, c0, self.rho))

    # ---- state ------------------------------------------------------------
    def recompute(self) -> None:
        """Derive totals and per-shape counts for every node from ``free`` (bulk loads)."""
        self.total = self.free.sum(axis=1)
        self._fcur[:] = np.nan
        if self.shapes:
            m = self.s_milli[None, None, :]
            ge = (self.free[:, :, None] >= m) & (m > 0)
            self.cnt = ge.sum(axis=1)
            self.small = np.where(ge, 0, self.free[:, :, None]).sum(axis=1)

    def set_rows(self, rows: np.ndarray, free: np.ndarray) -> None:
        """New free milli for some nodes (CPU, memory and health set by the caller)."""
        self.free[rows] = free
        self.total[rows] = free.sum(axis=1)
        self._fcur[rows] = np.nan
        if self.shapes:
            m = self.s_milli[None, None, :]
            ge = (free[:, :, None] >= m) & (m > 0)
            self.cnt[rows] = ge.sum(axis=1)
            self.small[rows] = np.where(ge, 0, free[:, :, None]).sum(axis=1)

    def set_node(self, i: int, free: Sequence[int], cpu: int, mem: int, ok: bool = True) -> None:
        row = self.free[i]
        row[:] = 0
        row[: len(free)] = free
        self.cpu[i] = cpu
        self.mem[i] = mem
        self.total[i] = row.sum()
        self.ok[i] = ok
        self._fcur[i] = np.nan
        if self.shapes:
            m = self.s_milli
            ge = (row[:, None] >= m[None, :]) & (m[None, :] > 0)
            self.cnt[i] = ge.sum(axis=0)
            self.small[i] = np.where(ge, 0, row[:, None]).sum(axis=0)

    def frag(self, nodes: np.ndarray | None = None, w: np.ndarray | None = None) -> np.ndarray:
        """F per node (expected stranded milli under the weights ``w``)."""
        idx = np.arange(self.n) if nodes is None else nodes
        if w is None:
            w = np.ones(len(self.shapes)) / max(1, len(self.shapes))
        cols = self._cols(w)
        ix = np.ix_(idx, cols)
        f = self._f(ix, cols, self.cpu[idx], self.mem[idx], self.cnt[ix], self.small[ix],
                    self.total[idx])
        return f @ w[cols]

    def _before(self, cand: np.ndarray, w: np.ndarray) -> np.ndarray:
        """F of the candidates' current states (cached per node until it changes)."""
        if self._fcur_w is not w:
            self._fcur[:] = np.nan
            self._fcur_w = w
        cur = self._fcur[cand]
        miss = np.isnan(cur)
        if miss.any():
            todo = cand[miss]
            cur[miss] = self.frag(todo, w)
            self._fcur[todo] = cur[miss]
        return cur

    def _cols(self, w: np.ndarray) -> np.ndarray:
        """Columns with weight: only the typical shapes take part in F."""
        if self._cols_for is not w:
            self._cols_cache = np.flatnonzero(w > 0)
            self._cols_for = w
        return self._cols_cache

    def _f(self, ix: Any, cols: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
           cnt: np.ndarray, small: np.ndarray, total: np.ndarray) -> np.ndarray:
        """f per (node, shape column): stranded free milli if that shape arrived next."""
        gpus = self.s_gpus[cols][None, :]
        fits = (self.access[ix] & (cpu[:, None] >= self.s_cpu[cols][None, :])
                & (cnt >= gpus) & (gpus > 0))
        if self.frag_memory:
            fits &= mem[:, None] >= self.s_mem[cols][None, :]
        return np.where(fits, small, total[:, None])

    # ---- scoring ----------------------------------------------------------
    def score_whole(self, s: Shape, w: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """ΔF for taking ``s.gpus`` wholly free GPUs (and the host needs) on each candidate."""
        k = s.gpus
        cols = self._cols(w)
        wc = w[cols]
        ix = np.ix_(cand, cols)
        cpu0, mem0 = self.cpu[cand], self.mem[cand]
        cnt0, small0, tot0 = self.cnt[ix], self.small[ix], self.total[cand]
        before = self._before(cand, w)
        # a wholly free GPU counts for every GPU shape (free 1000 >= any milli); taken, it is 0
        gpu_shape = (self.s_milli[cols] > 0)[None, :]
        after = self._f(ix, cols, cpu0 - s.cpu_milli, mem0 - s.memory_mib,
                        cnt0 - k * gpu_shape, small0, tot0 - k * MILLI) @ wc
        return after - before

    def score_share(self, s: Shape, w: np.ndarray, cand: np.ndarray, gpu: np.ndarray
                    ) -> np.ndarray:
        """ΔF for taking ``s.milli`` of GPU ``gpu[j]`` on node ``cand[j]`` (pairs)."""
        u = s.milli
        cols = self._cols(w)
        wc = w[cols]
        ix = np.ix_(cand, cols)
        a = self.free[cand, gpu][:, None]  # free before, per pair
        b = a - u
        m = self.s_milli[cols][None, :]
        pos = m > 0
        ge_a = (a >= m) & pos
        ge_b = (b >= m) & pos
        cnt0, small0, tot0 = self.cnt[ix], self.small[ix], self.total[cand]
        cpu0, mem0 = self.cpu[cand], self.mem[cand]
        before = self._before(cand, w)
        cnt1 = cnt0 - ge_a + ge_b
        small1 = small0 - np.where(ge_a, 0, a) + np.where(ge_b, 0, b)
        after = self._f(ix, cols, cpu0 - s.cpu_milli, mem0 - s.memory_mib, cnt1, small1,
                        tot0 - u) @ wc
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

    def representatives(self, nodes: np.ndarray) -> np.ndarray:
        """The first node of each group of identical nodes (same free milli per GPU in any
        order, free CPU and memory, model): they score alike, so one stands for all."""
        if len(nodes) < 2 or self.g + 3 > len(_HASH):
            return nodes
        f = np.sort(self.free[nodes], axis=1)
        key = np.concatenate([f, self.cpu[nodes, None], self.mem[nodes, None],
                              self.model_id[nodes, None]], axis=1).astype(np.uint64)
        h = (key * _HASH[: key.shape[1]][None, :]).sum(axis=1, dtype=np.uint64)
        _, first = np.unique(h, return_index=True)
        return nodes[np.sort(first)]

    def best_share(self, s: Shape, mix: ShapeMix | MixView, dedupe: bool = True
                   ) -> Sequence[tuple[int, int]]:
        """Candidate (node, gpu) pairs for a share of one GPU, best (least ΔF) first. With
        ``dedupe``, one GPU per distinct free amount on a node and one node per group of
        identical nodes (callers fall back to packing if none of these can take it)."""
        n, g = self.candidates_share(s)
        if len(n) == 0:
            return []
        if dedupe:  # n comes sorted from nonzero(): its distinct values without a sort
            nodes = n[np.concatenate(([True], n[1:] != n[:-1]))]
            keep = np.zeros(self.n, dtype=bool)
            keep[self.representatives(nodes)] = True
            sel = keep[n]
            n, g = n[sel], g[sel]
        if dedupe:  # equal free on one node gives equal ΔF: keep the first GPU of each value
            key = n * (MILLI + 1) + self.free[n, g]
            _, first = np.unique(key, return_index=True)
            first.sort()
            n, g = n[first], g[first]
        w = self.weights(mix)
        d = self.score_share(s, w, n, g) + self.strand_weight * self.strand_delta(
            n, s.cpu_milli, s.milli)
        # ΔF plus a little best fit (see fit_weight); ties: the fullest GPU that fits
        key = np.round(d + self.fit_weight * MILLI * self.fit_score(n), 6)
        order = np.lexsort((g, n, self.free[n, g], key))
        return _Pairs(n[order], g[order])

    def best_whole(self, s: Shape, mix: ShapeMix | MixView, dedupe: bool = True
                   ) -> Sequence[int]:
        """Candidate nodes for ``s.gpus`` whole GPUs on one node, best (least ΔF) first (with
        ``dedupe``: one node per group of identical nodes)."""
        cand = self.candidates_whole(s)
        if len(cand) == 0:
            return []
        if dedupe:
            cand = self.representatives(cand)
        w = self.weights(mix)
        d = self.score_whole(s, w, cand) + self.strand_weight * self.strand_delta(
            cand, s.cpu_milli, s.gpus * MILLI)
        key = np.round(d + self.fit_weight * MILLI * self.fit_score(cand), 6)
        order = np.lexsort((cand, key))
        return _Ints(cand[order])

    def fit_score(self, nodes: np.ndarray) -> np.ndarray:
        """Best-fit tie-breaker: free CPU and free GPU, each relative to the largest node
        (lower = fuller). Nodes that do not track CPU count as having the most."""
        cpu = np.minimum(self.cpu[nodes], self.cpu_scale) / self.cpu_scale
        return 0.5 * cpu + 0.5 * self.total[nodes] / (MILLI * self.g)


class _Pairs(Sequence[tuple[int, int]]):
    """(node, GPU) candidates, best first, converted one at a time (callers mostly take the
    first)."""

    __slots__ = ("n", "g")

    def __init__(self, n: np.ndarray, g: np.ndarray) -> None:
        self.n, self.g = n, g

    def __len__(self) -> int:
        return len(self.n)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return list(zip(self.n[k].tolist(), self.g[k].tolist(), strict=True))
        return int(self.n[k]), int(self.g[k])

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for k in range(len(self.n)):
            yield int(self.n[k]), int(self.g[k])


class _Ints(Sequence[int]):
    __slots__ = ("a",)

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __len__(self) -> int:
        return len(self.a)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return self.a[k].tolist()
        return int(self.a[k])

    def __iter__(self) -> Iterator[int]:
        for k in range(len(self.a)):
            yield int(self.a[k])

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented


# ---------------------------------------------------------------------- cluster adapter


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
           "cluster_fragmentation", "cpu_stranded", "cpu_per_milli"]
