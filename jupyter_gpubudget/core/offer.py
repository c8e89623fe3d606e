"""What a session could get: the slice choices an inventory offers, whether a request could
ever be held, the forecast of when queued work starts, and quotes (predicted start,
protection, its cost, backed or not).

Pure like the rest of the core. One start-time predictor: :func:`forecast` replays the queue
with the scheduler itself; pending work reads its start there, and a quote reads the start
of its slice shape there unless it fits now. Quotes are answered from the last cycle's
scheduler (:class:`Quoter`), so the spawn form never runs a cycle per choice.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from .forecast import Forecast as Forecast  # the forecast quotes read (forecast.py)
from .forecast import LazyForecast as LazyForecast
from .forecast import forecast as forecast
from .inventory import GpuSpec, Inventory, NodeSpec
from .members import over_limit_words
from .mig import profiles_for
from .model import SliceRequest, Workload, request_milli
from .placement import gang_links, place
from .preemption import choose_victims
from .pricing import OffPeak, describe_start, weighted_seconds
from .ranking import INF
from .scheduler import Scheduler
from .workqueue import with_interconnect

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
            m = models.setdefault(g.model, {"whole": 0, "mig": False, "mem": [],
                                            "profiles": set()})
            if g.mig:
                m["mig"] = True
                # a fixed layout offers the profiles of its instances; a carved GPU all
                m["profiles"] |= ({n for n, _ in g.mig_layout} if g.mig_layout is not None
                                  else set(profiles_for(g.model)))
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
                if p.name not in m["profiles"]:
                    continue
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
    None. Such a request is refused at submission (batch jobs and sessions alike) instead of
    waiting in the queue forever. A request naming a cluster is judged by that cluster's
    nodes alone; a cluster the inventory does not have is refused, listing those it has."""
    if req.cluster is not None:
        names = inventory.clusters
        if req.cluster not in names:
            return "cluster", (f"no cluster {req.cluster!r} here (clusters: "
                               f"{', '.join(names)})")
        inventory = Inventory(tuple(n for n in inventory.nodes if n.cluster == req.cluster),
                              inventory.source)
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


def request_for(key: str) -> SliceRequest:
    """A slice choice's key (``cpu``, ``gpu:N``, ``mig:<profile>``, ``mps:<milli>``) as the
    request it stands for (keys come from :func:`slice_choices`)."""
    kind, _, arg = key.partition(":")
    if kind == "gpu":
        return SliceRequest.whole(int(arg))
    if kind == "mig":
        return SliceRequest.mig(arg)
    if kind == "mps":
        return SliceRequest.mps(int(arg))
    return SliceRequest.cpu_only()


# ---------------------------------------------------------------------------- quotes
class Quoter:
    """Quotes against the scheduler of the last cycle (the state after its decisions) and
    that cycle's forecast: no cycle is run per quote, so a form with many projects and slices
    is answered in milliseconds. The scheduler is only read (under a lock: placement keeps
    caches)."""

    def __init__(self, sched: Scheduler, fc: Forecast | LazyForecast, now: float,
                 lock: threading.Lock | None = None) -> None:
        self.sched = sched
        self.forecast = fc
        self.at = now
        # the lock of the scheduler's capacity model when it is kept for a later cycle
        # (core/kept.py: that cycle changes it under this lock)
        self._lock = lock if lock is not None else threading.Lock()

    def quote(self, user: str, project: str, key: str, req: SliceRequest, min_runtime: float,
              now: float) -> dict:
        """What a session would get if submitted now (nothing is kept)."""
        s = self.sched
        w = Workload(id=QUOTE_ID, project=project, user=user, request=req, submitted_at=now,
                     kind="interactive", min_runtime=min_runtime, stops_at_once=False)
        links = None  # the interconnect a gang waits for, when that is what keeps it
        with self._lock:
            w = with_interconnect(w, s.policy)
            req = w.request
            backed = s.is_backed(w, now)
            over = None if backed else s.backing.member_over(w)  # the member's limit (members.py)
            end = now + s.predict(w)
            got = place(s.cluster, req, end)
            fits = got is not None
            if not fits and req.kind == "gpu" and req.gpus >= 2:
                level, _ = gang_links(s.cluster, req)
                if level != "any" and place(s.cluster, replace(req, interconnect="any"),
                                            end) is not None:
                    links = level
            yields = None if fits or not backed else self._yielding(w, end, now)
        fraction = request_milli(req) / 1000
        protected = s.policy.effective_min_runtime(w) if backed else 0.0
        out: dict[str, Any] = {"backed": backed, "fraction": fraction,
                               "protected_s": protected, "starts_now": fits}
        if got is not None and len(s.cluster.cluster_names) > 1:
            out["cluster"] = s.cluster.by_name[got.slices[0].node].cluster  # where it starts
        elif req.cluster is not None:
            out["cluster"] = req.cluster
        if fits:
            out["predicted_start"] = now
            out["why"] = "fits free capacity now"
        elif yields is not None:
            out["predicted_start"] = yields
            out["starts_now"] = yields <= now
            out["why"] = "unbacked or idle work yields to it"
        else:
            at = self.forecast.probe_start(key)  # (a lazy forecast replays as far as it needs)
            out["predicted_start"] = max(at, now) if at is not None else None
            out["why"] = ("when running work ends and the queue ahead is served" if at
                          is not None else "not within the forecast (the usage window)")
        if links is not None:
            out["waits_for_interconnect"] = links
            out["why"] += (f"; enough GPUs are free now, but not with the {links} "
                           "interconnect it asks for: it waits for its interconnect")
        if over is not None:
            out["note"] = over_limit_words(project, over)
            out["member_limit"] = {"limit": over[0], "used": round(over[1], 3), "of": over[2],
                                   "adds": round(over[3], 3)}
        elif not backed:
            out["note"] = ("unbacked: the project's grant does not cover this session's "
                           "protected time; it may run on idle capacity but is never "
                           "protected and is preempted first")
        out["cost_gpu_hours"] = round(fraction * protected / 3600, 4)
        if s.policy.off_peak is not None:
            price_offpeak(out, s.policy.off_peak, fraction, protected, min_runtime, now)
        return out

    def _yielding(self, w: Workload, end: float, now: float) -> float | None:
        """When ``w`` would start by preempting work that always yields to backed work
        (unbacked or idle, unprotected): now, or after such sessions' stop grace."""
        s = self.sched
        held = s.cluster.allocations  # (a kept model a later cycle changed holds others)
        eligible = {wid: v for wid, v in s.running.items()
                    if wid in held and not v.is_protected(now)
                    and (not v.backed or v.idle or v.stopping)}
        if not eligible:
            return None
        victims = choose_victims(s.cluster, w.request, end, eligible,
                                 lambda v: s._st.standing.get(v.project, INF) if s._st else INF)
        if not victims:
            return None
        slow = any(v.stopping or not v.stops_at_once for v in victims)
        return now + s.policy.stop_grace if slow else now

    def free_now(self, own: SliceRequest, keys: list[str], now: float) -> list[str]:
        """The queue page's hint ("a MIG 3g.40gb slice is free now"): the slice choices other
        than the queued request's own that fit the capacity left free after the last cycle —
        taken without preempting anyone, so the next cycle would start them. In the order
        given."""
        out = []
        with self._lock:
            for key in keys:
                req = request_for(key)
                if req.shape == own.shape or req.kind == "cpu":
                    continue
                if place(self.sched.cluster, req, now + self.sched.policy.default_runtime):
                    out.append(key)
        return out

    def offer(self, user: str, projects: list[str], keys: list[str], min_runtime: float,
              now: float) -> dict[str, dict[str, dict]]:
        return {p: {k: self.quote(user, p, k, request_for(k), min_runtime, now) for k in keys}
                for p in projects}


def price_offpeak(out: dict, off_peak: OffPeak, fraction: float, protected: float,
                  run: float, now: float) -> None:
    """Add off-peak prices to a quote ``out``: ``cost_gpu_hours`` of the ``protected``
    seconds from the predicted start at their prices, and ``price``: the factor now, the next
    window's start, the sentence the form shows ("now: 1.0× — start after 20:00 CET for 0.5×
    (half the cost)"), and what ``run`` seconds (the minimum runtime asked, or a job's time
    limit) cost from the predicted start (``run_gpu_hours``) and, outside a window, from the
    next window's start (``run_off_peak_gpu_hours``)."""
    price = describe_start(off_peak, now)
    start = out.get("predicted_start") or now
    out["cost_gpu_hours"] = round(
        fraction * weighted_seconds(off_peak, start, start + protected) / 3600, 4)
    price["run_s"] = run
    price["run_gpu_hours"] = round(fraction * weighted_seconds(off_peak, start, start + run)
                                   / 3600, 4)
    nxt = price["next_off_peak"]
    if nxt is not None:
        price["run_off_peak_gpu_hours"] = round(
            fraction * weighted_seconds(off_peak, max(nxt, start), max(nxt, start) + run)
            / 3600, 4)
    out["price"] = price


def standings_of(sched: Scheduler, now: float) -> dict[str, dict[str, float]]:
    """Usage (GPU-hours in the window), grant and standing of every account, as the
    scheduler's last cycle saw them."""
    st = sched._st if sched._st is not None else sched.standings(now)
    return {a: {"usage_hours": st.usage[a], "grant_hours": st.grant.get(a, 0.0),
                "standing": st.standing[a]} for a in sched.accounts.accounts}
