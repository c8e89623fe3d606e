"""The per-node arrays behind fragmentation-aware placement (fragmentation.py): free
capacity per node and GPU, and per shape of the mix how many GPUs could host it and how much
free capacity is too small for it, so that scoring every node for a request is a few numpy
operations over (nodes × shapes), not a Python loop (:class:`FragIndex`); and the
host-stranding term (:func:`cpu_stranded`). Pure data: nothing here knows the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .fragmix import MixView, Shape, ShapeMix, cpu_per_milli
from .model import MILLI

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
