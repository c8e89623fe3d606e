"""Who is calling, and what they may do.

Identity comes from JupyterHub (``HubOAuth``: an ``Authorization: token`` header or the OAuth
cookie). Authority has two sources:

- JupyterHub RBAC custom scopes carried by the token:
  ``custom:gpubudget:read`` (own workloads, own projects' figures),
  ``custom:gpubudget:submit`` (submit and cancel own jobs; implies read),
  ``custom:gpubudget:manage`` (change grants of accounts one manages; implies read),
  ``custom:gpubudget:admin`` (everything). ``access:services`` (the OAuth login to this
  service) counts as read.
- the budgets file: project membership (who may charge what), account managers, admins.

A user needs both: the scope for the kind of action and the budgets-file relation for the
object. Every refusal is a 403 with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_gpubudget.core.accounts import AccountTree

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


class Denied(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Caller:
    name: str
    kind: str  # "user" or "service"
    scopes: frozenset[str]
    budget_admin: bool = False  # listed under `admins:` in the budgets file

    @classmethod
    def from_hub_model(cls, model: dict, admins: frozenset[str], service_name: str) -> Caller:
        scopes = frozenset(model.get("scopes") or ())
        return cls(name=model["name"], kind=model.get("kind", "user"), scopes=scopes,
                   budget_admin=model["name"] in admins)

    def _has(self, scope: str) -> bool:
        return scope in self.scopes or SCOPE_ADMIN in self.scopes

    @property
    def is_admin(self) -> bool:
        # the budgets file's admins still need a token that may act on this service
        return SCOPE_ADMIN in self.scopes or (self.budget_admin and self.can_read)

    @property
    def can_read(self) -> bool:
        return any(self._has(s) for s in (SCOPE_READ, SCOPE_SUBMIT, SCOPE_MANAGE)) or any(
            s == "access:services" or s.startswith("access:services!service=")
            for s in self.scopes)

    # ------------------------------------------------------------------ checks
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
        if self.is_admin:
            return
        if not self._has(SCOPE_MANAGE):
            raise Denied(f"token lacks scope {SCOPE_MANAGE}")
        if not tree.can_manage(self.name, account):
            raise Denied(f"user {self.name!r} does not manage account {account!r}")

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
