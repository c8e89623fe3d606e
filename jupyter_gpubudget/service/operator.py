"""What the operator's pages and endpoints show: accounts, queue and running work, nodes, the
audit log. Assembled here once, for the JSON endpoints (``handlers/operator.py``) and the
server-rendered pages (``pages.py``) alike, so a page never shows other figures than the API.

Every function here reads the ledger: call them on the database threads (``BaseHandler.db``).
Policy stays in the core: why work waits (``core.explain``), what a grant change would do and
shares of the parent (``core.whatif``).
"""

from __future__ import annotations

from datetime import tzinfo
from typing import TYPE_CHECKING, Any

from jupyter_gpubudget.core.explain import describe_request, why_waiting
from jupyter_gpubudget.core.whatif import grant_preview, sibling_shares
from jupyter_gpubudget.ledger import nodes as ledger_nodes
from jupyter_gpubudget.ledger.models import DecisionRow, WorkloadRow

from .auth import Caller, Denied
from .dependencies import off_peak_wait
from .state import request_from_dict, tree_with_ledger_grants
from .timefmt import clock_text, companions, duration_text
from .views import grant_json

if TYPE_CHECKING:
    from .app import GpuBudgetService

STATE_WORDS = {"in_service": "in service", "draining": "draining",
               "ready_for_repair": "drained: ready for repair"}


def window_words(seconds: float) -> str:
    """'7 days', '1 day', '12 hours' (the usage window, in the pages' headings)."""
    if seconds % 86400 == 0:
        d = int(seconds // 86400)
        return f"{d} day{'s' if d != 1 else ''}"
    h = seconds / 3600
    return f"{h:g} hour{'s' if h != 1 else ''}"


def can_edit(c: Caller, tree: Any, account: str) -> bool:
    try:
        c.require_manage(tree, account)
    except Denied:
        return False
    return True


def slice_text(request: dict | None, placement: list[dict] | None = None) -> str:
    """'1 whole GPU', 'MIG 1g.10gb', ... from a stored request (or the placement's slices)."""
    if request:
        try:
            return describe_request(request_from_dict(request))
        except TypeError:
            pass
    if placement:
        return ", ".join(f"{s.get('kind', 'gpu')}" for s in placement)
    return "?"


def where_text(placement: list[dict] | None) -> str:
    """'h100-a GPU 3', 'h100-a GPU 6 (MIG 1g.10gb @0)', 'h100-b GPUs 0, 1'."""
    if not placement:
        return ""
    by: dict[str, list[str | int]] = {}
    for s in placement:
        g = s.get("gpu", -1)
        if g is None or g < 0:
            txt: str | int = "CPU"
        elif s.get("kind") == "mig":
            txt = f"{g} (MIG {s.get('profile')})"
        elif s.get("kind") == "mps":
            txt = f"{g} (MPS {s.get('milli', 0) / 10:g}%)"
        else:
            txt = int(g)
        by.setdefault(str(s.get("node")), []).append(txt)
    out = []
    for node, gs in by.items():
        if gs == ["CPU"]:
            out.append(f"{node} (CPU only)")
        else:
            out.append(f"{node} GPU{'s' if len(gs) > 1 else ''} {_ranges(gs)}")
    return "; ".join(out)


def _ranges(items: list[str | int]) -> str:
    """'0–7', '0, 1', '2–4, 6 (MIG 1g.10gb)': runs of three or more whole GPUs shortened."""
    out: list[str] = []
    run: list[int] = []

    def flush() -> None:
        if len(run) >= 3:
            out.append(f"{run[0]}–{run[-1]}")
        else:
            out.extend(str(x) for x in run)
        run.clear()

    for x in items:
        if isinstance(x, int) and (not run or x == run[-1] + 1):
            run.append(x)
            continue
        flush()
        if isinstance(x, int):
            run.append(x)
        else:
            out.append(x)
    flush()
    return ", ".join(out)


# ---------------------------------------------------------------------- accounts
def accounts_overview(svc: GpuBudgetService, c: Caller, now: float,
                      tz: tzinfo | None = None, history: int = 10) -> dict[str, Any]:
    """The visible account tree, depth first, with the same figures as ``GET /accounts``
    plus shares of the parent, work per kind and the grant history."""
    tree = svc.tree()
    visible = c.visible_accounts(tree)
    grants = svc.ledger.current_grants()
    view = svc.loop.view
    shares = sibling_shares(tree, view.standings)
    rows: list[dict[str, Any]] = []

    def work(name: str) -> dict[str, dict[str, int]]:
        below = {p for p in tree.projects() if name in tree.path(p)}
        out: dict[str, dict[str, int]] = {"running": {}, "pending": {}}
        for key, counts in (("running", view.running), ("pending", view.pending)):
            for (p, kind), n in counts.items():
                if p in below:
                    out[key][kind] = out[key].get(kind, 0) + n
        return out

    def siblings(name: str) -> tuple[str, ...]:
        p = tree.get(name).parent
        return tree.get(p).children if p is not None else tree.roots

    def walk(name: str, depth: int) -> None:
        if name in visible:
            row = svc.account_json(name, grants.get(name))
            w = work(name)
            # shares among siblings tell about the siblings too: only when the caller may
            # see every one of them
            mine = c.is_admin or all(x in visible for x in siblings(name))
            row.update(depth=depth, path=list(tree.path(name)),
                       grant_share=shares.get(name, {}).get("grant_share") if mine else None,
                       delivered_share=shares.get(name, {}).get("delivered_share")
                       if mine else None, shares_hidden=not mine,
                       running=w["running"], pending=w["pending"],
                       can_edit=can_edit(c, tree, name),
                       history=[grant_json(g) for g in
                                svc.ledger.grant_history(name)[-history:]][::-1])
            rows.append(row)
        for child in tree.get(name).children:
            walk(child, depth + 1)

    for r in tree.roots:
        walk(r, 0)
    pol = svc.budgets.policy
    return companions({"accounts": rows, "computed_at": view.at, "window_s": pol.window,
                       "window_text": duration_text(pol.window),
                       "window_words": window_words(pol.window),
                       "half_life_s": pol.half_life, "is_admin": c.is_admin,
                       "user": c.name}, ("computed_at",), now, tz)


def preview(svc: GpuBudgetService, c: Caller, account: str, g: dict, now: float
            ) -> dict[str, Any]:
    """What ``g`` (a parsed grant body) would do to standings and backing; ``refused`` says
    why saving it would be refused (a manager's change beyond the parent's grant)."""
    state, _ = svc.loop.build_state(now)
    out = grant_preview(state, now, account, g["grant_hours"], g["share_pct"])
    before = tree_with_ledger_grants(svc.tree(), svc.ledger)
    after = before.with_grant(account, g["grant_hours"], g["share_pct"])
    hours = svc.inventory.gpu_count * svc.budgets.policy.window / 3600
    try:
        c.require_within_parent(before, after, account, hours)
        c.grant_approval(before, after, account, hours, svc.budgets.admins,
                         svc.budgets.policy.managers_fund_own_projects, g.get("requested_by"))
        out["refused"] = None
    except Denied as e:
        out["refused"] = e.reason
    visible = c.visible_accounts(svc.tree())
    out["accounts"] = {a: v for a, v in out["accounts"].items() if a in visible}
    out["backing"] = [b for b in out["backing"] if c.is_admin or b["user"] == c.name
                      or b["project"] in visible]
    return out


# ---------------------------------------------------------------------- queue and running
def _mine(c: Caller, r: WorkloadRow) -> bool:
    return c.is_admin or r.user == c.name


def queue_overview(svc: GpuBudgetService, c: Caller, now: float, tz: tzinfo | None = None,
                   project: str | None = None) -> dict[str, Any]:
    """Pending work in rank order with why it waits; running work with slice, place,
    protected-until and cost so far. Other users' entries are redacted for non-admins (the
    project stays when the caller may see it)."""
    view = svc.loop.view
    tree = svc.tree()
    visible = c.visible_accounts(tree)
    state, _ = svc.loop.build_state(now)
    # jobs waiting for their off-peak window are out of the cycle, as the loop holds them
    state, off_peak = off_peak_wait(state, now)
    waits = why_waiting(state, now)
    rows = svc.ledger.workloads(states=("pending", "running"))  # every column, for display
    by_id = {r.id: r for r in rows}
    order = [w for w in view.queue if w in by_id and by_id[w].state == "pending"]
    order += sorted((r.id for r in rows if r.state == "pending" and r.id not in order),
                    key=lambda w: (by_id[w].submitted_at, w))
    running = [r for r in rows if r.state == "running"]
    cost = ledger_nodes.costs(svc.ledger, [r.id for r in running], now)
    stopping = svc.ledger.stop_requested_running()
    idle = svc.ledger.idle_running()

    def base(r: WorkloadRow) -> dict[str, Any]:
        mine = _mine(c, r)
        return {"id": r.id if mine else None, "name": r.name if mine else None,
                "user": r.user if mine else None,
                "project": r.project if (mine or r.project in visible) else None,
                "kind": r.kind, "slice": slice_text(r.request, r.placement),
                "mine": r.user == c.name, "can_act": c.is_admin}

    below = ({p for p in tree.projects() if project in tree.path(p)} if project in tree
             else {project}) if project else None
    pending = []
    for pos, wid in enumerate(order, 1):
        r = by_id[wid]
        if below is not None and r.project not in below:
            continue
        w = waits.get(wid)
        d = base(r)
        d.update(position=pos if wid in view.queue else None, submitted_at=r.submitted_at,
                 why=w.reason if w else ("off-peak" if wid in off_peak else "unknown"),
                 why_text=w.message if w else off_peak.get(wid, ""),
                 backed=w.backed if w else None, blocker=w.blocker if (w and c.is_admin)
                 else None, predicted_start=(w.at if w and w.at else
                                             view.reservations.get(wid)),
                 waited_s=max(0.0, now - r.submitted_at),
                 waited_text=duration_text(max(0.0, now - r.submitted_at)),
                 resumable=r.resumable, min_runtime=r.min_runtime,
                 min_runtime_text=duration_text(r.min_runtime) if r.min_runtime else "none",
                 cluster=r.cluster)  # the one it names (None: wherever it starts sooner)
        pending.append(companions(d, ("submitted_at", "predicted_start"), now, tz))
    run = []
    for r in sorted(running, key=lambda r: (r.started_at or 0, r.id)):
        if below is not None and r.project not in below:
            continue
        d = base(r)
        prot = r.protected_until if (r.backed and r.protected_until and
                                     r.protected_until > now) else None
        d.update(where=where_text(r.placement),
                 nodes=sorted({str(s.get("node")) for s in (r.placement or [])}),
                 started_at=r.started_at, protected_until=prot, backed=r.backed,
                 cost_gpu_hours=round(cost.get(r.id, 0.0), 4), resumable=r.resumable,
                 backend=r.backend, stopping=r.id in stopping, idle=r.id in idle,
                 cluster=r.cluster,
                 can_requeue=c.is_admin and r.backend == svc.backend.name)
        run.append(companions(d, ("started_at", "protected_until"), now, tz))
    return companions({"pending": pending, "running": run, "computed_at": view.at,
                       "is_admin": c.is_admin, "project": project,
                       "clusters": list(svc.inventory.clusters)}, ("computed_at",), now, tz)


# ---------------------------------------------------------------------- nodes
def nodes_overview(svc: GpuBudgetService, c: Caller, now: float, tz: tzinfo | None = None
                   ) -> dict[str, Any]:
    """Every node: GPUs and the slices on them (what runs where), health and drain state."""
    tree = svc.tree()
    visible = c.visible_accounts(tree)
    health = ledger_nodes.node_health(svc.ledger)
    rows = svc.ledger.workloads(states=("running",))
    on: dict[tuple[str, int], list[dict]] = {}
    per_node: dict[str, list[WorkloadRow]] = {}
    for r in rows:
        for s in r.placement or []:
            node, gpu = str(s.get("node")), int(s.get("gpu", -1))
            mine = _mine(c, r)
            on.setdefault((node, gpu), []).append({
                "workload": r.id if mine else None, "name": r.name if mine else None,
                "user": r.user if mine else None,
                "project": r.project if (mine or r.project in visible) else None,
                "kind": r.kind, "slice": s.get("kind", "gpu"), "profile": s.get("profile"),
                "milli": s.get("milli", 1000)})
            if r not in per_node.setdefault(node, []):
                per_node[node].append(r)
    nodes = []
    notices = []
    for spec in svc.inventory.nodes:
        row = health.get(spec.name)
        ws = per_node.get(spec.name, [])
        healthy = row is None or row.healthy
        prot = [r.protected_until for r in ws if r.backed and r.protected_until
                and r.protected_until > now]
        if healthy:
            state = "in_service"
        else:  # ready once the scheduling loop found it empty and recorded it (and told)
            assert row is not None
            state = "ready_for_repair" if (row.drained_at is not None and not ws) else "draining"
        text = STATE_WORDS[state]
        if state == "draining":
            text += (f": protected work until {clock_text(max(prot), now, tz)}" if prot else
                     f": waiting for {len(ws)} workload{'s' if len(ws) != 1 else ''} to stop"
                     if ws else ": nothing runs on it any more (confirmed within a cycle)")
        gpus = []
        for g in spec.gpus:
            used = on.get((spec.name, g.index), [])
            gpus.append({"index": g.index, "model": g.model, "memory_mib": g.memory_mib,
                         "mig": g.mig, "uuid": g.uuid, "used_milli": sum(
                             int(x["milli"] or 0) for x in used), "slices": used})
        d = {"name": spec.name, "rack": spec.rack, "cluster": spec.cluster, "gpus": gpus,
             "state": state,
             "state_text": text, "healthy": healthy, "running": len(ws),
             "protected_until": max(prot) if prot else None,
             "reason": row.reason if row is not None else "",
             "source": row.source if row is not None else "",
             "changed_by": row.changed_by if row is not None else "",
             "changed_at": row.changed_at if row is not None else None,
             "drained_at": row.drained_at if row is not None else None,
             "can_act": c.is_admin}
        nodes.append(companions(d, ("protected_until", "changed_at", "drained_at"), now, tz))
        if state == "ready_for_repair" and c.is_admin:
            notices.append({"node": spec.name, "state": state,
                            "message": f"Node {spec.name} is drained and ready for repair "
                                       f"({d['reason']}). Undrain it once it is repaired."})
    return companions({"nodes": nodes, "notices": notices, "is_admin": c.is_admin,
                       "clusters": list(svc.inventory.clusters),
                       "inventory": svc.inventory.source, "computed_at": now,
                       "health_errors": dict(svc.health_monitor.errors) if c.is_admin else {}},
                      ("computed_at",), now, tz)


# ---------------------------------------------------------------------- decisions
KIND_WORDS = {"start": "started", "preempt": "preempted", "preempting": "preempting",
              "preempt-requested": "asked to stop", "reserve": "GPUs reserved",
              "drain": "node drained", "health": "node unhealthy",
              "undrain": "node back in service", "grant": "grant changed",
              "cancel": "cancelled", "cancelling": "cancelling", "requeue": "requeued",
              "requeueing": "requeueing", "idle": "reported idle", "snapshot": "snapshot",
              "notice-failed": "notice not delivered"}


def _why(d: dict[str, Any]) -> tuple[str, float | None]:
    """Words for a decision recorded without a reason (starts, reservations), and the time
    they end with (formatted by the caller: the page in the viewer's time zone)."""
    det = d["detail"]
    if d["kind"] == "start":
        if not det.get("backed"):
            return "unbacked: runs on idle GPUs, preempted first", None
        pu = det.get("protected_until")
        return ("backed; protected until", pu) if pu and pu > 0 else ("backed", None)
    if d["kind"] == "reserve" and det.get("at"):
        return "GPUs held for it from", det["at"]
    return "", None


def decision_json(d: DecisionRow, now: float, tz: tzinfo | None = None) -> dict[str, Any]:
    det = d.detail or {}
    return companions({"id": d.id, "at": d.at, "cycle": d.cycle, "kind": d.kind,
                       "workload": d.workload, "actor": d.actor, "reason": d.reason,
                       "detail": det, "node": det.get("node"), "account": det.get("account")},
                      ("at",), now, tz)


def decisions_overview(svc: GpuBudgetService, c: Caller, now: float, tz: tzinfo | None = None,
                       kinds: list[str] | None = None, workload: str | None = None,
                       actor: str | None = None, text: str | None = None,
                       before: int | None = None, limit: int = 100) -> dict[str, Any]:
    """The audit log, newest first. Admins see everything; others the decisions about their
    own workloads and the grant changes of the accounts they may see."""
    keep = None
    if not c.is_admin:
        tree = svc.tree()
        visible = c.visible_accounts(tree)
        own = {r.id for r in svc.ledger.workloads(user=c.name)}

        def keep(d: DecisionRow) -> bool:
            if d.workload:
                return d.workload in own
            return d.kind == "grant" and (d.detail or {}).get("account") in visible

    rows = ledger_nodes.audit(svc.ledger, kinds=kinds, workload=workload, actor=actor,
                              text=text, before=before, limit=limit + 1, keep=keep)
    more = len(rows) > limit
    rows = rows[:limit]
    out = [decision_json(d, now, tz) for d in rows]
    owners = {w.id: w for w in ledger_nodes.workloads_by_id(
        svc.ledger, {d.workload for d in rows if d.workload})}
    for d in out:
        w = owners.get(d["workload"])
        d["workload_user"] = w.user if w else None
        d["workload_project"] = w.project if w else None
        d["workload_name"] = w.name if w else None
        d["what"] = KIND_WORDS.get(d["kind"], d["kind"])
        d["why"], d["why_at"] = (d["reason"], None) if d["reason"] else _why(d)
        companions(d, ("why_at",), now, tz)
        d["where"] = where_text(d["detail"].get("placement"))
    return {"decisions": out,
            "next_before": rows[-1].id if more and rows else None,
            "kinds": list(ledger_nodes.AUDIT_KINDS), "is_admin": c.is_admin}
