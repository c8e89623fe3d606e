"""Node health in the ledger, and the audit log's view for operators.

A node without a ``node_health`` row, or with ``healthy`` true, is in service. A health
source, the engine or an admin marks it unhealthy (kind ``health``; the scheduling core then
places nothing new there and drains it: the loop records the core's ``Drain`` as ``drain``);
once nothing runs on it any more it is recorded as ready for repair (``repair``, and
``drained_at``); an undrain returns it to service (``undrain``). Every change is one
transaction together with its decision in the audit log.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select

from .models import ChargeRow, DecisionRow, NodeHealthRow, WorkloadRow
from .store import Ledger

#: decisions an operator filters the audit log by (the page's choices)
AUDIT_KINDS = ("start", "preempt", "preempt-requested", "reserve", "health", "drain", "repair",
               "undrain", "grant", "cancel", "requeue", "idle", "snapshot", "timeout",
               "lost", "notice-failed")


def node_health(ledger: Ledger) -> dict[str, NodeHealthRow]:
    """Every node with a recorded health state (healthy or not)."""
    with ledger.ro() as s:
        return {r.node: r for r in s.scalars(select(NodeHealthRow))}


def unhealthy_nodes(ledger: Ledger) -> frozenset[str]:
    with ledger.ro() as s:
        return frozenset(s.scalars(select(NodeHealthRow.node)
                                   .where(NodeHealthRow.healthy.is_(False))))


def mark_unhealthy(ledger: Ledger, node: str, reason: str, source: str, by: str,
                   now: float) -> bool:
    """Record ``node`` unhealthy; False (nothing written) when it already is."""
    with ledger.tx() as s:
        row = s.get(NodeHealthRow, node, with_for_update=True)
        if row is not None and not row.healthy:
            return False
        if row is None:
            row = NodeHealthRow(node=node)
            s.add(row)
        row.healthy, row.reason, row.source = False, reason, source
        row.changed_by, row.changed_at, row.drained_at = by, now, None
        s.add(DecisionRow(at=now, kind="health", actor=by,
                          reason=f"node {node} unhealthy ({source}): {reason}; draining",
                          detail={"node": node, "healthy": False, "source": source,
                                  "problem": reason}))
        return True


def mark_healthy(ledger: Ledger, node: str, reason: str, source: str, by: str,
                 now: float) -> bool:
    """Return ``node`` to service; False when it was not out of service."""
    with ledger.tx() as s:
        row = s.get(NodeHealthRow, node, with_for_update=True)
        if row is None or row.healthy:
            return False
        was = row.reason
        row.healthy, row.reason, row.source = True, reason, source
        row.changed_by, row.changed_at, row.drained_at = by, now, None
        s.add(DecisionRow(at=now, kind="undrain", actor=by,
                          reason=f"node {node} back in service ({source}): {reason}",
                          detail={"node": node, "healthy": True, "source": source,
                                  "was": was}))
        return True


def mark_drained(ledger: Ledger, node: str, now: float) -> NodeHealthRow | None:
    """Record that the unhealthy ``node`` has nothing running any more — ready for repair —
    once per episode: the row, or None when it was not unhealthy or was already recorded."""
    with ledger.tx() as s:
        row = s.get(NodeHealthRow, node, with_for_update=True)
        if row is None or row.healthy or row.drained_at is not None:
            return None
        row.drained_at = now
        s.add(DecisionRow(at=now, kind="repair",
                          reason=f"node {node} drained: ready for repair ({row.reason})",
                          detail={"node": node, "source": row.source, "problem": row.reason,
                                  "since": row.changed_at}))
        return row


def drains_total(ledger: Ledger) -> int:
    """Nodes found empty while unhealthy (``repair`` decisions), ever."""
    with ledger.ro() as s:
        return int(s.scalar(select(func.count()).select_from(DecisionRow)
                            .where(DecisionRow.kind == "repair")) or 0)


def audit(ledger: Ledger, *, kinds: Iterable[str] | None = None, workload: str | None = None,
          actor: str | None = None, text: str | None = None, before: int | None = None,
          since: float | None = None, limit: int = 100, scan: int = 5000,
          keep: Any = None) -> list[DecisionRow]:
    """Decisions newest first, filtered. ``text`` matches the reason or the detail
    (case-insensitive; an account, a node, a user); ``keep(row)`` is a further filter (what
    the caller may see); at most ``scan`` rows are looked at."""
    with ledger.ro() as s:
        q = select(DecisionRow)
        kinds = list(kinds) if kinds else None
        if kinds:
            q = q.where(DecisionRow.kind.in_(kinds))
        if workload:
            q = q.where(DecisionRow.workload == workload)
        if actor:
            q = q.where(DecisionRow.actor == actor)
        if before is not None:
            q = q.where(DecisionRow.id < before)
        if since is not None:
            q = q.where(DecisionRow.at >= since)
        rows = s.scalars(q.order_by(DecisionRow.id.desc()).limit(scan))
        out: list[DecisionRow] = []
        needle = text.lower() if text else None
        for r in rows:
            if needle and needle not in r.reason.lower() and needle not in str(
                    r.detail).lower() and needle not in (r.workload or "").lower():
                continue
            if keep is not None and not keep(r):
                continue
            out.append(r)
            if len(out) >= limit:
                break
        return out


def audit_trail(ledger: Ledger, *, kinds: Iterable[str], since: float | None = None,
                until: float | None = None, before: int | None = None, limit: int = 100,
                scan: int = 20000, keep: Any = None
                ) -> list[tuple[DecisionRow, WorkloadRow | None]]:
    """The administrative part of the audit log (the Audit page): decisions of ``kinds`` in
    ``[since, until)``, newest first, each with the workload it is about (None for grant and
    node changes). ``keep(decision, workload)`` says what the caller may see (a manager: their
    subtree); at most ``scan`` rows are looked at, so one page never reads the whole log."""
    with ledger.ro() as s:
        q = (select(DecisionRow, WorkloadRow)
             .outerjoin(WorkloadRow, DecisionRow.workload == WorkloadRow.id)
             .where(DecisionRow.kind.in_(list(kinds))))
        if since is not None:
            q = q.where(DecisionRow.at >= since)
        if until is not None:
            q = q.where(DecisionRow.at < until)
        if before is not None:
            q = q.where(DecisionRow.id < before)
        out: list[tuple[DecisionRow, WorkloadRow | None]] = []
        for d, w in s.execute(q.order_by(DecisionRow.id.desc()).limit(scan)):
            if keep is not None and not keep(d, w):
                continue
            out.append((d, w))
            if len(out) >= limit:
                break
        return out


def costs(ledger: Ledger, workloads: Iterable[str], now: float) -> dict[str, float]:
    """GPU-hours charged so far to each workload (every attempt; open intervals up to now)."""
    ids = list(workloads)
    if not ids:
        return {}
    out = dict.fromkeys(ids, 0.0)
    with ledger.ro() as s:
        for wid, milli, start, end in s.execute(
                select(ChargeRow.workload, ChargeRow.milli, ChargeRow.start, ChargeRow.end)
                .where(ChargeRow.workload.in_(ids))):
            out[wid] += milli / 1000 * max(0.0, (now if end is None else end) - start) / 3600
    return out


def workloads_by_id(ledger: Ledger, ids: Iterable[str]) -> list[WorkloadRow]:
    wanted = list(ids)
    if not wanted:
        return []
    with ledger.ro() as s:
        return list(s.scalars(select(WorkloadRow).where(WorkloadRow.id.in_(wanted))))
