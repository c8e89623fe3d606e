"""The audit trail for admins and managers: who changed a grant, drained or undrained a node,
cancelled, preempted or requeued work — when and why. The Audit page (``handlers/pages.py``)
and ``GET /audit`` (``handlers/audit.py``, JSON or CSV) show the same entries.

There is one log: the ``decisions`` table every such change is written to together with the
change itself (``ledger/store.py``, ``ledger/nodes.py``, ``service/loop.py``). This module only
chooses the administrative kinds from it and limits them to what the caller may see:

- an admin: everything;
- a manager (``managers:`` in the budgets file, with ``custom:gpubudget:manage`` on the token):
  the grant changes of, and the work charged to, the accounts they manage and everything below
  them; and node health changes (drains are shown to everyone on the Nodes page anyway);
- anyone else: nothing (403), even for their own work: they have the Decisions page.

Every function that reads the ledger runs on the database threads (``BaseHandler.db``).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any

from jupyter_gpubudget.core.accounts import AccountTree
from jupyter_gpubudget.ledger import nodes as ledger_nodes
from jupyter_gpubudget.ledger.models import DecisionRow, WorkloadRow

from .auth import SCOPE_MANAGE, Caller, Denied
from .timefmt import companions, local_iso

if TYPE_CHECKING:
    from .app import GpuBudgetService

#: what the Audit page offers to filter by (``?what=``), and the decision kinds of each
GROUPS: dict[str, tuple[str, ...]] = {
    "grants": ("grant", "member_limit"),
    "nodes": ("health", "drain", "repair", "undrain"),
    "cancellations": ("cancel",),
    "preemptions": ("preempt", "preempt-requested"),
    "requeues": ("requeue",),
}
GROUP_WORDS = {"grants": "grant changes", "nodes": "node drains and undrains",
               "cancellations": "cancellations", "preemptions": "preemptions",
               "requeues": "requeues"}
KINDS = tuple(k for ks in GROUPS.values() for k in ks)
NODE_KINDS = frozenset(GROUPS["nodes"])
ACCOUNT_KINDS = frozenset(GROUPS["grants"])  # about an account (``detail["account"]``)
WHAT = {"grant": "grant changed", "member_limit": "member limit changed", "health": "drain started (node unhealthy)",
        "drain": "node drained", "repair": "node ready for repair",
        "undrain": "node back in service", "cancel": "cancelled", "preempt": "preempted",
        "preempt-requested": "asked to stop (preempted)", "requeue": "requeued"}
#: rows one CSV export holds at most (newest first); the page pages by 100
CSV_MAX = 10000
#: a cell a spreadsheet would run as a formula starts with one of these
_FORMULA = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")


class BadFilter(ValueError):
    """A filter the caller gave that cannot be used: a 400 naming ``field``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, f"{field}: {message}"


def audit_scope(c: Caller, tree: AccountTree) -> set[str] | None:
    """The accounts whose entries ``c`` may see: None for an admin (all, and node changes);
    for a manager the accounts they manage and everything below them. Raises ``Denied``
    for anyone else (and for a token without the manage scope)."""
    if c.is_admin:
        return None
    if SCOPE_MANAGE not in c.scopes:
        raise Denied(f"the audit log is for gpubudget admins and account managers "
                     f"(token lacks scope {SCOPE_MANAGE})")
    mine = {a for a in tree.accounts if tree.can_manage(c.name, a)}
    if not mine:
        raise Denied(f"the audit log is for gpubudget admins and account managers; user "
                     f"{c.name!r} manages no account")
    return mine


def may_audit(c: Caller, tree: AccountTree) -> bool:
    try:
        audit_scope(c, tree)
    except Denied:
        return False
    return True


# ---------------------------------------------------------------------- filters
@dataclass(frozen=True)
class Filters:
    account: str | None = None
    since: float | None = None
    until: float | None = None
    groups: tuple[str, ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for g in (self.groups or tuple(GROUPS)) for k in GROUPS[g])


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_time(raw: str, field: str, tz: tzinfo | None, end_of_day: bool = False) -> float:
    """A date (``2025-03-01``) or date and time (``2025-03-01T14:00``, seconds and an offset
    allowed), in ``tz`` (else the service's zone) when it has no offset. A bare date as
    ``until`` means the end of that day: the day is included."""
    text = raw.strip()
    if len(text) > 40:
        raise BadFilter(field, "at most 40 characters")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        raise BadFilter(field, f"expected a date such as 2025-03-01 or a date and time such "
                               f"as 2025-03-01T14:00 (not a number of seconds), got {text!r}")
    try:
        if _DATE.fullmatch(text):
            d = date.fromisoformat(text)
            if end_of_day:
                d = d + timedelta(days=1)
            dt = datetime(d.year, d.month, d.day)
        else:
            dt = datetime.fromisoformat(text.replace(" ", "T", 1))
    except (ValueError, OverflowError):
        raise BadFilter(field, f"expected a date such as 2025-03-01 or a date and time such "
                               f"as 2025-03-01T14:00, got {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz) if tz is not None else dt.astimezone()
    try:
        return dt.timestamp()
    except (OverflowError, OSError, ValueError):
        raise BadFilter(field, f"out of range: {text!r}") from None


def parse_filters(get: Callable[[str], str | None], tree: AccountTree,
                  scope: set[str] | None, tz: tzinfo | None) -> Filters:
    """``?account=&since=&until=&what=`` (``get(name)`` reads one); a bad one is a
    :class:`BadFilter` naming it. A manager may only name an account in their scope (the
    same answer for one that does not exist: the names of others' accounts are not told)."""
    account = (get("account") or "").strip() or None
    if account is not None:
        if scope is None and account not in tree:
            raise BadFilter("account", f"no account {account[:200]!r}")
        if scope is not None and account not in scope:
            raise BadFilter("account", f"{account[:200]!r} is not an account you manage "
                                       f"or one below it")
    since = until = None
    if get("since"):
        since = parse_time(get("since") or "", "since", tz)
    if get("until"):
        until = parse_time(get("until") or "", "until", tz, end_of_day=True)
    if since is not None and until is not None and until <= since:
        raise BadFilter("until", "must be later than since")
    groups: list[str] = []
    for g in (get("what") or "").split(","):
        g = g.strip()
        if not g:
            continue
        if g not in GROUPS:
            raise BadFilter("what", f"unknown {g[:40]!r} (expected one or more of "
                                    f"{', '.join(GROUPS)}, comma-separated)")
        if g not in groups:
            groups.append(g)
    return Filters(account=account, since=since, until=until, groups=tuple(groups))


# ---------------------------------------------------------------------- entries
def who_text(actor: str) -> str:
    """Who made a change, for people: 'admin', 'the scheduler', 'the nvml health check',
    'the budgets file (budgets.yaml)'."""
    if actor == "scheduler":
        return "the scheduler"
    if actor.startswith("health:"):
        return f"the {actor[7:]} health check"
    if actor.startswith("file:"):
        return f"the budgets file ({actor[5:]})"
    if actor.startswith("policy:"):
        return f"the budgets file's policy {actor[7:]}"
    return actor


def _hours(x: float) -> str:
    return f"{x:,.1f}" if abs(x) < 100 else f"{x:,.0f}"


def _entry(d: DecisionRow, w: WorkloadRow | None, now: float, tz: tzinfo | None
           ) -> dict[str, Any]:
    det = d.detail or {}
    account = det.get("account") if d.kind in ACCOUNT_KINDS else (w.project if w else None)
    change = ""
    if d.kind == "grant":
        if det.get("grant_hours") is not None:
            change = f"grant set to {_hours(float(det['grant_hours']))} GPU-h"
        elif det.get("share_pct") is not None:
            change = f"grant set to {float(det['share_pct']):g} % of its parent"
        else:
            change = "grant removed"
        if det.get("approved_by"):  # a change that needed a second person (or the policy)
            asked = f"asked by {det['requested_by']}, " if det.get("requested_by") else ""
            change += f" ({asked}approved by {who_text(str(det['approved_by']))})"
    elif d.kind == "member_limit":  # service/member_limits.py
        lim = det.get("limit") or {}
        parts = [f"{_hours(float(lim['gpu_hours']))} GPU-h per window"] \
            if lim.get("gpu_hours") is not None else []
        parts += [f"{float(lim['gpus']):g} GPUs at once"] if lim.get("gpus") is not None else []
        change = (f"{det.get('user')}'s limit set to {' and '.join(parts)}" if parts
                  else f"{det.get('user')}'s limit cleared")
    elif d.kind == "preempt" and det.get("requeued"):
        change = "requeued to run again"
    elif d.kind in NODE_KINDS:
        change = f"node {det.get('node')}"
    # a health change's own words are the problem given (the reason repeats node and source)
    why = det.get("problem") if d.kind == "health" and det.get("problem") else d.reason
    undrained = f"node {det.get('node')} back in service ({det.get('source')}): "
    if d.kind == "undrain" and why.startswith(undrained):  # the admin's note only
        why = why[len(undrained):]
    if not why:
        why = {"cancel": f"cancelled by {d.actor}", "preempt": "preempted"}.get(d.kind, "")
    e = {"id": d.id, "at": d.at, "kind": d.kind, "what": WHAT.get(d.kind, d.kind),
         "who": d.actor, "who_text": who_text(d.actor), "account": account,
         "workload": d.workload, "workload_name": (w.name or None) if w else None,
         "user": w.user if w else None, "node": det.get("node"), "why": why,
         "change": change, "approved_by": det.get("approved_by"),
         "requested_by": det.get("requested_by"), "detail": det}
    return companions(e, ("at",), now, tz)


def _keeper(tree: AccountTree, scope: set[str] | None, f: Filters
            ) -> Callable[[DecisionRow, WorkloadRow | None], bool] | None:
    """What to keep of a decision: about an account the caller may see (and below the
    ``account`` filter); node changes only without an account filter."""
    allowed = scope
    if f.account is not None:
        below = {a for a in tree.accounts if f.account in tree.path(a)}
        allowed = below if scope is None else below & scope
    if allowed is None:
        return None

    def keep(d: DecisionRow, w: WorkloadRow | None) -> bool:
        if d.kind in NODE_KINDS:
            return f.account is None
        if d.kind in ACCOUNT_KINDS:
            return (d.detail or {}).get("account") in allowed
        return w is not None and w.project in allowed

    return keep


def audit_overview(svc: GpuBudgetService, c: Caller, scope: set[str] | None, f: Filters,
                   now: float, tz: tzinfo | None = None, before: int | None = None,
                   limit: int = 100) -> dict[str, Any]:
    """The entries newest first (``next_before``: the id to page on with ``before``)."""
    tree = svc.tree()
    rows = ledger_nodes.audit_trail(svc.ledger, kinds=f.kinds, since=f.since, until=f.until,
                                    before=before, limit=limit + 1,
                                    scan=max(20000, 2 * limit),
                                    keep=_keeper(tree, scope, f))
    more = len(rows) > limit
    rows = rows[:limit]
    accounts = sorted(tree.accounts) if scope is None else sorted(scope)
    return {"entries": [_entry(d, w, now, tz) for d, w in rows],
            "next_before": rows[-1][0].id if more and rows else None,
            "accounts": accounts, "groups": dict(GROUP_WORDS), "is_admin": c.is_admin,
            "filters": {"account": f.account, "what": list(f.groups),
                        "since": f.since, "until": f.until,
                        "since_local": local_iso(f.since, tz) if f.since else None,
                        "until_local": local_iso(f.until, tz) if f.until else None}}


CSV_COLUMNS = ("time", "what", "who", "account", "workload", "user", "node", "change", "why")


def safe_cell(value: Any) -> str:
    """A CSV cell a spreadsheet shows as text: one that would start a formula (``=``, ``+``,
    ``-``, ``@``, a tab or a line break; full-width forms too) gets a leading ``'``."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(_FORMULA) else text


def audit_csv(entries: list[dict[str, Any]]) -> str:
    """The entries as CSV (every cell quoted and formula-safe; times in the caller's zone as
    ISO 8601 with the offset)."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\r\n")
    w.writerow(CSV_COLUMNS)
    for e in entries:
        w.writerow([safe_cell(x) for x in (
            e["at_local"], e["what"], e["who_text"], e["account"],
            e["workload_name"] or e["workload"], e["user"], e["node"], e["change"],
            e["why"])])
    return buf.getvalue()
