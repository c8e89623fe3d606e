"""Members' limits in a project: GPU-hours per window and GPUs running at once that the
project's grant backs of one member's work (core/members.py). Read by anyone who sees the
project; set and cleared by an admin or a manager of the project or of an account above it
(the same authorisation as a grant change, where a project's own managers may cap its
members), each change in the audit log."""

from __future__ import annotations

from typing import Any

from jupyter_gpubudget.core.accounts import AccountTree
from jupyter_gpubudget.core.members import LIMIT_KEYS, MemberLimit, limit_problem, valid_user_name
from jupyter_gpubudget.launcher.policy import MAX_NOTE_CHARS

from .. import member_limits
from ..auth import SCOPE_MANAGE, Caller, Denied
from ..base import ApiError, BaseHandler


def require_cap(c: Caller, tree: AccountTree, project: str) -> None:
    """May set a limit in ``project``: admins any; a manager of it or of an account above."""
    if c.is_admin:
        return
    c.require_scope(SCOPE_MANAGE)
    if not tree.can_manage(c.name, project):
        raise Denied(f"user {c.name!r} does not manage project {project!r}")


def parse_limit(body: Any) -> tuple[MemberLimit, str]:
    """A PUT body ``{"gpu_hours": …, "gpus": …, "note": …}`` (either limit may be left out or
    null, not both): the limit and the note, or a 400 naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "body: expected a JSON object such as "
                            '{"gpu_hours": 200, "gpus": 4}', "body")
    for key in body:
        if key not in (*LIMIT_KEYS, "note"):
            raise ApiError(400, f"{key}: unknown field (expected gpu_hours, gpus, note)", key)
    got: dict[str, float] = {}
    for key in LIMIT_KEYS:
        v = body.get(key)
        if v is None:
            continue
        why = limit_problem(key, v)
        if why is not None:
            raise ApiError(400, why, key)
        got[key] = float(v)
    if not got:
        raise ApiError(400, "gpu_hours: give gpu_hours, gpus or both (DELETE clears a limit)",
                       "gpu_hours")
    note = body.get("note", "")
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise ApiError(400, f"note: expected text of at most {MAX_NOTE_CHARS} characters", "note")
    return MemberLimit(got.get("gpu_hours"), got.get("gpus")), note


class MemberLimitsHandler(BaseHandler):
    """GET the project's members' limits (the budgets file's with the API's laid over)."""

    async def get(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_see_account(self.tree, name)
        svc = self.svc
        tree = await self.db(member_limits.with_ledger_limits, self.tree, svc.ledger)
        self.send({"account": name, "member_limits": {
            u: lim.as_json() for u, lim in tree.get(name).member_limits}})


class MemberLimitHandler(BaseHandler):
    """PUT sets one member's limit in a project, DELETE clears it."""

    async def put(self, name: str, user: str) -> None:
        c, tree = await self._check(name, user)
        limit, note = parse_limit(self.body())
        await self._store(c, name, user, limit, note)

    async def delete(self, name: str, user: str) -> None:
        c, _ = await self._check(name, user)
        await self._store(c, name, user, None, "")

    async def _check(self, name: str, user: str) -> tuple[Caller, AccountTree]:
        c = await self.caller()
        self.account_or_404(name)
        tree = self.tree
        require_cap(c, tree, name)
        if not tree.is_project(name):
            raise ApiError(400, f"account: {name!r} is not a project; member limits go on a "
                                "project (an account without children)", "account")
        if not valid_user_name(user):
            raise ApiError(400, f"user: {user[:64]!r} is not a user name (letters, digits and "
                                "'-_.@+')", "user")
        if name not in tree.projects_of(user):
            raise ApiError(400, f"user: {user!r} is not a member of {name!r}", "user")
        return c, tree

    async def _store(self, c: Caller, name: str, user: str, limit: MemberLimit | None,
                     note: str) -> None:
        svc = self.svc

        def apply() -> None:
            with svc.ledger.tx() as s:
                member_limits.store(s, name, user, limit, c.name, svc.clock(), note)

        await self.db(apply)
        svc.kick()
        self.send({"account": name, "user": user,
                   "limit": limit.as_json() if limit is not None else None})


_NAME = r"([^/]+)"
API_ROUTES = [
    (f"/accounts/{_NAME}/member_limits", MemberLimitsHandler),
    (f"/accounts/{_NAME}/member_limits/{_NAME}", MemberLimitHandler),
]
