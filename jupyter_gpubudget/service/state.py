"""Ledger rows <-> core objects. The service keeps no scheduling state of its own: every cycle
rebuilds :class:`ClusterState` from the ledger, which is what makes a restart safe."""

from __future__ import annotations

from dataclasses import asdict, fields

from jupyter_gpubudget.core.accounts import AccountTree
from jupyter_gpubudget.core.model import (
    ChargeInterval,
    Placement,
    RuntimeHistory,
    SliceAlloc,
    SliceRequest,
    Workload,
)
from jupyter_gpubudget.core.scheduler import ClusterState
from jupyter_gpubudget.ledger import Ledger
from jupyter_gpubudget.ledger.models import WorkloadRow
from jupyter_gpubudget.ledger.snapshots import snapshot_history
from jupyter_gpubudget.sim.costs import RESTORE_COST_S, SNAPSHOT_COST_S

# only the constructor's fields (the core may add derived, non-init fields)
_REQ_FIELDS = {f.name for f in fields(SliceRequest) if f.init}
_ALLOC_FIELDS = {f.name for f in fields(SliceAlloc) if f.init}


def request_to_dict(r: SliceRequest) -> dict:
    return {k: v for k, v in asdict(r).items() if k in _REQ_FIELDS}


def request_from_dict(d: dict) -> SliceRequest:
    return SliceRequest(**{k: v for k, v in d.items() if k in _REQ_FIELDS})


def placement_to_list(p: Placement) -> list[dict]:
    return [{k: v for k, v in asdict(s).items() if k in _ALLOC_FIELDS} for s in p.slices]


def placement_from_list(items: list[dict]) -> Placement:
    return Placement(tuple(SliceAlloc(**{k: v for k, v in d.items() if k in _ALLOC_FIELDS})
                           for d in items))


def snapshot_estimate(hist: dict | None, age_s: float) -> tuple[float, float]:
    """What preempting an interactive session is expected to cost its user, in seconds, and
    how reliable its snapshots are, from its user's measured snapshot history
    (``ledger.snapshots.snapshot_history``): the mean dump and restore times (the
    simulator's measured defaults when there are none yet), plus — for the share of
    snapshots that did not save everything — the session's run so far, which a failed
    snapshot loses. Reliability is ``(ok + 1) / (tries + 1)``: 1 until a snapshot fails."""
    dump, restore, tries, ok = SNAPSHOT_COST_S, RESTORE_COST_S, 0, 0
    if hist:
        dump = hist.get("dump_s") if hist.get("dump_s") is not None else dump
        restore = hist.get("restore_s") if hist.get("restore_s") is not None else restore
        tries, ok = int(hist.get("tries") or 0), int(hist.get("ok") or 0)
    reliability = min(1.0, (ok + 1) / (tries + 1))
    return dump + restore + (1.0 - reliability) * max(0.0, age_s), reliability


def to_workload(row: WorkloadRow, idle: bool = False, stopping: bool = False,
                sync_backends: frozenset[str] = frozenset({"local"}),
                snapshots: dict | None = None, now: float = 0.0) -> Workload:
    """A ledger row as the core sees it. Workloads of ``sync_backends`` are stopped by the
    service itself before the next decision is carried out; any other (hub sessions, remote
    engines, external usage) keeps its slice until reported gone. ``snapshots``: snapshot
    history by user (interactive sessions get their snapshot cost and reliability from it)."""
    cost, reliability = 0.0, 1.0
    if row.kind == "interactive":
        age = now - row.started_at if row.started_at is not None and now else 0.0
        cost, reliability = snapshot_estimate((snapshots or {}).get(row.user), age)
    return Workload(
        id=row.id, project=row.project, user=row.user, request=request_from_dict(row.request),
        submitted_at=row.submitted_at, kind=row.kind, min_runtime=row.min_runtime,
        resumable=row.resumable, time_limit=row.time_limit, started_at=row.started_at,
        placement=placement_from_list(row.placement) if row.placement is not None else None,
        backed=row.backed, protected_until=row.protected_until, idle=idle,
        stops_at_once=row.backend in sync_backends, stopping=stopping, snapshot_cost=cost,
        snapshot_reliability=reliability)


def tree_with_ledger_grants(tree: AccountTree, ledger: Ledger) -> AccountTree:
    """The budgets file's tree with the grants currently in force in the ledger."""
    for name, g in ledger.current_grants().items():
        if name in tree and (tree.get(name).grant_hours, tree.get(name).share_pct) != (
                g.grant_hours, g.share_pct):
            tree = tree.with_grant(name, g.grant_hours, g.share_pct)
    return tree


def build_state(ledger: Ledger, tree: AccountTree, inventory, policy, now: float,  # noqa: ANN001
                history_keep: int = 500, sync_backends: frozenset[str] = frozenset({"local"})
                ) -> tuple[ClusterState, list[WorkloadRow]]:
    rows = ledger.workloads(states=("pending", "running"))
    idle = ledger.idle_running()
    stopping = ledger.stop_requested_running()
    horizon = max(policy.window, 10 * policy.half_life if policy.half_life else 0.0)
    snaps = snapshot_history(ledger, now - horizon) if any(
        r.kind == "interactive" for r in rows) else {}
    running = [to_workload(r, r.id in idle, r.id in stopping, sync_backends, snaps, now)
               for r in rows if r.state == "running" and r.placement is not None]
    # pending work of a project no longer in the budgets file cannot be scheduled: it waits
    # (visible in the API) until the project is back or the job is cancelled
    pending = [to_workload(r, snapshots=snaps, now=now) for r in rows
               if r.state == "pending" and tree.is_project(r.project)]
    charges = [ChargeInterval(c.workload, c.project, c.user, c.milli, c.start, c.end)
               for c in ledger.charges(since=now - horizon)]
    history = RuntimeHistory()
    for r in ledger.workloads(states=("done",))[-history_keep:]:
        if r.started_at is not None and r.ended_at is not None:
            history.add(r.user, r.project, r.kind, r.ended_at - r.started_at)
    state = ClusterState(accounts=tree_with_ledger_grants(tree, ledger), inventory=inventory,
                         policy=policy, running=running, pending=pending, charges=charges,
                         history=history)
    return state, rows
