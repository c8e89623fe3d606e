"""A seeded synthetic workload, so the simulator and the demo need no external data.

Three kinds, each charged to a project drawn in proportion to its grant:
- **interactive** notebook sessions: every user works in sessions (lognormal length, median
  ~1.5 h) separated by think-time gaps (exponential, mean ~4 h, longer at night); a session asks
  for a whole GPU, a MIG slice or an MPS share; protected for its first 30-60 min; preempted
  sessions are snapshotted and restored.
- **debug** jobs: short (minutes), one GPU or a share, arriving at random (Poisson).
- **batch** training: gangs of 1-64 whole GPUs running hours to days, resumable (checkpoints).

Batch run times are scaled so the total demand is ``load`` × the cluster's GPU-hours over the
span. Same arguments and seed → the same trace, on any machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.inventory import Inventory, make_node
from ..core.model import DAY, HOUR, SliceRequest, gpu_fraction
from .traces import Trace, TraceJob

MIG_PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")  # H100-80GB


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    workloads: int = 2000
    days: float = 7.0
    gpus: int = 64  # cluster size (whole GPUs), 8 per node
    load: float = 0.85  # offered GPU-hours / capacity over the span
    interactive_share: float = 0.45  # of workload count
    debug_share: float = 0.35
    mig_node_share: float = 0.125  # fraction of nodes with all GPUs in MIG mode
    seed: int = 0


def synthetic_inventory(gpus: int = 64, mig_node_share: float = 0.125,
                        model: str = "H100-80GB") -> Inventory:
    """``gpus`` H100s, 8 per node, a share of the nodes MIG-partitioned; 4 nodes per rack."""
    nodes_n, mig_n = _node_counts(gpus, mig_node_share)
    nodes = []
    for i in range(nodes_n):
        count = min(8, gpus - 8 * i)
        mig = tuple(range(count)) if i >= nodes_n - mig_n else ()
        nodes.append(make_node(f"n{i:04d}", model, count, mig=mig, rack=f"r{i // 4:03d}",
                               cpu_milli=128000, memory_mib=1024 * 1024))
    return Inventory(tuple(nodes), "declared")


def _node_counts(gpus: int, mig_node_share: float) -> tuple[int, int]:
    nodes_n = max(1, (gpus + 7) // 8)
    mig_n = int(round(nodes_n * mig_node_share)) if nodes_n > 1 else 0
    return nodes_n, mig_n


def generate(spec: SyntheticSpec, projects: Sequence[str] = ("physics", "biology", "ml"),
             weights: Sequence[float] | None = None) -> Trace:
    rng = np.random.default_rng(spec.seed)
    span = spec.days * DAY
    n = spec.workloads
    n_int = int(n * spec.interactive_share)
    n_dbg = int(n * spec.debug_share)
    n_bat = max(0, n - n_int - n_dbg)
    projects = list(projects)
    w = np.array(weights if weights is not None else [1.0] * len(projects), dtype=float)
    if w.sum() <= 0:
        w = np.ones(len(projects))
    w = w / w.sum()
    mig_ok = _node_counts(spec.gpus, spec.mig_node_share)[1] > 0
    jobs: list[TraceJob] = []

    # ---- interactive sessions: users with session / think-time chains
    users_n = max(1, n_int // max(1, int(span / (6 * HOUR))))
    user_project = rng.choice(len(projects), size=users_n, p=w)
    per_user = np.full(users_n, n_int // users_n)
    per_user[: n_int - per_user.sum()] += 1
    for u in range(users_n):
        t = float(rng.uniform(0, 8 * HOUR))
        proj = projects[int(user_project[u])]
        for k in range(int(per_user[u])):
            length = float(np.clip(rng.lognormal(np.log(1.5 * HOUR), 0.8), 5 * 60, 12 * HOUR))
            gap = float(rng.exponential(4 * HOUR))
            if t >= span:
                t = float(rng.uniform(0, span))  # wrap rather than run past the span
            r = rng.random()
            if r < 0.45:
                req = SliceRequest.whole(1)
            elif r < 0.75 and mig_ok:
                req = SliceRequest.mig(str(rng.choice(MIG_PROFILES, p=[0.5, 0.3, 0.2])),
                                       gpu_model="H100-80GB")
            else:
                req = SliceRequest.mps(int(rng.choice([250, 500])), 20000)
            min_rt = float(rng.choice([30 * 60, 60 * 60]))
            jobs.append(TraceJob(f"i{u}-{k}", round(t, 1), round(length, 1), req, proj,
                                 f"{proj}-nb{u}", "interactive", min_rt, True))
            t += length + gap

    # ---- debug jobs: Poisson arrivals, minutes long
    times = np.sort(rng.uniform(0, span, n_dbg))
    dproj = rng.choice(len(projects), size=n_dbg, p=w)
    for k in range(n_dbg):
        dur = float(np.clip(rng.lognormal(np.log(10 * 60), 0.7), 60, 2 * HOUR))
        req = SliceRequest.whole(1) if rng.random() < 0.7 else SliceRequest.mps(500, 40000)
        proj = projects[int(dproj[k])]
        jobs.append(TraceJob(f"d{k}", round(float(times[k]), 1), round(dur, 1), req, proj,
                             f"{proj}-u{int(rng.integers(4))}", "debug", 10 * 60, True))

    # ---- batch training gangs, scaled to the offered load
    sizes = np.array([1, 2, 4, 8, 16, 32, 64])
    sizes = sizes[sizes <= max(1, spec.gpus // 2)]
    p = np.array([0.30, 0.15, 0.15, 0.25, 0.08, 0.05, 0.02])[: len(sizes)]
    p = p / p.sum()
    btimes = np.sort(rng.uniform(0, span, n_bat))
    bsize = rng.choice(sizes, size=n_bat, p=p)
    bdur = np.clip(rng.lognormal(np.log(6 * HOUR), 1.0, n_bat), 10 * 60, 7 * DAY)
    bproj = rng.choice(len(projects), size=n_bat, p=w)
    used = sum(j.duration * gpu_fraction(j.request) for j in jobs)
    want = spec.load * spec.gpus * span - used
    have = float((bdur * bsize).sum())
    if n_bat and have > 0 and want > 0:
        bdur = np.clip(bdur * (want / have), 5 * 60, 14 * DAY)
    for k in range(n_bat):
        proj = projects[int(bproj[k])]
        g = int(bsize[k])
        jobs.append(TraceJob(f"b{k}", round(float(btimes[k]), 1), round(float(bdur[k]), 1),
                             SliceRequest.whole(g), proj, f"{proj}-u{int(rng.integers(4))}",
                             "batch", 30 * 60, True))
    jobs.sort(key=lambda j: (j.submit, j.id))
    return Trace(tuple(jobs), f"synthetic(seed={spec.seed}, workloads={n}, days={spec.days:g}, "
                 f"gpus={spec.gpus})", "synthetic")


def offered_load(trace: Trace, gpus: int) -> float:
    """Offered GPU-hours / capacity over the trace's span."""
    if not trace.jobs or gpus <= 0:
        return 0.0
    work = 0.0
    for j in trace.jobs:
        work += gpu_fraction(j.request) * j.duration
    return work / (gpus * max(trace.span, 1.0))
