"""Ledger rows <-> core objects. The service keeps no scheduling state of its own: every cycle
rebuilds :class:`ClusterState` from the ledger, which is what makes a restart safe."""

from __future__ import annotations

import bisect
import json
import math
import threading
from dataclasses import asdict, fields
from pathlib import Path

from sqlalchemy import Row

from jupyter_gpubudget.core.accounts import AccountTree
from jupyter_gpubudget.core.model import (
    ChargeInterval,
    Placement,
    RuntimeHistory,
    SliceAlloc,
    SliceRequest,
    Workload,
    shape_label,
)
from jupyter_gpubudget.core.scheduler import LOSS_WINDOW, ClusterState
from jupyter_gpubudget.ledger import Ledger
from jupyter_gpubudget.ledger.bookings import live_bookings
from jupyter_gpubudget.ledger.nodes import unhealthy_nodes
from jupyter_gpubudget.ledger.rollups import HOUR
from jupyter_gpubudget.ledger.snapshots import snapshot_history
from jupyter_gpubudget.ledger.store import WorkloadWatch
from jupyter_gpubudget.sim.costs import RESTORE_COST_S, SNAPSHOT_COST_S

from .member_limits import with_ledger_limits

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


def tree_with_ledger_grants(tree: AccountTree, ledger: Ledger) -> AccountTree:
    """The budgets file's tree with the grants currently in force in the ledger, and the
    members' limits set through the API (service/member_limits.py)."""
    for name, g in ledger.current_grants().items():
        if name in tree and (tree.get(name).grant_hours, tree.get(name).share_pct) != (
                g.grant_hours, g.share_pct):
            tree = tree.with_grant(name, g.grant_hours, g.share_pct)
    return with_ledger_limits(tree, ledger)


def command_name(command: list | None) -> str:
    """The program a job runs, as a prediction feature: ``train.py`` for
    ``python train.py --epochs 3``, ``sleep`` for ``/bin/sh -c "sleep 60"``."""
    if not command:
        return ""
    argv = list(command)
    if argv[:2] == ["/bin/sh", "-c"] and len(argv) > 2:
        argv = argv[2].split()
    words = [a for a in argv if not a.startswith("-")]
    if not words:
        return ""
    prog = Path(words[0]).name
    if prog.startswith("python") and len(words) > 1:
        prog = Path(words[1]).name
    return prog[:100]


class LiveWorkloads:
    """Ledger rows of live work -> core ``Workload`` objects, reusing the object built in an
    earlier cycle when nothing of the row changed (the core never mutates its inputs): a cycle
    decodes only what changed since the last one, however long the queue.

    :meth:`rows` reads the ledger's live rows again only for the workloads this process wrote
    since the last read (``Ledger.watch_workloads``; the service is the ledger's only
    writer): a cycle after an arrival or an end reads one row, not the whole queue.

    The cycle thread and request threads read through one instance: :func:`build_state`
    holds :attr:`lock` from the first read to the conversion, so that no read sees the
    cache half-updated by another."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._cache: dict[str, tuple[Row, tuple, Workload]] = {}
        self._requests: dict[str, SliceRequest] = {}
        self._ledger: Ledger | None = None
        self._watch: WorkloadWatch | None = None
        self._rows: list[Row] = []  # live rows in the ledger's order (submitted_at, id)
        self._usage: tuple[tuple, list[ChargeInterval]] | None = None
        self._open: tuple[list[Row], list[ChargeInterval]] | None = None
        #: workloads written since open charges / convert last looked (None: all)
        self._charges_stale: set[str | None] = {None}
        self._convert_stale: set[str | None] = {None}
        #: the last conversion: (of :meth:`rows`' list, idle, stopping, sync backends,
        #: snapshot history, -, running sessions)
        self._converted: tuple | None = None

    def rows(self, ledger: Ledger) -> list[Row]:
        """Pending and running rows, as ``ledger.live()`` answers now (same order)."""
        if self._watch is None or self._ledger is not ledger:
            self._ledger, self._watch = ledger, ledger.watch_workloads()
        changed = self._watch.take()  # before the read: a write after it is read next time
        for seen in (self._charges_stale, self._convert_stale):
            if changed is None:
                seen.clear()
                seen.add(None)
            else:
                seen.update(changed)
        if changed is None:  # (ordered here as below, whatever the database's collation)
            self._rows = sorted(ledger.live(), key=_live_order)
        elif changed:
            fresh = [r for r in ledger.live_by_id(changed) if r.state in ("pending", "running")]
            rows = [r for r in self._rows if r.id not in changed]
            for r in fresh:
                bisect.insort(rows, r, key=_live_order)
            self._rows = rows
        return self._rows

    def usage(self, ledger: Ledger, since: float) -> list[ChargeInterval]:
        """The closed usage that may count after ``since`` (``Ledger.usage_for_window``) as
        charge intervals, read again only when an interval closed or the window's first hour
        moved."""
        key = (id(ledger), ledger.usage_version, math.ceil(since / HOUR))
        if self._usage is None or self._usage[0] != key:
            self._usage = (key, by_member(ledger.usage_for_window(since),
                                          ledger.member_usage_for_window(since)))
        return self._usage[1]

    def open_charges(self, ledger: Ledger) -> tuple[list[Row], list[ChargeInterval]]:
        """``ledger.open_charges()`` and the same as the core's charge intervals. An interval
        opens and closes in the transaction that changes its workload, so only the intervals
        of the workloads written since the last read are read again (the rows' ``checkpoint``
        may be older than the ledger's)."""
        self.rows(ledger)  # what was written since
        stale = self._charges_stale
        if self._open is None or None in stale:
            stale.clear()
            rows = ledger.open_charges()
        elif stale:
            ids = set(stale)
            stale.clear()
            rows = [c for c in self._open[0] if c.workload not in ids]
            rows += ledger.open_charges(ids)
        else:
            return self._open
        self._open = (rows, [ChargeInterval(c.workload, c.project, c.user, c.milli, c.start,
                                            None) for c in rows])
        return self._open

    def convert(self, rows: list, idle: set[str], stopping: set[str],
                sync_backends: frozenset[str], snapshots: dict | None = None,
                now: float = 0.0) -> list[Workload]:
        last, stale = self._converted, self._convert_stale
        mine = rows is self._rows  # what :meth:`rows` gave: changed only where written since
        if mine and last is not None and last[0] and None not in stale \
                and last[3] == sync_backends and last[4] == (snapshots or {}):
            # redo the rows written since, those whose marks changed, and running sessions
            # (their snapshot estimate grows with their age); reuse the rest as they are
            redo = stale | (idle ^ last[1]) | (stopping ^ last[2]) | last[6]
            if len(redo) < len(rows) // 4:
                cache = self._cache
                part = self._convert([r for r in rows if r.id in redo], idle, stopping,
                                     sync_backends, snapshots, now, keep=False)
                for rid in stale:
                    if rid not in part:  # no longer live
                        cache.pop(rid, None)
                out = [part[r.id] if r.id in redo else cache[r.id][2] for r in rows]
                sessions = (last[6] - stale) | {
                    rid for rid, w in part.items()
                    if w.kind == "interactive" and w.started_at is not None}
                stale.clear()
                self._converted = (True, set(idle), set(stopping), sync_backends,
                                   dict(snapshots or {}), None, sessions)
                return out
        stale.clear()
        out = self._convert(rows, idle, stopping, sync_backends, snapshots, now)
        sessions = {r.id for r in rows if r.kind == "interactive" and r.started_at is not None}
        self._converted = (mine, set(idle), set(stopping), sync_backends,
                           dict(snapshots or {}), None, sessions)
        return out

    def _convert(self, rows: list, idle: set[str], stopping: set[str],
                 sync_backends: frozenset[str], snapshots: dict | None, now: float,
                 keep: bool = True):  # noqa: ANN202
        """Convert ``rows`` (reusing cached objects); ``keep``: the cache becomes exactly
        these rows (else they are added to it, and a dict id -> workload is returned)."""
        out, fresh, cache = [], {}, self._cache
        snaps = snapshots or {}
        estimates: dict[tuple, tuple[float, float]] = {}  # (user, age) -> snapshot estimate
        for r in rows:
            rid = r.id
            if r.kind == "interactive":  # its snapshot's cost grows with the session's age
                age = now - r.started_at if r.started_at is not None and now else 0.0
                key = (r.user, 10.0 * (age // 10))
                est = estimates.get(key)
                if est is None:
                    est = estimates[key] = snapshot_estimate(snaps.get(r.user), key[1])
                sig = (rid in idle, rid in stopping, r.backend in sync_backends, *est)
            else:
                sig = (rid in idle, rid in stopping, r.backend in sync_backends, 0.0, 1.0)
            hit = cache.get(rid)
            if hit is not None and (hit[0] is r or hit[0] == r) and hit[1] == sig:
                w = hit[2]
            else:
                req = self._requests.get(r.request_json)
                if req is None:
                    req = request_from_dict(json.loads(r.request_json))
                    if len(self._requests) < 10_000:
                        self._requests[r.request_json] = req
                placement = (placement_from_list(json.loads(r.placement_json))
                             if r.placement_json not in (None, "null") else None)
                w = Workload(id=r.id, project=r.project, user=r.user, request=req,
                             submitted_at=r.submitted_at, kind=r.kind,
                             min_runtime=r.min_runtime, resumable=r.resumable,
                             time_limit=r.time_limit, started_at=r.started_at,
                             placement=placement, backed=r.backed,
                             protected_until=r.protected_until, idle=sig[0],
                             stops_at_once=sig[2], stopping=sig[1],
                             checkpoint_interval=r.checkpoint_interval,
                             backfill_until=r.backfill_until,
                             command=command_name(json.loads(r.command_json or "null")),
                             snapshot_cost=sig[3], snapshot_reliability=sig[4],
                             array=r.array_id, array_max=r.array_max or 0,
                             after=tuple((r.after or "").split()),
                             after_kind=r.after_kind or "afterok",
                             not_before=r.not_before)
            fresh[rid] = (r, sig, w)
            out.append(w)
        if not keep:
            cache.update(fresh)
            return {rid: v[2] for rid, v in fresh.items()}
        self._cache = fresh
        return out


def by_member(closed: list[tuple[str, float, float, float]],
              parts: dict[tuple[str, int], list[tuple[str, float]]]) -> list[ChargeInterval]:
    """The hourly rollups (project, start, end, milli) as charge intervals, each split among
    the users who were charged in it (``parts``: their milli-GPU-seconds per (project,
    hour)), so that a member's usage inside a project counts their closed work too (members'
    limits, the member level of the ranking); what no user's part covers (a booking's charge,
    rounding) stays the project's (user ""). The parts of one bucket add up to its milli."""
    out: list[ChargeInterval] = []
    for project, start, end, milli in closed:
        left = milli
        span = end - start
        for user, ms in parts.get((project, int(start)), ()):
            m = min(left, ms / span)
            if m > 0:
                out.append(ChargeInterval(f"rollup:{project}:{start:.0f}:{user}", project, user,
                                          m, start, end))
                left -= m
        if left > 1e-9 * milli:
            out.append(ChargeInterval(f"rollup:{project}:{start:.0f}", project, "", left,
                                      start, end))
    return out


def _live_order(r: Row) -> tuple:
    return (r.submitted_at, r.id)


def build_state(ledger: Ledger, tree: AccountTree, inventory, policy, now: float,  # noqa: ANN001
                history_keep: int = 500, sync_backends: frozenset[str] = frozenset({"local"}),
                live: LiveWorkloads | None = None) -> tuple[ClusterState, list]:
    """The ledger as the core sees it. Returns the state and the live rows it was built from
    (plain rows: id, project, user, kind, state, backend, ...; see ``Ledger.live``)."""
    live = live or LiveWorkloads()
    horizon = max(policy.window, 20 * policy.half_life if policy.half_life else 0.0)
    with live.lock:
        rows = live.rows(ledger)
        idle, stopping = ledger.running_marks()
        # sessions' snapshot cost and reliability, from their users' snapshot history
        snaps = snapshot_history(ledger, now - horizon) if any(
            r.kind == "interactive" for r in rows) else {}
        workloads = live.convert(rows, idle, stopping, sync_backends, snaps, now)
        charges = live.usage(ledger, now - horizon) + live.open_charges(ledger)[1]
    running = [w for w, r in zip(workloads, rows, strict=True)
               if r.state == "running" and w.placement is not None]
    # pending work of a project no longer in the budgets file cannot be scheduled: it waits
    # (visible in the API) until the project is back or the job is cancelled
    pending = [w for w, r in zip(workloads, rows, strict=True)
               if r.state == "pending" and tree.is_project(r.project)]
    # how the work that pending work runs after ended (core/holds.py)
    after = {d for w in pending if w.after for d in w.after}
    finished = ledger.outcomes(after) if after else {}
    history = RuntimeHistory()
    for user, project, kind, seconds, req, command in ledger.recent_runs(history_keep):
        history.add(user, project, kind, seconds,
                    shape=shape_label(request_from_dict(req)) if req else "",
                    command=command_name(command))
    state = ClusterState(accounts=tree_with_ledger_grants(tree, ledger), inventory=inventory,
                         policy=policy, running=running, pending=pending, charges=charges,
                         history=history, unhealthy=unhealthy_nodes(ledger),
                         recent_losses=ledger.recent_losses(now - LOSS_WINDOW),
                         finished=finished, bookings=live_bookings(ledger, now))
    return state, rows
