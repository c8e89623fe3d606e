"""What a session could get: the slice choices an inventory offers, whether a request could
ever be held, and quotes (predicted start, protection, its cost, backed or not).

Pure like the rest of the core: the spawn form's quotes come from the same scheduling code
that will later decide, run on a copy of the state with the would-be session added.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .backfill import predict_runtime
from .inventory import Inventory
from .mig import profiles_for
from .model import Policy, Preempt, Reserve, SliceRequest, Start, Workload
from .scheduler import ClusterState, Scheduler, request_milli

MPS_SHARES = (250, 500)
QUOTE_ID = "quote:would-be-session"


def slice_choices(inventory: Inventory) -> list[dict]:
    """What the inventory can offer a session: CPU only, whole GPUs, MIG profiles, MPS.

    Each choice: ``key`` (what a session asks for), ``label``, ``kind``, ``fraction`` (of a
    GPU, what an hour costs in GPU-hours), ``compute`` (share of one GPU's compute),
    ``memory_gb`` (GPU memory it gets for itself; None for CPU only and MPS shares, which
    share the GPU's memory) and ``gpu_model``/``gpu_memory_gb`` where they apply."""
    models: dict[str, dict[str, Any]] = {}
    max_gpus = 0
    for node in inventory.nodes:
        max_gpus = max(max_gpus, sum(1 for g in node.gpus if not g.mig))
        for g in node.gpus:
            m = models.setdefault(g.model, {"whole": 0, "mig": False, "mem": []})
            if g.mig:
                m["mig"] = True
            else:
                m["whole"] += 1
                m["mem"].append(g.memory_mib)
    whole_mem = [mib for m in models.values() for mib in m["mem"]]
    per_gpu_gb = round(min(whole_mem) / 1024) if whole_mem and min(whole_mem) else None
    out: list[dict] = [{"key": "cpu", "label": "CPU only (no GPU)", "kind": "cpu",
                        "fraction": 0.0, "compute": 0.0, "memory_gb": None}]
    n = 1
    while n <= max_gpus:
        out.append({"key": f"gpu:{n}", "label": f"{n} whole GPU{'s' if n > 1 else ''}",
                    "kind": "gpu", "fraction": float(n), "compute": float(n),
                    "memory_gb": per_gpu_gb * n if per_gpu_gb else None,
                    "gpu_memory_gb": per_gpu_gb})
        n *= 2
    for model, m in sorted(models.items()):
        if m["mig"]:
            for p in profiles_for(model).values():
                out.append({"key": f"mig:{p.name}", "label": f"MIG {p.name} on {model} "
                            f"({p.compute}/7 of a GPU)", "kind": "mig", "gpu_model": model,
                            "fraction": p.milli / 1000, "compute": p.compute / 7,
                            "memory_gb": p.memory_gb})
    if any(m["whole"] for m in models.values()):
        for milli in MPS_SHARES:
            out.append({"key": f"mps:{milli}", "label": f"MPS share, {milli / 10:g}% of a GPU",
                        "kind": "mps", "fraction": milli / 1000, "compute": milli / 1000,
                        "memory_gb": None, "gpu_memory_gb": per_gpu_gb})
    return out


def not_offered(inventory: Inventory, req: SliceRequest) -> tuple[str, str] | None:
    """Why no hardware in the inventory could ever hold ``req`` — ``(field, message)`` — or
    None. Such a request is refused at submission instead of waiting in the queue forever."""
    keys = {c["key"] for c in slice_choices(inventory)}
    if req.kind == "mig":
        if f"mig:{req.profile}" not in keys:
            offered = sorted(k[4:] for k in keys if k.startswith("mig:"))
            return "slice", (f"no MIG-partitioned GPU here offers {req.profile!r} "
                             f"(offered: {', '.join(offered) or 'none'})")
    elif req.kind == "gpu":
        most = max((sum(1 for g in n.gpus if not g.mig) for n in inventory.nodes), default=0)
        if req.gpus > most and req.single_node:
            return "gpus", f"at most {most} whole GPUs on one node"
        total = sum(sum(1 for g in n.gpus if not g.mig) for n in inventory.nodes)
        if req.gpus > total:
            return "gpus", f"the cluster has {total} whole GPUs"
    elif req.kind == "mps" and not any(k.startswith("mps:") for k in keys):
        return "slice", "no GPU here takes MPS shares"
    return None


def estimate_start(state: ClusterState, position: int, now: float) -> float | None:
    """A rough predicted start for work queued at ``position`` without a reservation: the
    position-th earliest predicted end of running work (never before its protection ends)."""
    pol: Policy = state.policy
    ends = []
    for w in state.running:
        if w.started_at is None or not w.placement or w.placement.milli <= 0:
            continue
        end = w.started_at + (predict_runtime(w, state.history, pol) if state.history
                              else pol.default_runtime)
        if w.protected_until:
            end = max(end, w.protected_until)
        ends.append(max(end, now))
    ends.sort()
    if not ends:
        return None
    return ends[min(len(ends), max(1, position)) - 1]


def quote(state: ClusterState, user: str, project: str, req: SliceRequest,
          min_runtime: float, now: float) -> dict:
    """What a session would get if submitted now (nothing is kept)."""
    w = Workload(id=QUOTE_ID, project=project, user=user, request=req, submitted_at=now,
                 kind="interactive", min_runtime=min_runtime)
    state.pending = [*state.pending, w]
    try:
        s = Scheduler.from_state(state)
        backed = s.is_backed(w, now)
        decisions = s.cycle(now)
    finally:
        state.pending = state.pending[:-1]
    protected = state.policy.effective_min_runtime(w)
    fraction = request_milli(req) / 1000
    out: dict[str, Any] = {"backed": backed, "predicted_start": None, "starts_now": False,
                           "protected_s": protected if backed else 0.0,
                           "fraction": fraction}
    for d in decisions:
        if isinstance(d, Start) and d.workload == QUOTE_ID:
            out.update(predicted_start=now, starts_now=True, backed=d.backed,
                       protected_s=(d.protected_until - now) if d.protected_until else 0.0)
            break
        if isinstance(d, Reserve) and d.workload == QUOTE_ID:
            out["predicted_start"] = d.at
            break
    else:
        out["predicted_start"] = estimate_start(state, len(state.pending) + 1, now)
    if not out["backed"]:
        out["protected_s"] = 0.0
        out["note"] = ("unbacked: the project's grant does not cover this session's protected "
                       "time; it may run on idle capacity but is never protected and is "
                       "preempted first")
    out["cost_gpu_hours"] = round(fraction * out["protected_s"] / 3600, 4)
    return out


def starts_now(state: ClusterState, workload_id: str, options: dict[str, SliceRequest],
               now: float) -> list[str]:
    """Which other requests would start *now* for the queued workload ``workload_id`` — same
    project, user and contract, only the slice changed — without preempting anyone: the keys
    of ``options`` whose request the next cycle would start, in the order given.

    The queue page's hint ("a MIG 3g.40gb slice is free now"). Each option is one cycle of the
    real scheduler on the state with the workload's request swapped (nothing is kept); the
    workload's own request and options of the same shape are skipped."""
    idx = next((i for i, w in enumerate(state.pending) if w.id == workload_id), None)
    if idx is None:
        return []
    own = state.pending[idx]
    pending = state.pending
    out: list[str] = []
    try:
        for key, req in options.items():
            if req.shape == own.request.shape:
                continue
            state.pending = [*pending[:idx], replace(own, request=req), *pending[idx + 1:]]
            decisions = Scheduler.from_state(state).cycle(now)
            started = any(isinstance(d, Start) and d.workload == workload_id
                          for d in decisions)
            evicts = any(isinstance(d, Preempt) and d.for_workload == workload_id
                         for d in decisions)
            if started and not evicts:
                out.append(key)
    finally:
        state.pending = pending
    return out
