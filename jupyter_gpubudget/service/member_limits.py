"""Members' limits set through the REST API, kept in the ledger.

The budgets file may set ``member_limits:`` on a project (core/members.py); a project's
managers and the admins change them through ``PUT /accounts/{project}/member_limits/{user}``.
What the API set lives in the ledger's service state under :data:`KEY` as JSON,
``{project: {user: {"gpu_hours": …, "gpus": …} | null}}`` (null: cleared, even where the file
sets one), and is laid over the file's tree wherever the service builds it for a cycle, a
quote or a page (:func:`with_ledger_limits`). The sidebar reads a member's own limits and
where they stand against them on ``GET /accounts`` (:func:`mine`)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.orm import Session

from jupyter_gpubudget.core.accounts import AccountTree, MemberLimit
from jupyter_gpubudget.core.members import over_limit_words
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


def mine(tree: AccountTree, user: str, sched: Any) -> dict[str, dict[str, Any]]:
    """Per project in which ``user`` has a limit (``tree`` with the API's laid over): the
    limit, what they used in the window and the GPUs their backed work holds as the last
    cycle saw them (``sched``, the quoter's scheduler; None: no cycle yet, figures null), and
    the words the sidebar shows."""
    out: dict[str, dict[str, Any]] = {}
    st = sched.backing.st if sched is not None else None
    for project in tree.projects_of(user):
        lim = tree.member_limit(project, user)
        if lim is None:
            continue
        used = st.member_usage.get((project, user), 0.0) if st is not None else None
        gpus = sched.backing.member_gpus.get((project, user), 0.0) if st is not None else None
        words = None
        if used is not None and gpus is not None:
            if lim.gpu_hours is not None and used >= lim.gpu_hours - 1e-9:
                words = over_limit_words(project, ("gpu_hours", used, lim.gpu_hours, 0.0))
            elif lim.gpus is not None and gpus >= lim.gpus - 1e-9:
                words = over_limit_words(project, ("gpus", gpus, lim.gpus, 0.0))
            else:
                parts = ([f"{used:.0f} of {lim.gpu_hours:g} GPU-h"]
                         if lim.gpu_hours is not None else []) + (
                    [f"{gpus:g} of {lim.gpus:g} GPUs running"] if lim.gpus is not None else [])
                words = f"your member limit in {project}: {', '.join(parts)}"
        out[project] = {**lim.as_json(), "used_hours": used, "running_gpus": gpus,
                        "over": bool(words and "runs unbacked" in words), "text": words}
    return out


def overview(tree: AccountTree, user: str, is_admin: bool, sched: Any) -> list[dict[str, Any]]:
    """The Accounts page's members' limits (``tree`` with the API's laid over): per project
    whose limits the caller may set (an admin, a manager of it or of an account above), every
    member with their limit (None: none) and where they stand (GPU-hours charged in the window
    and GPUs their backed work holds, as the last cycle saw them; None before the first
    cycle); for a plain member only their own limits, read-only."""
    st = sched.backing.st if sched is not None else None
    out: list[dict[str, Any]] = []
    for project in tree.projects():
        path = tree.path(project)
        members = sorted({u for a in path for u in (*tree.get(a).members,
                                                     *tree.get(a).managers)})
        may_set = is_admin or tree.can_manage(user, project)
        if not may_set:
            if user not in members or tree.member_limit(project, user) is None:
                continue
            members = [user]
        rows = []
        for u in members:
            lim = tree.member_limit(project, u)
            rows.append({
                "user": u, "gpu_hours": lim.gpu_hours if lim is not None else None,
                "gpus": lim.gpus if lim is not None else None,
                "used_hours": st.member_usage.get((project, u), 0.0) if st is not None else None,
                "running_gpus": (sched.backing.member_gpus.get((project, u), 0.0)
                                 if st is not None else None)})
        out.append({"project": project, "may_set": may_set, "members": rows})
    return out
