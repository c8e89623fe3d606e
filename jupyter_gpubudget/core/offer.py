"""What a session could get: the slice choices an inventory offers, whether a request could
ever be held, and quotes (predicted start, protection, its cost, backed or not).

Pure like the rest of the core: the spawn form's quotes come from the same scheduling code
that will later decide, run on a copy of the state with the would-be session added.
"""

from __future__ import annotations

from typing import Any

from .backfill import predict_runtime
from .inventory import GpuSpec, Inventory, NodeSpec
from .mig import profiles_for
from .model import Policy, Reserve, SliceRequest, Start, Workload
from .scheduler import ClusterState, Scheduler, request_milli

MPS_SHARES = (250, 500)
QUOTE_ID = "quote:would-be-session"


def slice_choices(inventory: Inventory) -> list[dict]:
    """What the inventory can offer a session: CPU only, whole GPUs, MIG profiles, MPS."""
    models: dict[str, dict[str, Any]] = {}
    max_gpus = 0
    for node in inventory.nodes:
        max_gpus = max(max_gpus, sum(1 for g in node.gpus if not g.mig))
        for g in node.gpus:
            m = models.setdefault(g.model, {"whole": 0, "mig": False})
            if g.mig:
                m["mig"] = True
            else:
                m["whole"] += 1
    out: list[dict] = [{"key": "cpu", "label": "CPU only (no GPU)", "kind": "cpu",
                        "fraction": 0.0}]
    n = 1
    while n <= max_gpus:
        out.append({"key": f"gpu:{n}", "label": f"{n} whole GPU{'s' if n > 1 else ''}",
                    "kind": "gpu", "fraction": float(n)})
        n *= 2
    for model, m in sorted(models.items()):
        if m["mig"]:
            for p in profiles_for(model).values():
                out.append({"key": f"mig:{p.name}", "label": f"MIG {p.name} on {model} "
                            f"({p.compute}/7 of a GPU)", "kind": "mig", "gpu_model": model,
                            "fraction": p.milli / 1000})
    if any(m["whole"] for m in models.values()):
        for milli in MPS_SHARES:
            out.append({"key": f"mps:{milli}", "label": f"MPS share, {milli / 10:g}% of a GPU",
                        "kind": "mps", "fraction": milli / 1000})
    return out


def not_offered(inventory: Inventory, req: SliceRequest) -> tuple[str, str] | None:
    """Why no hardware in the inventory could ever hold ``req`` — ``(field, message)`` — or
    None. Such a request is refused at submission (batch jobs and sessions alike) instead of
    waiting in the queue forever."""
    present = sorted({g.model for n in inventory.nodes for g in n.gpus})
    wanted = set(req.gpu_model.split("|")) if req.gpu_model else None
    if wanted is not None:
        unknown = sorted(wanted - set(present))
        if unknown:
            return "gpu_model", (f"no GPU of model {unknown[0]!r} here (models: "
                                 f"{', '.join(present) or 'none'})")

    def whole(node: NodeSpec) -> list[GpuSpec]:
        return [g for g in node.gpus if not g.mig and (wanted is None or g.model in wanted)]

    if req.kind == "mig":
        offered = sorted({p for n in inventory.nodes for g in n.gpus
                          if g.mig and (wanted is None or g.model in wanted)
                          for p in profiles_for(g.model)})
        if req.profile not in offered:
            return "slice", (f"no MIG-partitioned GPU here offers {req.profile!r} "
                             f"(offered: {', '.join(offered) or 'none'})")
    elif req.kind == "gpu":
        most = max((len(whole(n)) for n in inventory.nodes), default=0)
        if req.gpus > most and req.single_node:
            return "gpus", f"at most {most} whole GPUs on one node"
        total = sum(len(whole(n)) for n in inventory.nodes)
        if req.gpus > total:
            return "gpus", f"the cluster has {total} whole GPUs"
    elif req.kind == "mps":
        gpus = [g for n in inventory.nodes for g in whole(n)]
        if not gpus:
            return "slice", "no GPU here takes MPS shares"
        mem = max(g.memory_mib for g in gpus)
        if mem and req.gpu_memory_mib > mem:
            return "slice", (f"an MPS share of {req.gpu_memory_mib} MiB is more than a GPU "
                             f"here has ({mem} MiB)")
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
