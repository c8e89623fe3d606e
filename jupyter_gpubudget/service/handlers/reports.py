"""``GET /reports``: where an account subtree's GPU-hours went over a period — charged, busy
(or unknown), idle, grant, a line per user, waits, preemptions, the sessions that held GPUs
idle longest (``ledger/reports.py``) — as JSON or, with ``?format=csv``, as CSV.

Who sees what (as for accounts): an admin every account; a manager the subtree of an account
they manage; anyone else the totals of their own projects in the subtree and only their own
line inside them."""

from __future__ import annotations

import time
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from jupyter_gpubudget.ledger.reports import BY, Scope, report
from jupyter_gpubudget.usage_report import csv_text

from ..audit import BadFilter, parse_time, safe_cell
from ..auth import Caller, Denied
from ..base import ApiError, BaseHandler
from ..state import tree_with_ledger_grants
from .accounts import time_zone

MAX_DAYS = 3660  # ten years: longer ranges are refused (400), not computed


def report_scope(c: Caller, tree: Any, account: str) -> Scope:
    """The projects under ``account`` the caller may see, and whose lines (403 if none)."""
    below = [p for p in tree.projects() if account in tree.path(p)]
    users_of = {p: sorted(tree.get(p).members) for p in below}
    if c.is_admin or tree.can_manage(c.name, account):
        return Scope(sorted(below), None, users_of)
    mine = sorted(set(below) & set(tree.projects_of(c.name)))
    if not mine:
        raise Denied(f"user {c.name!r} is neither a member of a project in {account!r} nor "
                     f"a manager of it")
    return Scope(mine, c.name, users_of)


def parse_period(get: Any, tz: ZoneInfo, now: float) -> tuple[float, float]:
    """``from``/``to`` (dates, ``to`` included, or dates and times in ``tz``), or
    ``period=day|week|month`` holding ``at`` (a date; default today): (start, end)."""
    period, at = get("period"), get("at")
    raw_from, raw_to = get("from"), get("to")
    try:
        if period is not None:
            if raw_from is not None or raw_to is not None:
                raise ApiError(400, "period: give either period (with at) or from and to",
                               "period")
            if period not in ("day", "week", "month"):
                raise ApiError(400, f"period: expected day, week or month, got "
                                    f"{period[:20]!r}", "period")
            d = datetime.fromtimestamp(now, tz).date() if at is None else _date(at)
            if period == "week":
                d0 = d - timedelta(days=d.weekday())
                d1 = d0 + timedelta(days=7)
            elif period == "month":
                d0 = d.replace(day=1)
                d1 = (d0 + timedelta(days=32)).replace(day=1)
            else:
                d0, d1 = d, d + timedelta(days=1)
            return (datetime(d0.year, d0.month, d0.day, tzinfo=tz).timestamp(),
                    datetime(d1.year, d1.month, d1.day, tzinfo=tz).timestamp())
        if raw_from is None or raw_to is None:
            raise ApiError(400, "from and to (dates such as 2025-03-01), or period=day|week|"
                                "month, are required", "from" if raw_from is None else "to")
        start = parse_time(raw_from, "from", tz)
        end = parse_time(raw_to, "to", tz, end_of_day=True)
    except BadFilter as e:
        raise ApiError(400, f"{e.field}: {e.message}", e.field) from None
    if end <= start:
        raise ApiError(400, "to: the period ends before it starts", "to")
    if end - start > MAX_DAYS * 86400:
        raise ApiError(400, f"to: a report covers at most {MAX_DAYS} days", "to")
    return start, end


def _date(raw: str) -> date:
    try:
        if len(raw) <= 10:
            return date.fromisoformat(raw.strip())
    except ValueError:
        pass
    raise ApiError(400, f"at: expected a date such as 2025-03-01, got {raw[:40]!r}", "at")


class ReportsHandler(BaseHandler):
    async def get(self) -> None:
        c = await self.caller()
        c.require_read()
        q = self.get_query_argument
        account = q("account", None)
        tree, svc = self.tree, self.svc
        if not account:
            raise ApiError(400, "account: required (an account of the budgets file)", "account")
        if account not in tree:
            raise ApiError(400, f"account: no account {account[:200]!r} in the budgets file",
                           "account")
        fmt = q("format", None) or "json"
        if fmt not in ("json", "csv"):
            raise ApiError(400, f"format: expected json or csv, got {fmt[:20]!r}", "format")
        by = q("by", None) or "user"
        if by not in BY:
            raise ApiError(400, f"by: expected day, week or user, got {by[:20]!r}", "by")
        tz_name = q("tz", None) or "UTC"
        tz = time_zone(tz_name)
        scope = report_scope(c, tree, account)
        start, end = parse_period(lambda k: q(k, None), tz, svc.clock())
        window = svc.policy().window
        off_peak = svc.policy().off_peak

        def work() -> dict:
            now = svc.clock()
            hours = svc.inventory.gpu_count * window / 3600
            eff = tree_with_ledger_grants(tree, svc.ledger).effective_grants(hours)
            grants: dict[str, float | None] = {
                n: (eff.get(n) if (tree.get(n).grant_hours is not None
                                   or tree.get(n).share_pct is not None
                                   or not tree.is_project(n)) else None)
                for n in [account, *scope.projects]}
            if scope.only_user is not None:  # a researcher: their projects' grants only
                grants[account] = None
            with svc.ledger.ro() as s:
                return report(s, account=account, scope=scope, start=start, end=end, tz=tz,
                              by=by, now=now, grants=grants, window=window,
                              off_peak=off_peak)

        out = await self.db(work)
        out["tz"] = tz_name
        if fmt == "json":
            self.send(out)
            return
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        stamp = time.strftime("%Y%m%d-%H%M")
        self.set_header("Content-Disposition",
                        f'attachment; filename="gpubudget-report-{stamp}.csv"')
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(csv_text(out, safe_cell))


API_ROUTES = [("/reports", ReportsHandler)]
