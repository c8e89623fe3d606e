"""Who is calling, and what they may do.

Identity comes from JupyterHub (``HubOAuth``: an ``Authorization: token`` header, or the OAuth
cookie — then only with JupyterHub's XSRF check for state changes). Authority needs both:

- a **scope on the token** (JupyterHub RBAC custom scopes), and only gpubudget's own:
  ``custom:gpubudget:read`` (own workloads, own projects' figures; so does
  ``access:services!service=gpubudget``, the OAuth login to this service),
  ``custom:gpubudget:submit`` (submit and cancel own jobs; implies read),
  ``custom:gpubudget:manage`` (redistribute grants below the accounts one manages),
  ``custom:gpubudget:admin`` (everything). A token's scopes bound what anyone can do, admins
  included: an admin's token down-scoped to read can only read. Another service's
  ``access:services`` scope counts for nothing here.
- a **relation in the budgets file**: project membership (who may charge what) and account
  managers.

Every refusal is a 403 with the reason; a token that lacks a scope is told which.

Each verb declares the scope it needs with :func:`needs_scope` (JupyterHub's ``@needs_scope``
habit): reads need ``read``; every change to a user's work — submitting, cancelling, ending
a session, reporting it idle, its heartbeats, asking for a snapshot or a restore, what its
server reports about them — needs ``submit`` (and then it must be the caller's own, or the
caller an admin).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from jupyter_gpubudget.core.accounts import AccountTree, grant_approvers, self_funded

SCOPE_READ = "custom:gpubudget:read"
SCOPE_SUBMIT = "custom:gpubudget:submit"
SCOPE_MANAGE = "custom:gpubudget:manage"
SCOPE_ADMIN = "custom:gpubudget:admin"

CUSTOM_SCOPES = {
    SCOPE_READ: {"description": "Read your own GPU workloads and your projects' budgets."},
    SCOPE_SUBMIT: {"description": "Submit and cancel your own GPU batch jobs.",
                   "subscopes": [SCOPE_READ]},
    SCOPE_MANAGE: {"description": "Change grants of the accounts you manage.",
                   "subscopes": [SCOPE_READ]},
    SCOPE_ADMIN: {"description": "Administer GPU budgets: every account, grant and workload.",
                  "subscopes": [SCOPE_READ, SCOPE_SUBMIT, SCOPE_MANAGE]},
}


def needs_scope(scope: str) -> Callable[[Callable[..., Awaitable[None]]],
                                        Callable[..., Awaitable[None]]]:
    """Declare the scope a handler's verb needs: the caller's token is checked before
    anything else (a 403 naming the scope; nothing is looked up or changed)::

        @needs_scope(SCOPE_SUBMIT)
        async def delete(self, wid): ...

    The handler then gets the same :class:`Caller` from ``await self.caller()``."""
    if scope not in CUSTOM_SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    def wrap(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        @functools.wraps(method)
        async def checked(self: Any, *args: Any, **kw: Any) -> None:
            c = await self.caller()
            c.require_scope(scope)
            await method(self, *args, **kw)

        checked.__needs_scope__ = scope  # type: ignore[attr-defined]
        return checked

    return wrap


class Denied(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Caller:
    name: str
    kind: str  # "user" or "service"
    scopes: frozenset[str]
    service_name: str = "gpubudget"

    @classmethod
    def from_hub_model(cls, model: dict, service_name: str) -> Caller:
        scopes = frozenset(model.get("scopes") or ())
        return cls(name=model["name"], kind=model.get("kind", "user"), scopes=scopes,
                   service_name=service_name)

    def _has(self, scope: str) -> bool:
        return scope in self.scopes or SCOPE_ADMIN in self.scopes

    @property
    def is_admin(self) -> bool:
        return SCOPE_ADMIN in self.scopes

    @property
    def can_read(self) -> bool:
        return any(self._has(s) for s in (SCOPE_READ, SCOPE_SUBMIT, SCOPE_MANAGE)) or (
            f"access:services!service={self.service_name}" in self.scopes)

    # ------------------------------------------------------------------ checks
    def require_scope(self, scope: str) -> None:
        """The token carries ``scope`` (or one that implies it)."""
        if scope == SCOPE_READ:
            self.require_read()
        elif not self._has(scope):
            raise Denied(f"token lacks scope {scope}"
                         + (f" ({SCOPE_READ} only reads)" if self.can_read else ""))

    def require_read(self) -> None:
        if not self.can_read:
            raise Denied(f"token lacks scope {SCOPE_READ}")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise Denied(f"only gpubudget admins (scope {SCOPE_ADMIN}) may do this")

    def require_submit(self, tree: AccountTree, project: str) -> None:
        if not (self._has(SCOPE_SUBMIT) or self.is_admin):
            raise Denied(f"token lacks scope {SCOPE_SUBMIT}")
        if self.is_admin:
            return
        if project not in tree.projects_of(self.name):
            raise Denied(f"user {self.name!r} is not a member of project {project!r}")

    def require_manage(self, tree: AccountTree, account: str) -> None:
        """May change ``account``'s grant: admins any; a manager only accounts strictly
        below one they manage (an account's own grant is its parent's business)."""
        if self.is_admin:
            return
        if not self._has(SCOPE_MANAGE):
            raise Denied(f"token lacks scope {SCOPE_MANAGE}")
        if not any(self.name in tree.get(a).managers for a in tree.path(account)[:-1]):
            if tree.can_manage(self.name, account):
                raise Denied(f"user {self.name!r} manages {account!r} but only an admin "
                             f"changes its own grant; managers redistribute below it")
            raise Denied(f"user {self.name!r} does not manage account {account!r}")

    def require_within_parent(self, before: AccountTree, after: AccountTree, account: str,
                              cluster_gpu_hours: float) -> None:
        """A manager's change keeps the children of ``account``'s parent within the parent's
        own grant (or at least does not add to an overrun that was already there)."""
        if self.is_admin:
            return
        parent = before.get(account).parent
        if parent is None:
            return
        g0 = before.effective_grants(cluster_gpu_hours)
        g1 = after.effective_grants(cluster_gpu_hours)
        kids = before.get(parent).children
        old, new, cap = sum(g0[k] for k in kids), sum(g1[k] for k in kids), g1[parent]
        if new > cap + 1e-6 and new > old + 1e-6:
            raise Denied(f"the accounts below {parent!r} would be granted {new:g} GPU-hours, "
                         f"more than {parent!r}'s own grant of {cap:g}; a manager "
                         f"redistributes within it (an admin can raise {parent!r}'s grant)")

    def grant_approval(self, before: AccountTree, after: AccountTree, account: str,
                       cluster_gpu_hours: float, admins: frozenset[str], allow_own: bool,
                       requested_by: str | None = None) -> dict:
        """Who approved a grant change, for the audit entry (``{}``: nobody needed to).

        A change that raises the grant of an account its maker charges as a member (a
        manager funding their own project) is refused unless the maker is an admin or the
        policy ``managers_fund_own_projects`` allows it: an admin or another manager of the
        parent who is not a member makes it for them (``requested_by``), and so approves it."""
        funded = self_funded(before, after, self.name, cluster_gpu_hours)
        out: dict = {}
        if requested_by is not None and requested_by != self.name:
            out = {"requested_by": requested_by, "approved_by": self.name}
        if not funded:
            return out
        if self.is_admin:
            return {**out, "funds": list(funded), "approved_by": self.name}
        if allow_own:
            return {**out, "funds": list(funded),
                    "approved_by": "policy:managers_fund_own_projects"}
        parent = before.get(account).parent
        who = [a for a in grant_approvers(before, account, admins, funded) if a != self.name]
        raise Denied(
            f"user {self.name!r} is a member of {', '.join(repr(f) for f in funded)}: a change "
            f"that raises its grant needs an admin or another manager of {parent!r} who is not "
            f"a member ({', '.join(who) or 'none named in the budgets file'}) to make it for "
            f"them, with \"requested_by\": {self.name!r} (the budgets file's policy "
            f"managers_fund_own_projects: true lets managers fund their own projects)")

    def visible_accounts(self, tree: AccountTree) -> set[str]:
        """Accounts whose figures the caller may see: admins all; others the accounts on the
        path to their projects and every account below one they manage."""
        if self.is_admin:
            return set(tree.accounts)
        seen: set[str] = set()
        for p in tree.projects_of(self.name):
            seen.update(tree.path(p))
        for a in tree.accounts:
            if tree.can_manage(self.name, a):
                seen.update(tree.path(a))
        return seen

    def require_see_account(self, tree: AccountTree, account: str) -> None:
        self.require_read()
        if account not in self.visible_accounts(tree):
            raise Denied(f"user {self.name!r} is neither a member nor a manager of {account!r}")

    def require_see_workload(self, owner: str) -> None:
        self.require_read()
        if owner != self.name and not self.is_admin:
            raise Denied("this workload belongs to another user")

    def require_change_workload(self, owner: str) -> None:
        """May change ``owner``'s workload or session (end it, report it idle, beat its
        heart, ask for or report its snapshots): the submit scope, and the caller's own (or
        an admin). Seeing it is not enough."""
        self.require_see_workload(owner)
        self.require_scope(SCOPE_SUBMIT)
