"""Members' requests for more GPU-hours for a project (``budget_requests``) and their answers.

A request is *pending* until one of the project's managers (or an admin) *grants* it — the
project's grant is raised through the ordinary grant change (``Ledger.set_grant``, in the same
transaction, whose version the request keeps) — or *declines* it with a note. Every step is
also a decision (``budget-request``, ``budget-granted``, ``budget-declined``: the audit log and
the notices of those concerned; ``detail.notify`` names who is told).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from .models import BudgetRequestRow, DecisionRow
from .store import LedgerError

#: decision kinds of budget requests (the notices of ``service/budget_requests.py``)
REQUEST_KINDS = ("budget-request", "budget-granted", "budget-declined")


def request_json(r: BudgetRequestRow) -> dict[str, Any]:
    return {"id": r.id, "project": r.project, "user": r.user, "gpu_hours": r.gpu_hours,
            "reason": r.reason, "state": r.state, "created_at": r.created_at,
            "decided_at": r.decided_at, "decided_by": r.decided_by, "note": r.note,
            "grant_version": r.grant_version}


def create(s: Session, *, project: str, user: str, gpu_hours: float, reason: str, now: float,
           notify: list[str]) -> BudgetRequestRow:
    """A new pending request (409 while the same member has one pending for the project)."""
    dup = s.scalar(select(BudgetRequestRow.id).where(
        BudgetRequestRow.state == "pending", BudgetRequestRow.project == project,
        BudgetRequestRow.user == user).limit(1))
    if dup is not None:
        raise LedgerError(409, f"you already asked for more GPU-hours for {project!r} "
                                f"(request {dup}, still pending): wait for its answer")
    row = BudgetRequestRow(project=project, user=user, gpu_hours=gpu_hours, reason=reason,
                           state="pending", created_at=now, note="")
    s.add(row)
    s.flush()
    s.add(DecisionRow(at=now, cycle=0, kind="budget-request", workload=None, actor=user,
                      reason=reason, detail={"request": row.id, "project": project,
                                             "user": user, "gpu_hours": gpu_hours,
                                             "notify": notify}))
    return row


def pending(s: Session, rid: int) -> BudgetRequestRow:
    """The request, still pending (404 unknown, 409 answered already), locked for update."""
    row = s.get(BudgetRequestRow, rid, with_for_update=True)
    if row is None:
        raise LedgerError(404, f"no budget request {rid}")
    if row.state != "pending":
        raise LedgerError(409, f"budget request {rid} was {row.state} already "
                                f"(by {row.decided_by})")
    return row


def decide(s: Session, row: BudgetRequestRow, *, state: str, by: str, now: float, note: str,
           grant_version: int | None = None, detail: dict | None = None) -> None:
    """Record the answer on the request and as a decision telling the requester."""
    row.state, row.decided_by, row.decided_at, row.note = state, by, now, note
    row.grant_version = grant_version
    s.add(DecisionRow(at=now, cycle=0, kind=f"budget-{state}", workload=None, actor=by,
                      reason=note, detail={"request": row.id, "project": row.project,
                                           "user": row.user, "gpu_hours": row.gpu_hours,
                                           "notify": [row.user], **(detail or {})}))


def listing(s: Session, *, projects: list[str] | None, user: str | None, states: list[str],
            limit: int = 200) -> list[BudgetRequestRow]:
    """Requests in ``states``, newest first: of ``projects`` (None: every project) or made by
    ``user``."""
    q = select(BudgetRequestRow).where(BudgetRequestRow.state.in_(states))
    if projects is not None:
        cond: list[Any] = [BudgetRequestRow.project.in_(projects)]
        if user is not None:
            cond.append(BudgetRequestRow.user == user)
        q = q.where(or_(*cond))
    return list(s.scalars(q.order_by(BudgetRequestRow.id.desc()).limit(limit)))


def decisions_for(s: Session, user: str, after: int = 0, limit: int = 200
                  ) -> list[DecisionRow]:
    """Budget-request decisions that tell ``user`` something (None: anyone), newest first."""
    rows = s.scalars(select(DecisionRow).where(DecisionRow.kind.in_(REQUEST_KINDS),
                                               DecisionRow.id > after)
                     .order_by(DecisionRow.id.desc()).limit(limit))
    return [d for d in rows if user in ((d.detail or {}).get("notify") or [])]
