"""Accounts: the tree's figures, grant history, grant changes, usage."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import select
from sqlalchemy.orm import Session

from jupyter_gpubudget.core.model import ChargeInterval
from jupyter_gpubudget.core.usage import usage_by_span
from jupyter_gpubudget.ledger.models import DecisionRow, GrantRow

from .. import member_limits
from ..base import ApiError, BaseHandler
from ..state import tree_with_ledger_grants
from ..validate import parse_grant
from ..views import grant_json


class AccountsHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        visible = c.visible_accounts(self.tree)
        grants = await self.db(self.svc.ledger.current_grants)
        accounts = [self.svc.account_json(n, grants.get(n)) for n in sorted(visible)]
        # the caller's own limits as a member (the sidebar's words: service/member_limits.py)
        tree = await self.db(member_limits.with_ledger_limits, self.tree, self.svc.ledger)
        quoter = self.svc.loop.view.quoter
        mine = member_limits.mine(tree, c.name, quoter.sched if quoter is not None else None)
        for a in accounts:
            if a["name"] in mine:
                a["my_limit"] = mine[a["name"]]
        self.send({"accounts": accounts})


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
            hours = svc.inventory.gpu_count * svc.budgets.policy.window / 3600
            c.require_within_parent(before, after, name, hours)
            approval = c.grant_approval(before, after, name, hours, svc.budgets.admins,
                                        svc.budgets.policy.managers_fund_own_projects,
                                        g["requested_by"])
            now = svc.clock()
            with svc.ledger.tx() as s:
                row = svc.ledger.set_grant(name, g["grant_hours"], g["share_pct"], by=c.name,
                                           now=now, note=g["note"], s=s)
                if approval:  # the audit entry says who asked and who approved
                    note_approval(s, row, c.name, now, approval)
            return row

        row = await self.db(apply)
        self.svc.kick()
        self.send({"account": name, "grant": grant_json(row)})


def note_approval(s: Session, row: GrantRow, actor: str, now: float, approval: dict) -> None:
    """Add who asked for and who approved a grant change to its audit entry (the decision the
    ledger recorded with it, in the same transaction)."""
    for d in s.scalars(select(DecisionRow).where(
            DecisionRow.kind == "grant", DecisionRow.actor == actor, DecisionRow.at == now)
            .order_by(DecisionRow.id.desc()).limit(20)):
        det = d.detail or {}
        if det.get("account") == row.account and det.get("version") == row.version:
            d.detail = {**det, **approval}
            return


class UsageHandler(BaseHandler):
    async def get(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_see_account(self.tree, name)
        self.send(self.svc.usage_json(name))


_TZ = re.compile(r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}$")


def time_zone(name: str) -> ZoneInfo:
    """An IANA zone name (``Europe/Berlin``, ``UTC``) or a 400 naming the field ``tz``."""
    if len(name) > 64 or not _TZ.fullmatch(name):
        raise ApiError(400, f"tz: {name[:64]!r} is not an IANA time zone name such as "
                            "'Europe/Berlin' or 'UTC'", "tz")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ApiError(400, f"tz: unknown time zone {name!r}", "tz") from None


def day_spans(now: float, window: float, tz: ZoneInfo) -> list[tuple[date, float, float]]:
    """The days of ``tz`` that overlap ``[now - window, now]``, oldest first, each clipped to
    that range: ``(date, start, end)``. Days are local midnight to midnight (23 or 25 hours
    long when the clocks change)."""
    lo = now - window
    day = datetime.fromtimestamp(lo, tz).date()
    today = datetime.fromtimestamp(now, tz).date()
    out = []
    while day <= today:
        start = datetime(day.year, day.month, day.day, tzinfo=tz).timestamp()
        nxt = day + timedelta(days=1)
        end = datetime(nxt.year, nxt.month, nxt.day, tzinfo=tz).timestamp()
        out.append((day, max(start, lo), min(end, now)))
        day = nxt
    return out


class UsageDailyHandler(BaseHandler):
    """GPU-hours per day of ``tz`` over the usage window, for the account and everything
    below it, from the ledger's charge intervals (slice fraction × wall time; no decay)."""

    async def get(self, name: str) -> None:
        c = await self.caller()
        self.account_or_404(name)
        c.require_see_account(self.tree, name)
        tz_name = self.get_query_argument("tz", "UTC")
        tz = time_zone(tz_name)
        tree, svc = self.tree, self.svc
        window = svc.policy().window
        below = {p for p in tree.projects() if name in tree.path(p)}

        def work() -> tuple[float, list]:
            now = svc.clock()
            charges = [ChargeInterval(r.workload, r.project, r.user, r.milli, r.start, r.end)
                       for r in svc.ledger.charges(since=now - window) if r.project in below]
            return now, charges

        now, charges = await self.db(work)
        spans = day_spans(now, window, tz)
        hours = usage_by_span(charges, [(a, b) for _, a, b in spans], now,
                              svc.policy().off_peak)
        self.send({"account": name, "tz": tz_name, "window_s": window,
                   "days": [{"date": d.isoformat(), "start": a, "end": b, "gpu_hours": h}
                            for (d, a, b), h in zip(spans, hours, strict=True)],
                   "computed_at": now})


_NAME = r"([^/]+)"  # account names follow the budgets file; unknown ones are a 404
API_ROUTES = [
    ("/accounts", AccountsHandler),
    (f"/accounts/{_NAME}", AccountHandler),
    (f"/accounts/{_NAME}/grants", GrantHistoryHandler),
    (f"/accounts/{_NAME}/grant", GrantHandler),
    (f"/accounts/{_NAME}/usage", UsageHandler),
    (f"/accounts/{_NAME}/usage/daily", UsageDailyHandler),
]
