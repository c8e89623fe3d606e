"""Members' limits set through the REST API, kept in the ledger.

The budgets file may set ``member_limits:`` on a project (core/members.py); a project's
managers and the admins change them through ``PUT /accounts/{project}/member_limits/{user}``.
What the API set lives in the ledger's service state under :data:`KEY` as JSON,
``{project: {user: {"gpu_hours": …, "gpus": …} | null}}`` (null: cleared, even where the file
sets one), and is laid over the file's tree wherever the service builds it for a cycle, a
quote or a page (:func:`with_ledger_limits`)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.orm import Session

from jupyter_gpubudget.core.accounts import AccountTree, MemberLimit
from jupyter_gpubudget.ledger import Ledger
from jupyter_gpubudget.ledger.models import DecisionRow, ServiceStateRow

KEY = "member_limits"


def read(ledger: Ledger) -> dict[str, dict[str, Any]]:
    raw = ledger.get_state(KEY)
    return json.loads(raw) if raw else {}


def with_ledger_limits(tree: AccountTree, ledger: Ledger) -> AccountTree:
    """``tree`` with the limits the API set laid over the file's (projects and members the
    tree no longer has are left out)."""
    for project, users in read(ledger).items():
        if not tree.is_project(project):
            continue
        for user, lim in users.items():
            limit = MemberLimit(lim.get("gpu_hours"), lim.get("gpus")) if lim else None
            if tree.member_limit(project, user) != limit:
                tree = tree.with_member_limit(project, user, limit)
    return tree


def store(s: Session, project: str, user: str, limit: MemberLimit | None, by: str,
          now: float, note: str) -> None:
    """Keep ``user``'s limit in ``project`` (None: cleared) and audit it, in transaction
    ``s``."""
    row = s.get(ServiceStateRow, KEY, with_for_update=True)
    data = json.loads(row.value) if row is not None and row.value else {}
    data.setdefault(project, {})[user] = limit.as_json() if limit is not None else None
    value = json.dumps(data, sort_keys=True)
    if row is None:
        s.add(ServiceStateRow(key=KEY, value=value))
    else:
        row.value = value
    s.add(DecisionRow(at=now, kind="member_limit", actor=by, reason=note,
                      detail={"account": project, "user": user,
                              "limit": limit.as_json() if limit is not None else None}))
