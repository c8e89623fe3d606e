"""The mix of request shapes that fragmentation-aware placement (fragmentation.py) scores
against: what a request's shape is to it (:class:`Shape`), a decayed histogram of the shapes
seen (:class:`ShapeMix`) or a view of the scheduler's own histogram (:class:`MixView`), and
the mix's CPU per GPU (:func:`cpu_per_milli`).

The most frequent shapes that make up ``threshold`` (95 %) of a mix are its "typical" ones,
as in the FGD paper's artifact. Nothing here reads files or the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .model import MILLI, SliceRequest


def cpu_per_milli(typical: Sequence[tuple[Shape, float]]) -> float:
    """ρ of a mix: CPU milli asked per GPU milli asked, over the shapes that ask for a GPU,
    weighted by how often each arrives (0 when none asks for CPU)."""
    cpu = sum(p * s.cpu_milli for s, p in typical if s.gpus > 0 and s.milli > 0)
    gpu = sum(p * s.milli * s.gpus for s, p in typical if s.gpus > 0 and s.milli > 0)
    return cpu / gpu if gpu > 0 else 0.0


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
