"""Accounts: the tree's figures, grant history, grant changes, usage."""

from __future__ import annotations

from jupyter_gpubudget.ledger.models import GrantRow

from ..base import BaseHandler
from ..state import tree_with_ledger_grants
from ..validate import parse_grant
from ..views import grant_json


class AccountsHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        visible = c.visible_accounts(self.tree)
        grants = await self.db(self.svc.ledger.current_grants)
        self.send({"accounts": [self.svc.account_json(n, grants.get(n))
                                for n in sorted(visible)]})


class AccountHandler(BaseHandler):
    async def get(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_see_account(self.tree, name)
        grants = await self.db(self.svc.ledger.current_grants)
        self.send(self.svc.account_json(name, grants.get(name)))


class GrantHistoryHandler(BaseHandler):
    async def get(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_see_account(self.tree, name)
        history = await self.db(self.svc.ledger.grant_history, name)
        self.send({"account": name, "versions": [grant_json(g) for g in history]})


class GrantHandler(BaseHandler):
    async def put(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_manage(self.tree, name)
        g = parse_grant(self.body())
        svc = self.svc

        def apply() -> GrantRow:
            before = tree_with_ledger_grants(self.tree, svc.ledger)
            after = before.with_grant(name, g["grant_hours"], g["share_pct"])
            c.require_within_parent(before, after, name, svc.inventory.gpu_count
                                    * svc.budgets.policy.window / 3600)
            return svc.ledger.set_grant(name, g["grant_hours"], g["share_pct"], by=c.name,
                                        now=svc.clock(), note=g["note"])

        row = await self.db(apply)
        self.svc.kick()
        self.send({"account": name, "grant": grant_json(row)})


class UsageHandler(BaseHandler):
    async def get(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_see_account(self.tree, name)
        self.send(self.svc.usage_json(name))


_NAME = r"([^/]+)"  # account names follow the budgets file; unknown ones are a 404
API_ROUTES = [
    ("/accounts", AccountsHandler),
    (f"/accounts/{_NAME}", AccountHandler),
    (f"/accounts/{_NAME}/grants", GrantHistoryHandler),
    (f"/accounts/{_NAME}/grant", GrantHandler),
    (f"/accounts/{_NAME}/usage", UsageHandler),
]
