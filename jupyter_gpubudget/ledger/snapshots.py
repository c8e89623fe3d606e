"""Snapshots in the ledger: what was taken, what went bad, what was lost.

The store (``jupyter_gpubudget.snapshot.store``) holds the bytes and is the authority on
whether a snapshot verifies; these functions keep the ``snapshots`` table and the audit log in
step with it, so the service can list a session's snapshots, quote their cost and show a loss.
Snapshot time is never charged: nothing here touches charge intervals.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from .models import DecisionRow, SnapshotRow
from .store import Ledger, LedgerError


def record_snapshot(ledger: Ledger, snap: Any, now: float, actor: str = "scheduler") -> SnapshotRow:
    """Record a committed snapshot (a ``jupyter_gpubudget.snapshot.Snapshot``); the ones its
    commit pruned (``snap.summary["pruned"]``) are marked deleted. Idempotent per id."""
    with ledger.tx() as s:
        row = s.get(SnapshotRow, snap.id)
        if row is None:
            row = SnapshotRow(id=snap.id)
            s.add(row)
        row.workload, row.project, row.method = snap.session, snap.project, snap.method
        row.created_at, row.location, row.digest = snap.created_at, snap.manifest, snap.digest
        row.size, row.raw_size, row.verified = snap.stored_bytes, snap.raw_bytes, True
        row.status, row.problem, row.changed_at = "ok", "", now
        row.seconds = float(sum(v for v in snap.seconds.values() if isinstance(v, (int, float))))
        detail = {k: v for k, v in snap.summary.items() if k != "pruned"}
        row.detail = detail
        s.add(DecisionRow(at=now, kind="snapshot", workload=snap.session, actor=actor,
                          reason=f"{snap.method} snapshot {snap.id} taken and verified",
                          detail={"snapshot": snap.id, "bytes": snap.stored_bytes,
                                  "unsaved": sorted(detail.get("unsaved", {}))}))
        for old in snap.summary.get("pruned", []):
            _set_status(s, old, "deleted", "retention", now)
        s.flush()
        return row


def _set_status(s: Any, snapshot_id: str, status: str, problem: str, now: float) -> bool:
    row = s.get(SnapshotRow, snapshot_id)
    if row is None:
        return False
    row.status, row.problem, row.changed_at = status, problem, now
    if status == "bad":
        row.verified = False
    return True


def mark_snapshot_bad(ledger: Ledger, snapshot_id: str, problem: str, now: float) -> None:
    """A snapshot failed verification: it is never used again; the problem is kept."""
    with ledger.tx() as s:
        if not _set_status(s, snapshot_id, "bad", problem, now):
            raise LedgerError(404, f"no snapshot {snapshot_id!r}")
        row = s.get(SnapshotRow, snapshot_id)
        s.add(DecisionRow(at=now, kind="snapshot_bad", workload=row.workload, reason=problem,
                          detail={"snapshot": snapshot_id}))


def mark_snapshot_deleted(ledger: Ledger, snapshot_id: str, reason: str, now: float) -> None:
    with ledger.tx() as s:
        if not _set_status(s, snapshot_id, "deleted", reason, now):
            raise LedgerError(404, f"no snapshot {snapshot_id!r}")


def record_snapshot_loss(ledger: Ledger, workload: str, reason: str, now: float,
                         detail: dict | None = None) -> None:
    """A session lost its state (no snapshot could be taken before its grace period ended, or
    none could be restored): recorded in the audit log, shown to its user."""
    ledger.record_decision(now=now, kind="snapshot_lost", workload=workload, reason=reason,
                           detail=detail or {})


def snapshots_of(ledger: Ledger, workload: str, *, statuses: tuple[str, ...] = ("ok", "bad")
                 ) -> list[SnapshotRow]:
    """A session's snapshots, newest first (deleted ones only when asked for)."""
    with ledger.ro() as s:
        return list(s.scalars(select(SnapshotRow).where(
            SnapshotRow.workload == workload, SnapshotRow.status.in_(statuses))
            .order_by(SnapshotRow.created_at.desc(), SnapshotRow.id.desc())))


def snapshot_bytes_by_project(ledger: Ledger) -> dict[str, int]:
    """Bytes of usable snapshots per project, as recorded (the store counts shared chunks once;
    this sum counts them per snapshot, an upper bound)."""
    out: dict[str, int] = {}
    with ledger.ro() as s:
        for project, size in s.execute(select(SnapshotRow.project, SnapshotRow.size)
                                       .where(SnapshotRow.status == "ok")):
            out[project] = out.get(project, 0) + int(size or 0)
    return out
