"""Placement reproduction on Alibaba's openb trace, as in the FGD paper (Weng et al., ATC'23).

Setting (see ../shared/traces/README.md): the GPU nodes of the node list; pods sampled with
replacement (seeded) until their total GPU request reaches ``ratio`` (130 %) of the cluster's
GPU capacity; placed one at a time, nothing ever departs; a pod that fits nowhere is dropped.
The metric is the *allocation ratio*: GPU capacity (milli) allocated / total capacity, read at
the end (130 % arrived) and along the way.

Policies:
- ``bestfit``: the artifact's BestFit baseline, standalone: the node minimising
  ½·(free CPU − request)/128 cores + ½·(free GPU − request)/8 GPUs; a share goes to the fullest
  GPU that fits it.
- ``default``: the project's own scheduler: every pod goes through ``Scheduler.submit`` with its
  default placement policy (FGD, :mod:`jupyter_gpubudget.core.fragmentation`).
- ``fgd-index``: the same FGD scoring run directly on a :class:`FragIndex` (no scheduler), as a
  cross-check of the core path and a fast figure.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.fragmentation import FragIndex, Shape, ShapeMix
from ..core.inventory import Inventory, make_node
from ..core.model import MILLI
from .traces import OpenbNode, OpenbPod

MAX_SPEC_CPU = 128000.0
MAX_SPEC_GPU = 8000.0
CHECKPOINTS = (0.5, 0.7, 0.9, 1.0, 1.1, 1.2, 1.3)


def sample_pods(pods: Sequence[OpenbPod], capacity_milli: int, ratio: float = 1.3,
                seed: int = 0) -> list[OpenbPod]:
    """Shuffle, then draw with replacement until the GPU request reaches ``ratio`` × capacity
    (the last pod crosses the line). Deterministic for a seed."""
    if not pods:
        return []
    rng = random.Random(seed)
    pool = list(pods)
    rng.shuffle(pool)
    target = ratio * capacity_milli
    out: list[OpenbPod] = []
    total = 0
    if not any(p.gpu_request_milli for p in pool):
        raise ValueError("no pod requests a GPU")
    while total < target:
        p = pool[rng.randrange(len(pool))]
        out.append(p)
        total += p.gpu_request_milli
    return out


@dataclass(slots=True)
class PlacementRun:
    policy: str
    seed: int
    capacity_milli: int
    arrived_milli: int = 0
    allocated_milli: int = 0
    placed: int = 0
    failed: int = 0
    curve: dict[float, float] = field(default_factory=dict)  # arrived ratio -> alloc %

    @property
    def alloc_pct(self) -> float:
        return 100.0 * self.allocated_milli / self.capacity_milli

    def to_dict(self) -> dict[str, object]:
        return {"policy": self.policy, "seed": self.seed, "alloc_pct": round(self.alloc_pct, 3),
                "arrived_pct": round(100.0 * self.arrived_milli / self.capacity_milli, 3),
                "placed": self.placed, "failed": self.failed,
                "curve": {f"{int(round(k * 100))}": round(v, 3) for k, v in self.curve.items()}}


def _record(run: PlacementRun, req: int, ok: bool, marks: list[float]) -> None:
    run.arrived_milli += req
    if ok:
        run.placed += 1
        run.allocated_milli += req
    else:
        run.failed += 1
    while marks and run.arrived_milli >= marks[0] * run.capacity_milli:
        run.curve[marks.pop(0)] = run.alloc_pct


# ---------------------------------------------------------------------- array state


class _Arrays:
    def __init__(self, nodes: Sequence[OpenbNode]) -> None:
        g = max(n.gpus for n in nodes)
        self.free = np.zeros((len(nodes), g), dtype=np.int64)
        for i, n in enumerate(nodes):
            self.free[i, : n.gpus] = MILLI
        self.cpu = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.model = np.array([n.model for n in nodes])


def _model_ok(arr: _Arrays, spec: str) -> np.ndarray | bool:
    if not spec:
        return True
    return np.isin(arr.model, spec.split("|"))


def run_bestfit(nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod], seed: int = 0,
                marks: Sequence[float] = CHECKPOINTS) -> PlacementRun:
    arr = _Arrays(nodes)
    cap = int(arr.free.sum())
    run = PlacementRun("bestfit", seed, cap)
    todo = sorted(marks)
    for p in pods:
        ok = _bestfit_one(arr, p)
        _record(run, p.gpu_request_milli, ok, todo)
    return run


def _bestfit_one(arr: _Arrays, p: OpenbPod) -> bool:
    feas = (arr.cpu >= p.cpu_milli) & (arr.mem >= p.memory_mib) & _model_ok(arr, p.gpu_spec)
    share = 0 < p.gpu_milli < MILLI
    if p.num_gpu > 0:
        if share:
            feas &= (arr.free >= p.gpu_milli).any(axis=1)
        else:
            feas &= (arr.free == MILLI).sum(axis=1) >= p.num_gpu
    cand = np.flatnonzero(feas)
    if len(cand) == 0:
        return False
    score = (0.5 * (arr.cpu[cand] - p.cpu_milli) / MAX_SPEC_CPU
             + 0.5 * (arr.free[cand].sum(axis=1) - p.gpu_request_milli) / MAX_SPEC_GPU)
    i = int(cand[int(np.argmin(score))])
    arr.cpu[i] -= p.cpu_milli
    arr.mem[i] -= p.memory_mib
    if p.num_gpu > 0:
        row = arr.free[i]
        if share:
            fits = np.flatnonzero(row >= p.gpu_milli)
            g = int(fits[np.argmin(row[fits])])
            row[g] -= p.gpu_milli
        else:
            whole = np.flatnonzero(row == MILLI)[: p.num_gpu]
            row[whole] = 0
    return True


# ---------------------------------------------------------------------- FGD on arrays


def workload_mix(pods: Sequence[OpenbPod]) -> ShapeMix:
    """The mix the FGD paper scores against: the shapes of the workload, plain counts."""
    mix = ShapeMix(decay=1.0)
    for p in pods:
        s = Shape.of(p.request())
        if s is not None:
            mix.observe(s)
    return mix


def run_fgd_index(nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod], seed: int = 0,
                  mix: ShapeMix | None = None, marks: Sequence[float] = CHECKPOINTS
                  ) -> PlacementRun:
    idx = FragIndex([n.gpus for n in nodes], [n.model for n in nodes],
                    [n.cpu_milli for n in nodes], [n.memory_mib for n in nodes])
    mix = mix if mix is not None else workload_mix(pods)
    cap = int(idx.free.sum())
    run = PlacementRun("fgd-index", seed, cap)
    todo = sorted(marks)
    for p in pods:
        s = Shape.of(p.request())
        assert s is not None
        ok = False
        if s.gpus == 0:
            bestn = idx.best_whole(s, mix)
            if bestn:
                i = bestn[0]
                idx.set_node(i, idx.free[i].tolist(), int(idx.cpu[i] - s.cpu_milli),
                             int(idx.mem[i] - s.memory_mib))
                ok = True
        elif s.milli < MILLI:
            best = idx.best_share(s, mix)
            if best:
                i, g = best[0]
                row = idx.free[i].copy()
                row[g] -= s.milli
                idx.set_node(i, row.tolist(), int(idx.cpu[i] - s.cpu_milli),
                             int(idx.mem[i] - s.memory_mib))
                ok = True
        else:
            bestn = idx.best_whole(s, mix)
            if bestn:
                i = bestn[0]
                row = idx.free[i].copy()
                row[np.flatnonzero(row == MILLI)[: s.gpus]] = 0
                idx.set_node(i, row.tolist(), int(idx.cpu[i] - s.cpu_milli),
                             int(idx.mem[i] - s.memory_mib))
                ok = True
        _record(run, p.gpu_request_milli, ok, todo)
    return run


# ---------------------------------------------------------------------- the project's scheduler


def openb_inventory(nodes: Sequence[OpenbNode]) -> Inventory:
    return Inventory(tuple(make_node(n.name, n.model, n.gpus, cpu_milli=n.cpu_milli,
                                     memory_mib=n.memory_mib) for n in nodes), "declared")


def run_default(nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod], seed: int = 0,
                mix: ShapeMix | None = None, marks: Sequence[float] = CHECKPOINTS,
                placement: str = "fgd") -> PlacementRun:
    """Every pod through the project's scheduler (``Scheduler.submit``) on an inventory built
    from the node list. One project with an ample grant; nothing departs.

    With ``placement="fgd"`` the scheduler's cluster carries an FGD index whose mix is the
    scheduler's own histogram of submitted shapes (what it has seen so far), unless ``mix`` is
    given (e.g. :func:`workload_mix`, the whole workload's shapes as in the paper)."""
    from dataclasses import replace

    from ..core.accounts import load_budgets
    from ..core.fragmentation import MixView, index_for
    from ..core.model import Policy, Workload
    from ..core.scheduler import Scheduler

    budgets = load_budgets("accounts:\n  openb: {grant: 1000000000}\n", "<openb>")
    policy = Policy()
    if "placement" in Policy.__dataclass_fields__:
        policy = replace(policy, placement=placement)  # type: ignore[call-arg]
    sched = Scheduler(budgets.accounts, openb_inventory(nodes), policy)
    if placement == "fgd":
        seen = getattr(sched, "mix", None)
        index_for(sched.cluster, mix if mix is not None else
                  MixView(seen) if isinstance(seen, dict) else None)
    run = PlacementRun("default" if placement == "fgd" else placement, seed,
                       sched.cluster.total_milli)
    todo = sorted(marks)
    for k, p in enumerate(pods):
        w = Workload(f"p{k}", "openb", "openb", p.request(), float(k), kind="batch")
        decisions = sched.submit(w, float(k))
        ok = any(getattr(d, "workload", None) == w.id and type(d).__name__ == "Start"
                 for d in decisions)
        if not ok:
            sched.cancel(w.id, float(k))
        _record(run, p.gpu_request_milli, ok, todo)
    return run


POLICIES: dict[str, Callable[..., PlacementRun]] = {
    "bestfit": run_bestfit, "default": run_default, "fgd-index": run_fgd_index}


def reproduce(nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod], seeds: Sequence[int],
              policies: Sequence[str] = ("bestfit", "default"), ratio: float = 1.3,
              progress: Callable[[str, int], None] | None = None) -> dict[str, list[PlacementRun]]:
    cap = MILLI * sum(n.gpus for n in nodes)
    out: dict[str, list[PlacementRun]] = {p: [] for p in policies}
    for seed in seeds:
        sample = sample_pods(pods, cap, ratio, seed)
        for pol in policies:
            out[pol].append(POLICIES[pol](nodes, sample, seed))
            if progress:
                progress(pol, seed)
    return out


def summarise(runs: dict[str, list[PlacementRun]]) -> dict[str, dict[str, float]]:
    out = {}
    for pol, rs in runs.items():
        vals = np.array([r.alloc_pct for r in rs])
        out[pol] = {"mean": float(vals.mean()), "std": float(vals.std(ddof=1)) if len(vals) > 1
                    else 0.0, "n": len(vals)}
    return out
