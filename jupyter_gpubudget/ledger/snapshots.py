"""Snapshots in the ledger: what was taken, what went bad, what was lost.

The store (``jupyter_gpubudget.snapshot.store``) holds the bytes and is the authority on
whether a snapshot verifies; these functions keep the ``snapshots`` table and the audit log in
step with it, so the service can list a session's snapshots, quote their cost and show a loss.
Snapshot time is never charged: nothing here touches charge intervals.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from .models import DecisionRow, SnapshotRow, WorkloadRow
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


# ---------------------------------------------------------------- snapshot sets (phase 2)
# A session's snapshot is a *set* (jupyter_gpubudget.snapshot.sets): one row per set, ``method``
# the methods used ("criu", "namespace", "criu+namespace"; "none" when no kernel could be
# saved), ``detail`` what each kernel saved or why not, and why the set was taken.

def record_set(ledger: Ledger, summary: dict, now: float, actor: str) -> SnapshotRow:
    """Record a snapshot set a user's server took (``Sets.summary`` plus ``pruned`` and
    ``request``); the sets its retention or quota deleted are marked deleted. Idempotent per
    id: a repeated report changes nothing but its status."""
    members = summary.get("members") or []
    kernels = [{
        "kernel_name": str(m.get("kernel_name", ""))[:100],
        "notebooks": [str(s.get("path", ""))[:500] for s in (m.get("sessions") or [])][:50],
        "method": m.get("method"), "saved": bool(m.get("snapshot")),
        "error": (str(m["error"])[:1000] if m.get("error") else None),
        "variables": len(m.get("variables") or []),
        "unsaved": {str(k)[:200]: str(v)[:300]
                    for k, v in list((m.get("unsaved") or {}).items())[:50]},
        "raw_bytes": int(m.get("raw_bytes") or 0), "stored_bytes": int(m.get("stored_bytes") or 0),
    } for m in members[:100]]
    methods = sorted({k["method"] for k in kernels if k["method"]})
    detail = {"reason": summary.get("reason", "user"), "kernels": kernels,
              "saved": sum(1 for k in kernels if k["saved"]), "count": len(kernels),
              "request": summary.get("request"), "server": summary.get("server", "")}
    with ledger.tx() as s:
        row = s.get(SnapshotRow, summary["id"])
        new = row is None
        if new:
            row = SnapshotRow(id=summary["id"])
            s.add(row)
        row.workload, row.project = summary["session"], summary["project"]
        row.method = "+".join(methods) or "none"
        row.created_at = float(summary["created_at"])
        row.location, row.digest = "user server store", str(summary.get("checksum", ""))[:128]
        row.size, row.raw_size = int(summary.get("stored_bytes") or 0), int(
            summary.get("raw_bytes") or 0)
        row.verified = True
        row.status = "ok"
        row.problem = "" if detail["saved"] == detail["count"] else \
            f"{detail['count'] - detail['saved']} of {detail['count']} kernels not saved"
        row.seconds, row.detail, row.changed_at = float(summary.get("seconds") or 0), detail, now
        if new:
            unsaved = sorted({k for x in kernels for k in x["unsaved"]})
            s.add(DecisionRow(at=now, kind="snapshot", workload=row.workload, actor=actor,
                              reason=f"snapshot {row.id} ({row.method}): {detail['saved']} of "
                                     f"{detail['count']} kernels saved",
                              detail={"snapshot": row.id, "bytes": row.size, "unsaved": unsaved,
                                      "reason": detail["reason"], "request": detail["request"]}))
        for old in summary.get("pruned", []) or []:
            if isinstance(old, str):
                _set_status(s, old, "deleted", "retention or quota", now)
        s.flush()
        return row


def set_json(row: SnapshotRow) -> dict:
    d = row.detail or {}
    return {"id": row.id, "session": row.workload, "project": row.project,
            "created_at": row.created_at, "method": row.method, "status": row.status,
            "problem": row.problem, "stored_bytes": row.size, "raw_bytes": row.raw_size,
            "seconds": row.seconds, "reason": d.get("reason"), "kernels": d.get("kernels", []),
            "saved": d.get("saved"), "count": d.get("count")}


def sets_of(ledger: Ledger, workloads: list[str], statuses: tuple[str, ...] = ("ok", "bad")
            ) -> list[SnapshotRow]:
    with ledger.ro() as s:
        return list(s.scalars(select(SnapshotRow).where(
            SnapshotRow.workload.in_(workloads), SnapshotRow.status.in_(statuses))
            .order_by(SnapshotRow.created_at.desc(), SnapshotRow.id.desc())))


def sets_of_user(ledger: Ledger, user: str | None, statuses: tuple[str, ...] = ("ok", "bad"),
                 limit: int = 200) -> list[tuple[SnapshotRow, WorkloadRow]]:
    with ledger.ro() as s:
        q = (select(SnapshotRow, WorkloadRow)
             .join(WorkloadRow, SnapshotRow.workload == WorkloadRow.id)
             .where(SnapshotRow.status.in_(statuses)))
        if user is not None:
            q = q.where(WorkloadRow.user == user)
        q = q.order_by(SnapshotRow.created_at.desc(), SnapshotRow.id.desc()).limit(limit)
        return [(a, b) for a, b in s.execute(q)]


def project_bytes(ledger: Ledger, project: str, exclude_user: str | None = None) -> int:
    """Bytes of a project's usable snapshots (of other users than ``exclude_user``)."""
    with ledger.ro() as s:
        q = (select(SnapshotRow.size).join(WorkloadRow, SnapshotRow.workload == WorkloadRow.id)
             .where(SnapshotRow.project == project, SnapshotRow.status == "ok"))
        if exclude_user is not None:
            q = q.where(WorkloadRow.user != exclude_user)
        return int(sum(int(x or 0) for (x,) in s.execute(q)))


def resume_chain(ledger: Ledger, workload: str, depth: int = 20) -> list[str]:
    """The session and the ones it resumed (newest first): snapshots of a resumed session
    belong to what the user sees as the same server."""
    out = [workload]
    with ledger.ro() as s:
        while len(out) < depth:
            d = s.scalars(select(DecisionRow).where(
                DecisionRow.workload == out[-1], DecisionRow.kind == "resume")
                .order_by(DecisionRow.id.desc()).limit(1)).first()
            prev = (d.detail or {}).get("resumes") if d is not None else None
            if not prev or prev in out:
                return out
            out.append(prev)
    return out


REQUEST_DONE = ("snapshot", "restore", "snapshot-request-failed")


def open_requests(ledger: Ledger, workload: str, since: float) -> list[dict]:
    """Snapshot or restore requests for a running session that its server has not answered
    yet (delivered to it by BudgetSpawner)."""
    with ledger.ro() as s:
        rows = list(s.scalars(select(DecisionRow).where(
            DecisionRow.workload == workload, DecisionRow.at >= since,
            DecisionRow.kind.in_(("snapshot-request", *REQUEST_DONE)))
            .order_by(DecisionRow.id)))
    asked: dict[str, dict] = {}
    for d in rows:
        rid = (d.detail or {}).get("request")
        if not rid:
            continue
        if d.kind == "snapshot-request":
            asked[rid] = {"request": rid, "action": d.detail.get("action"),
                          "snapshot": d.detail.get("snapshot"), "at": d.at, "by": d.actor}
        else:
            asked.pop(rid, None)
    return list(asked.values())


def request_outcome(ledger: Ledger, workload: str, request: str) -> dict | None:
    """What became of a request: the decision that answered it, or None while open."""
    with ledger.ro() as s:
        for d in s.scalars(select(DecisionRow).where(
                DecisionRow.workload == workload, DecisionRow.kind.in_(REQUEST_DONE))
                .order_by(DecisionRow.id.desc()).limit(200)):
            if (d.detail or {}).get("request") == request:
                return {"kind": d.kind, "at": d.at, "reason": d.reason, "detail": d.detail}
    return None


def snapshot_history(ledger: Ledger, since: float) -> dict[str, dict]:
    """Per user, what their sessions' snapshots cost and how reliable they were since
    ``since``: ``dump_s`` and ``restore_s`` (means of the last 10), ``tries`` and ``ok``
    (snapshots taken for a preemption or hibernation, and those that saved every kernel;
    a recorded loss counts as a try that failed)."""
    out: dict[str, dict] = {}
    with ledger.ro() as s:
        q = (select(SnapshotRow, WorkloadRow.user)
             .join(WorkloadRow, SnapshotRow.workload == WorkloadRow.id)
             .where(SnapshotRow.created_at >= since).order_by(SnapshotRow.created_at.desc()))
        for row, user in s.execute(q):
            st = out.setdefault(user, {"dumps": [], "restores": [], "tries": 0, "ok": 0})
            d = row.detail or {}
            if d.get("count") is None:  # a phase-1 per-kernel row: no set detail
                continue
            if len(st["dumps"]) < 10:
                st["dumps"].append(float(row.seconds or 0.0))
            if d.get("reason") in ("preempt", "hibernate"):
                st["tries"] += 1
                st["ok"] += 1 if d.get("saved") == d.get("count") else 0
        q2 = (select(DecisionRow, WorkloadRow.user)
              .join(WorkloadRow, DecisionRow.workload == WorkloadRow.id)
              .where(DecisionRow.at >= since,
                     DecisionRow.kind.in_(("restore", "snapshot_lost")))
              .order_by(DecisionRow.id.desc()))
        for d, user in s.execute(q2):
            st = out.setdefault(user, {"dumps": [], "restores": [], "tries": 0, "ok": 0})
            if d.kind == "snapshot_lost":
                st["tries"] += 1
            elif len(st["restores"]) < 10 and isinstance((d.detail or {}).get("seconds"),
                                                         int | float):
                st["restores"].append(float(d.detail["seconds"]))
    for st in out.values():
        st["dump_s"] = sum(st["dumps"]) / len(st["dumps"]) if st["dumps"] else None
        st["restore_s"] = sum(st["restores"]) / len(st["restores"]) if st["restores"] else None
    return out
